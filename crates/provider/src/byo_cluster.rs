//! # ByoCluster controller (CAPI contract v1beta2)
//!
//! Waits for its owner Cluster, honours pause, holds a finalizer, defaults the endpoint port to
//! 6443, reports `initialization.provisioned` once the control-plane endpoint is known, and
//! lists as `failureDomains` the zones (`topology.kubernetes.io/zone`, an admin's label) of the
//! healthy hosts its machines may use, updated when a host's zone or health changes. On delete it
//! waits until the cluster's ByoMachines are gone.
//!
//! Finalizer: `byocluster.infrastructure.cluster.x-k8s.io`. Field managers: `bootsman-provider`
//! (the port default) and `bootsman-provider/status`. Conditions: `Ready`, `Paused`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bootsman_api::capi::Cluster;
use bootsman_api::condition::types;
use bootsman_api::labels;
use bootsman_api::v1beta1::{
    ApiEndpoint, ByoCluster, ByoClusterStatus, ByoHost, ByoMachine, FailureDomain, HostPhase, Initialization,
};
use bootsman_runtime::conditions::{self, Status};
use bootsman_runtime::ssa;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::byo_machine::{STATUS_MANAGER, paused};
use crate::context::Context;
use crate::error::{Error, Result, kube as kerr};

/// Controller name in metrics and logs.
pub const CONTROLLER: &str = "byocluster";
/// Finalizer held until the cluster's ByoMachines are gone.
pub const FINALIZER: &str = "byocluster.infrastructure.cluster.x-k8s.io";

/// Reconciles one ByoCluster.
pub async fn reconcile(bc: Arc<ByoCluster>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let ns = bc
        .namespace()
        .ok_or_else(|| Error::Invalid("ByoCluster without namespace".into()))?;
    let api: Api<ByoCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = bc
        .owner_references()
        .iter()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .cloned();
    let cluster = owner.as_ref().and_then(|o| ctx.cluster(&ns, &o.name));
    let mut status = bc.status.clone().unwrap_or_default();
    if let Some(reason) = paused(cluster.as_deref(), bc.as_ref()) {
        set(&mut status, &bc, types::PAUSED, Status::True, "Paused", reason);
        write_status(&api, &bc, status).await?;
        return Ok(Action::await_change());
    }
    set(&mut status, &bc, types::PAUSED, Status::False, "NotPaused", "");
    let c = ctx.clone();
    finalizer(&api, FINALIZER, bc, |event| async move {
        match event {
            FinalizerEvent::Apply(bc) => apply(bc, &c, cluster, status).await,
            FinalizerEvent::Cleanup(bc) => cleanup(bc, &c, owner.map(|o| o.name)).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Retries failed reconciles after a pause.
pub fn error_policy(bc: Arc<ByoCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(CONTROLLER, bc.as_ref(), err)
}

async fn apply(
    bc: Arc<ByoCluster>,
    ctx: &Context,
    cluster: Option<Arc<Cluster>>,
    mut status: ByoClusterStatus,
) -> Result<Action> {
    let ns = bc.namespace().unwrap_or_default();
    let api: Api<ByoCluster> = Api::namespaced(ctx.client.clone(), &ns);
    if cluster.is_none() {
        set(
            &mut status,
            &bc,
            types::READY,
            Status::False,
            "WaitingForCluster",
            "no Cluster owns this ByoCluster yet",
        );
        write_status(&api, &bc, status).await?;
        return Ok(Action::await_change());
    }
    let endpoint = bc.spec.control_plane_endpoint.clone().unwrap_or_default();
    if !endpoint.host.is_empty() && endpoint.port.is_none() {
        let patch = json!({"spec": {"controlPlaneEndpoint": {"port": ApiEndpoint::DEFAULT_PORT}}});
        api.patch(&bc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr(format!(
                "default the endpoint port of ByoCluster {ns}/{}",
                bc.name_any()
            )))?;
    }
    status.failure_domains = failure_domains(ctx, &ns);
    if endpoint.host.is_empty() {
        set(
            &mut status,
            &bc,
            types::READY,
            Status::False,
            "WaitingForEndpoint",
            "spec.controlPlaneEndpoint.host is empty",
        );
    } else {
        status.initialization = Some(Initialization {
            provisioned: Some(true),
        });
        set(&mut status, &bc, types::READY, Status::True, "Provisioned", "");
    }
    write_status(&api, &bc, status).await?;
    // Zones can appear as hosts register; look again now and then.
    Ok(Action::requeue(Duration::from_secs(60)))
}

async fn cleanup(bc: Arc<ByoCluster>, ctx: &Context, cluster: Option<String>) -> Result<Action> {
    let ns = bc.namespace().unwrap_or_default();
    let Some(cluster) = cluster.or_else(|| bc.labels().get(labels::CLUSTER_NAME).cloned()) else {
        return Ok(Action::await_change());
    };
    let lp = ListParams::default().labels(&format!("{}={cluster}", labels::CLUSTER_NAME));
    let left = Api::<ByoMachine>::namespaced(ctx.client.clone(), &ns)
        .list_metadata(&lp)
        .await
        .map_err(kerr(format!("list ByoMachines of cluster {ns}/{cluster}")))?;
    if left.items.is_empty() {
        Ok(Action::await_change())
    } else {
        Err(Error::Waiting {
            why: format!("{} ByoMachine(s) of cluster {cluster} to go", left.items.len()),
            after: Duration::from_secs(5),
        })
    }
}

/// The zone a host gives the failure domains of the clusters that may use it: its zone label (an
/// admin's; hosts may not write it) while the host is healthy, none while it is offline,
/// quarantined, in maintenance or not yet judged. A zone whose hosts are all down is no place to
/// put a control-plane machine.
pub fn zone_of(host: &ByoHost) -> Option<&str> {
    let healthy = matches!(
        host.status.as_ref().and_then(|s| s.phase),
        Some(
            HostPhase::Available
                | HostPhase::Claimed
                | HostPhase::Bootstrapping
                | HostPhase::Provisioned
                | HostPhase::Releasing
        )
    );
    healthy
        .then(|| host.labels().get(labels::ZONE).map(String::as_str))
        .flatten()
}

/// The zones of the healthy hosts that machines in `ns` may use.
fn failure_domains(ctx: &Context, ns: &str) -> Vec<FailureDomain> {
    let pools = ctx.pools_for(ns);
    let zones: BTreeSet<String> = ctx
        .hosts
        .state()
        .iter()
        .filter(|h| h.namespace().is_some_and(|n| pools.contains(&n)))
        .filter_map(|h| zone_of(h).map(String::from))
        .collect();
    zones
        .into_iter()
        .map(|name| FailureDomain {
            name,
            control_plane: Some(true),
            ..Default::default()
        })
        .collect()
}

fn set(status: &mut ByoClusterStatus, bc: &ByoCluster, type_: &str, s: Status, reason: &str, message: &str) {
    conditions::set(
        &mut status.conditions,
        type_,
        s,
        reason,
        message,
        bc.metadata.generation,
        conditions::now(),
    );
}

async fn write_status(api: &Api<ByoCluster>, bc: &ByoCluster, status: ByoClusterStatus) -> Result<()> {
    if bc.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let body = ssa::body::<ByoCluster>(&bc.name_any(), None, json!({"status": status}));
    ssa::apply_status(api, STATUS_MANAGER, &bc.name_any(), &body)
        .await
        .map_err(kerr(format!("write status of ByoCluster {}", bc.name_any())))?;
    Ok(())
}
