//! # Host health controller
//!
//! A host's heartbeat Lease (named after the host, renewed by its agent) decides its
//! `AgentHealthy` condition and, with its spec and the agent's reports, its `status.phase`. The
//! host is reconciled again when its Lease changes and when the Lease is due to expire.
//!
//! Field manager: `bootsman-provider/health` (owns `status.phase` and the `AgentHealthy`
//! condition only; the agent owns the rest of the status). Also keeps the pool-size gauges.
//!
//! It also hands each host's pool access to its ByoHost: the RoleBinding `byoh:host:<host>` the
//! CSR approver wrote at enrollment (see [`pool_access::grant_pool_access`]) gets the
//! ByoHost as owner (`blockOwnerDeletion: false`), so the garbage collector deletes the binding
//! with the ByoHost and a deleted host's certificate no longer carries rights in the pool. Only a
//! binding of that host's user alone, owned by no ByoHost yet, is adopted: a binding never moves
//! to another owner, so a ByoHost deleted and registered again under its name does not inherit
//! it (the garbage collector takes it). Field manager `bootsman-provider/host-access`
//! (owns that one owner reference; the approver's apply leaves it alone). Each host is checked
//! once per process once its binding is owned; a host without a binding (one an admin created,
//! not enrolled through the approver, which writes the binding before the host can register) is
//! checked again only after [`ABSENT_RECHECK`], not on every change of the host.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bootsman_api::condition::types;
use bootsman_api::v1beta1::{ByoHost, HostPhase};
use bootsman_runtime::conditions;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::enrollment::pool_access;
use crate::error::{Result, kube as kerr};
use crate::pool;

/// Controller name in metrics and logs.
pub const CONTROLLER: &str = "byohost-health";
/// Field manager of `status.phase` and `AgentHealthy`.
pub const MANAGER: &str = "bootsman-provider/health";
/// Field manager of the ByoHost owner reference on the host's pool RoleBinding.
pub const ACCESS_MANAGER: &str = "bootsman-provider/host-access";

/// How long a host found without a pool RoleBinding is not looked at again.
pub const ABSENT_RECHECK: Duration = Duration::from_secs(300);

/// The hosts (by ByoHost uid) whose pool RoleBinding this process has seen owned by them: they
/// are not looked at again; and those found without one, with when.
#[derive(Debug, Default)]
pub struct AdoptedBindings {
    uids: Mutex<HashSet<String>>,
    absent: Mutex<HashMap<String, Instant>>,
}

impl AdoptedBindings {
    fn contains(&self, uid: &str) -> bool {
        self.uids.lock().is_ok_and(|s| s.contains(uid))
    }

    /// Whether `uid` was found without a binding less than [`ABSENT_RECHECK`] ago.
    fn recently_absent(&self, uid: &str) -> bool {
        self.absent
            .lock()
            .is_ok_and(|m| m.get(uid).is_some_and(|at| at.elapsed() < ABSENT_RECHECK))
    }

    /// Remembers that `uid` has no binding now; forgets the stale entries as it goes.
    fn note_absent(&self, uid: String) {
        if let Ok(mut m) = self.absent.lock() {
            m.retain(|_, at| at.elapsed() < ABSENT_RECHECK);
            m.insert(uid, Instant::now());
        }
    }

    /// Remembers `uid`; forgets the hosts that are no longer in the pool index when the set has
    /// grown to twice the index.
    fn insert(&self, uid: String, ctx: &Context) {
        let Ok(mut set) = self.uids.lock() else {
            return;
        };
        set.insert(uid);
        if set.len() >= 64 && set.len() >= 2 * ctx.hosts.len() {
            let live: HashSet<String> = ctx.hosts.state().iter().filter_map(|h| h.uid()).collect();
            set.retain(|u| live.contains(u));
        }
    }
}

/// Makes the ByoHost the owner of the host's pool RoleBinding, when that binding exists, is the
/// approver's binding for this host alone, and is owned by no ByoHost yet (a binding never changes
/// owner). The write carries the
/// binding's `resourceVersion`, so a binding changed since it was read is not adopted.
async fn adopt_pool_binding(host: &ByoHost, ctx: &Context, adopted: &AdoptedBindings) -> Result<()> {
    let (Some(uid), Some(ns)) = (host.uid(), host.namespace()) else {
        return Ok(());
    };
    if adopted.contains(&uid) || adopted.recently_absent(&uid) {
        return Ok(());
    }
    let name = host.name_any();
    let binding_name = pool_access::pool_binding_name(&name);
    let bindings = Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns);
    let what = || format!("hand RoleBinding {ns}/{binding_name} to ByoHost {name}");
    let Some(binding) = bindings.get_opt(&binding_name).await.map_err(kerr(what()))? else {
        adopted.note_absent(uid);
        return Ok(());
    };
    if !pool_access::is_pool_binding(&binding, &name) {
        tracing::debug!(namespace = %ns, host = %name, "the host's RoleBinding is not the approver's; not adopted");
        return Ok(());
    }
    let owners: Vec<_> = binding
        .owner_references()
        .iter()
        .filter(|o| pool_access::is_host_owner(o))
        .collect();
    if !owners.is_empty() && !owners.iter().any(|o| o.uid == uid) {
        // Another ByoHost of this name owns it: one deleted, whose binding the garbage collector
        // is about to take. A binding never changes owner, or a host re-registered in that window
        // would keep the rights of the removed one.
        tracing::warn!(namespace = %ns, host = %name, owner = %owners[0].uid,
            "the host's pool RoleBinding belongs to an earlier ByoHost of this name; not adopted");
        return Ok(());
    }
    if owners.is_empty() {
        let body = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {
                "name": binding_name,
                "namespace": ns,
                "resourceVersion": binding.resource_version(),
                "ownerReferences": [{
                    "apiVersion": ByoHost::api_version(&()),
                    "kind": ByoHost::kind(&()),
                    "name": name,
                    "uid": uid,
                    "blockOwnerDeletion": false,
                }],
            },
        });
        bindings
            .patch(
                &binding_name,
                &PatchParams::apply(ACCESS_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(kerr(what()))?;
        tracing::info!(namespace = %ns, host = %name, "the host's pool RoleBinding is now owned by its ByoHost");
    }
    adopted.insert(uid, ctx);
    Ok(())
}

/// Reconciles the health of one host, and hands its pool RoleBinding to it.
pub async fn reconcile(
    host: Arc<ByoHost>,
    ctx: Arc<Context>,
    adopted: Arc<AdoptedBindings>,
) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    // First, so a phase written by this reconcile is seen only after the binding was looked at.
    // A failure here does not hold the health back; the next reconcile tries again.
    if let Err(e) = adopt_pool_binding(&host, &ctx, &adopted).await {
        tracing::warn!(error = %e, "adopting the host's pool RoleBinding failed; retrying later");
    }
    if host.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let lease = ctx.lease_of(&host);
    let fresh = pool::lease_fresh(lease.as_deref(), now);
    let phase = pool::phase(&host, fresh);
    let (status, reason, message) = match (fresh, &lease) {
        (true, _) => ("True", "LeaseRenewed", String::new()),
        (false, Some(_)) => (
            "False",
            "LeaseExpired",
            "the agent has not renewed its Lease in time".to_string(),
        ),
        (false, None) => (
            "False",
            "NoLease",
            "the agent has not created its Lease yet".to_string(),
        ),
    };
    let current = host.status.as_ref();
    let current_cond = current.and_then(|s| conditions::get(&s.conditions, types::AGENT_HEALTHY));
    let unchanged = current.and_then(|s| s.phase) == Some(phase)
        && current_cond.is_some_and(|c| c.status == status && c.reason == reason && c.message == message);
    if !unchanged {
        let transition = match current_cond {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => conditions::now(),
        };
        let body = json!({
            "apiVersion": ByoHost::api_version(&()),
            "kind": ByoHost::kind(&()),
            "status": {
                "phase": phase,
                "conditions": [{
                    "type": types::AGENT_HEALTHY,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": transition,
                    "observedGeneration": host.metadata.generation,
                }],
            },
        });
        let ns = host.namespace().unwrap_or_default();
        Api::<ByoHost>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &host.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(kerr(format!("write health of ByoHost {ns}/{}", host.name_any())))?;
        if current
            .and_then(|s| s.phase)
            .is_some_and(|p| p != HostPhase::Offline)
            && phase == HostPhase::Offline
        {
            ctx.event(host.as_ref(), true, "AgentOffline", "Heartbeat", message.clone())
                .await;
        }
    }
    // Look again just after the Lease would expire.
    let next = pool::lease_expiry(lease.as_deref())
        .filter(|e| *e > now)
        .map(|e| e.duration_since(now).as_secs_f64() + 0.5)
        .unwrap_or(300.0);
    Ok(Action::requeue(Duration::from_secs_f64(next.min(300.0))))
}

/// Retries failed reconciles after a pause.
pub fn error_policy(host: Arc<ByoHost>, err: &crate::error::Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(CONTROLLER, host.as_ref(), err)
}

/// Recomputes `bootsman_provider_pool_hosts{pool,phase}` from the pool index, and
/// `bootsman_provider_machines_waiting` from the claim bookkeeping.
pub fn update_pool_gauges(ctx: &Context) {
    let now = Timestamp::now();
    ctx.metrics
        .machines_waiting
        .set(i64::try_from(ctx.claims.waiting()).unwrap_or(i64::MAX));
    ctx.metrics.pool_hosts.reset();
    for h in ctx.hosts.state() {
        let fresh = pool::lease_fresh(ctx.lease_of(&h).as_deref(), now);
        let phase = format!("{:?}", pool::phase(&h, fresh));
        ctx.metrics
            .pool_hosts
            .with_label_values(&[&h.namespace().unwrap_or_default(), &phase])
            .inc();
    }
}
