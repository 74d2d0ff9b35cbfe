//! `bootsman-provider`: the Cluster API infrastructure provider for a pool of bare-metal hosts.
//! See the crate documentation and the README for flags, metrics and Events.

use std::time::Duration;

use std::sync::Arc;

use bootsman_runtime::leader::{LeaderElection, always_leader};
use bootsman_runtime::metrics::Metrics;
use clap::Parser;
use tokio::sync::watch;

use bootsman_provider::{Config, SharedPool};

/// Cluster API infrastructure provider for a pool of bare-metal hosts (ByoHost, ByoMachine,
/// ByoCluster).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Watch only this namespace (clusterctl contract). All namespaces when empty.
    #[arg(long, env = "BOOTSMAN_NAMESPACE")]
    namespace: Option<String>,
    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value> (clusterctl contract).
    #[arg(long)]
    watch_filter: Option<String>,
    /// A shared pool of hosts: `NAMESPACE=ALLOWED1,ALLOWED2` or `NAMESPACE=*` (repeatable). A
    /// machine always may use hosts of its own namespace.
    #[arg(long = "pool", value_parser = SharedPool::parse)]
    pools: Vec<SharedPool>,
    /// How long a released host may take to report CleanupSucceeded before it is quarantined.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    release_timeout: Duration,
    /// Run the controllers only while holding the leader Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease (defaults to the pod's namespace, then `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    leader_elect_namespace: Option<String>,
    /// Address of the /livez, /readyz and /metrics server.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_bind_address: std::net::SocketAddr,
    /// Approve the client-certificate requests of enrolling and renewing hosts (and deny forged
    /// ones) while leading. Turn off only when another approver decides them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    approve_host_csrs: bool,
}

/// The controllers and, when `approve_host_csrs`, the host CSR approver, until `shutdown`.
async fn run_leading(
    client: kube::Client,
    config: Config,
    metrics: Arc<Metrics>,
    approve_host_csrs: bool,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let shutdown = futures::FutureExt::shared(shutdown);
    let approver = async {
        if approve_host_csrs {
            bootsman_provider::csr_approver::run(client.clone(), metrics.clone(), shutdown.clone()).await
        } else {
            Ok(())
        }
    };
    let (controllers, approver) = tokio::join!(
        bootsman_provider::run(client.clone(), config, metrics.clone(), shutdown.clone()),
        approver
    );
    controllers.and(approver)
}

/// Parses `90s`, `15m`, `1h` or a plain number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 90s, 15m or 1h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?}: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

/// The client of the infrastructure cluster. A stalled connection fails the request after
/// [`bootsman_provider::READ_TIMEOUT`] instead of hanging a reconcile forever; watches end on the
/// server's side before that (see [`bootsman_provider::WATCH_TIMEOUT_SECS`]).
async fn client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(bootsman_provider::READ_TIMEOUT);
    config.reset_reader_on_write = true;
    Ok(kube::Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    bootsman_runtime::telemetry::init("info,kube=warn");
    let client = client().await?;
    let config = Config {
        namespace: args.namespace,
        watch_filter: args.watch_filter,
        shared_pools: args.pools,
        release_timeout: args.release_timeout,
        ..Config::default()
    };
    let metrics = Arc::new(Metrics::new()?);
    let approve_host_csrs = args.approve_host_csrs;

    // Stops on SIGTERM or Ctrl-C.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // Ready once the process serves; readiness never depends on leadership.
    let server = bootsman_runtime::server::bind(args.metrics_bind_address).await?;
    let (_ready_tx, ready_rx) = watch::channel(true);
    let server_task = tokio::spawn(server.serve(metrics.clone(), ready_rx, stopped(stop_rx.clone())));

    let (mut leader, election) = if args.leader_elect {
        let ns = args.leader_elect_namespace.unwrap_or_else(|| "default".into());
        let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
            format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "provider".into()),
                std::process::id()
            )
        });
        let (rx, handle) = LeaderElection::new(client.clone(), ns, "bootsman-provider", identity)
            .start()
            .await?;
        (rx, Some(handle))
    } else {
        (always_leader(), None)
    };
    tracing::info!("waiting for leadership");
    tokio::select! {
        r = leader.wait_for(|held| *held) => { r?; }
        () = stopped(stop_rx.clone()) => { let _ = server_task.await; return Ok(()); }
    }
    tracing::info!("leading: starting controllers");
    let mut lost = leader.clone();
    let stop = stop_rx.clone();
    let shutdown = async move {
        tokio::select! {
            lost = async {
                // A closed channel (no election) never changes: leadership is never lost.
                if lost.wait_for(|held| !*held).await.is_err() {
                    std::future::pending::<()>().await;
                }
            } => { let () = lost; tracing::error!("lost the leader Lease") },
            () = stopped(stop) => {}
        }
    };
    let result = match election {
        Some(mut handle) => {
            let outcome = tokio::select! {
                r = run_leading(client, config, metrics, approve_host_csrs, shutdown) => r,
                r = &mut handle => Err(anyhow::anyhow!("the leader election ended: {r:?}")),
            };
            let _ = handle.stop().await;
            outcome
        }
        None => run_leading(client, config, metrics, approve_host_csrs, shutdown).await,
    };
    let _ = server_task.await;
    result?;
    if !*stop_rx.borrow() {
        anyhow::bail!(
            "stopped reconciling after losing the leader Lease; exiting so a fresh candidate starts"
        );
    }
    Ok(())
}
