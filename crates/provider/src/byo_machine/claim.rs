//! The claim: binding one free host to one machine, race-free.
//!
//! Each claim attempt is two writes, each guarded by `resourceVersion`:
//! 1. the **intent** on the ByoMachine (annotation `infrastructure.cluster.x-k8s.io/byohost` =
//!    `<namespace>/<host>`, a fresh `infrastructure.cluster.x-k8s.io/byohost-attempt` nonce, and
//!    `clusterctl.cluster.x-k8s.io/block-move`): every attempt changes the machine, so of two
//!    provider replicas attempting for one machine at once only one gets past this step;
//! 2. the **claim** on the ByoHost (`spec.machineRef`), guarded by the host's version as seen
//!    claimable: a host is never bound to two machines.
//!
//! An intent is abandoned only once its host can no longer be claimed by the writer of the
//! intent (claimed by another machine, gone, or changed so that it is out of the pool): while
//! the intended host is still free, every replica (the writer after a conflict too) renews the
//! intent and claims that host, never another. So two hosts are never bound to one machine.
//!
//! Before choosing, the machine looks for a host it already holds (pool index, then the
//! intent), so a crash between the steps never claims twice.
//!
//! A host is held by a machine when its `spec.machineRef` names the machine's uid, or names the
//! machine's namespace and name and the binding id the machine carries in its annotation
//! [`BINDING_ANNOTATION`] (see [`binds`]). The binding id is the machine's uid when it wrote its
//! intent; `clusterctl move` recreates the machine under a new uid but keeps its annotations, so
//! the moved machine still holds its host and claims no second one, and the host's
//! `machineRef.uid`, which keys the agent's journal, never changes. A machine recreated under the
//! same name by hand is a new machine: it has no such annotation (or its own uid in it).
//!
//! What a process remembers between reconciles (machines waiting for a host, its own writes, the
//! hosts it is claiming) is kept in a [`Book`]; the decisions of the protocol ([`binds`],
//! [`judge`]) are pure functions of the objects.

mod book;

pub use book::{Book, CLAIM_MEMORY};

use bootsman_api::capi::Machine;
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use bootsman_runtime::api_errors;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::error::{Error, Result, is_not_found, kube as kerr};
use crate::pool::{self, Choice, Wanted};

/// Annotation on a ByoMachine naming the host it is claiming or holds.
pub const HOST_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/byohost";
/// Annotation on a ByoMachine that changes with every claim attempt (see the module docs).
pub const ATTEMPT_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/byohost-attempt";
/// Annotation on a ByoMachine holding its binding id: its uid when it wrote the intent, which is
/// the `machineRef.uid` of the host it claims (see the module docs).
pub const BINDING_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/byohost-binding";
/// Claim attempts on one host before the reconcile gives up and is retried.
const ATTEMPTS_PER_HOST: usize = 5;

/// Outcome of [`ensure`].
pub enum Claim {
    /// The machine holds this host (fresh from the API server or the index).
    Held {
        /// The host.
        host: Box<ByoHost>,
        /// Whether this call claimed it (to be announced by the caller, see [`announce`]).
        new: bool,
    },
    /// No host can be claimed now.
    Waiting {
        /// `WaitingForHost`, `NoMatchingHost` or `InvalidSelector`.
        reason: &'static str,
        /// What the operator should know.
        message: String,
    },
}

/// Finds the host this machine holds, or claims one. `bm` is left as last written (the intent
/// changes it).
pub async fn ensure(bm: &mut ByoMachine, ctx: &Context, machine: &Machine) -> Result<Claim> {
    let ns = bm.namespace().unwrap_or_default();
    let uid = bm.uid().unwrap_or_default();
    let pools = ctx.pools_for(&ns);
    match lookup(bm, ctx).await? {
        Lookup::Held(host) => {
            return Ok(Claim::Held {
                host: Box::new(host),
                new: false,
            });
        }
        Lookup::Intended(host) => {
            // The intent may be another replica's claim in flight: finish it, do not replace it.
            if let Some(claimed) = attempt(bm, ctx, &host, &machine.spec.cluster_name).await? {
                return Ok(counted(bm, ctx, claimed));
            }
            ctx.metrics.claim_conflicts.inc();
        }
        Lookup::Nothing => {}
    }
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
        // Hosts another reconcile of this process is claiming are left to it.
        let Some(host) = candidates
            .iter()
            .copied()
            .find(|h| !tried.contains(&key(h)) && !ctx.claims.is_being_claimed(h))
            .or_else(|| candidates.iter().copied().find(|h| !tried.contains(&key(h))))
        else {
            // Every candidate lost a race already; the index is catching up.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            tried.clear();
            continue;
        };
        tried.push(key(host));
        ctx.claims.start_claim(host);
        let claimed = attempt(bm, ctx, host, &machine.spec.cluster_name).await;
        if claimed.is_err() {
            ctx.claims.forget_claim(host);
        }
        match claimed? {
            Some(claimed) => return Ok(counted(bm, ctx, claimed)),
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

/// Counts and times a successful claim.
fn counted(bm: &ByoMachine, ctx: &Context, claimed: ByoHost) -> Claim {
    ctx.metrics.claims.inc();
    if let Some(created) = bm.metadata.creation_timestamp.as_ref() {
        let secs = Timestamp::now().duration_since(created.0).as_secs_f64();
        ctx.metrics.time_to_claim.observe(secs.max(0.0));
    }
    Claim::Held {
        host: Box::new(claimed),
        new: true,
    }
}

/// Announces a claim, and with `delivered` the bootstrap hand-over that followed it. Published
/// by the caller once that hand-over is done (or has failed), so that the host's two spec changes
/// follow each other closely.
pub async fn announce(bm: &ByoMachine, ctx: &Context, host: &ByoHost, delivered: bool) {
    let mut note = format!(
        "claimed host {}/{}",
        host.namespace().unwrap_or_default(),
        host.name_any()
    );
    if delivered {
        note.push_str(" and handed it the bootstrap data");
    }
    ctx.event(bm, false, "HostClaimed", "Claim", note).await;
}

/// Takes the longest-waiting machine that may use `host` (its pools, selector and failure
/// domain), so a host that becomes claimable wakes one machine that can take it, not all. A
/// waiting machine missing from the store is woken anyway: its reconcile decides.
pub fn wake_for(ctx: &Context, host: &ByoHost) -> Option<ObjectRef<ByoMachine>> {
    let hns = host.namespace()?;
    ctx.claims.take_waiting(|r| {
        let pools = ctx.pools_for(r.namespace.as_deref().unwrap_or_default());
        let Some(bm) = ctx.byomachines.get(r) else {
            return pools.contains(&hns);
        };
        let failure_domain = ctx.owner_machine(&bm).and_then(|m| m.spec.failure_domain.clone());
        may_take(&bm, &pools, failure_domain.as_deref(), host)
    })
}

/// Whether `bm`, drawing from `pools` for a Machine in `failure_domain`, could claim `host` were
/// it free and healthy.
fn may_take(bm: &ByoMachine, pools: &[String], failure_domain: Option<&str>, host: &ByoHost) -> bool {
    if !host.namespace().is_some_and(|ns| pools.contains(&ns)) {
        return false;
    }
    let uid = bm.uid().unwrap_or_default();
    let wanted = Wanted {
        machine_uid: &uid,
        pools,
        selector: bm.spec.selector.as_ref(),
        failure_domain,
    };
    !matches!(pool::choose(&[host], &wanted, |_| true), Choice::NoMatchingHost)
}

/// What the pool and the intent say about a machine's host.
#[derive(Debug)]
enum Lookup {
    /// The host is bound to the machine.
    Held(ByoHost),
    /// The intent names this host, which is free: a claim of it may be in flight.
    Intended(ByoHost),
    /// Neither: the machine may choose.
    Nothing,
}

/// Whether a host's spec lets it be claimed (its heartbeat aside: a claim in flight does not
/// look at the Lease again, so neither may the decision to abandon it).
fn free(host: &ByoHost) -> bool {
    pool::unavailable(host, true).is_none()
}

/// The host bound to this machine, if any: the pool index first (by uid), then the host named
/// by the intent annotation, read fresh (the index may not have seen our own claim yet).
pub async fn held(bm: &ByoMachine, ctx: &Context) -> Result<Option<ByoHost>> {
    Ok(match lookup(bm, ctx).await? {
        Lookup::Held(h) => Some(h),
        _ => None,
    })
}

/// Whether `host` is bound to `bm`: its claim names the machine's uid, or the machine's namespace,
/// name and binding id (a machine moved by `clusterctl move`, see the module docs).
pub fn binds(bm: &ByoMachine, host: &ByoHost) -> bool {
    let Some(r) = &host.spec.machine_ref else {
        return false;
    };
    if bm.uid().is_some_and(|uid| uid == r.uid) {
        return true;
    }
    bm.namespace().as_deref() == Some(r.namespace.as_str())
        && bm.name_any() == r.name
        && bm.annotations().get(BINDING_ANNOTATION) == Some(&r.uid)
}

/// The host the machine's intent names, as `(namespace, name)`.
fn intended(bm: &ByoMachine) -> Option<(&str, &str)> {
    bm.annotations()
        .get(HOST_ANNOTATION)
        .and_then(|v| v.split_once('/'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

/// What a host read fresh from the API server (`None`: it is gone) means for the machine that
/// intends or tried to claim it: bound to the machine, still free (a claim of it may go on), or
/// lost, which is the only case where the intent is abandoned (see the module docs).
fn judge(bm: &ByoMachine, host: Option<ByoHost>) -> Lookup {
    match host {
        Some(h) if binds(bm, &h) => Lookup::Held(h),
        Some(h) if free(&h) => Lookup::Intended(h),
        _ => Lookup::Nothing,
    }
}

async fn lookup(bm: &ByoMachine, ctx: &Context) -> Result<Lookup> {
    if let Some(h) = ctx.hosts.find(|h| binds(bm, h)) {
        return Ok(Lookup::Held(h.as_ref().clone()));
    }
    let Some((ns, name)) = intended(bm) else {
        return Ok(Lookup::Nothing);
    };
    let fresh = Api::<ByoHost>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kerr(format!("get ByoHost {ns}/{name}")))?;
    Ok(judge(bm, fresh))
}

/// Claims `host` for the machine: renews the intent, then writes the claim. While the host stays
/// free after a lost write, tries it again (never another host: see the module docs). `None`
/// once the host is claimed by another machine, gone, or out of the pool.
async fn attempt(
    bm: &mut ByoMachine,
    ctx: &Context,
    host: &ByoHost,
    cluster: &str,
) -> Result<Option<ByoHost>> {
    let hns = host.namespace().unwrap_or_default();
    let name = host.name_any();
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &hns);
    let mut host = host.clone();
    for _ in 0..ATTEMPTS_PER_HOST {
        *bm = write_intent(bm, ctx, &host).await?;
        ctx.claims.note_written(bm);
        match claim_host(bm, &api, &host, cluster).await {
            Ok(h) => return Ok(Some(h)),
            Err(kube::Error::Api(s)) if api_errors::conflict(&s) || api_errors::invalid(&s) => {
                // Lost a race, unless the winner was this machine (another replica acting for it).
                let current = api
                    .get_opt(&name)
                    .await
                    .map_err(kerr(format!("get ByoHost {hns}/{name}")))?;
                match judge(bm, current) {
                    Lookup::Held(h) => return Ok(Some(h)),
                    Lookup::Intended(h) => host = h,
                    Lookup::Nothing => return Ok(None),
                }
            }
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(kerr(format!("claim ByoHost {hns}/{name}"))(e)),
        }
    }
    Err(Error::Conflict(format!(
        "claiming ByoHost {hns}/{name} for ByoMachine {}: it kept changing",
        bm.name_any()
    )))
}

/// Records which host this machine is about to claim and the binding id of the claim (the
/// machine's uid), guarded by the machine's resourceVersion, and always a change, thanks to a
/// fresh attempt nonce. The first intent also adds the machine's finalizer: it is in place before
/// any host can be bound to the machine.
async fn write_intent(bm: &ByoMachine, ctx: &Context, host: &ByoHost) -> Result<ByoMachine> {
    use std::hash::{BuildHasher, Hasher};
    let ns = bm.namespace().unwrap_or_default();
    let value = format!("{}/{}", host.namespace().unwrap_or_default(), host.name_any());
    let nonce = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mut patch = json!({"metadata": {
        "resourceVersion": bm.resource_version(),
        "annotations": {
            HOST_ANNOTATION: value,
            ATTEMPT_ANNOTATION: format!("{nonce:016x}"),
            BINDING_ANNOTATION: bm.uid(),
            labels::CLUSTERCTL_BLOCK_MOVE: "claiming a host",
        },
    }});
    if let Some(finalizers) = super::finalizers_with_ours(bm) {
        // A merge patch replaces the list; the resourceVersion guard keeps others' entries.
        patch["metadata"]["finalizers"] = json!(finalizers);
    }
    Api::<ByoMachine>::namespaced(ctx.client.clone(), &ns)
        .patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!(
            "record the claim intent on ByoMachine {ns}/{}",
            bm.name_any()
        )))
}

/// Writes `spec.machineRef` on the host, guarded by the host's resourceVersion as seen free.
async fn claim_host(
    bm: &ByoMachine,
    api: &Api<ByoHost>,
    host: &ByoHost,
    cluster: &str,
) -> Result<ByoHost, kube::Error> {
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
    api.patch(&host.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootsman_api::v1beta1::{ByoHostSpec, ByoMachineSpec, MachineRef, Quarantine, ReleaseRequest};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

    fn machine(uid: &str, annotations: &[(&str, &str)]) -> ByoMachine {
        let mut bm = ByoMachine::new("m1", ByoMachineSpec::default());
        bm.metadata.namespace = Some("team".into());
        bm.metadata.uid = Some(uid.into());
        bm.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        bm
    }

    fn host(ns: &str, name: &str) -> ByoHost {
        let mut h = ByoHost::new(name, ByoHostSpec::default());
        h.metadata.namespace = Some(ns.into());
        h
    }

    fn bound(mut h: ByoHost, ns: &str, name: &str, uid: &str) -> ByoHost {
        h.spec.machine_ref = Some(MachineRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        });
        h
    }

    #[test]
    fn a_host_is_bound_by_uid_or_by_name_and_binding_id_after_a_move() {
        let h = bound(host("pool", "h1"), "team", "m1", "u1");
        assert!(binds(&machine("u1", &[]), &h));
        assert!(
            !binds(&machine("u1", &[]), &host("pool", "h1")),
            "a free host binds nothing"
        );

        // `clusterctl move` recreated the machine under a new uid; its binding id moved with it.
        let moved = machine("u2", &[(BINDING_ANNOTATION, "u1")]);
        assert!(binds(&moved, &h));
        // A machine recreated by hand under the same name is a new machine.
        assert!(!binds(&machine("u2", &[]), &h));
        assert!(!binds(&machine("u2", &[(BINDING_ANNOTATION, "u2")]), &h));
        // The binding id counts only with the same namespace and name.
        assert!(!binds(&moved, &bound(host("pool", "h1"), "other", "m1", "u1")));
        assert!(!binds(&moved, &bound(host("pool", "h1"), "team", "m2", "u1")));
    }

    #[test]
    fn the_intent_names_one_host() {
        assert_eq!(
            intended(&machine("u1", &[(HOST_ANNOTATION, "pool/h1")])),
            Some(("pool", "h1"))
        );
        assert_eq!(intended(&machine("u1", &[])), None);
        for broken in ["h1", "/h1", "pool/", ""] {
            assert_eq!(
                intended(&machine("u1", &[(HOST_ANNOTATION, broken)])),
                None,
                "{broken:?}"
            );
        }
    }

    #[test]
    fn an_intent_is_kept_while_its_host_is_free_and_abandoned_once_it_is_lost() {
        let bm = machine("u1", &[(HOST_ANNOTATION, "pool/h1")]);
        // Bound to this machine: held (our claim, or another replica's for this machine, won).
        assert!(matches!(
            judge(&bm, Some(bound(host("pool", "h1"), "team", "m1", "u1"))),
            Lookup::Held(_)
        ));
        // Free: the claim may be in flight; finish it, never choose another host.
        assert!(matches!(
            judge(&bm, Some(host("pool", "h1"))),
            Lookup::Intended(_)
        ));

        // Lost: claimed by another machine, gone, or out of the pool.
        let lost = |h: Option<ByoHost>| matches!(judge(&bm, h), Lookup::Nothing);
        assert!(lost(Some(bound(host("pool", "h1"), "team", "m2", "u9"))));
        assert!(lost(None));
        let mut releasing = host("pool", "h1");
        releasing.spec.release = Some(ReleaseRequest {
            machine_uid: "u9".into(),
            requested_at: Time(Timestamp::from_second(1).unwrap()),
        });
        assert!(lost(Some(releasing)));
        let mut quarantined = host("pool", "h1");
        quarantined.spec.quarantine = Some(Quarantine {
            reason: "reset failed".into(),
            since: Time(Timestamp::from_second(1).unwrap()),
        });
        assert!(lost(Some(quarantined)));
        let mut maintenance = host("pool", "h1");
        maintenance.spec.maintenance = Some(true);
        assert!(lost(Some(maintenance)));
        let mut deleting = host("pool", "h1");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        assert!(lost(Some(deleting)));
    }

    #[test]
    fn a_claimable_host_wakes_only_a_machine_that_could_take_it() {
        let pools = vec!["pool".to_string()];
        let h = {
            let mut h = host("pool", "h1");
            h.metadata.labels = Some([("role".to_string(), "worker".to_string())].into());
            h
        };
        let mut bm = machine("u1", &[]);
        assert!(may_take(&bm, &pools, None, &h));
        assert!(
            !may_take(&bm, &["elsewhere".to_string()], None, &h),
            "another pool"
        );

        bm.spec.selector = Some(LabelSelector {
            match_labels: Some([("role".to_string(), "control-plane".to_string())].into()),
            ..Default::default()
        });
        assert!(!may_take(&bm, &pools, None, &h), "the selector does not match");
        bm.spec.selector = Some(LabelSelector {
            match_labels: Some([("role".to_string(), "worker".to_string())].into()),
            ..Default::default()
        });
        assert!(may_take(&bm, &pools, None, &h));
    }
}
