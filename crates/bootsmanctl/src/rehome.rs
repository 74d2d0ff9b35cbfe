//! `bootsmanctl hosts rehome`: moves hosts' agents from this management cluster (the source)
//! to another (the target), one step per host, as the pivot of an install does once the host
//! objects have been copied.
//!
//! For each host:
//! 1. on the target, a one-time bootstrap token pinned to the host's name and issued as a
//!    replacement (the moved ByoHost holds the name there), as `bootsmanctl hosts replace` does;
//! 2. on the source, the Secret `bootsman-rehome-<host>` with the target's bootstrap kubeconfig
//!    (server, CA, token), readable by that host alone (a Role and RoleBinding of that one
//!    Secret for user `byoh:host:<host>`), all three owned by the host's ByoHost;
//! 3. `spec.rehome` on the source ByoHost (the target's server and the time).
//!
//! The agent then enrols with the target, reports `Rehomed=True` on the source and talks only
//! to the target from then on (see the agent's documentation). With `--wait`, the command waits
//! for both: `Rehomed=True` on the source and the host's Lease renewed on the target after the
//! request.
//!
//! A second run (after a crash, or for the hosts a first run did not finish) leaves alone every
//! host that answered `Rehomed=True` for the same target, so no token is spent twice.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use bootsman_api::condition::types;
use bootsman_api::identity;
use bootsman_api::v1beta1::{ByoHost, REHOME_SECRET_KEY, rehome_secret_name};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use bootsman_runtime::ssa;

use crate::token;

/// Field manager of what this command writes.
pub const MANAGER: &str = "bootsmanctl";

/// What to rehome where.
#[derive(Clone, Debug)]
pub struct Request {
    /// The pool on both sides.
    pub pool: String,
    /// The hosts; every host of the pool when empty.
    pub hosts: Vec<String>,
    /// The target's API server as the hosts reach it.
    pub server: String,
    /// The target's CA bundle (PEM).
    pub ca_pem: Vec<u8>,
    /// How long each token stays valid if unused.
    pub ttl: Duration,
}

/// A host whose rehome was requested.
#[derive(Clone, Debug)]
pub struct Requested {
    /// Its name.
    pub host: String,
    /// When `spec.rehome` was set.
    pub at: Timestamp,
    /// It had moved to this target already (`Rehomed=True` for the same server): nothing was
    /// written for it this time.
    pub already: bool,
}

/// When host `h` was asked to move to `server` and answered `Rehomed=True` for that request.
fn rehomed_to(h: &ByoHost, server: &str) -> Option<Timestamp> {
    let req = h.spec.rehome.as_ref().filter(|r| r.server == server)?;
    let done = h.status.as_ref()?.conditions.iter().any(|c| {
        c.type_ == types::REHOMED && c.status == "True" && c.observed_generation >= h.metadata.generation
    });
    done.then_some(req.requested_at.0)
}

/// Requests the rehome of `req.hosts` (every host of the pool when empty) from `source` to
/// `target`. Nothing is written for any host unless every named host exists on both sides.
pub async fn request(
    source: &kube::Client,
    target: &kube::Client,
    req: &Request,
) -> anyhow::Result<Vec<Requested>> {
    let src_hosts: Api<ByoHost> = Api::namespaced(source.clone(), &req.pool);
    let dst_hosts: Api<ByoHost> = Api::namespaced(target.clone(), &req.pool);
    let names: Vec<String> = if req.hosts.is_empty() {
        let mut n: Vec<String> = src_hosts
            .list(&ListParams::default())
            .await
            .with_context(|| format!("list the ByoHosts of pool {}", req.pool))?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        n.sort();
        n
    } else {
        req.hosts.clone()
    };
    if names.is_empty() {
        anyhow::bail!("--namespace: pool {:?} has no hosts to rehome", req.pool);
    }
    let mut hosts = Vec::new();
    for name in &names {
        identity::validate_host_name(name).map_err(|m| anyhow::anyhow!("HOST {name:?}: {m}"))?;
        let h = src_hosts
            .get_opt(name)
            .await
            .with_context(|| format!("read ByoHost {}/{name}", req.pool))?
            .ok_or_else(|| anyhow::anyhow!("HOST: no ByoHost {name:?} in pool {:?} here", req.pool))?;
        if dst_hosts
            .get_opt(name)
            .await
            .with_context(|| format!("read ByoHost {}/{name} on the target", req.pool))?
            .is_none()
        {
            anyhow::bail!(
                "HOST: ByoHost {name:?} is not in pool {:?} on the target yet: move the host objects first",
                req.pool
            );
        }
        hosts.push(h);
    }
    let mut out = Vec::new();
    for h in &hosts {
        let name = h.name_any();
        // A re-run after a crash or a partial run: a host that has moved already keeps its
        // request, and no token is spent on it again.
        if let Some(at) = rehomed_to(h, &req.server) {
            out.push(Requested {
                host: name,
                at,
                already: true,
            });
            continue;
        }
        let t = token::create(
            target,
            &token::Request {
                pool: req.pool.clone(),
                host: Some(name.clone()),
                ttl: req.ttl,
                replace: true,
            },
        )
        .await
        .with_context(|| format!("issue the target's token for host {name}"))?;
        let kubeconfig = token::bootstrap_kubeconfig(&req.server, &req.ca_pem, &t);
        write_access(source, &req.pool, h, &kubeconfig).await?;
        let at = Timestamp::now();
        src_hosts
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"rehome": {"server": req.server, "requestedAt": Time(at)}}})),
            )
            .await
            .with_context(|| format!("set spec.rehome of ByoHost {}/{name}", req.pool))?;
        out.push(Requested {
            host: name,
            at,
            already: false,
        });
    }
    Ok(out)
}

/// The rehome Secret of host `h` and the Role and RoleBinding that let that host alone read it,
/// all owned by the ByoHost (so they go with it), by server-side apply.
async fn write_access(
    client: &kube::Client,
    pool: &str,
    h: &ByoHost,
    kubeconfig: &str,
) -> anyhow::Result<()> {
    let host = h.name_any();
    let name = rehome_secret_name(&host);
    let owner = OwnerReference {
        api_version: ByoHost::api_version(&()).into(),
        kind: ByoHost::kind(&()).into(),
        name: host.clone(),
        uid: h.uid().unwrap_or_default(),
        ..OwnerReference::default()
    };
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(pool.into()),
        owner_references: Some(vec![owner]),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/part-of".into(),
            "bootsman".into(),
        )])),
        ..ObjectMeta::default()
    };
    let secret = Secret {
        metadata: meta.clone(),
        type_: Some("bootsman.io/rehome".into()),
        data: Some(BTreeMap::from([(
            REHOME_SECRET_KEY.to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    let (role, binding) = identity::host_secret_access(meta, &host, &name, &["get"]);
    ssa::apply(
        &Api::<Secret>::namespaced(client.clone(), pool),
        MANAGER,
        &name,
        &ssa::typed(&secret)?,
    )
    .await
    .with_context(|| format!("write Secret {pool}/{name}"))?;
    ssa::apply(
        &Api::<Role>::namespaced(client.clone(), pool),
        MANAGER,
        &name,
        &ssa::typed(&role)?,
    )
    .await
    .with_context(|| format!("write Role {pool}/{name}"))?;
    ssa::apply(
        &Api::<RoleBinding>::namespaced(client.clone(), pool),
        MANAGER,
        &name,
        &ssa::typed(&binding)?,
    )
    .await
    .with_context(|| format!("write RoleBinding {pool}/{name}"))?;
    Ok(())
}

/// Waits until every requested host reports `Rehomed=True` on the source and has renewed its
/// Lease on the target since the request, or `timeout` passes (an error naming the hosts and
/// what each lacks). `progress` is told each host's line as it completes; all lines are
/// returned in request order.
pub async fn wait(
    source: &kube::Client,
    target: &kube::Client,
    pool: &str,
    requested: &[Requested],
    timeout: Duration,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<String>> {
    let src: Api<ByoHost> = Api::namespaced(source.clone(), pool);
    let leases: Api<Lease> = Api::namespaced(target.clone(), pool);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut done: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let mut waiting = Vec::new();
        let pending: Vec<&Requested> = requested.iter().filter(|r| !done.contains_key(&r.host)).collect();
        for r in pending {
            let rehomed = src
                .get_opt(&r.host)
                .await?
                .and_then(|h| h.status)
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == types::REHOMED));
            let renewed = leases
                .get_opt(&r.host)
                .await?
                .and_then(|l| l.spec?.renew_time)
                .map(|t| t.0)
                .filter(|t| *t > r.at);
            match (&rehomed, renewed) {
                (Some(c), Some(t)) if c.status == "True" => {
                    let line = format!(
                        "{}: rehomed; its Lease on the target was renewed {:.1}s after the request",
                        r.host,
                        t.duration_since(r.at).as_secs_f64()
                    );
                    progress(&line);
                    done.insert(r.host.clone(), line);
                }
                (Some(c), _) if c.status == "False" => {
                    waiting.push(format!("{}: Rehomed=False {}: {}", r.host, c.reason, c.message));
                }
                (Some(_), None) => waiting.push(format!("{}: no heartbeat on the target yet", r.host)),
                _ => waiting.push(format!("{}: no answer from its agent yet", r.host)),
            }
        }
        if waiting.is_empty() {
            return Ok(requested
                .iter()
                .filter_map(|r| done.get(&r.host).cloned())
                .collect());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("--wait: after {}s, {}", timeout.as_secs(), waiting.join("; "));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
