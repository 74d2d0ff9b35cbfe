//! The agent's life on the management cluster: registration, heartbeat and the watch of its own
//! ByoHost that drives bootstrap and reset.
//!
//! Writes, each by server-side apply with its own field manager so no write undoes another:
//! - `byoh-agent/labels`: the ByoHost's own labels, all under `host.bootsman.io/` (from
//!   `--label`; labels dropped from the flags are removed because the manager no longer applies
//!   them); labels outside that prefix are admins' and the provider's, never touched here;
//! - `byoh-agent`: the heartbeat Lease;
//! - `byoh-agent/inventory`: `status.hostInfo`, `status.network`, `status.agentVersion`;
//! - `byoh-agent/<Condition>`: one manager per condition (`Registered`, `BootstrapSucceeded`,
//!   `CleanupSucceeded`, `Rehomed`), each with the `observedGeneration` of the spec it answers.
//!
//! Events on the ByoHost: `BootstrapSucceeded`, `BootstrapFailed`, `CleanupSucceeded`,
//! `CleanupFailed`, `Rehomed`, `RehomeFailed`.
//!
//! **Rehome.** When an admin sets `spec.rehome` (a pivot moves the site to another management
//! cluster), the agent finishes the action in progress, reads the Secret
//! `bootsman-rehome-<host>` (only this host may), enrols with the cluster it names using the
//! one-time token in it (a fresh key, kept aside: the current identity stays in use), reports
//! `Rehomed=True` here, and only then replaces its kubeconfig and runs on against the new
//! cluster, in the same process. A failure is reported as `Rehomed=False` with the reason and
//! retried; a rehome interrupted after the new certificate was issued resumes from it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootsman_api::condition::types;
use bootsman_api::v1beta1::{ByoHost, REHOME_SECRET_KEY, RehomeRequest, rehome_secret_name};
use bootsman_runtime::{conditions, ssa};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Resource};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use serde_json::json;
use tokio::sync::watch;

use crate::cloudinit;
use crate::enroll;
use crate::executor::{ExecError, Executor};
use crate::state::Outcome;

/// Field manager of the Lease (and of Events).
pub const MANAGER: &str = "byoh-agent";
/// Field manager of the host's own labels (all under `host.bootsman.io/`). Agents before host-owned
/// labels applied theirs, such as `role`, as [`MANAGER`]; that manager no longer applies to the
/// ByoHost, so those labels stay as they were (an admin's to keep or remove) instead of being
/// removed by the host, which the host policy would refuse.
pub const LABELS_MANAGER: &str = "byoh-agent/labels";
/// Field manager of the inventory.
pub const INVENTORY_MANAGER: &str = "byoh-agent/inventory";

/// What the agent needs to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Host (and ByoHost, and Lease) name.
    pub name: String,
    /// Pool namespace.
    pub namespace: String,
    /// Labels the ByoHost carries.
    pub labels: BTreeMap<String, String>,
    /// How often the Lease is renewed; it lasts four times as long.
    pub heartbeat_interval: Duration,
    /// Runs bootstraps and resets.
    pub executor: Executor,
    /// The host's identity files, for a rehome (`spec.rehome`); `None` refuses rehomes.
    pub identity: Option<enroll::Options>,
    /// Told when a rehome has replaced the host's kubeconfig: the caller runs the agent again
    /// with a client of the new cluster.
    pub identity_changed: Option<watch::Sender<u64>>,
}

/// A failure that ends the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Registration failed.
    #[error("register ByoHost {ns}/{name}: {source}")]
    Register {
        /// Namespace.
        ns: String,
        /// Name.
        name: String,
        /// Cause.
        source: kube::Error,
    },
    /// The host's ByoHost was deleted after this enrolment registered it: the host has left its
    /// pool, and the agent does not create it again.
    #[error(
        "ByoHost {ns}/{name} was deleted: the host has left its pool, and its access there went \
         with it, so the agent does not register it again; to bring it back, issue a token with \
         `bootsmanctl hosts replace {name} --namespace {ns}` (its certificate still holds the \
         name) and start the agent with it as --bootstrap-kubeconfig"
    )]
    Removed {
        /// Namespace.
        ns: String,
        /// Name.
        name: String,
    },
    /// The state directory could not be read or written.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// A metric could not be registered.
    #[error("register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The agent's own metrics (prefix `bootsman_agent_`).
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    /// Bootstraps run, by result.
    pub bootstraps: IntCounterVec,
    /// Resets run, by result.
    pub resets: IntCounterVec,
    /// Lease renewals that succeeded.
    pub renewals: IntCounter,
    /// Lease renewals that failed.
    pub renewal_failures: IntCounter,
    /// Unix time of the last successful renewal.
    pub last_renew: IntGauge,
    /// 1 while the Lease has not been renewed for longer than it lasts (the host shows Offline).
    pub lost: IntGauge,
}

impl AgentMetrics {
    /// Registers the agent metrics in `registry`.
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            bootstraps: IntCounterVec::new(
                Opts::new(
                    "agent_bootstrap_runs_total",
                    "Bootstraps finished, by result (succeeded, failed).",
                ),
                &["result"],
            )?,
            resets: IntCounterVec::new(
                Opts::new(
                    "agent_reset_runs_total",
                    "Resets finished, by result (succeeded, failed).",
                ),
                &["result"],
            )?,
            renewals: IntCounter::new(
                "agent_heartbeat_renewals_total",
                "Heartbeat Lease renewals that succeeded.",
            )?,
            renewal_failures: IntCounter::new(
                "agent_heartbeat_failures_total",
                "Heartbeat Lease renewals that failed.",
            )?,
            last_renew: IntGauge::new(
                "agent_heartbeat_last_success_timestamp_seconds",
                "Unix time of the last successful Lease renewal.",
            )?,
            lost: IntGauge::new(
                "agent_heartbeat_lost",
                "1 while the Lease has not been renewed for longer than it lasts.",
            )?,
        };
        registry.register(Box::new(m.bootstraps.clone()))?;
        registry.register(Box::new(m.resets.clone()))?;
        registry.register(Box::new(m.renewals.clone()))?;
        registry.register(Box::new(m.renewal_failures.clone()))?;
        registry.register(Box::new(m.last_renew.clone()))?;
        registry.register(Box::new(m.lost.clone()))?;
        Ok(m)
    }
}

/// Whether a rehome is to be done (or tried again): `spec.rehome` is set and no `Rehomed=True`
/// answers this generation, or the certificate for the new cluster is kept aside (`staged`)
/// but not yet in use, because the switch after the report did not happen.
pub fn rehome_due(host: &ByoHost, staged: bool) -> bool {
    if host.spec.rehome.is_none() {
        return false;
    }
    let done = host
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, types::REHOMED))
        .is_some_and(|c| c.status == "True" && c.observed_generation >= host.metadata.generation);
    !done || staged
}

/// Whether `name` is an RFC 1123 subdomain (what a ByoHost name must be); the error names the
/// rule.
pub fn check_host_name(name: &str) -> Result<(), String> {
    bootsman_api::identity::validate_host_name(name)
}

struct Agent {
    opts: Options,
    api: Api<ByoHost>,
    secrets: kube::Client,
    recorder: Recorder,
    metrics: AgentMetrics,
}

/// Runs the agent until `stop` fires, or until `restart` fires and the action in progress (a
/// bootstrap or reset command) has finished. `registered` is told once the ByoHost reports
/// `Registered=True`.
///
/// Nothing but `stop` interrupts a running command: an API server that cannot be reached (the
/// Lease expires and the host shows `Offline`) or a renewed certificate (`restart`, so the next
/// run uses the new identity) leave it running to its end, since a half-done `kubeadm join`
/// cannot be run again. Results are reported once the API server answers again.
pub async fn run(
    client: kube::Client,
    opts: Options,
    metrics: AgentMetrics,
    registered: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
    restart: watch::Receiver<bool>,
) -> Result<(), Error> {
    let api: Api<ByoHost> = Api::namespaced(client.clone(), &opts.namespace);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: MANAGER.into(),
            instance: Some(opts.name.clone()),
        },
    );
    let agent = Arc::new(Agent {
        opts,
        api,
        secrets: client.clone(),
        recorder,
        metrics,
    });
    // The Lease first, so a freshly registered host is not seen Offline.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &agent.opts.namespace);
    if let Err(e) = agent.renew(&leases).await {
        tracing::warn!(error = %e, "first heartbeat failed; retrying");
    }
    agent.register().await?;
    registered.send_replace(true);
    tracing::info!(host = %agent.opts.name, namespace = %agent.opts.namespace, "registered");

    let (done_tx, done_rx) = watch::channel(false);
    let heartbeat = tokio::spawn(agent.clone().heartbeat(leases, done_rx.clone()));
    let (host_tx, host_rx) = watch::channel::<Option<ByoHost>>(None);
    let (removed_tx, removed_rx) = watch::channel(false);
    let worker = tokio::spawn(
        agent
            .clone()
            .work(host_rx, stop.clone(), restart, removed_rx.clone()),
    );
    let watch_task = tokio::spawn(agent.clone().watch(host_tx, removed_tx, done_rx));

    // The worker returns on `stop` (abandoning a running command, keeping its progress) or on
    // `restart` once its action is done; heartbeat and watch run until then.
    let mut stopping = stop.clone();
    let mut worker = worker;
    tokio::select! {
        _ = &mut worker => {}
        _ = stopping.wait_for(|s| *s) => {
            let _ = tokio::time::timeout(Duration::from_secs(20), &mut worker).await;
        }
    }
    let _ = done_tx.send(true);
    watch_task.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), heartbeat).await;
    if *removed_rx.borrow() {
        return Err(agent.removed());
    }
    Ok(())
}

impl Agent {
    fn lease_duration(&self) -> Duration {
        self.opts.heartbeat_interval * 4
    }

    async fn renew(&self, leases: &Api<Lease>) -> Result<(), kube::Error> {
        let body = ssa::body::<Lease>(
            &self.opts.name,
            Some(&self.opts.namespace),
            json!({"spec": {
                "holderIdentity": self.opts.name,
                "leaseDurationSeconds": self.lease_duration().as_secs().max(1),
                "renewTime": MicroTime(Timestamp::now()),
            }}),
        );
        ssa::apply(leases, MANAGER, &self.opts.name, &body).await?;
        self.metrics.renewals.inc();
        self.metrics.last_renew.set(Timestamp::now().as_second());
        Ok(())
    }

    /// Renews the Lease every interval until `done`. A Lease that could not be renewed for
    /// longer than it lasts is reported (log, `agent_heartbeat_lost`) and renewal goes on: the
    /// agent keeps its work and comes back as soon as the API server answers.
    async fn heartbeat(self: Arc<Self>, leases: Api<Lease>, mut done: watch::Receiver<bool>) {
        let mut last_ok = Instant::now();
        let mut lost = false;
        let mut tick = tokio::time::interval(self.opts.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = done.wait_for(|s| *s) => return,
            }
            match tokio::time::timeout(self.opts.heartbeat_interval, self.renew(&leases)).await {
                Ok(Ok(())) => {
                    if lost {
                        tracing::info!(
                            after_secs = last_ok.elapsed().as_secs(),
                            "heartbeat restored: the Lease is renewed again"
                        );
                        lost = false;
                        self.metrics.lost.set(0);
                    }
                    last_ok = Instant::now();
                }
                failed => {
                    let last = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".into(),
                    };
                    self.metrics.renewal_failures.inc();
                    tracing::warn!(error = %last, "heartbeat renewal failed");
                    if !lost && last_ok.elapsed() > self.lease_duration() {
                        lost = true;
                        self.metrics.lost.set(1);
                        tracing::error!(
                            lease = %format!("{}/{}", self.opts.namespace, self.opts.name),
                            secs = self.lease_duration().as_secs(),
                            error = %last,
                            "heartbeat lost: the Lease could not be renewed for longer than it lasts, so the host shows Offline; \
                             a running bootstrap or reset goes on, and renewal is retried"
                        );
                    }
                }
            }
        }
    }

    fn removed(&self) -> Error {
        Error::Removed {
            ns: self.opts.namespace.clone(),
            name: self.opts.name.clone(),
        }
    }

    /// Creates or updates the ByoHost: labels, inventory, `Registered=True`. A ByoHost this
    /// enrolment registered before and that is gone now (or whose pool no longer admits the
    /// host) was removed by an admin: that is [`Error::Removed`], and nothing is created.
    async fn register(&self) -> Result<(), Error> {
        let err = |source| Error::Register {
            ns: self.opts.namespace.clone(),
            name: self.opts.name.clone(),
            source,
        };
        let recorded = self.opts.executor.state.registration()?;
        match self.api.get_opt(&self.opts.name).await {
            Ok(None) if recorded.is_some() => return Err(self.removed()),
            Err(kube::Error::Api(s)) if s.code == 403 && recorded.is_some() => return Err(self.removed()),
            Err(e) => return Err(err(e)),
            Ok(_) => {}
        }
        let body = ssa::body::<ByoHost>(&self.opts.name, Some(&self.opts.namespace), json!({"spec": {}}));
        let mut body = body;
        body["metadata"]["labels"] = json!(self.opts.labels);
        let host = ssa::apply(&self.api, LABELS_MANAGER, &self.opts.name, &body)
            .await
            .map_err(err)?;
        let hostname = crate::inventory::kernel_hostname().unwrap_or_else(|| self.opts.name.clone());
        let (info, network) = crate::inventory::collect(self.opts.executor.root.dir(), &hostname);
        let inv = ssa::body::<ByoHost>(
            &self.opts.name,
            Some(&self.opts.namespace),
            json!({"status": {
                "hostInfo": info,
                "network": network,
                "agentVersion": env!("CARGO_PKG_VERSION"),
            }}),
        );
        ssa::apply_status(&self.api, INVENTORY_MANAGER, &self.opts.name, &inv)
            .await
            .map_err(err)?;
        if let Some(uid) = host.metadata.uid.clone()
            && recorded.as_deref() != Some(uid.as_str())
        {
            self.opts.executor.state.record_registration(&uid)?;
        }
        self.report(
            &host,
            types::REGISTERED,
            true,
            "Registered",
            "the agent registered the host with its inventory",
        )
        .await
        .map_err(err)?;
        Ok(())
    }

    /// Writes one condition for the host's current generation (keeping its transition time when
    /// the status did not change).
    async fn report(
        &self,
        host: &ByoHost,
        type_: &str,
        ok: bool,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let mut conds = host
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        conditions::set(
            &mut conds,
            type_,
            conditions::Status::from_bool(ok),
            reason,
            message,
            host.metadata.generation,
            conditions::now(),
        );
        let cond = conditions::get(&conds, type_).cloned();
        let body = ssa::body::<ByoHost>(
            &self.opts.name,
            Some(&self.opts.namespace),
            json!({"status": {"conditions": [cond]}}),
        );
        ssa::apply_status(&self.api, &format!("{MANAGER}/{type_}"), &self.opts.name, &body).await?;
        Ok(())
    }

    async fn event(&self, host: &ByoHost, warning: bool, reason: &str, action: &str, note: &str) {
        let note: String = note.chars().take(1000).collect();
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &host.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "could not publish Event");
        }
    }

    /// Watches the agent's own ByoHost and hands every new version to the worker. On its
    /// deletion the worker is told (`removed`) and the watch ends.
    async fn watch(
        self: Arc<Self>,
        tx: watch::Sender<Option<ByoHost>>,
        removed: watch::Sender<bool>,
        _stop: watch::Receiver<bool>,
    ) {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.opts.name));
        let mut stream = watcher(self.api.clone(), cfg).boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(h) | watcher::Event::InitApply(h)) => {
                    tx.send_replace(Some(h));
                }
                Ok(watcher::Event::Delete(_)) => {
                    tracing::error!(
                        "the ByoHost was deleted: the host has left its pool; a running action \
                         finishes, then the agent stops"
                    );
                    tx.send_replace(None);
                    removed.send_replace(true);
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watch of the ByoHost failed; retrying");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }

    /// Acts on the latest ByoHost: bootstrap, reset or nothing. One action at a time.
    /// Returns on `stop` (a running command is abandoned, its progress kept) or, between
    /// actions, on `restart`.
    async fn work(
        self: Arc<Self>,
        mut rx: watch::Receiver<Option<ByoHost>>,
        stop: watch::Receiver<bool>,
        mut restart: watch::Receiver<bool>,
        mut removed: watch::Receiver<bool>,
    ) {
        let mut stopping = stop.clone();
        loop {
            if *restart.borrow() || *removed.borrow() {
                return;
            }
            let host = rx.borrow_and_update().clone();
            let retry = match host {
                Some(h) => match self.act(&h, &stop).await {
                    Ok(()) => false,
                    Err(ActError::Interrupted) => return,
                    Err(ActError::Retry(why)) => {
                        tracing::warn!(error = %why, "will retry");
                        true
                    }
                },
                None => false,
            };
            let pause = if retry {
                Duration::from_secs(5)
            } else {
                Duration::from_secs(3600)
            };
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(pause) => {}
                _ = stopping.wait_for(|s| *s) => return,
                _ = restart.wait_for(|s| *s) => return,
                _ = removed.wait_for(|s| *s) => return,
            }
        }
    }

    /// Moves the agent to the cluster the rehome Secret names (see the module documentation).
    async fn rehome(&self, host: &ByoHost, req: &RehomeRequest) -> Result<(), ActError> {
        let (Some(ident), Some(changed)) = (&self.opts.identity, &self.opts.identity_changed) else {
            let why = "this agent runs without its identity files and cannot move to another cluster";
            self.report(host, types::REHOMED, false, "RehomeUnsupported", why)
                .await
                .map_err(retry)?;
            return Ok(());
        };
        // A failure is reported, and retried every few seconds; its Event is published once.
        let stored = host
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, types::REHOMED))
            .cloned();
        let fail = |reason: &'static str, why: String| async move {
            tracing::warn!(reason, error = %why, "rehome failed");
            let again = stored
                .as_ref()
                .is_some_and(|c| c.status == "False" && c.reason == reason && c.message == why);
            self.report(host, types::REHOMED, false, reason, &why)
                .await
                .map_err(retry)?;
            if !again {
                self.event(host, true, "RehomeFailed", "Rehome", &why).await;
            }
            Err::<(), ActError>(ActError::Retry(why))
        };
        // Already talking to the cluster asked for (the request was copied there with the host).
        if enroll::current_server(ident).is_ok_and(|s| s == req.server) {
            let msg = format!("the agent talks to {} already", req.server);
            self.report(host, types::REHOMED, true, "Rehomed", &msg)
                .await
                .map_err(retry)?;
            return Ok(());
        }
        let name = rehome_secret_name(&self.opts.name);
        let secret = match Api::<Secret>::namespaced(self.secrets.clone(), &self.opts.namespace)
            .get_opt(&name)
            .await
        {
            Ok(s) => s,
            // Without the Role that `bootsmanctl hosts rehome` writes with it, reading is refused.
            Err(kube::Error::Api(s)) if s.is_forbidden() => None,
            Err(e) => return fail("RehomeSecretUnreadable", format!("read Secret {name}: {e}")).await,
        };
        let Some(bootstrap) = secret
            .and_then(|s| s.data)
            .and_then(|d| d.get(REHOME_SECRET_KEY).map(|b| b.0.clone()))
        else {
            return fail(
                "RehomeSecretMissing",
                format!(
                    "Secret {name} with key {REHOME_SECRET_KEY} does not exist, or this host may not read it; \
                     `bootsmanctl hosts rehome` writes both"
                ),
            )
            .await;
        };
        match enroll::server_of(&bootstrap) {
            Ok(s) if s == req.server => {}
            Ok(s) => {
                return fail(
                    "RehomeServerMismatch",
                    format!(
                        "spec.rehome.server is {} but Secret {name} points at {s}",
                        req.server
                    ),
                )
                .await;
            }
            Err(e) => return fail("RehomeSecretInvalid", format!("Secret {name}: {e}")).await,
        }
        tracing::info!(server = %req.server, "rehome requested: enrolling with the new cluster");
        if let Err(e) = enroll::rehome(ident, &bootstrap).await {
            return fail("RehomeFailed", format!("enrol with {}: {e}", req.server)).await;
        }
        let msg = format!(
            "the agent enrolled with {} and talks only to it from now on; this ByoHost is no longer kept",
            req.server
        );
        self.report(host, types::REHOMED, true, "Rehomed", &msg)
            .await
            .map_err(retry)?;
        self.event(host, false, "Rehomed", "Rehome", &msg).await;
        enroll::commit_rehome(ident)
            .map_err(|e| ActError::Retry(format!("switch to the new kubeconfig: {e}")))?;
        tracing::info!(server = %req.server, "rehomed: continuing with the new cluster");
        changed.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn act(&self, host: &ByoHost, stop: &watch::Receiver<bool>) -> Result<(), ActError> {
        let generation = host.metadata.generation;
        let answered = |type_: &str| {
            host.status
                .as_ref()
                .and_then(|s| conditions::get(&s.conditions, type_))
                .is_some_and(|c| c.observed_generation >= generation)
        };
        let staged = self.opts.identity.as_ref().is_some_and(enroll::rehome_staged);
        if let Some(req) = &host.spec.rehome
            && rehome_due(host, staged)
        {
            return self.rehome(host, req).await;
        }
        if let Some(release) = &host.spec.release {
            if answered(types::CLEANUP_SUCCEEDED) {
                return Ok(());
            }
            tracing::info!(machine_uid = %release.machine_uid, "release requested: resetting the host");
            return match self.opts.executor.reset(stop).await {
                Ok(summary) => {
                    self.metrics.resets.with_label_values(&["succeeded"]).inc();
                    let msg = format!("host reset: {summary}");
                    self.report(host, types::CLEANUP_SUCCEEDED, true, "CleanupSucceeded", &msg)
                        .await
                        .map_err(retry)?;
                    self.event(host, false, "CleanupSucceeded", "Reset", &msg).await;
                    Ok(())
                }
                Err(Ok(why)) => {
                    self.metrics.resets.with_label_values(&["failed"]).inc();
                    tracing::warn!(error = %why, "reset failed");
                    self.report(host, types::CLEANUP_SUCCEEDED, false, "CleanupFailed", &why)
                        .await
                        .map_err(retry)?;
                    self.event(host, true, "CleanupFailed", "Reset", &why).await;
                    Ok(())
                }
                Err(Err(ExecError::Interrupted)) => Err(ActError::Interrupted),
                Err(Err(e)) => Err(ActError::Retry(e.to_string())),
            };
        }
        let (Some(mref), Some(secret_ref)) = (&host.spec.machine_ref, &host.spec.bootstrap_secret) else {
            return Ok(());
        };
        let state = &self.opts.executor.state;
        if let Some(o) = state.journal(&mref.uid).map_err(retry)?.and_then(|j| j.outcome) {
            if !answered(types::BOOTSTRAP_SUCCEEDED) {
                self.report(
                    host,
                    types::BOOTSTRAP_SUCCEEDED,
                    o.succeeded,
                    &o.reason,
                    &o.message,
                )
                .await
                .map_err(retry)?;
            }
            return Ok(());
        }
        // A host claimed again without a release (its quarantine lifted by an admin, say) still
        // holds another machine's bootstrap: it is reset before anything of the new machine
        // runs, and is not bootstrapped while that fails.
        let others: Vec<String> = state
            .journals()
            .map_err(retry)?
            .into_iter()
            .map(|j| j.machine_uid)
            .filter(|u| *u != mref.uid)
            .collect();
        if !others.is_empty() {
            tracing::info!(machine_uid = %mref.uid, previous = ?others, "the host holds another machine's bootstrap: resetting it first");
            match self.opts.executor.reset(stop).await {
                Ok(summary) => {
                    self.metrics.resets.with_label_values(&["succeeded"]).inc();
                    let msg = format!("reset before bootstrapping machine {}: {summary}", mref.name);
                    self.event(host, false, "CleanupSucceeded", "Reset", &msg).await;
                }
                Err(Ok(why)) => {
                    self.metrics.resets.with_label_values(&["failed"]).inc();
                    let msg = format!(
                        "the host still holds the bootstrap of machine(s) {} and could not be reset, so machine {} is \
                         not bootstrapped: {why}",
                        others.join(", "),
                        mref.name
                    );
                    self.report(host, types::BOOTSTRAP_SUCCEEDED, false, "NeedsReset", &msg)
                        .await
                        .map_err(retry)?;
                    self.event(host, true, "NeedsReset", "Bootstrap", &msg).await;
                    return Err(ActError::Retry(msg));
                }
                Err(Err(ExecError::Interrupted)) => return Err(ActError::Interrupted),
                Err(Err(e)) => return Err(ActError::Retry(e.to_string())),
            }
        }
        let ns = secret_ref
            .namespace
            .clone()
            .unwrap_or_else(|| self.opts.namespace.clone());
        let secret = match Api::<Secret>::namespaced(self.secrets.clone(), &ns)
            .get(&secret_ref.name)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("cannot read bootstrap Secret {ns}/{}: {e}", secret_ref.name);
                self.report(
                    host,
                    types::BOOTSTRAP_SUCCEEDED,
                    false,
                    "BootstrapDataUnreadable",
                    &msg,
                )
                .await
                .map_err(retry)?;
                return Err(ActError::Retry(msg));
            }
        };
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get("value"))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned());
        let outcome = match data.map(|d| cloudinit::parse(&d)) {
            None => self.refuse(
                &mref.uid,
                "InvalidBootstrapData",
                format!("bootstrap Secret {ns}/{} has no `value` key", secret_ref.name),
            )?,
            Some(Err(e @ cloudinit::ParseError::Unsupported(_))) => {
                self.refuse(&mref.uid, "UnsupportedDirective", e.to_string())?
            }
            Some(Err(e)) => self.refuse(&mref.uid, "InvalidBootstrapData", e.to_string())?,
            Some(Ok(steps)) => {
                tracing::info!(machine = %mref.name, machine_uid = %mref.uid, steps = steps.len(), "running bootstrap");
                match self.opts.executor.bootstrap(&mref.uid, &steps, stop).await {
                    Ok(o) => o,
                    Err(ExecError::Interrupted) => return Err(ActError::Interrupted),
                    Err(e) => return Err(ActError::Retry(e.to_string())),
                }
            }
        };
        let result = if outcome.succeeded { "succeeded" } else { "failed" };
        self.metrics.bootstraps.with_label_values(&[result]).inc();
        tracing::info!(machine_uid = %mref.uid, result, message = %outcome.message, "bootstrap finished");
        self.report(
            host,
            types::BOOTSTRAP_SUCCEEDED,
            outcome.succeeded,
            &outcome.reason,
            &outcome.message,
        )
        .await
        .map_err(retry)?;
        self.event(
            host,
            !outcome.succeeded,
            &outcome.reason,
            "Bootstrap",
            &outcome.message,
        )
        .await;
        Ok(())
    }

    /// Records refused bootstrap data as a finished, failed bootstrap.
    fn refuse(&self, uid: &str, reason: &str, message: String) -> Result<Outcome, ActError> {
        let outcome = Outcome {
            succeeded: false,
            reason: reason.into(),
            message,
        };
        let j = crate::state::Journal {
            machine_uid: uid.into(),
            outcome: Some(outcome.clone()),
            ..Default::default()
        };
        self.opts.executor.state.save(&j).map_err(retry)?;
        Ok(outcome)
    }
}

enum ActError {
    Interrupted,
    Retry(String),
}

fn retry(e: impl std::fmt::Display) -> ActError {
    ActError::Retry(e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bootsman_api::v1beta1::{ByoHostSpec, ByoHostStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn host(generation: i64, rehomed: Option<(bool, i64)>) -> ByoHost {
        let mut h = ByoHost::new(
            "h1",
            ByoHostSpec {
                rehome: Some(RehomeRequest {
                    server: "https://10.0.0.2:6443".into(),
                    requested_at: Time(Timestamp::now()),
                }),
                ..ByoHostSpec::default()
            },
        );
        h.metadata.generation = Some(generation);
        if let Some((ok, observed)) = rehomed {
            let mut conds = Vec::new();
            conditions::set(
                &mut conds,
                types::REHOMED,
                conditions::Status::from_bool(ok),
                "R",
                "",
                Some(observed),
                conditions::now(),
            );
            h.status = Some(ByoHostStatus {
                conditions: conds,
                ..ByoHostStatus::default()
            });
        }
        h
    }

    #[test]
    fn a_rehome_is_retried_until_it_is_answered_true_and_switched() {
        assert!(rehome_due(&host(2, None), false), "not answered yet");
        assert!(
            rehome_due(&host(2, Some((false, 2))), false),
            "a failure is tried again"
        );
        assert!(!rehome_due(&host(2, Some((true, 2))), false), "done");
        assert!(
            rehome_due(&host(2, Some((true, 2))), true),
            "reported but not switched"
        );
        assert!(rehome_due(&host(3, Some((true, 2))), false), "a new request");
        let mut none = host(2, None);
        none.spec.rehome = None;
        assert!(!rehome_due(&none, true));
    }

    #[test]
    fn host_names() {
        assert!(check_host_name("node-1.rack2").is_ok());
        for bad in ["", "Node1", "-a", "a-", "a..b", "a_b", &"x".repeat(254)] {
            assert!(check_host_name(bad).is_err(), "{bad}");
        }
    }
}
