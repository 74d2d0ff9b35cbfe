//! # bootsman-provider
//!
//! The Cluster API infrastructure provider for a pool of bare-metal hosts. It runs three
//! controllers over one in-memory index (shared reflector stores of ByoHosts, their heartbeat
//! Leases, ByoMachines, CAPI Machines and Clusters, and with [`Config::projects`] the Projects
//! that decide their namespaces' pools, each watched once):
//!
//! - [`byo_cluster`]: ByoCluster → provisioned endpoint and failure domains;
//! - [`byo_machine`]: ByoMachine → a claimed host, its bootstrap data, `providerID`, and the
//!   release of the host when the machine goes (and, by a sweeper, of a host whose machine went
//!   without releasing it: [`byo_machine::orphans`]);
//! - [`host_health`]: heartbeat Lease → `AgentHealthy` and the host's phase; the host's pool
//!   RoleBinding owned by its ByoHost.
//!
//! The claim protocol ([`byo_machine::claim`]) never binds one host to two machines, nor two
//! hosts to one machine, even with several provider replicas racing. Decisions are pure
//! functions in [`pool`].

pub mod byo_cluster;
pub mod byo_machine;
pub mod config;
pub mod context;
pub mod enrollment;
pub mod error;
pub mod host_health;
pub mod metrics;
pub mod pool;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::labels;
use bootsman_api::v1alpha1::Project;
use bootsman_api::v1beta1::{ByoCluster, ByoHost, ByoMachine};
use bootsman_runtime::lifecycle::Readiness;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
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

/// How long a client of the provider waits for a response before the request fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the API server keeps one watch request open: shorter than [`READ_TIMEOUT`], so a
/// quiet watch is renewed before the client gives up on it.
pub const WATCH_TIMEOUT_SECS: u32 = 45;

/// Objects a shared reflector buffers for its slowest subscriber before it waits for it.
const SHARED_BUFFER: usize = 4096;

/// ByoMachine reconciles in flight at once. Each is a handful of round trips; more would only
/// queue at the API server and raise claim conflicts.
const MACHINE_CONCURRENCY: u16 = 32;
/// Host-health and ByoCluster reconciles in flight at once.
const OTHER_CONCURRENCY: u16 = 8;
/// Burst of triggers for one object folded into one reconcile.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// The same for host health: a claim and its bootstrap hand-over change a host twice within
/// moments, and its phase is written once for both.
const HEALTH_DEBOUNCE: Duration = Duration::from_millis(500);

/// Starts a shared reflector of `K` (in `namespace`, or all): a task that keeps the returned
/// store current and hands every change to the `N` returned subscriptions.
fn shared<K, const N: usize>(
    tasks: &mut tokio::task::JoinSet<()>,
    client: &kube::Client,
    namespace: Option<&str>,
    config: &watcher::Config,
) -> anyhow::Result<(reflector::Store<K>, [reflector::ReflectHandle<K>; N])>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store_shared::<K>(SHARED_BUFFER);
    let mut subs = Vec::with_capacity(N);
    for _ in 0..N {
        subs.push(writer.subscribe().context("a shared store is subscribable")?);
    }
    let subs: [reflector::ReflectHandle<K>; N] = subs
        .try_into()
        .map_err(|_| anyhow::anyhow!("subscriptions of a shared store"))?;
    // Managed fields are never read here and are most of a small object's size.
    let stream = watcher(api::<K>(client, namespace), config.clone())
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect_shared(writer);
    tasks.spawn(async move {
        stream.for_each(|_| async {}).await;
    });
    Ok((store, subs))
}

/// Runs the controllers until `shutdown` resolves. Reconciles only while running; callers that
/// use leader election start this once they lead and stop it when they lose the lease.
///
/// Every kind is watched once, by a shared reflector, and the controllers start only when every
/// store has listed: a claim decided from an index that has not listed yet could miss the host a
/// machine already holds.
pub async fn run(
    client: kube::Client,
    config: Config,
    metrics: std::sync::Arc<bootsman_runtime::metrics::Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    run_reporting(client, config, metrics, Readiness::detached(), shutdown).await
}

/// [`run`], telling `ready` once every store has listed (the process's `/readyz`).
pub async fn run_reporting(
    client: kube::Client,
    config: Config,
    metrics: std::sync::Arc<bootsman_runtime::metrics::Metrics>,
    ready: Readiness,
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
    let watch = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let mut filtered = watch.clone();
    if let Some(v) = &config.watch_filter {
        filtered = filtered.labels(&format!("cluster.x-k8s.io/watch-filter={v}"));
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let mut reflectors = tokio::task::JoinSet::new();
    let hns = host_ns.as_deref();
    let (hosts, [host_events, host_events_health, host_events_zones]) =
        shared(&mut reflectors, &client, hns, &watch)?;
    let (leases, [lease_events]) = shared(&mut reflectors, &client, hns, &watch)?;
    let (byomachines, [bm_events, bm_events_clusters]) =
        shared(&mut reflectors, &client, ns.as_deref(), &filtered)?;
    let (machines, [machine_events]) = shared(&mut reflectors, &client, ns.as_deref(), &watch)?;
    let (clusters, [cluster_events, cluster_events_bc]) =
        shared(&mut reflectors, &client, ns.as_deref(), &watch)?;
    // Projects decide the pools of their namespaces' machines; without a namespace of its own
    // the provider watches them (few and small).
    let projects = (config.projects && ns.is_none()).then(|| {
        let (store, writer) = reflector::store_shared::<Project>(SHARED_BUFFER);
        let events = writer.subscribe();
        let stream = watcher(Api::<Project>::all(client.clone()), watch.clone())
            .default_backoff()
            .modify(|p: &mut Project| p.metadata.managed_fields = None)
            .reflect_shared(writer);
        reflectors.spawn(async move {
            stream.for_each(|_| async {}).await;
        });
        (store, events)
    });
    let (project_store, project_events) = match projects {
        Some((store, events)) => (Some(store), events),
        None => (None, None),
    };

    let stores = context::Stores {
        hosts: hosts.clone(),
        leases: leases.clone(),
        byomachines: byomachines.clone(),
        machines: machines.clone(),
        clusters: clusters.clone(),
        projects: project_store.clone(),
    };
    let listed = async {
        tokio::try_join!(
            hosts.wait_until_ready(),
            leases.wait_until_ready(),
            byomachines.wait_until_ready(),
            machines.wait_until_ready(),
            clusters.wait_until_ready(),
            async {
                match &project_store {
                    Some(p) => p.wait_until_ready().await,
                    None => Ok(()),
                }
            },
        )
        .map(|_| ())
    };
    tracing::info!("listing hosts, Leases, machines and clusters");
    tokio::select! {
        r = listed => {
            r.context("a reflector stopped before its first list")?;
            ready.ready();
        }
        () = stopped(stop_rx.clone()) => {
            reflectors.shutdown().await;
            return Ok(());
        }
    }
    let ctx = Context::new(client.clone(), config, stores, metrics);
    let machine_cfg = controller::Config::default()
        .concurrency(MACHINE_CONCURRENCY)
        .debounce(DEBOUNCE);
    let other_cfg = controller::Config::default()
        .concurrency(OTHER_CONCURRENCY)
        .debounce(DEBOUNCE);

    // ByoMachines: woken by their hosts, by a host that becomes claimable (one waiting machine
    // per such host), by their Machine (bootstrap data), and by their Cluster (pause,
    // infrastructure).
    let c = ctx.clone();
    let claimable = std::sync::Mutex::new(HashMap::<ObjectRef<ByoHost>, bool>::new());
    let bm_for_clusters = byomachines.clone();
    let bm_for_projects = byomachines.clone();
    let machine_ctl = Controller::for_shared_stream(bm_events, byomachines.clone())
        .with_config(machine_cfg)
        .watches_shared_stream(host_events, move |host: Arc<ByoHost>| {
            let mut refs = Vec::new();
            if let Some(r) = &host.spec.machine_ref {
                refs.push(ObjectRef::new(&r.name).within(&r.namespace));
            }
            let now = pool::unavailable(&host, c.is_fresh(&host)).is_none();
            let before = claimable
                .lock()
                .ok()
                .and_then(|mut m| m.insert(ObjectRef::from_obj(host.as_ref()), now));
            if now && before != Some(true) {
                refs.extend(byo_machine::claim::wake_for(&c, &host));
            }
            refs
        })
        .watches_shared_stream(machine_events, |m: Arc<Machine>| {
            let ns = m.namespace()?;
            (m.spec.infrastructure_ref.kind == "ByoMachine")
                .then(|| ObjectRef::new(&m.spec.infrastructure_ref.name).within(&ns))
        })
        .watches_shared_stream(cluster_events, move |cl: Arc<Cluster>| {
            let ns = cl.namespace().unwrap_or_default();
            let name = cl.name_any();
            bm_for_clusters
                .state()
                .iter()
                .filter(|bm| {
                    bm.namespace().as_deref() == Some(&ns)
                        && bm.labels().get(labels::CLUSTER_NAME) == Some(&name)
                })
                .map(|bm| ObjectRef::from_obj(bm.as_ref()))
                .collect::<Vec<_>>()
        });
    // A Project's change (its pools, the namespaces it holds) wakes the machines of its
    // namespaces that have no host yet.
    let machine_ctl = match project_events {
        Some(events) => machine_ctl.watches_shared_stream(events, move |p: Arc<Project>| {
            let namespaces = p.named_namespaces();
            bm_for_projects
                .state()
                .iter()
                .filter(|bm| bm.spec.provider_id.is_none())
                .filter(|bm| bm.namespace().is_some_and(|n| namespaces.contains(n.as_str())))
                .map(|bm| ObjectRef::from_obj(bm.as_ref()))
                .collect::<Vec<_>>()
        }),
        None => machine_ctl,
    };
    let machine_ctl = machine_ctl
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(byo_machine::reconcile, byo_machine::error_policy, ctx.clone())
        .for_each(|_| async {});

    let clusters_ctl = Controller::new(api::<ByoCluster>(&client, ns.as_deref()), filtered);
    // A host whose zone counts or stops counting (its zone label, or its health) changes the
    // failure domains of every ByoCluster that may use its pool.
    let byoclusters = clusters_ctl.store();
    let zones_seen = std::sync::Mutex::new(HashMap::<ObjectRef<ByoHost>, Option<String>>::new());
    let c = ctx.clone();
    let cluster_ctl = clusters_ctl
        .with_config(other_cfg.clone())
        .watches_shared_stream(host_events_zones, move |host: Arc<ByoHost>| {
            let zone = byo_cluster::zone_of(&host).map(String::from);
            let before = zones_seen
                .lock()
                .ok()
                .and_then(|mut m| m.insert(ObjectRef::from_obj(host.as_ref()), zone.clone()));
            if before == Some(zone) {
                return Vec::new();
            }
            let pool = host.namespace().unwrap_or_default();
            byoclusters
                .state()
                .iter()
                .filter(|bc| bc.namespace().is_some_and(|ns| c.pools_for(&ns).contains(&pool)))
                .map(|bc| ObjectRef::from_obj(bc.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(cluster_events_bc, |cl: Arc<Cluster>| {
            let ns = cl.namespace()?;
            let r = cl.spec.infrastructure_ref.clone()?;
            (r.kind == "ByoCluster").then(|| ObjectRef::new(&r.name).within(&ns))
        })
        .watches_shared_stream(bm_events_clusters, |bm: Arc<ByoMachine>| {
            // A deleting ByoCluster waits for its machines; their going wakes it.
            let ns = bm.namespace()?;
            let cluster = bm.labels().get(labels::CLUSTER_NAME)?.clone();
            Some(ObjectRef::new(&cluster).within(&ns))
        })
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(byo_cluster::reconcile, byo_cluster::error_policy, ctx.clone())
        .for_each(|_| async {});

    let adopted = Arc::new(host_health::AdoptedBindings::default());
    let health_ctl = Controller::for_shared_stream(host_events_health, hosts.clone())
        .with_config(other_cfg.debounce(HEALTH_DEBOUNCE))
        .watches_shared_stream(lease_events, |lease: Arc<Lease>| {
            let ns = lease.namespace()?;
            Some(ObjectRef::new(&lease.name_any()).within(&ns))
        })
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(
            move |host, ctx| host_health::reconcile(host, ctx, adopted.clone()),
            host_health::error_policy,
            ctx.clone(),
        )
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
    // Claimed hosts whose machine is gone are released after a grace period.
    let sweep_ctx = ctx.clone();
    let mut sweep_stop = stop_rx.clone();
    let sweeper = async move {
        let mut sweeper = byo_machine::orphans::Sweeper::default();
        let every = byo_machine::orphans::sweep_every(sweep_ctx.config.orphan_grace);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = sweep_stop.wait_for(|s| *s) => break,
            }
            sweeper.sweep(&sweep_ctx).await;
        }
    };
    tracing::info!("bootsman-provider controllers running");
    tokio::join!(machine_ctl, cluster_ctl, health_ctl, gauges, sweeper);
    reflectors.shutdown().await;
    Ok(())
}
