//! The approver controller: watches CSRs, checks them with [`super::csr_form`],
//! [`super::token`] and [`super::pool_access`], spends the token, grants pool access and
//! approves or denies, then retires spent tokens. Its decisions are counted in
//! `bootsman_provider_host_csrs_total{decision,reason}`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bootsman_api::identity;
use bootsman_api::v1beta1::ByoHost;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};
use prometheus::{IntCounterVec, Opts};
use serde_json::json;

use super::csr_form::{Request, Verdict, check_lifetime, csr_ref, examine, requested_host};
use super::pool_access::{ORPHAN_BINDING_GRACE, check_renewal, grant_pool_access, sweep_orphan_bindings};
use super::token::{check_name, check_token, name_holders};
use super::{APPROVED_REASON, Denial, delete_exactly, deny};
use crate::error::{Error, Result, is_not_found, kube as kerr};

/// How the approver decides.
#[derive(Clone, Debug)]
pub struct Options {
    /// Longest lifetime a host certificate may ask for (`spec.expirationSeconds`).
    pub max_certificate_lifetime: Duration,
}

/// The default [`Options::max_certificate_lifetime`]: 30 days, what the agent asks for by default.
pub const DEFAULT_MAX_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

impl Default for Options {
    fn default() -> Self {
        Self {
            max_certificate_lifetime: DEFAULT_MAX_CERTIFICATE_LIFETIME,
        }
    }
}

/// How often the approver sweeps orphan pool bindings.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Counts decisions.
#[derive(Clone, Debug)]
struct Metrics {
    decisions: IntCounterVec,
}

impl Metrics {
    fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let decisions = IntCounterVec::new(
            Opts::new(
                "provider_host_csrs_total",
                "Host certificate requests decided, by decision (approved, denied) and reason",
            ),
            &["decision", "reason"],
        )?;
        registry.register(Box::new(decisions.clone()))?;
        Ok(Self { decisions })
    }
}

struct Ctx {
    client: kube::Client,
    metrics: Metrics,
    options: Options,
}

/// Runs the approver until `shutdown` resolves. Run it under leader election (it spends tokens,
/// which is safe with several replicas, but one approver is enough).
pub async fn run(
    client: kube::Client,
    metrics: Arc<bootsman_runtime::metrics::Metrics>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        metrics: Metrics::register(metrics.registry())?,
        options,
    });
    tracing::info!("host CSR approver running");
    let sweeper = {
        let client = client.clone();
        async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                if let Err(e) =
                    sweep_orphan_bindings(&client, None, ORPHAN_BINDING_GRACE, Timestamp::now()).await
                {
                    tracing::warn!(error = %e, "sweeping the pool RoleBindings of unregistered hosts failed");
                }
            }
        }
    };
    let approver = Controller::new(
        Api::<CertificateSigningRequest>::all(client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown)
    .run(reconcile, error_policy, ctx)
    .for_each(|_| async {});
    // The sweeper never ends; the approver ends at shutdown, and the sweeper with it.
    tokio::select! {
        () = approver => {}
        () = sweeper => {}
    }
    Ok(())
}

fn error_policy(csr: Arc<CertificateSigningRequest>, err: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(csr = %csr.name_any(), error = %err, "deciding the CSR failed; retrying");
    Action::requeue(crate::error::retry_after(err).unwrap_or(Duration::from_secs(5)))
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action> {
    let name = csr.name_any();
    let user = csr.spec.username.clone().unwrap_or_default();
    if approved_at(&csr).is_some() && user.starts_with(identity::BOOTSTRAP_USER_PREFIX) {
        return retire_spent_token(&csr, &ctx).await;
    }
    let req = match examine(&csr) {
        Verdict::Ignore => return Ok(Action::await_change()),
        Verdict::Deny(d) => return decide(&csr, &ctx, Err(d)).await,
        Verdict::Admissible(r) => r,
    };
    if let Err(d) = check_lifetime(&csr, ctx.options.max_certificate_lifetime) {
        return decide(&csr, &ctx, Err(d)).await;
    }
    let Request::Enroll { token_id, .. } = &req else {
        if let Request::Renew { host } = &req
            && let Err(d) = check_renewal(&ctx.client, host).await?
        {
            return decide(&csr, &ctx, Err(d)).await;
        }
        return decide(&csr, &ctx, Ok(&req)).await;
    };
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), identity::TOKEN_NAMESPACE);
    let secret_name = identity::token_secret_name(token_id);
    let secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(kerr(format!("read token Secret {secret_name}")))?;
    let by = csr_ref(&csr);
    if let Err(d) = check_token(secret.as_ref(), &req, &by, Timestamp::now()) {
        return decide(&csr, &ctx, Err(d)).await;
    }
    let Some(mut secret) = secret else {
        return Err(Error::Invalid(format!("token Secret {secret_name} vanished")));
    };
    // A token this CSR already spent passed this check before the approver stopped; its own
    // grant may exist by now and must not count against it.
    if secret.annotations().get(identity::TOKEN_SPENT_BY) != Some(&by)
        && let Request::Enroll { host, .. } = &req
    {
        let holders = name_holders(&ctx.client, host, &csr.name_any(), Timestamp::now()).await?;
        if let Err(d) = check_name(&req, &secret, &holders) {
            return decide(&csr, &ctx, Err(d)).await;
        }
    }
    if !secret.annotations().contains_key(identity::TOKEN_SPENT_BY) {
        // Spend first: the replace carries the resourceVersion just read, so only one CSR (and
        // one approver) can ever spend this token.
        secret
            .annotations_mut()
            .insert(identity::TOKEN_SPENT_BY.into(), by.clone());
        secrets
            .replace(&secret_name, &PostParams::default(), &secret)
            .await
            .map_err(kerr(format!("spend token Secret {secret_name} for CSR {name}")))?;
        tracing::info!(csr = %name, requester = %user, token = %secret_name, "spent bootstrap token");
    }
    // The host's rights in its pool, before it holds a certificate to use them with.
    if let Request::Enroll { host, pool, .. } = &req {
        match grant_pool_access(&ctx.client, pool, host).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {
                let d = deny(
                    "PoolNotFound",
                    format!("the pool namespace {pool:?} of bootstrap token {token_id:?} does not exist"),
                );
                return decide(&csr, &ctx, Err(d)).await;
            }
            Err(e) => return Err(kerr(format!("grant host {host:?} access to pool {pool:?}"))(e)),
        }
    }
    decide(&csr, &ctx, Ok(&req)).await?;
    // The spent token goes once the host holds its certificate (`retire_spent_token`).
    Ok(Action::requeue(TOKEN_RETIRE_POLL))
}

/// How long a spent token outlives the approval of the CSR that spent it when nothing shows
/// that the host has its certificate: the agent reads its CSR with the token at least every
/// 10 s, so after this it has its certificate or has given up.
pub const TOKEN_READ_GRACE: Duration = Duration::from_secs(120);
/// How often an approved enrollment is looked at again until its token is deleted.
const TOKEN_RETIRE_POLL: Duration = Duration::from_secs(5);

/// When the CSR was approved (the `Approved` condition's `lastUpdateTime`, else
/// `lastTransitionTime`, else the epoch), if it was.
fn approved_at(csr: &CertificateSigningRequest) -> Option<Timestamp> {
    let c = csr
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Approved" && c.status == "True")?;
    Some(
        c.last_update_time
            .as_ref()
            .or(c.last_transition_time.as_ref())
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
    )
}

/// Deletes the bootstrap token an approved enrollment spent, once the host no longer needs it.
/// The agent reads its CSR, and so its certificate, with the token's identity: a token deleted
/// the moment the CSR is approved (before the signer has issued the certificate) would leave
/// the host unable ever to read it. So the token stays, spent (denied for any other CSR),
/// until the host's ByoHost has been registered since the approval (it has its certificate),
/// or [`TOKEN_READ_GRACE`] after the approval. A token replacing an existing host waits for
/// the grace, since that host's ByoHost exists already.
async fn retire_spent_token(csr: &CertificateSigningRequest, ctx: &Ctx) -> Result<Action> {
    let user = csr.spec.username.as_deref().unwrap_or_default();
    let token_id = user.trim_start_matches(identity::BOOTSTRAP_USER_PREFIX);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), identity::TOKEN_NAMESPACE);
    let secret_name = identity::token_secret_name(token_id);
    let Some(secret) = secrets
        .get_opt(&secret_name)
        .await
        .map_err(kerr(format!("read token Secret {secret_name}")))?
    else {
        return Ok(Action::await_change());
    };
    if secret.annotations().get(identity::TOKEN_SPENT_BY) != Some(&csr_ref(csr)) {
        return Ok(Action::await_change());
    }
    let approved = approved_at(csr).unwrap_or(Timestamp::UNIX_EPOCH);
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    let annotations = secret.annotations();
    let replaces = annotations.contains_key(identity::TOKEN_REPLACES);
    let host = requested_host(&csr.spec.request.0);
    let registered = match (
        issued && !replaces,
        secret.labels().get(identity::TOKEN_POOL),
        &host,
    ) {
        (true, Some(pool), Some(host)) => Api::<ByoHost>::namespaced(ctx.client.clone(), pool)
            .get_opt(host)
            .await
            .map_err(kerr(format!("read ByoHost {pool}/{host}")))?
            .and_then(|h| h.metadata.creation_timestamp)
            .is_some_and(|t| t.0.as_second() >= approved.as_second()),
        _ => false,
    };
    let grace_over = Timestamp::now().as_second() - approved.as_second()
        >= i64::try_from(TOKEN_READ_GRACE.as_secs()).unwrap_or(i64::MAX);
    if !registered && !grace_over {
        return Ok(Action::requeue(TOKEN_RETIRE_POLL));
    }
    match delete_exactly(&secrets, &secret_name, secret.uid()).await {
        Ok(()) => {
            tracing::info!(csr = %csr.name_any(), token = %secret_name,
                reason = if registered { "the host registered" } else { "grace over" },
                "deleted the spent bootstrap token");
            Ok(Action::await_change())
        }
        // The approval stands; the spent token is denied for any other CSR, and expires anyway.
        Err(e) => Err(kerr(format!("delete the spent token Secret {secret_name}"))(e)),
    }
}

/// Writes the decision through the `approval` subresource, preconditioned on the CSR's
/// `resourceVersion` so a CSR changed meanwhile is looked at again.
async fn decide(
    csr: &CertificateSigningRequest,
    ctx: &Ctx,
    decision: Result<&Request, Denial>,
) -> Result<Action> {
    let name = csr.name_any();
    let user = csr.spec.username.clone().unwrap_or_default();
    let (type_, reason, message, label) = match &decision {
        Ok(Request::Enroll { host, pool, .. }) => (
            "Approved",
            APPROVED_REASON,
            format!("host {host:?} of pool {pool:?} enrolled with an unspent bootstrap token"),
            "enroll",
        ),
        Ok(Request::Renew { host }) => (
            "Approved",
            APPROVED_REASON,
            format!("host {host:?} renews its own certificate"),
            "renew",
        ),
        Err(d) => ("Denied", d.reason, d.message.clone(), d.reason),
    };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now());
    let patch = json!({
        "metadata": {"resourceVersion": csr.resource_version()},
        "status": {"conditions": [{
            "type": type_,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
        }]},
    });
    Api::<CertificateSigningRequest>::all(ctx.client.clone())
        .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!("{type_} CSR {name}")))?;
    let decision_label = if type_ == "Approved" { "approved" } else { "denied" };
    ctx.metrics
        .decisions
        .with_label_values(&[decision_label, label])
        .inc();
    if type_ == "Approved" {
        tracing::info!(csr = %name, requester = %user, reason = label, %message, "approved host CSR");
    } else {
        tracing::warn!(csr = %name, requester = %user, reason, %message, "denied host CSR");
    }
    Ok(Action::await_change())
}
