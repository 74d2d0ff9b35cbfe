//! # bootsman-provider
//!
//! The Cluster API infrastructure provider for a pool of bare-metal hosts. It runs three
//! controllers over one in-memory pool index (reflector stores of ByoHosts and their heartbeat
//! Leases):
//!
//! - [`byo_cluster`]: ByoCluster → provisioned endpoint and failure domains;
//! - [`byo_machine`]: ByoMachine → a claimed host, its bootstrap data, `providerID`, and the
//!   release of the host when the machine goes;
//! - [`host_health`]: heartbeat Lease → `AgentHealthy` and the host's phase.
//!
//! The claim protocol ([`byo_machine::claim`]) never binds one host to two machines, nor two
//! hosts to one machine, even with several provider replicas racing. Decisions are pure
//! functions in [`pool`].

pub mod byo_cluster;
pub mod byo_machine;
pub mod config;
pub mod context;
pub mod csr_approver;
pub mod error;
pub mod host_health;
pub mod metrics;
pub mod pool;

use std::future::Future;
use std::time::Duration;

use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoCluster, ByoHost, ByoMachine};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};

pub use config::{Config, SharedPool};

pub use context::Context;

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controllers until `shutdown` resolves. Reconciles only while running; callers that
/// use leader election start this once they lead and stop it when they lose the lease.
pub async fn run(
    client: kube::Client,
    config: Config,
    metrics: std::sync::Arc<bootsman_runtime::metrics::Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let metrics = metrics::Metrics::register(metrics)?;
    let ns = config.namespace.clone();
    // Hosts may live in shared pool namespaces outside the watched namespace.
    let host_ns = if config.shared_pools.is_empty() {
        ns.clone()
    } else {
        None
    };
    let mut filtered = watcher::Config::default();
    if let Some(v) = &config.watch_filter {
        filtered = filtered.labels(&format!("cluster.x-k8s.io/watch-filter={v}"));
    }

    let (hosts, hosts_writer) = reflector::store::<ByoHost>();
    let host_stream = watcher(
        api::<ByoHost>(&client, host_ns.as_deref()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(hosts_writer)
    .applied_objects();
    let (leases, leases_writer) = reflector::store::<Lease>();
    let lease_stream = watcher(
        api::<Lease>(&client, host_ns.as_deref()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(leases_writer)
    .applied_objects();
    let ctx = Context::new(client.clone(), config, hosts, leases, metrics);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // ByoMachines: woken by their hosts, by free hosts arriving (while waiting), by their Machine
    // (bootstrap data), and by their Cluster (pause, infrastructure).
    let machines = Controller::new(api::<ByoMachine>(&client, ns.as_deref()), filtered.clone());
    let bm_store = machines.store();
    let c = ctx.clone();
    let bm_store2 = bm_store.clone();
    let machine_ctl = machines
        .watches_stream(host_stream, move |host: ByoHost| {
            let mut refs = c.waiting_machines();
            if let Some(r) = &host.spec.machine_ref {
                refs.push(ObjectRef::new(&r.name).within(&r.namespace));
            }
            refs
        })
        .watches(
            api::<Machine>(&client, ns.as_deref()),
            watcher::Config::default(),
            |m: Machine| {
                let ns = m.namespace()?;
                (m.spec.infrastructure_ref.kind == "ByoMachine")
                    .then(|| ObjectRef::new(&m.spec.infrastructure_ref.name).within(&ns))
            },
        )
        .watches(
            api::<Cluster>(&client, ns.as_deref()),
            watcher::Config::default(),
            move |cl: Cluster| {
                let ns = cl.namespace().unwrap_or_default();
                let name = cl.name_any();
                bm_store2
                    .state()
                    .iter()
                    .filter(|bm| {
                        bm.namespace().as_deref() == Some(&ns)
                            && bm.labels().get(labels::CLUSTER_NAME) == Some(&name)
                    })
                    .map(|bm| ObjectRef::from_obj(bm.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(byo_machine::reconcile, byo_machine::error_policy, ctx.clone())
        .for_each(|_| async {});

    let clusters = Controller::new(api::<ByoCluster>(&client, ns.as_deref()), filtered);
    let bm_for_clusters = bm_store.clone();
    let cluster_ctl = clusters
        .watches(
            api::<Cluster>(&client, ns.as_deref()),
            watcher::Config::default(),
            |cl: Cluster| {
                let ns = cl.namespace()?;
                let r = cl.spec.infrastructure_ref?;
                (r.kind == "ByoCluster").then(|| ObjectRef::new(&r.name).within(&ns))
            },
        )
        .watches(
            api::<ByoMachine>(&client, ns.as_deref()),
            watcher::Config::default(),
            move |bm: ByoMachine| {
                // A deleting ByoCluster waits for its machines; their going wakes it.
                let ns = bm.namespace()?;
                let cluster = bm.labels().get(labels::CLUSTER_NAME)?.clone();
                let _ = &bm_for_clusters;
                Some(ObjectRef::new(&cluster).within(&ns))
            },
        )
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(byo_cluster::reconcile, byo_cluster::error_policy, ctx.clone())
        .for_each(|_| async {});

    let health_ctl = Controller::new(
        api::<ByoHost>(&client, host_ns.as_deref()),
        watcher::Config::default(),
    )
    .watches_stream(lease_stream, |lease: Lease| {
        let ns = lease.namespace()?;
        Some(ObjectRef::new(&lease.name_any()).within(&ns))
    })
    .graceful_shutdown_on(stopped(stop_rx.clone()))
    .run(host_health::reconcile, host_health::error_policy, ctx.clone())
    .for_each(|_| async {});

    let gauge_ctx = ctx.clone();
    let mut gauge_stop = stop_rx.clone();
    let gauges = async move {
        loop {
            host_health::update_pool_gauges(&gauge_ctx);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = gauge_stop.wait_for(|s| *s) => break,
            }
        }
    };
    tracing::info!("bootsman-provider controllers running");
    tokio::join!(machine_ctl, cluster_ctl, health_ctl, gauges);
    Ok(())
}
