//! The claim: binding one free host to one machine, race-free.
//!
//! Two writes, each guarded by `resourceVersion`:
//! 1. the **intent** on the ByoMachine (annotation `infrastructure.cluster.x-k8s.io/byohost` =
//!    `<namespace>/<host>`, plus `clusterctl.cluster.x-k8s.io/block-move`): serializes claims per
//!    machine, so two provider replicas can never bind two hosts to one machine;
//! 2. the **claim** on the ByoHost (`spec.machineRef`): serializes claims per host, so a host is
//!    never bound to two machines. A conflict means another claim won: re-read and pick again
//!    (unless the winner was this very machine).
//!
//! Before choosing, the machine looks for a host it already holds (pool index by uid, then the
//! intent), so a crash between the steps never claims twice.

use bootsman_api::capi::Machine;
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::error::{Error, Result, is_not_found, kube as kerr};
use crate::pool::{self, Choice, Wanted};

/// Annotation on a ByoMachine naming the host it is claiming or holds.
pub const HOST_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/byohost";

/// Outcome of [`ensure`].
pub enum Claim {
    /// The machine holds this host (fresh from the API server or the index).
    Held(Box<ByoHost>),
    /// No host can be claimed now.
    Waiting {
        /// `WaitingForHost`, `NoMatchingHost` or `InvalidSelector`.
        reason: &'static str,
        /// What the operator should know.
        message: String,
    },
}

/// Finds the host this machine holds, or claims one.
pub async fn ensure(bm: &ByoMachine, ctx: &Context, machine: &Machine) -> Result<Claim> {
    if let Some(host) = held(bm, ctx).await? {
        return Ok(Claim::Held(Box::new(host)));
    }
    let ns = bm.namespace().unwrap_or_default();
    let uid = bm.uid().unwrap_or_default();
    let pools = ctx.config.pools_for(&ns);
    let mut bm = bm.clone();
    let mut tried: Vec<(Option<String>, String)> = Vec::new();
    for _attempt in 0..8 {
        let snapshot = ctx.hosts.state();
        let hosts: Vec<&ByoHost> = snapshot.iter().map(AsRef::as_ref).collect();
        let wanted = Wanted {
            machine_uid: &uid,
            pools: &pools,
            selector: bm.spec.selector.as_ref(),
            failure_domain: machine.spec.failure_domain.as_deref(),
        };
        let candidates = match pool::choose(&hosts, &wanted, |h| ctx.is_fresh(h)) {
            Choice::Candidates(c) => c,
            Choice::WaitingForHost { matching } => {
                return Ok(Claim::Waiting {
                    reason: "WaitingForHost",
                    message: format!(
                        "{matching} host(s) in {} match the selector, none is free and healthy",
                        pools.join(", ")
                    ),
                });
            }
            Choice::NoMatchingHost => {
                return Ok(Claim::Waiting {
                    reason: "NoMatchingHost",
                    message: format!("no host in {} matches the selector", pools.join(", ")),
                });
            }
            Choice::InvalidSelector(e) => {
                return Ok(Claim::Waiting {
                    reason: "InvalidSelector",
                    message: format!("spec.selector: {e}"),
                });
            }
        };
        let key = |h: &ByoHost| (h.namespace(), h.name_any());
        let Some(host) = candidates.iter().copied().find(|h| !tried.contains(&key(h))) else {
            // Every candidate lost a race already; the index is catching up.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            tried.clear();
            continue;
        };
        tried.push(key(host));
        bm = write_intent(&bm, ctx, host).await?;
        match claim_host(&bm, ctx, host, &machine.spec.cluster_name).await? {
            Some(claimed) => {
                ctx.metrics.claims.inc();
                if let Some(created) = bm.metadata.creation_timestamp.as_ref() {
                    let secs = Timestamp::now().duration_since(created.0).as_secs_f64();
                    ctx.metrics.time_to_claim.observe(secs.max(0.0));
                }
                let note = format!(
                    "claimed host {}/{}",
                    claimed.namespace().unwrap_or_default(),
                    claimed.name_any()
                );
                ctx.event(&bm, false, "HostClaimed", "Claim", note).await;
                return Ok(Claim::Held(Box::new(claimed)));
            }
            None => {
                ctx.metrics.claim_conflicts.inc();
                // Give the index a moment to learn about the winner before choosing again.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    Err(Error::Conflict(format!(
        "claiming a host for ByoMachine {ns}/{}: every candidate was taken",
        bm.name_any()
    )))
}

/// The host bound to this machine, if any: the pool index first (by uid), then the host named
/// by the intent annotation, read fresh (the index may not have seen our own claim yet).
pub async fn held(bm: &ByoMachine, ctx: &Context) -> Result<Option<ByoHost>> {
    let uid = bm.uid().unwrap_or_default();
    let ours = |h: &ByoHost| h.spec.machine_ref.as_ref().is_some_and(|r| r.uid == uid);
    if let Some(h) = ctx.hosts.find(|h| ours(h)) {
        return Ok(Some(h.as_ref().clone()));
    }
    let Some((ns, name)) = bm
        .annotations()
        .get(HOST_ANNOTATION)
        .and_then(|v| v.split_once('/'))
    else {
        return Ok(None);
    };
    match Api::<ByoHost>::namespaced(ctx.client.clone(), ns).get(name).await {
        Ok(h) if ours(&h) => Ok(Some(h)),
        Ok(_) => Ok(None),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(kerr(format!("get ByoHost {ns}/{name}"))(e)),
    }
}

/// Records which host this machine is about to claim (guarded by the machine's resourceVersion).
async fn write_intent(bm: &ByoMachine, ctx: &Context, host: &ByoHost) -> Result<ByoMachine> {
    let ns = bm.namespace().unwrap_or_default();
    let value = format!("{}/{}", host.namespace().unwrap_or_default(), host.name_any());
    let patch = json!({"metadata": {
        "resourceVersion": bm.resource_version(),
        "annotations": {HOST_ANNOTATION: value, labels::CLUSTERCTL_BLOCK_MOVE: "claiming a host"},
    }});
    Api::<ByoMachine>::namespaced(ctx.client.clone(), &ns)
        .patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!(
            "record the claim intent on ByoMachine {ns}/{}",
            bm.name_any()
        )))
}

/// Writes `spec.machineRef` on the host, guarded by the host's resourceVersion as the index saw
/// it free. `None` when another claim won.
async fn claim_host(
    bm: &ByoMachine,
    ctx: &Context,
    host: &ByoHost,
    cluster: &str,
) -> Result<Option<ByoHost>> {
    let hns = host.namespace().unwrap_or_default();
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &hns);
    let patch = json!({
        "metadata": {
            "resourceVersion": host.resource_version(),
            "labels": {labels::CLUSTER_NAME: cluster},
        },
        "spec": {"machineRef": {
            "namespace": bm.namespace(),
            "name": bm.name_any(),
            "uid": bm.uid(),
        }},
    });
    match api
        .patch(&host.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(h) => Ok(Some(h)),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {
            // Lost the race, unless the winner was this machine (another replica acting for it).
            let current = api
                .get(&host.name_any())
                .await
                .map_err(kerr(format!("get ByoHost {hns}/{}", host.name_any())))?;
            let uid = bm.uid().unwrap_or_default();
            Ok(current
                .spec
                .machine_ref
                .as_ref()
                .is_some_and(|r| r.uid == uid)
                .then_some(current))
        }
        Err(e) => Err(kerr(format!("claim ByoHost {hns}/{}", host.name_any()))(e)),
    }
}
