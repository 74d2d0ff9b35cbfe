//! `bootsman-operator`: the provisioning operator of Bootsman. It turns each BootsmanCluster into
//! the Cluster API objects of a child cluster and keeps them matching. See the crate
//! documentation and the README's `bootsman-operator` section for flags, metrics and Events.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bootsman_api::pools::SharedPool;
use bootsman_operator::OperatorSettings;
use bootsman_operator::controller::{self, Context};
use bootsman_runtime::lifecycle::{self, ProcessArgs};
use bootsman_runtime::metrics::Metrics;
use clap::Parser;

/// Provisioning operator: BootsmanCluster → Cluster API objects (Cluster, ByoCluster,
/// KubeadmControlPlane, MachineDeployments, addon HelmChartProxies).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Watch only this namespace. All namespaces when empty.
    #[arg(long, env = "BOOTSMAN_NAMESPACE")]
    namespace: Option<String>,
    /// Settings file (YAML): addon chart repositories, versions and image registries, and the
    /// kube-vip image. Public upstream locations when not given.
    #[arg(long, env = "BOOTSMAN_OPERATOR_SETTINGS")]
    settings: Option<PathBuf>,
    /// A shared pool of hosts, as the provider's flag of the same name: `NAMESPACE=ALLOWED1,ALLOWED2`
    /// or `NAMESPACE=*` (repeatable). Its free hosts count for `HostsAvailable` of clusters in the
    /// allowed namespaces.
    #[arg(long = "pool", value_parser = SharedPool::parse)]
    pools: Vec<SharedPool>,
    /// Run the Project controller (namespaces, member RoleBindings, host-pool access, usage of
    /// each Project). Needs cluster-wide rights, so it never runs with `--namespace`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    projects: bool,
    #[command(flatten)]
    process: ProcessArgs,
}

/// The client of the management cluster; a stalled connection fails the request instead of
/// hanging a reconcile.
async fn client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(330));
    Ok(kube::Client::try_from(config)?)
}

/// The controller never fails on its own; it runs until shutdown.
#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
enum Never {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    bootsman_runtime::telemetry::init("info,kube=warn");
    let settings = match &args.settings {
        Some(path) => OperatorSettings::from_file(path)?,
        None => OperatorSettings::default(),
    };
    let client = client().await?;
    let metrics = Arc::new(Metrics::new()?);
    let process = args.process.process("bootsman-operator");
    let namespace = args.namespace;
    let projects = args.projects && namespace.is_none();
    let ctx = Arc::new(
        Context::new(client.clone(), settings, metrics.clone())
            .with_shared_pools(args.pools)
            .with_projects(projects),
    );
    let project_client = client.clone();
    lifecycle::run(client, process, metrics, |shutdown, ready| async move {
        if projects {
            // Both stop when `shutdown` resolves.
            let shutdown = futures::FutureExt::shared(shutdown);
            tokio::join!(
                controller::run(ctx, namespace, ready, shutdown.clone()),
                bootsman_operator::project::run(project_client, shutdown),
            );
        } else {
            controller::run(ctx, namespace, ready, shutdown).await;
        }
        Ok::<(), Never>(())
    })
    .await?;
    Ok(())
}
