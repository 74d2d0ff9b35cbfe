//! Lease-based leader election on `coordination.k8s.io/v1` Lease objects, for controllers that
//! run more than one replica.
//!
//! It follows client-go's algorithm:
//!
//! - A candidate reads the Lease every renew interval (with jitter). It takes the Lease when it
//!   is free (missing, or without a holder) or when the holder has not renewed it for a whole
//!   lease duration, measured on **our own monotonic clock** from when we last saw the Lease
//!   change, so clock skew between nodes never shortens a lease. Every write carries the
//!   `resourceVersion` it read (optimistic concurrency): of two candidates racing, one gets a
//!   conflict and stays a candidate.
//! - The leader renews every renew interval. If no renewal succeeds within the renew deadline
//!   (counted from the start of the last successful renewal, and shorter than the lease duration)
//!   it considers itself no longer leader at once, before any other replica may take over. It
//!   also stops being leader the moment it reads the Lease held by someone else.
//! - Stopping ([`LeaderHandle::stop`], or dropping the handle) flips the channel to `false` and
//!   releases the Lease (clears the holder) so a standby takes over within one renew interval
//!   instead of waiting for the lease to expire.
//!
//! Leadership is published on a `watch::Receiver<bool>`: `true` while we hold the Lease.
//!
//! **Callers must:**
//!
//! 1. run their controllers only while the value is `true`;
//! 2. when it turns from `true` to `false`, stop reconciling at once: shut down gracefully and
//!    exit so the pod restarts as a fresh candidate (simpler and safer than pausing);
//! 3. watch the [`LeaderHandle`] (it is a future) and exit non-zero if it completes: the election
//!    task only ends on a fatal error (RBAC forbids the Lease, the namespace does not exist) or a
//!    panic, and a replica that cannot take part in the election must not keep running.
//!
//! Readiness must not depend on leadership, or standbys never become Ready.
//!
//! ```no_run
//! # async fn run(client: kube::Client) -> Result<(), bootsman_runtime::Error> {
//! use bootsman_runtime::leader::LeaderElection;
//! let (mut leader, mut election) =
//!     LeaderElection::new(client, "bootsman-system", "bootsman-provider", "provider-7d9f-abcde")
//!         .start()
//!         .await?;
//! leader.wait_for(|held| *held).await.ok(); // wait until we lead
//! tokio::select! {
//!     _ = leader.wait_for(|held| !*held) => { /* lost: stop the controllers, exit non-zero */ }
//!     result = &mut election => { /* the election died: exit non-zero */ let _ = result; }
//!     // _ = controller.run(..) => {}
//! }
//! election.stop().await?; // release the Lease when shutting down cleanly
//! # Ok(()) }
//! ```
//!
//! With `--leader-elect=false` use [`always_leader`] instead.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Error;
use crate::api_errors;

/// Default time a Lease stays valid after its last renewal.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default time the leader keeps trying to renew before it gives up leadership.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Default time between renewals by the leader and between attempts by a candidate.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(2);

/// A leadership channel that is `true` forever, for binaries run with `--leader-elect=false`
/// (a single replica).
pub fn always_leader() -> watch::Receiver<bool> {
    // A receiver whose sender is gone keeps its last value; `changed()` then returns an error
    // at once, which callers waiting for a change must treat as "nothing will change".
    let (_tx, rx) = watch::channel(true);
    rx
}

/// The configuration of one replica's leader election on one Lease. Build it with
/// [`LeaderElection::new`], adjust it with the `with_*` methods, then [`LeaderElection::start`].
#[derive(Clone)]
pub struct LeaderElection {
    client: Client,
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    renew_interval: Duration,
}

impl fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElection")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease_duration", &self.lease_duration)
            .field("renew_deadline", &self.renew_deadline)
            .field("renew_interval", &self.renew_interval)
            .finish_non_exhaustive()
    }
}

impl LeaderElection {
    /// Election on Lease `namespace/name` (by convention `bootsman-<binary>`, in the binary's own
    /// namespace) as `identity`, which must be unique among the replicas: the pod name. Durations
    /// default to 15 s lease, 10 s renew deadline, 2 s renew interval.
    pub fn new(
        client: Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            renew_interval: DEFAULT_RENEW_INTERVAL,
        }
    }

    /// How long a Lease stays valid after its last renewal: how long standbys wait before
    /// taking over from a leader that vanished without releasing. Written to the Lease in whole
    /// seconds (rounded up).
    pub fn with_lease_duration(mut self, lease_duration: Duration) -> Self {
        self.lease_duration = lease_duration;
        self
    }

    /// How long the leader keeps retrying a failed renewal before it stops being leader. Must be
    /// shorter than the lease duration; the difference is the margin for the caller to stop
    /// reconciling before a standby may take over.
    pub fn with_renew_deadline(mut self, renew_deadline: Duration) -> Self {
        self.renew_deadline = renew_deadline;
        self
    }

    /// How often the leader renews the Lease and a candidate tries to take it. Must be shorter
    /// than the renew deadline.
    pub fn with_renew_interval(mut self, renew_interval: Duration) -> Self {
        self.renew_interval = renew_interval;
        self
    }

    /// This replica's identity, as written to `spec.holderIdentity`.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Checks names and durations: non-empty names, a lease of at least one second,
    /// `0 < renew interval < renew deadline < lease duration`.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |msg: String| Err(Error::LeaderConfig(msg));
        if self.namespace.is_empty() {
            return invalid("the Lease namespace is empty".into());
        }
        if self.name.is_empty() {
            return invalid("the Lease name is empty".into());
        }
        if self.identity.is_empty() {
            return invalid("the identity is empty".into());
        }
        if self.lease_duration < Duration::from_secs(1) {
            return invalid(format!(
                "lease duration {:?} is shorter than one second",
                self.lease_duration
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.renew_deadline {
            return invalid(format!(
                "renew interval {:?} must be above zero and shorter than the renew deadline {:?}",
                self.renew_interval, self.renew_deadline
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid(format!(
                "renew deadline {:?} must be shorter than the lease duration {:?}",
                self.renew_deadline, self.lease_duration
            ));
        }
        Ok(())
    }

    /// Validates the configuration, checks once that the Lease can be read (so RBAC mistakes
    /// and an unreachable API server fail at startup) and starts the election task.
    ///
    /// Returns the leadership channel (`true` while we hold the Lease) and the handle of the
    /// task. See the module documentation for what callers must do with both.
    pub async fn start(self) -> Result<(watch::Receiver<bool>, LeaderHandle), Error> {
        self.validate()?;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        api.get_opt(&self.name)
            .await
            .map_err(|source| self.get_error(source))?;

        let (tx, rx) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(
            Elector {
                config: self,
                api,
                observed: Observed::default(),
            }
            .run(tx, stop_rx),
        );
        Ok((
            rx,
            LeaderHandle {
                stop: Some(stop_tx),
                task,
            },
        ))
    }

    fn lease_duration_seconds(&self) -> i32 {
        let secs = self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }

    fn get_error(&self, source: kube::Error) -> Error {
        Error::GetLease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    fn create_error(&self, source: kube::Error) -> Error {
        Error::CreateLease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    fn update_error(&self, source: kube::Error) -> Error {
        Error::UpdateLease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }
}

/// The running election. It is a future that completes when the election task ends, which only
/// happens after [`LeaderHandle::stop`], on a fatal error or on a panic: a binary `select!`s on
/// it and exits non-zero when it completes unasked.
///
/// Dropping the handle stops the election as [`LeaderHandle::stop`] does, but without waiting:
/// the Lease is released in the background if the runtime lives long enough, and otherwise
/// expires after the lease duration.
#[derive(Debug)]
pub struct LeaderHandle {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl LeaderHandle {
    /// Stops the election: flips the channel to `false`, releases the Lease if we hold it and
    /// waits for the task to end. Call it after the leader-only work has stopped.
    pub async fn stop(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            // The task may have ended already; its result tells.
            let _ = stop.send(());
        }
        (&mut self.task).await.map_err(Error::LeaderTask)?
    }

    /// Whether the election task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Future for LeaderHandle {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task)
            .poll(cx)
            .map(|joined| joined.map_err(Error::LeaderTask).and_then(|r| r))
    }
}

/// What one attempt to take or renew the Lease found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// We hold the Lease (just acquired or renewed).
    Held,
    /// Someone else holds a valid Lease.
    HeldBy(String),
    /// Our write lost a race (resourceVersion conflict or a concurrent create).
    Conflict,
}

/// When we last saw the Lease's spec change, on our monotonic clock.
#[derive(Debug, Default)]
struct Observed {
    spec: Option<LeaseSpec>,
    at: Option<Instant>,
}

impl Observed {
    fn observe(&mut self, spec: Option<&LeaseSpec>, now: Instant) {
        if self.at.is_none() || self.spec.as_ref() != spec {
            self.spec = spec.cloned();
            self.at = Some(now);
        }
    }

    /// Whether a holder that renews every `lease_duration` has missed its renewal.
    fn expired(&self, lease_duration: Duration, now: Instant) -> bool {
        self.at
            .is_none_or(|at| now.saturating_duration_since(at) > lease_duration)
    }
}

/// The task's state.
struct Elector {
    config: LeaderElection,
    api: Api<Lease>,
    observed: Observed,
}

impl Elector {
    async fn run(mut self, tx: watch::Sender<bool>, mut stop: oneshot::Receiver<()>) -> Result<(), Error> {
        let lease = format!("{}/{}", self.config.namespace, self.config.name);
        let identity = self.config.identity.clone();
        tracing::info!(%lease, %identity, "leader election started");
        let outcome = loop {
            let acquired = tokio::select! {
                _ = &mut stop => break Ok(()),
                acquired = self.acquire() => acquired,
            };
            let renewed_at = match acquired {
                Ok(at) => at,
                Err(e) => break Err(e),
            };
            tx.send_replace(true);
            tracing::info!(%lease, %identity, "became leader");
            let lost = tokio::select! {
                _ = &mut stop => break Ok(()),
                lost = self.keep(renewed_at) => lost,
            };
            tx.send_replace(false);
            match lost {
                Ok(reason) => tracing::warn!(%lease, %identity, %reason, "lost leadership"),
                Err(e) => break Err(e),
            }
        };
        tx.send_replace(false);
        if let Err(e) = &outcome {
            tracing::error!(%lease, %identity, error = %e, source = ?std::error::Error::source(e),
                "leader election failed");
        }
        // Release even when we did not know we held the Lease: a write cancelled by the stop may
        // have taken it. Bounded, so a dead API server cannot block shutdown.
        match tokio::time::timeout(self.config.renew_deadline, self.release()).await {
            Ok(Ok(true)) => tracing::info!(%lease, %identity, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(%lease, %identity, error = %e, "releasing the lease"),
            Err(_) => tracing::warn!(%lease, %identity, "releasing the lease timed out"),
        }
        tracing::info!(%lease, %identity, "leader election stopped");
        outcome
    }

    /// Tries until we hold the Lease; returns when the successful attempt started.
    async fn acquire(&mut self) -> Result<Instant, Error> {
        let mut last_holder: Option<String> = None;
        loop {
            let started = Instant::now();
            match tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => return Ok(started),
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    if last_holder.as_deref() != Some(holder.as_str()) {
                        tracing::info!(%holder, "lease held by another replica; standing by");
                        last_holder = Some(holder);
                    }
                }
                Ok(Ok(Attempt::Conflict)) => tracing::debug!("lost a race for the lease"),
                Ok(Err(e)) if is_fatal(&e) => return Err(e),
                Ok(Err(e)) => tracing::warn!(error = %e, source = ?std::error::Error::source(&e),
                    "trying to acquire the lease"),
                Err(_) => tracing::warn!("trying to acquire the lease timed out"),
            }
            tokio::time::sleep(jittered(self.config.renew_interval)).await;
        }
    }

    /// Renews while we hold the Lease. Returns why we lost it, or a fatal error.
    async fn keep(&mut self, mut renewed_at: Instant) -> Result<&'static str, Error> {
        loop {
            tokio::time::sleep(self.config.renew_interval).await;
            let deadline = renewed_at + self.config.renew_deadline;
            loop {
                let started = Instant::now();
                if started >= deadline {
                    return Ok("renew deadline passed");
                }
                match tokio::time::timeout(deadline - started, self.try_acquire_or_renew()).await {
                    Err(_) => return Ok("renew deadline passed"),
                    Ok(Ok(Attempt::Held)) => {
                        renewed_at = started;
                        break;
                    }
                    Ok(Ok(Attempt::HeldBy(holder))) => {
                        tracing::warn!(%holder, "another replica holds the lease");
                        return Ok("another replica holds the lease");
                    }
                    Ok(Ok(Attempt::Conflict)) => tracing::debug!("renewal conflicted; retrying"),
                    Ok(Err(e)) if is_fatal(&e) => return Err(e),
                    Ok(Err(e)) => tracing::warn!(error = %e, source = ?std::error::Error::source(&e),
                        "renewing the lease"),
                }
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(self.config.renew_interval.min(left)).await;
            }
        }
    }

    /// One read and, if the Lease is ours or free, one write.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, Error> {
        let cfg = &self.config;
        let now = Instant::now();
        let Some(mut lease) = self.api.get_opt(&cfg.name).await.map_err(|e| cfg.get_error(e))? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(cfg.lease_duration_seconds()),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed.observe(created.spec.as_ref(), now);
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(s)) if api_errors::conflict(&s) => Ok(Attempt::Conflict),
                Err(e) => Err(cfg.create_error(e)),
            };
        };

        self.observed.observe(lease.spec.as_ref(), now);
        let old = lease.spec.take().unwrap_or_default();
        let (spec, taken_from) = match decide(cfg, old, &self.observed, now, micro_now()) {
            Decision::Wait(holder) => return Ok(Attempt::HeldBy(holder)),
            Decision::Write { spec, taken_from } => (spec, taken_from),
        };
        let ours = taken_from.is_none();
        let holder = taken_from.flatten();
        lease.spec = Some(spec);
        // `replace` sends the resourceVersion we read: a concurrent writer makes it conflict.
        match self.api.replace(&cfg.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.observed.observe(written.spec.as_ref(), now);
                if !ours {
                    tracing::debug!(previous = ?holder, "took the lease");
                }
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if api_errors::conflict(&s) => Ok(Attempt::Conflict),
            Err(e) => Err(cfg.update_error(e)),
        }
    }

    /// Clears the holder if it is us. Returns whether we released anything.
    async fn release(&self) -> Result<bool, Error> {
        let cfg = &self.config;
        let Some(mut lease) = self.api.get_opt(&cfg.name).await.map_err(|e| cfg.get_error(e))? else {
            return Ok(false);
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(false);
        };
        if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro_now());
        match self.api.replace(&cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            // Someone wrote it since we read it: it is theirs now.
            Err(kube::Error::Api(s)) if api_errors::conflict(&s) => Ok(false),
            Err(e) => Err(cfg.update_error(e)),
        }
    }
}

/// Errors that retrying cannot fix: RBAC forbids the Lease, the namespace does not exist, the
/// API server rejects the object.
/// What an attempt does with the Lease it read: the pure half of [`Elector::try_acquire_or_renew`].
#[derive(Debug, PartialEq)]
enum Decision {
    /// Another holder has not missed a renewal: wait.
    Wait(String),
    /// Write `spec`: our renewal (`taken_from: None`) or a free or expired Lease taken over
    /// (`Some(previous holder)`, `Some(None)` when it had none).
    Write {
        spec: LeaseSpec,
        taken_from: Option<Option<String>>,
    },
}

/// Decides from the Lease's spec as read (`old`), when we saw it change last (`observed`, on our
/// monotonic clock: a holder's timestamps come from its clock, not ours) and `stamp`, the time
/// written into the Lease. An empty holder is no holder; a holder's own lease duration decides
/// when it has missed its renewal.
fn decide(
    cfg: &LeaderElection,
    old: LeaseSpec,
    observed: &Observed,
    now: Instant,
    stamp: MicroTime,
) -> Decision {
    let holder = old.holder_identity.clone().filter(|h| !h.is_empty());
    if holder.as_deref() == Some(cfg.identity.as_str()) {
        return Decision::Write {
            spec: LeaseSpec {
                renew_time: Some(stamp),
                lease_duration_seconds: Some(cfg.lease_duration_seconds()),
                ..old
            },
            taken_from: None,
        };
    }
    if let Some(holder) = &holder {
        let their_duration = old
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(cfg.lease_duration, Duration::from_secs);
        if !observed.expired(their_duration, now) {
            return Decision::Wait(holder.clone());
        }
    }
    Decision::Write {
        spec: LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            acquire_time: Some(stamp.clone()),
            renew_time: Some(stamp),
            lease_duration_seconds: Some(cfg.lease_duration_seconds()),
            lease_transitions: Some(old.lease_transitions.unwrap_or(0).saturating_add(1)),
            ..old
        },
        taken_from: Some(holder),
    }
}

fn is_fatal(e: &Error) -> bool {
    match e.kube_error() {
        Some(kube::Error::Api(s)) => {
            s.is_forbidden()
                || api_errors::invalid(s)
                || (matches!(e, Error::CreateLease { .. }) && api_errors::not_found(s))
        }
        _ => false,
    }
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `d` plus up to 20 % more, so candidates that started together drift apart.
fn jittered(d: Duration) -> Duration {
    use rand::Rng as _;
    d + d.mul_f64(rand::rng().random_range(0.0..0.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renew_secs: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(renew_secs).expect("timestamp"),
            )),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn expiry_counts_from_the_last_change_we_saw() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(15);
        let mut observed = Observed::default();
        assert!(observed.expired(lease, t0), "never seen counts as expired");

        observed.observe(Some(&spec("a", 100)), t0);
        assert!(!observed.expired(lease, t0 + Duration::from_secs(10)));

        // The same record seen again does not move the clock.
        observed.observe(Some(&spec("a", 100)), t0 + Duration::from_secs(10));
        assert!(observed.expired(lease, t0 + Duration::from_secs(16)));

        // A renewal (new renewTime) does.
        observed.observe(Some(&spec("a", 110)), t0 + Duration::from_secs(16));
        assert!(!observed.expired(lease, t0 + Duration::from_secs(30)));
        assert!(observed.expired(lease, t0 + Duration::from_secs(32)));
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let d = Duration::from_secs(2);
        for _ in 0..100 {
            let j = jittered(d);
            assert!(j >= d && j < d.mul_f64(1.2), "{j:?}");
        }
    }

    fn election(lease: u64, deadline: u64, interval: u64) -> LeaderElection {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let client = Client::try_from(config).expect("client");
        LeaderElection::new(client, "ns", "lease", "me")
            .with_lease_duration(Duration::from_millis(lease))
            .with_renew_deadline(Duration::from_millis(deadline))
            .with_renew_interval(Duration::from_millis(interval))
    }

    fn stamp(secs: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(secs).expect("timestamp"))
    }

    /// The decision for Lease `old` last seen changing `seen_ago` ago (never, when `None`), by
    /// candidate "me" with a 15 s lease, written at time 500.
    fn decided(old: LeaseSpec, seen_ago: Option<u64>) -> Decision {
        let now = Instant::now() + Duration::from_secs(3600);
        let mut observed = Observed::default();
        if let Some(ago) = seen_ago {
            observed.observe(Some(&old), now - Duration::from_secs(ago));
        }
        decide(&election(15_000, 10_000, 2_000), old, &observed, now, stamp(500))
    }

    #[tokio::test]
    async fn our_lease_is_renewed_keeping_its_acquisition() {
        let mut old = spec("me", 100);
        old.acquire_time = Some(stamp(50));
        old.lease_transitions = Some(4);
        let Decision::Write { spec, taken_from } = decided(old, Some(1)) else {
            panic!("our own Lease is renewed");
        };
        assert_eq!(taken_from, None);
        assert_eq!(spec.renew_time, Some(stamp(500)));
        assert_eq!(spec.acquire_time, Some(stamp(50)), "a renewal is no acquisition");
        assert_eq!(spec.lease_transitions, Some(4), "a renewal is no transition");
        assert_eq!(spec.lease_duration_seconds, Some(15));
    }

    #[tokio::test]
    async fn a_live_holder_is_waited_for_an_expired_one_replaced() {
        // Renewed 5 s ago (by our clock) with a 15 s lease: wait.
        assert_eq!(
            decided(spec("other", 100), Some(5)),
            Decision::Wait("other".into())
        );
        // Its own lease duration counts, not ours: 60 s, seen 20 s ago, still live.
        let mut long = spec("other", 100);
        long.lease_duration_seconds = Some(60);
        assert_eq!(decided(long.clone(), Some(20)), Decision::Wait("other".into()));
        // Missed its renewal: taken, one more transition, acquired now.
        long.lease_transitions = Some(2);
        let Decision::Write { spec, taken_from } = decided(long, Some(61)) else {
            panic!("an expired holder is replaced");
        };
        assert_eq!(taken_from, Some(Some("other".into())));
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.acquire_time, Some(stamp(500)));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.lease_duration_seconds, Some(15));
    }

    #[tokio::test]
    async fn a_free_lease_is_taken_at_once() {
        for old in [LeaseSpec::default(), spec("", 100)] {
            let Decision::Write { spec, taken_from } = decided(old, Some(0)) else {
                panic!("a Lease without a holder is free");
            };
            assert_eq!(taken_from, Some(None));
            assert_eq!(spec.holder_identity.as_deref(), Some("me"));
            assert_eq!(spec.lease_transitions, Some(1));
        }
    }

    #[tokio::test]
    async fn validate_orders_the_durations() {
        assert!(election(15_000, 10_000, 2_000).validate().is_ok());
        assert!(election(3_000, 2_000, 500).validate().is_ok());
        for (lease, deadline, interval) in [
            (500, 400, 100),
            (3_000, 3_000, 500),
            (3_000, 2_000, 2_000),
            (3_000, 2_000, 0),
        ] {
            let err = election(lease, deadline, interval)
                .validate()
                .expect_err("invalid");
            assert_eq!(err.label(), "leader_config", "{err}");
        }
        let unnamed = LeaderElection::new(election(3_000, 2_000, 500).client, "ns", "", "me");
        assert!(unnamed.validate().is_err());
    }

    #[tokio::test]
    async fn lease_seconds_round_up() {
        assert_eq!(election(3_000, 2_000, 500).lease_duration_seconds(), 3);
        assert_eq!(election(3_200, 2_000, 500).lease_duration_seconds(), 4);
    }

    #[test]
    fn always_leader_stays_true() {
        let rx = always_leader();
        assert!(*rx.borrow());
    }
}
