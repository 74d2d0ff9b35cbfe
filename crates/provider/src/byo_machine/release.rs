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
    ctx.claims.set_waiting(ObjectRef::from_obj(bm.as_ref()), false);
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
#[derive(Debug, PartialEq)]
pub(super) enum Finished {
    /// The host reported clean: it is back in the pool.
    Clean,
    /// The host did not report clean in time, or its agent is offline: quarantined (why).
    Quarantined(String),
    /// Still resetting: look again after this long.
    Pending(Duration),
}

/// The quarantine decision, a pure function of the host, its release request, the time, the
/// release timeout and whether its agent is alive: clean once the agent reported
/// `CleanupSucceeded` for the host's current spec (a report from an earlier claim never counts);
/// otherwise quarantined when the agent is offline or the timeout has passed; otherwise pending,
/// looked at again before the timeout (between 0.5 and 10 seconds). `whose` names what the host
/// was released from, for the quarantine reason.
pub(super) fn decide(
    host: &ByoHost,
    release: &ReleaseRequest,
    now: Timestamp,
    timeout: Duration,
    agent_alive: bool,
    whose: &str,
) -> Finished {
    if pool::reported_for_current_spec(host, types::CLEANUP_SUCCEEDED) {
        return Finished::Clean;
    }
    let elapsed = now.duration_since(release.requested_at.0).as_secs_f64();
    if !agent_alive {
        return Finished::Quarantined(format!("the agent went offline while releasing {whose}"));
    }
    if elapsed >= timeout.as_secs_f64() {
        return Finished::Quarantined(format!(
            "the host did not report CleanupSucceeded within {}s of the release of {whose}",
            timeout.as_secs(),
        ));
    }
    let left = timeout.as_secs_f64() - elapsed;
    Finished::Pending(Duration::from_secs_f64(left.clamp(0.5, 10.0)))
}

/// Completes a requested release as [`decide`] says: a clean host goes back to the pool, one
/// that is not clean in time (or whose agent is offline) goes back quarantined. Either way its
/// bootstrap Secret, Role and RoleBinding go first.
pub(super) async fn finish(
    ctx: &Context,
    host: &ByoHost,
    release: &ReleaseRequest,
    whose: &str,
) -> Result<Finished> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &host.namespace().unwrap_or_default());
    let finished = decide(
        host,
        release,
        Timestamp::now(),
        ctx.config.release_timeout,
        ctx.is_fresh(host),
        whose,
    );
    match &finished {
        Finished::Clean => {
            bootstrap::remove(ctx, host).await?;
            return_to_pool(&api, host, None).await?;
        }
        Finished::Quarantined(reason) => {
            bootstrap::remove(ctx, host).await?;
            return_to_pool(&api, host, Some(reason)).await?;
            ctx.metrics.quarantined.inc();
        }
        Finished::Pending(_) => {}
    }
    Ok(finished)
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

#[cfg(test)]
mod tests {
    use super::*;
    use bootsman_api::v1beta1::{ByoHostSpec, ByoHostStatus};
    use bootsman_runtime::conditions;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const TIMEOUT: Duration = Duration::from_secs(600);
    const WHOSE: &str = "ByoMachine team/m";

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    /// A host of generation 4 asked to release at second 1000, with the agent's cleanup report
    /// (when given) for the spec of that generation.
    fn releasing(cleanup_for_generation: Option<i64>) -> (ByoHost, ReleaseRequest) {
        let mut h = ByoHost::new("h1", ByoHostSpec::default());
        h.metadata.namespace = Some("pool".into());
        h.metadata.generation = Some(4);
        let release = ReleaseRequest {
            machine_uid: "u1".into(),
            requested_at: Time(at(1000)),
        };
        h.spec.release = Some(release.clone());
        if let Some(generation) = cleanup_for_generation {
            let mut status = ByoHostStatus::default();
            conditions::set(
                &mut status.conditions,
                types::CLEANUP_SUCCEEDED,
                conditions::Status::True,
                "Reset",
                "",
                Some(generation),
                conditions::now(),
            );
            h.status = Some(status);
        }
        (h, release)
    }

    #[test]
    fn a_host_that_reported_clean_for_its_current_spec_returns_to_the_pool() {
        let (h, r) = releasing(Some(4));
        assert_eq!(decide(&h, &r, at(1001), TIMEOUT, true, WHOSE), Finished::Clean);
        // Clean is clean, even when the agent went away after reporting, or the report was late.
        assert_eq!(decide(&h, &r, at(1001), TIMEOUT, false, WHOSE), Finished::Clean);
        assert_eq!(decide(&h, &r, at(5000), TIMEOUT, true, WHOSE), Finished::Clean);
    }

    #[test]
    fn a_cleanup_report_of_an_earlier_claim_does_not_count() {
        let (h, r) = releasing(Some(3));
        assert_eq!(
            decide(&h, &r, at(1001), TIMEOUT, true, WHOSE),
            Finished::Pending(Duration::from_secs(10))
        );
        let Finished::Quarantined(why) = decide(&h, &r, at(1600), TIMEOUT, true, WHOSE) else {
            panic!("an old report must not release the host");
        };
        assert!(why.contains("within 600s"), "{why}");
    }

    #[test]
    fn an_offline_agent_is_quarantined_at_once_naming_what_was_released() {
        let (h, r) = releasing(None);
        assert_eq!(
            decide(&h, &r, at(1001), TIMEOUT, false, WHOSE),
            Finished::Quarantined("the agent went offline while releasing ByoMachine team/m".into())
        );
    }

    #[test]
    fn a_host_not_clean_within_the_timeout_is_quarantined() {
        let (h, r) = releasing(None);
        assert_eq!(
            decide(&h, &r, at(1600), TIMEOUT, true, WHOSE),
            Finished::Quarantined(
                "the host did not report CleanupSucceeded within 600s of the release of ByoMachine team/m"
                    .into()
            )
        );
        assert!(matches!(
            decide(&h, &r, at(1599), TIMEOUT, true, WHOSE),
            Finished::Pending(_)
        ));
    }

    #[test]
    fn a_pending_release_is_looked_at_again_before_its_timeout() {
        let (h, r) = releasing(None);
        // Far from the timeout: every 10 s at most.
        assert_eq!(
            decide(&h, &r, at(1000), TIMEOUT, true, WHOSE),
            Finished::Pending(Duration::from_secs(10))
        );
        // Close to it: when it passes.
        assert_eq!(
            decide(&h, &r, at(1597), TIMEOUT, true, WHOSE),
            Finished::Pending(Duration::from_secs(3))
        );
        // Never a busy loop.
        assert_eq!(
            decide(&h, &r, at(1599), TIMEOUT, true, WHOSE),
            Finished::Pending(Duration::from_secs(1))
        );
        // A request from the future (clock skew) waits, not quarantines.
        assert!(matches!(
            decide(&h, &r, at(900), TIMEOUT, true, WHOSE),
            Finished::Pending(_)
        ));
    }
}
