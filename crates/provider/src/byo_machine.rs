//! # ByoMachine controller (CAPI contract v1beta2)
//!
//! Binds one host of the pool to each ByoMachine and drives it to `initialization.provisioned`:
//! owner Machine → Cluster → pause → cluster infrastructure provisioned →
//! `Machine.spec.bootstrap.dataSecretName` → claim ([`claim`]) → bootstrap Secret ([`bootstrap`])
//! → `spec.providerID` → the host reports `BootstrapSucceeded` → provisioned. Deletion releases
//! the host ([`release`]); a host whose machine went without that is released by the sweeper
//! ([`orphans`]).
//!
//! Owns: the claim (`ByoHost.spec.machineRef`), the per-host bootstrap Secret, Role and
//! RoleBinding in the host's namespace, `ByoMachine.spec.providerID` and status.
//! Finalizer: `byomachine.infrastructure.cluster.x-k8s.io`. Field managers: `bootsman-provider`
//! (objects) and `bootsman-provider/status` (ByoMachine status).
//! Conditions: `HostAssigned`, `HostBootstrapped`, `Ready`, `Paused`; an Event on each transition.

pub mod bootstrap;
pub mod claim;
pub mod orphans;
pub mod release;

use std::sync::Arc;
use std::time::Duration;

use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::condition::types;
use bootsman_api::labels;
use bootsman_api::v1beta1::{
    ByoHost, ByoMachine, ByoMachineStatus, HostRef, Initialization, MachineAddress, MachineAddressType,
};
use bootsman_runtime::conditions::{self, Status};
use bootsman_runtime::ssa;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::error::{Error, Result, kube as kerr};
use crate::pool;

/// Controller name in metrics and logs.
pub const CONTROLLER: &str = "byomachine";
/// Finalizer held until the machine's host is released.
pub const FINALIZER: &str = "byomachine.infrastructure.cluster.x-k8s.io";
/// Field manager of the objects this controller writes.
pub const MANAGER: &str = "bootsman-provider";
/// Field manager of the ByoMachine status.
pub const STATUS_MANAGER: &str = "bootsman-provider/status";

/// Reconciles one ByoMachine.
pub async fn reconcile(bm: Arc<ByoMachine>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    // The stores have listed before the controllers start (see `crate::run`).
    if ctx.claims.is_stale(&bm) {
        return Ok(Action::await_change());
    }
    let ns = bm
        .namespace()
        .ok_or_else(|| Error::Invalid("ByoMachine without namespace".into()))?;
    let api: Api<ByoMachine> = Api::namespaced(ctx.client.clone(), &ns);

    let machine = ctx.owner_machine(&bm);
    let cluster = machine
        .as_ref()
        .and_then(|m| ctx.cluster(&ns, &m.spec.cluster_name));
    let mut status = bm.status.clone().unwrap_or_default();
    if let Some(reason) = paused(cluster.as_deref(), bm.as_ref()) {
        set(&mut status, &bm, types::PAUSED, Status::True, "Paused", reason);
        write_status(&api, &bm, status, &ctx).await?;
        return Ok(Action::await_change());
    }
    // Not paused: recorded with the next status write of `apply`, not on its own.
    set(&mut status, &bm, types::PAUSED, Status::False, "NotPaused", "");

    if bm.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(&bm) {
            return Ok(Action::await_change());
        }
        // The finalizer goes only once the host is released (or was never claimed).
        let action = release::cleanup(bm.clone(), &ctx).await?;
        remove_finalizer(&api, &bm).await?;
        return Ok(action);
    }
    // The finalizer is added by the first write that makes the machine hold something (the
    // claim intent, see [`claim`]), not by a write of its own.
    apply(bm, &ctx, machine, cluster, status).await
}

/// Whether the ByoMachine carries our finalizer.
pub fn has_finalizer(bm: &ByoMachine) -> bool {
    bm.finalizers().iter().any(|f| f == FINALIZER)
}

/// The machine's finalizers with ours added (for a merge patch guarded by `resourceVersion`,
/// which replaces the whole list), or `None` when ours is there already.
pub fn finalizers_with_ours(bm: &ByoMachine) -> Option<Vec<String>> {
    if has_finalizer(bm) {
        return None;
    }
    let mut f = bm.finalizers().to_vec();
    f.push(FINALIZER.to_string());
    Some(f)
}

/// Removes our finalizer, guarded by the machine's `resourceVersion` (so no other writer's
/// finalizer change is lost; a conflict is retried).
async fn remove_finalizer(api: &Api<ByoMachine>, bm: &ByoMachine) -> Result<()> {
    let rest: Vec<&String> = bm.finalizers().iter().filter(|f| *f != FINALIZER).collect();
    let patch = json!({"metadata": {"resourceVersion": bm.resource_version(), "finalizers": rest}});
    api.patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!(
            "remove the finalizer of ByoMachine {}/{}",
            bm.namespace().unwrap_or_default(),
            bm.name_any()
        )))?;
    Ok(())
}

/// Retries failed reconciles: quickly after a lost race, with a pause otherwise.
pub fn error_policy(bm: Arc<ByoMachine>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(CONTROLLER, bm.as_ref(), err)
}

async fn apply(
    bm: Arc<ByoMachine>,
    ctx: &Context,
    machine: Option<Arc<Machine>>,
    cluster: Option<Arc<Cluster>>,
    mut status: ByoMachineStatus,
) -> Result<Action> {
    let ns = bm.namespace().unwrap_or_default();
    let api: Api<ByoMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let me = ObjectRef::from_obj(bm.as_ref());
    let provisioned = status.initialization.as_ref().and_then(|i| i.provisioned) == Some(true);

    let wait = |status: &mut ByoMachineStatus, reason: &str, message: String| {
        set(status, &bm, types::HOST_ASSIGNED, Status::False, reason, &message);
        set(status, &bm, types::READY, Status::False, reason, &message);
    };
    let Some(machine) = machine else {
        wait(
            &mut status,
            "WaitingForMachineOwner",
            "no Machine owns this ByoMachine yet".into(),
        );
        write_status(&api, &bm, status, ctx).await?;
        return Ok(Action::await_change());
    };
    let Some(cluster) = cluster else {
        wait(
            &mut status,
            "WaitingForCluster",
            format!("Cluster {} does not exist", machine.spec.cluster_name),
        );
        write_status(&api, &bm, status, ctx).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let infra_ready = cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned);
    if infra_ready != Some(true) && !provisioned {
        wait(
            &mut status,
            "WaitingForClusterInfrastructure",
            "the Cluster's ByoCluster is not provisioned yet".into(),
        );
        write_status(&api, &bm, status, ctx).await?;
        return Ok(Action::await_change());
    }
    let Some(data_secret) = machine.spec.bootstrap.data_secret_name.clone() else {
        wait(
            &mut status,
            "WaitingForBootstrapData",
            "Machine.spec.bootstrap.dataSecretName is not set yet".into(),
        );
        write_status(&api, &bm, status, ctx).await?;
        return Ok(Action::await_change());
    };

    // The machine as last written by this pass (the claim intent changes it).
    let mut current = bm.as_ref().clone();
    let (host, claimed) = match claim::ensure(&mut current, ctx, &machine).await? {
        claim::Claim::Held { host, new } => (*host, new),
        claim::Claim::Waiting { reason, message } => {
            ctx.claims.set_waiting(me, true);
            wait(&mut status, reason, message);
            write_status(&api, &bm, status, ctx).await?;
            // Woken by host and Lease events; the requeue is only a safety net.
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
    };
    ctx.claims.set_waiting(me, false);
    let host_ns = host.namespace().unwrap_or_default();
    status.host_ref = Some(HostRef {
        namespace: host_ns.clone(),
        name: host.name_any(),
        uid: host.uid(),
    });
    set(
        &mut status,
        &bm,
        types::HOST_ASSIGNED,
        Status::True,
        "HostClaimed",
        &format!("host {host_ns}/{}", host.name_any()),
    );

    if let Some(finalizers) = finalizers_with_ours(&current) {
        // Held without our finalizer (a machine moved by `clusterctl move`, or one claimed by
        // an older provider): the finalizer first, so that a deletion releases the host.
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "finalizers": finalizers,
        }});
        current = api
            .patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr(format!(
                "add the finalizer of ByoMachine {ns}/{}",
                bm.name_any()
            )))?;
        ctx.claims.note_written(&current);
    }

    let handed_over = bootstrap::ensure(&bm, ctx, &host, &machine, &cluster, &data_secret).await;
    // A claim and its hand-over in one reconcile (the usual case) make one Event.
    let delivered_now = matches!(handed_over, Ok((_, true)));
    if claimed {
        claim::announce(&bm, ctx, &host, delivered_now).await;
    }
    let (host, delivered) = handed_over?;
    if delivered && !claimed {
        bootstrap::delivered_event(&bm, ctx, &host).await;
    }
    let provider_id = format!("byoh://{host_ns}/{}", host.name_any());
    let binding = host.spec.machine_ref.as_ref().map(|r| r.uid.as_str());
    if current.spec.provider_id.is_none()
        || current.annotations().contains_key(labels::CLUSTERCTL_BLOCK_MOVE)
        || current
            .annotations()
            .get(claim::BINDING_ANNOTATION)
            .map(String::as_str)
            != binding
    {
        // The claim and bootstrap hand-over are complete: record the providerID and the binding
        // id (missing on a machine claimed by an older provider), and let `clusterctl move`
        // proceed again.
        let patch = json!({
            "metadata": {"annotations": {
                labels::CLUSTERCTL_BLOCK_MOVE: null,
                claim::BINDING_ANNOTATION: binding,
            }},
            "spec": {"providerID": provider_id},
        });
        current = api
            .patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr(format!(
                "set providerID of ByoMachine {ns}/{}",
                bm.name_any()
            )))?;
        ctx.claims.note_written(&current);
    }

    status.addresses = addresses(&host);
    status.failure_domain = host.labels().get(labels::ZONE).cloned();
    let mut requeue = None;
    if provisioned || pool::reported_for_current_spec(&host, types::BOOTSTRAP_SUCCEEDED) {
        set(
            &mut status,
            &bm,
            types::HOST_BOOTSTRAPPED,
            Status::True,
            "BootstrapSucceeded",
            "",
        );
        set(&mut status, &bm, types::READY, Status::True, "Provisioned", "");
        status.initialization = Some(Initialization {
            provisioned: Some(true),
        });
        if let Err(e) = bootstrap::set_node_provider_id(ctx, &ns, &cluster, &host, &provider_id).await {
            tracing::info!(byomachine = %bm.name_any(), error = %e, "workload Node not labelled yet");
            requeue = Some(Duration::from_secs(10));
        }
    } else {
        let failed = host
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, types::BOOTSTRAP_SUCCEEDED))
            .filter(|c| {
                c.status == "False"
                    && c.observed_generation.unwrap_or(0) >= host.metadata.generation.unwrap_or(0)
            });
        let (reason, message) = match failed {
            Some(c) => (
                "BootstrapFailed",
                format!("host {}: {}: {}", host.name_any(), c.reason, c.message),
            ),
            None => (
                "WaitingForBootstrap",
                format!("host {} is running its bootstrap data", host.name_any()),
            ),
        };
        set(
            &mut status,
            &bm,
            types::HOST_BOOTSTRAPPED,
            Status::False,
            reason,
            &message,
        );
        set(&mut status, &bm, types::READY, Status::False, reason, &message);
    }
    // The conditions were decided against the spec as this pass leaves it (with the providerID
    // just written): say so, or the next pass would write the status again only to bump them.
    for c in &mut status.conditions {
        c.observed_generation = current.metadata.generation;
    }
    write_status(&api, &bm, status, ctx).await?;
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Why reconciliation is paused, if it is.
pub fn paused<K: Resource>(cluster: Option<&Cluster>, obj: &K) -> Option<&'static str> {
    if cluster.is_some_and(|c| c.spec.paused == Some(true)) {
        Some("Cluster spec.paused is set to true")
    } else if obj
        .meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(labels::PAUSED))
    {
        Some("the object has the cluster.x-k8s.io/paused annotation")
    } else {
        None
    }
}

fn set(status: &mut ByoMachineStatus, bm: &ByoMachine, type_: &str, s: Status, reason: &str, message: &str) {
    conditions::set(
        &mut status.conditions,
        type_,
        s,
        reason,
        message,
        bm.metadata.generation,
        conditions::now(),
    );
}

/// The host's addresses: its interfaces' IPs (without prefix length) and its host name.
pub fn addresses(host: &ByoHost) -> Vec<MachineAddress> {
    let mut out = Vec::new();
    if let Some(status) = &host.status {
        let mut ifaces: Vec<_> = status.network.iter().collect();
        ifaces.sort_by_key(|i| !i.is_default); // the default route's interface first
        for i in ifaces {
            for ip in &i.ip_addrs {
                let addr = ip.split('/').next().unwrap_or(ip).to_string();
                out.push(MachineAddress {
                    type_: MachineAddressType::InternalIp,
                    address: addr,
                });
            }
        }
        if let Some(h) = status.host_info.as_ref().and_then(|i| i.hostname.clone()) {
            out.push(MachineAddress {
                type_: MachineAddressType::Hostname,
                address: h,
            });
        }
    }
    out
}

/// Writes the status when it differs from what the object has, publishing an Event for each of
/// our conditions whose status or reason changed.
pub async fn write_status(
    api: &Api<ByoMachine>,
    bm: &ByoMachine,
    status: ByoMachineStatus,
    ctx: &Context,
) -> Result<()> {
    let old = bm.status.clone().unwrap_or_default();
    if old == status {
        return Ok(());
    }
    // One Event per transition that says something new: `Paused` is not announced, a claim has
    // its own `HostClaimed` Event, the hand-over of the bootstrap data its own
    // `BootstrapDataDelivered` Event (so `HostBootstrapped` appearing as `WaitingForBootstrap`
    // is not announced again), and `Ready` is announced only when its reason is not the one of
    // the condition it mirrors.
    let mirrored = |c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| {
        c.type_ == types::READY
            && status
                .conditions
                .iter()
                .any(|o| o.type_ != types::READY && o.type_ != types::PAUSED && o.reason == c.reason)
    };
    for c in &status.conditions {
        let before = conditions::get(&old.conditions, &c.type_);
        let handed_over =
            c.type_ == types::HOST_BOOTSTRAPPED && c.reason == "WaitingForBootstrap" && before.is_none();
        let quiet = c.type_ == types::PAUSED
            || (c.type_ == types::HOST_ASSIGNED && c.status == "True")
            || handed_over
            || mirrored(c);
        if !quiet && before.is_none_or(|b| b.status != c.status || b.reason != c.reason) {
            let warning = c.status == "False"
                && matches!(
                    c.reason.as_str(),
                    "BootstrapFailed" | "NoMatchingHost" | "InvalidSelector"
                );
            let note = if c.message.is_empty() {
                format!("{} is {}", c.type_, c.status)
            } else {
                c.message.clone()
            };
            ctx.event(bm, warning, &c.reason, &c.type_, note).await;
        }
    }
    let body = ssa::body::<ByoMachine>(&bm.name_any(), None, json!({"status": status}));
    let written = ssa::apply_status(api, STATUS_MANAGER, &bm.name_any(), &body)
        .await
        .map_err(kerr(format!("write status of ByoMachine {}", bm.name_any())))?;
    ctx.claims.note_written(&written);
    Ok(())
}
