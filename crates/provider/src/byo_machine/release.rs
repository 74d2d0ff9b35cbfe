//! Releasing a host when its ByoMachine goes.
//!
//! The provider sets `ByoHost.spec.release`; the agent resets the host and reports
//! `CleanupSucceeded` for that spec. Then the per-host Secret, Role and RoleBinding go and the
//! claim is cleared: the host is back in the pool. A host that does not report clean within the
//! release timeout, or whose agent is offline, is quarantined instead (out of the pool until an
//! admin removes `spec.quarantine`), so a Machine deletion is never blocked forever.

use std::sync::Arc;
use std::time::Duration;

use bootsman_api::condition::types;
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoMachine, ReleaseRequest};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{bootstrap, claim};
use crate::context::Context;
use crate::error::{Error, Result, kube as kerr};
use crate::pool;

/// Finalizer cleanup of a ByoMachine. `Ok` removes the finalizer; [`Error::Waiting`] keeps it.
pub async fn cleanup(bm: Arc<ByoMachine>, ctx: &Context) -> Result<Action> {
    ctx.set_waiting(ObjectRef::from_obj(bm.as_ref()), false);
    let Some(host) = claim::held(&bm, ctx).await? else {
        return Ok(Action::await_change());
    };
    let hns = host.namespace().unwrap_or_default();
    let name = host.name_any();
    let whose = format!(
        "ByoMachine {}/{}",
        bm.namespace().unwrap_or_default(),
        bm.name_any()
    );

    let Some(release) = host.spec.release.clone() else {
        mark_block_move(&bm, ctx, "releasing the host").await?;
        request(ctx, &host).await?;
        ctx.event(
            bm.as_ref(),
            false,
            "ReleaseRequested",
            "Release",
            format!("asked host {hns}/{name} to reset"),
        )
        .await;
        return Err(Error::Waiting {
            why: format!("host {hns}/{name} to reset"),
            after: Duration::from_secs(2),
        });
    };

    match finish(ctx, &host, &release, &whose).await? {
        Finished::Clean => {
            ctx.event(
                bm.as_ref(),
                false,
                "HostReleased",
                "Release",
                format!("host {hns}/{name} reset and back in the pool"),
            )
            .await;
            Ok(Action::await_change())
        }
        Finished::Quarantined(reason) => {
            ctx.event(
                bm.as_ref(),
                true,
                "HostQuarantined",
                "Release",
                format!("host {hns}/{name} quarantined: {reason}"),
            )
            .await;
            Ok(Action::await_change())
        }
        // Until the host is clean or quarantined the finalizer stays: returning an error keeps it.
        Finished::Pending(after) => Err(Error::Waiting {
            why: format!("host {hns}/{name} to report CleanupSucceeded"),
            after,
        }),
    }
}

/// Asks the host's agent to reset the host (`spec.release`, naming the binding id of its claim).
pub(super) async fn request(ctx: &Context, host: &ByoHost) -> Result<()> {
    let hns = host.namespace().unwrap_or_default();
    let name = host.name_any();
    let machine_uid = host.spec.machine_ref.as_ref().map(|r| r.uid.clone());
    let patch = json!({"spec": {"release": {
        "machineUID": machine_uid,
        "requestedAt": Timestamp::now().to_string(),
    }}});
    Api::<ByoHost>::namespaced(ctx.client.clone(), &hns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!("request release of ByoHost {hns}/{name}")))?;
    Ok(())
}

/// Where a requested release stands.
pub(super) enum Finished {
    /// The host reported clean: it is back in the pool.
    Clean,
    /// The host did not report clean in time, or its agent is offline: quarantined (why).
    Quarantined(String),
    /// Still resetting: look again after this long.
    Pending(Duration),
}

/// Completes a requested release once the host reported `CleanupSucceeded` (back to the pool),
/// or quarantines it when its agent is offline or the release timeout passed. `whose` names
/// what the host was released from, for the quarantine reason.
pub(super) async fn finish(
    ctx: &Context,
    host: &ByoHost,
    release: &ReleaseRequest,
    whose: &str,
) -> Result<Finished> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &host.namespace().unwrap_or_default());
    if pool::reported_for_current_spec(host, types::CLEANUP_SUCCEEDED) {
        bootstrap::remove(ctx, host).await?;
        return_to_pool(&api, host, None).await?;
        return Ok(Finished::Clean);
    }
    let elapsed = Timestamp::now().duration_since(release.requested_at.0);
    let timeout = ctx.config.release_timeout;
    let offline = !ctx.is_fresh(host);
    if offline || elapsed.as_secs_f64() >= timeout.as_secs_f64() {
        let reason = if offline {
            format!("the agent went offline while releasing {whose}")
        } else {
            format!(
                "the host did not report CleanupSucceeded within {}s of the release of {whose}",
                timeout.as_secs(),
            )
        };
        bootstrap::remove(ctx, host).await?;
        return_to_pool(&api, host, Some(&reason)).await?;
        ctx.metrics.quarantined.inc();
        return Ok(Finished::Quarantined(reason));
    }
    let left = timeout.as_secs_f64() - elapsed.as_secs_f64();
    Ok(Finished::Pending(Duration::from_secs_f64(left.clamp(0.5, 10.0))))
}

/// Clears the claim, the bootstrap Secret reference and the release request (guarded by the
/// host's resourceVersion); with `quarantine`, takes the host out of the pool instead.
async fn return_to_pool(api: &Api<ByoHost>, host: &ByoHost, quarantine: Option<&str>) -> Result<()> {
    let quarantine =
        quarantine.map(|reason| json!({"reason": reason, "since": Timestamp::now().to_string()}));
    let patch = json!({
        "metadata": {"resourceVersion": host.resource_version(), "labels": {labels::CLUSTER_NAME: null}},
        "spec": {"machineRef": null, "bootstrapSecret": null, "release": null, "quarantine": quarantine},
    });
    api.patch(&host.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!("return ByoHost {} to the pool", host.name_any())))?;
    Ok(())
}

async fn mark_block_move(bm: &ByoMachine, ctx: &Context, why: &str) -> Result<()> {
    let ns = bm.namespace().unwrap_or_default();
    let patch = json!({"metadata": {"annotations": {labels::CLUSTERCTL_BLOCK_MOVE: why}}});
    Api::<ByoMachine>::namespaced(ctx.client.clone(), &ns)
        .patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!(
            "mark ByoMachine {ns}/{} as not movable",
            bm.name_any()
        )))?;
    Ok(())
}
