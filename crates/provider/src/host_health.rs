//! # Host health controller
//!
//! A host's heartbeat Lease (named after the host, renewed by its agent) decides its
//! `AgentHealthy` condition and, with its spec and the agent's reports, its `status.phase`. The
//! host is reconciled again when its Lease changes and when the Lease is due to expire.
//!
//! Field manager: `bootsman-provider/health` (owns `status.phase` and the `AgentHealthy`
//! condition only; the agent owns the rest of the status). Also keeps the pool-size gauges.

use std::sync::Arc;
use std::time::Duration;

use bootsman_api::condition::types;
use bootsman_api::v1beta1::{ByoHost, HostPhase};
use bootsman_runtime::conditions;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::error::{Result, kube as kerr};
use crate::pool;

/// Controller name in metrics and logs.
pub const CONTROLLER: &str = "byohost-health";
/// Field manager of `status.phase` and `AgentHealthy`.
pub const MANAGER: &str = "bootsman-provider/health";

/// Reconciles the health of one host.
pub async fn reconcile(host: Arc<ByoHost>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
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

/// Recomputes `bootsman_provider_pool_hosts{pool,phase}` from the pool index.
pub fn update_pool_gauges(ctx: &Context) {
    let now = Timestamp::now();
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
