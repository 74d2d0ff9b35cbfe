//! # Orphaned claims
//!
//! A host's claim (`spec.machineRef`) normally ends with its machine: the ByoMachine's finalizer
//! releases the host before the machine goes ([`super::release`]). A host whose machine went
//! without that would stay claimed forever: a finalizer removed by hand, a claim that landed after
//! its machine's cleanup (a leader hand-over between the intent and the claim), an interrupted
//! `clusterctl move`. The sweeper looks at every claimed host each [`sweep_every`]: when the
//! ByoMachine its claim names does not exist or does not hold it ([`claim::binds`], confirmed with
//! the API server), the host gets a Warning Event `MachineGone`, and once that has lasted the grace
//! period ([`crate::Config::orphan_grace`], `--orphan-grace`, default 10m) it is released as a
//! machine's deletion releases it: `spec.release`, the agent resets the host, the claim is
//! cleared, or the host is quarantined when it does not report clean in time (Events
//! `OrphanReleaseRequested`, then `HostReleased` or `HostQuarantined`, on the host).
//!
//! The grace period covers `clusterctl move`, which deletes a cluster's machines from the source a
//! few seconds before its hosts. Hosts of a paused Cluster and hosts being deleted are left alone.
//! The clock is this process's: a new leader starts it again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoMachine, MachineRef};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::{claim, release};
use crate::context::Context;
use crate::error::{Result, kube as kerr};

/// How often the claimed hosts are looked at (more often under a grace period shorter than a
/// minute, see [`sweep_every`]).
pub const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// The sweep period for a grace period: [`SWEEP_EVERY`], or a quarter of a shorter grace period
/// (at least a second).
pub fn sweep_every(grace: Duration) -> Duration {
    (grace / 4).clamp(Duration::from_secs(1), SWEEP_EVERY)
}

/// The sweeper's memory: since when each claimed host (by uid) has been seen without its machine.
#[derive(Default, Debug)]
pub struct Sweeper {
    since: HashMap<String, Timestamp>,
}

impl Sweeper {
    /// Looks at every claimed host once (see the module docs). Errors are logged and retried on
    /// the next sweep.
    pub async fn sweep(&mut self, ctx: &Context) {
        let now = Timestamp::now();
        let mut orphans = HashSet::new();
        for host in ctx.hosts.state() {
            let (Some(r), Some(uid)) = (host.spec.machine_ref.as_ref(), host.uid()) else {
                continue;
            };
            if host.metadata.deletion_timestamp.is_some() {
                continue;
            }
            match machine_gone(ctx, &host, r).await {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    // Unknown: the clock keeps running, nothing is done this time.
                    tracing::warn!(error = %e, host = %host.name_any(), "looking up the machine of a claimed host failed");
                    orphans.insert(uid);
                    continue;
                }
            }
            orphans.insert(uid.clone());
            let first = match self.since.get(&uid) {
                Some(t) => *t,
                None => {
                    self.since.insert(uid, now);
                    let note = format!(
                        "ByoMachine {}/{} (binding {}) is gone; the host is released in {}s unless it returns",
                        r.namespace,
                        r.name,
                        r.uid,
                        ctx.config.orphan_grace.as_secs()
                    );
                    tracing::warn!(host = %host.name_any(), "{note}");
                    ctx.event(host.as_ref(), true, "MachineGone", "Release", note)
                        .await;
                    now
                }
            };
            if now.duration_since(first).as_secs_f64() < ctx.config.orphan_grace.as_secs_f64() {
                continue;
            }
            if let Err(e) = release_orphan(ctx, &host, r).await {
                tracing::warn!(error = %e, host = %host.name_any(), "releasing a host whose machine is gone failed");
            }
        }
        self.since.retain(|uid, _| orphans.contains(uid));
    }
}

/// Whether the machine `r` names is gone (or holds the host no longer). `false` for a host of a
/// paused Cluster.
async fn machine_gone(ctx: &Context, host: &ByoHost, r: &MachineRef) -> Result<bool> {
    if let Some(cluster) = host.labels().get(labels::CLUSTER_NAME)
        && ctx
            .cluster(&r.namespace, cluster)
            .is_some_and(|c| c.spec.paused == Some(true))
    {
        return Ok(false);
    }
    let key = ObjectRef::<ByoMachine>::new(&r.name).within(&r.namespace);
    if ctx
        .byomachines
        .get(&key)
        .is_some_and(|bm| claim::binds(&bm, host))
    {
        return Ok(false);
    }
    // The index may lag behind (or not hold the machine, under a watch filter): ask.
    let api: Api<ByoMachine> = Api::namespaced(ctx.client.clone(), &r.namespace);
    let bm = api
        .get_opt(&r.name)
        .await
        .map_err(kerr(format!("get ByoMachine {}/{}", r.namespace, r.name)))?;
    Ok(!bm.is_some_and(|bm| claim::binds(&bm, host)))
}

/// Requests the release of an orphaned host, or completes the release already requested.
async fn release_orphan(ctx: &Context, host: &ByoHost, r: &MachineRef) -> Result<()> {
    let name = host.name_any();
    let Some(request) = host.spec.release.as_ref() else {
        release::request(ctx, host).await?;
        ctx.metrics.orphans_released.inc();
        let note = format!(
            "ByoMachine {}/{} has been gone for {}s: asked the host to reset",
            r.namespace,
            r.name,
            ctx.config.orphan_grace.as_secs()
        );
        tracing::info!(host = %name, "{note}");
        ctx.event(host, false, "OrphanReleaseRequested", "Release", note)
            .await;
        return Ok(());
    };
    let whose = format!("ByoMachine {}/{}, which is gone", r.namespace, r.name);
    match release::finish(ctx, host, request, &whose).await? {
        release::Finished::Clean => {
            let note = "host reset and back in the pool".to_string();
            ctx.event(host, false, "HostReleased", "Release", note).await;
        }
        release::Finished::Quarantined(reason) => {
            ctx.event(
                host,
                true,
                "HostQuarantined",
                "Release",
                format!("quarantined: {reason}"),
            )
            .await;
        }
        release::Finished::Pending(_) => {}
    }
    Ok(())
}
