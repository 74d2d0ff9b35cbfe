//! The life of a controller process: stop on SIGTERM or Ctrl-C, serve `/livez`, `/readyz` and
//! `/metrics` from the start, wait for the leader Lease (or not, without election), run the
//! controllers until shutdown or lost leadership, and report a lost Lease or a dead election as
//! an error so the pod restarts as a fresh candidate.
//!
//! `/readyz` says whether this replica is fit for its part: a standby (another replica leads) is
//! ready while it waits; the replica that runs the controllers is ready only once they report
//! their caches listed ([`Readiness::ready`]), so a rollout never counts a leader that has not yet
//! seen the cluster.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

use crate::leader::{LeaderElection, always_leader};
use crate::metrics::Metrics;

/// Resolves when the controllers must stop (shutdown asked for, or leadership lost).
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send + Sync + 'static>>;

/// The controllers' side of `/readyz`: they call [`Readiness::ready`] once their caches have
/// listed.
#[derive(Clone, Debug)]
pub struct Readiness(watch::Sender<bool>);

impl Readiness {
    /// A handle for `/readyz` fed by `tx`.
    pub fn new(tx: watch::Sender<bool>) -> Self {
        Self(tx)
    }

    /// A handle that reports nowhere (a caller without a health server).
    pub fn detached() -> Self {
        Self(watch::channel(false).0)
    }

    /// The caches have listed: `/readyz` answers 200.
    pub fn ready(&self) {
        self.0.send_replace(true);
    }
}

/// SIGTERM and SIGINT (a pod's or unit's stop, Ctrl-C), listened for from the moment it is made:
/// the one way every Bootsman binary, controllers and `bootsmanctl` alike, learns it must stop.
#[derive(Debug)]
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers; from here on neither signal ends the process by itself.
    pub fn listen() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for the first of them and returns its name, `SIGTERM` or `SIGINT`.
    pub async fn first(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// A flag that turns true on the first SIGTERM or SIGINT (see [`StopSignals`]), when `message`
/// is logged with the signal's name.
pub fn stop_on_signals(message: &'static str) -> std::io::Result<watch::Receiver<bool>> {
    let mut signals = StopSignals::listen()?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let which = signals.first().await;
        tracing::info!(signal = which, "{message}");
        tx.send_replace(true);
    });
    Ok(rx)
}

/// How the process takes part in leader election and where it serves health and metrics.
#[derive(Clone, Debug)]
pub struct Process {
    /// Name of the leader Lease, e.g. `bootsman-operator`.
    pub lease_name: String,
    /// Run the controllers only while holding the Lease.
    pub leader_elect: bool,
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Address of the health and metrics server.
    pub metrics_bind_address: SocketAddr,
}

/// The command-line flags every controller binary shares (`#[command(flatten)]`).
#[derive(clap::Args, Clone, Debug)]
pub struct ProcessArgs {
    /// Run the controllers only while holding the leader Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease (defaults to the pod's namespace, then `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// Address of the /livez, /readyz and /metrics server.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,
}

impl ProcessArgs {
    /// The process settings with the leader Lease `lease_name`.
    pub fn process(&self, lease_name: &str) -> Process {
        Process {
            lease_name: lease_name.into(),
            leader_elect: self.leader_elect,
            lease_namespace: self
                .leader_elect_namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            metrics_bind_address: self.metrics_bind_address,
        }
    }
}

/// Why the process ended other than by a clean shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Exit<E: std::error::Error + 'static> {
    /// The server or the election could not start.
    #[error(transparent)]
    Runtime(#[from] crate::Error),
    /// The controllers failed.
    #[error("the controllers failed: {0}")]
    Controllers(#[source] E),
    /// The election task ended (a fatal error or a panic).
    #[error("the leader election ended: {0}")]
    ElectionEnded(String),
    /// Leadership was lost; reconciling stopped.
    #[error("stopped reconciling after losing the leader Lease; exiting so a fresh candidate starts")]
    LostLease,
}

/// Runs `controllers` under the rules of the module documentation until SIGTERM or Ctrl-C.
pub async fn run<E, F, Fut>(
    client: kube::Client,
    process: Process,
    metrics: Arc<Metrics>,
    controllers: F,
) -> Result<(), Exit<E>>
where
    E: std::error::Error + 'static,
    F: FnOnce(Shutdown, Readiness) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let stop_rx = stop_on_signals("shutting down").map_err(crate::Error::Signals)?;
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let server = crate::server::bind(process.metrics_bind_address).await?;
    let (ready_tx, ready_rx) = watch::channel(false);
    let server_task = tokio::spawn(server.serve(metrics, ready_rx, stopped(stop_rx.clone())));

    let (mut leader, election) = if process.leader_elect {
        let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
            format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| process.lease_name.clone()),
                std::process::id()
            )
        });
        let (rx, handle) = LeaderElection::new(
            client,
            process.lease_namespace.clone(),
            process.lease_name.clone(),
            identity,
        )
        .start()
        .await?;
        (rx, Some(handle))
    } else {
        (always_leader(), None)
    };
    if process.leader_elect {
        // A standby is ready: it serves health and takes over when the leader goes.
        ready_tx.send_replace(true);
    }
    tracing::info!("waiting for leadership");
    tokio::select! {
        r = async { leader.wait_for(|held| *held).await.map(|_| ()) } => {
            if r.is_err() {
                return Err(Exit::ElectionEnded("the leadership channel closed".into()));
            }
        }
        () = stopped(stop_rx.clone()) => { let _ = server_task.await; return Ok(()); }
    }
    tracing::info!("leading: starting controllers");
    // Not ready until the controllers have listed what they watch.
    ready_tx.send_replace(false);
    let readiness = Readiness::new(ready_tx);
    let mut lost = leader.clone();
    let stop = stop_rx.clone();
    let shutdown: Shutdown = Box::pin(async move {
        tokio::select! {
            () = async {
                // A closed channel (no election) never changes: leadership is never lost.
                if lost.wait_for(|held| !*held).await.map(|_| ()).is_err() {
                    std::future::pending::<()>().await;
                }
            } => tracing::error!("lost the leader Lease"),
            () = stopped(stop) => {}
        }
    });
    let result = match election {
        Some(mut handle) => {
            let outcome = tokio::select! {
                r = controllers(shutdown, readiness) => r.map_err(Exit::Controllers),
                r = &mut handle => Err(Exit::ElectionEnded(format!("{r:?}"))),
            };
            let _ = handle.stop().await;
            outcome
        }
        None => controllers(shutdown, readiness).await.map_err(Exit::Controllers),
    };
    let _ = server_task.await;
    result?;
    if !*stop_rx.borrow() {
        return Err(Exit::LostLease);
    }
    Ok(())
}
