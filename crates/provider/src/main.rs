//! `bootsman-provider`: the Cluster API infrastructure provider for a pool of bare-metal hosts.
//! See the crate documentation and the README for flags, metrics and Events.

use std::sync::Arc;
use std::time::Duration;

use bootsman_runtime::lifecycle::{self, ProcessArgs};
use bootsman_runtime::metrics::Metrics;
use clap::Parser;

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
    /// The namespaces whose Secrets the provider may read and write, when its rights to Secrets
    /// are namespaced (the chart's `namespaces`; comma-separated): its cache of cluster Secrets
    /// watches each of them instead of every namespace. Every namespace when empty.
    #[arg(long, env = "BOOTSMAN_SECRET_NAMESPACES", value_delimiter = ',')]
    secret_namespaces: Vec<String>,
    /// How long a released host may take to report CleanupSucceeded before it is quarantined.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    release_timeout: Duration,
    /// How long a claimed host whose ByoMachine is gone (a finalizer removed by hand, an
    /// interrupted `clusterctl move`) stays claimed before it is released and reset.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    orphan_grace: Duration,
    /// Honour Projects (bootsman.io/v1alpha1): a machine in a namespace a Project holds draws
    /// hosts only from that namespace and the Project's spec.hostPools, whatever --pool allows.
    /// Needs the Project CRD and list/watch on projects; ignored with --namespace.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    projects: bool,
    #[command(flatten)]
    process: ProcessArgs,
    /// Approve the client-certificate requests of enrolling and renewing hosts (and deny forged
    /// ones) while leading. Turn off only when another approver decides them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    approve_host_csrs: bool,
    /// Longest lifetime a host's certificate request may ask for (`spec.expirationSeconds`);
    /// longer or unbounded requests are denied with `LifetimeTooLong`. At least the agents'
    /// `--certificate-lifetime` (720h by default).
    #[arg(long, default_value = "720h", value_parser = parse_duration)]
    max_host_certificate_lifetime: Duration,
}

/// The controllers and, with `approver` options, the host CSR approver, until `shutdown`.
async fn run_leading(
    client: kube::Client,
    config: Config,
    metrics: Arc<Metrics>,
    approver: Option<bootsman_provider::enrollment::Options>,
    ready: lifecycle::Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let shutdown = futures::FutureExt::shared(shutdown);
    let approver = async {
        match approver {
            Some(options) => {
                bootsman_provider::enrollment::run(client.clone(), metrics.clone(), options, shutdown.clone())
                    .await
            }
            None => Ok(()),
        }
    };
    let (controllers, approver) = tokio::join!(
        bootsman_provider::run_reporting(client.clone(), config, metrics.clone(), ready, shutdown.clone()),
        approver
    );
    controllers.and(approver)
}

/// A duration flag (`bootsman_runtime::duration`: `90s`, `15m`, `1h30m`, `2d`, plain seconds).
fn parse_duration(s: &str) -> Result<Duration, String> {
    bootsman_runtime::duration::parse(s)
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
        projects: args.projects,
        release_timeout: args.release_timeout,
        orphan_grace: args.orphan_grace,
        secret_namespaces: args.secret_namespaces,
        ..Config::default()
    };
    let metrics = Arc::new(Metrics::new()?);
    let approver = args
        .approve_host_csrs
        .then_some(bootsman_provider::enrollment::Options {
            max_certificate_lifetime: args.max_host_certificate_lifetime,
        });
    let process = args.process.process("bootsman-provider");
    lifecycle::run(
        client.clone(),
        process,
        metrics.clone(),
        |shutdown, ready| async move {
            run_leading(client, config, metrics, approver, ready, shutdown)
                .await
                .map_err(Failed)
        },
    )
    .await?;
    Ok(())
}

/// A failure of the controllers or the approver, with its causes.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
struct Failed(anyhow::Error);
