//! What every reconcile of the provider shares: the client, the reflector stores that form the
//! in-memory pool index, the claim bookkeeping, Events, metrics and settings.

use std::sync::Arc;

use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::labels;
use bootsman_api::v1alpha1::Project;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::byo_machine::claim::Book;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pool;

/// The reflector stores the controllers read instead of the API server.
pub struct Stores {
    /// ByoHosts: the pool index.
    pub hosts: Store<ByoHost>,
    /// Heartbeat Leases of the hosts.
    pub leases: Store<Lease>,
    /// ByoMachines.
    pub byomachines: Store<ByoMachine>,
    /// CAPI Machines.
    pub machines: Store<Machine>,
    /// CAPI Clusters.
    pub clusters: Store<Cluster>,
    /// Projects, when [`Config::projects`] is on.
    pub projects: Option<Store<Project>>,
}

/// Shared state of the controllers.
pub struct Context {
    /// Client of the infrastructure cluster.
    pub client: kube::Client,
    /// Settings.
    pub config: Config,
    /// Every ByoHost the provider watches: the pool index.
    pub hosts: Store<ByoHost>,
    /// Every heartbeat Lease the provider watches (named after its host).
    pub leases: Store<Lease>,
    /// Every ByoMachine the provider reconciles.
    pub byomachines: Store<ByoMachine>,
    /// Every CAPI Machine the provider watches: the owners of ByoMachines.
    pub machines: Store<Machine>,
    /// Every CAPI Cluster the provider watches.
    pub clusters: Store<Cluster>,
    /// Every Project, when [`Config::projects`] is on: they decide which pools the machines of
    /// their namespaces draw from.
    pub projects: Option<Store<Project>>,
    /// What this process remembers about its claims: the machines waiting for a host, its own
    /// writes of ByoMachines, the hosts it is claiming.
    pub claims: Book,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
    /// The Secrets of Cluster API clusters (labelled `cluster.x-k8s.io/cluster-name`, as CAPI
    /// labels bootstrap data and kubeconfigs) in the watched namespaces: read here before asking
    /// the API server. A cache only: a Secret missing from it is read from the API server. One
    /// store per watched namespace (`None`: one watch of every namespace).
    cluster_secrets: Vec<(Option<String>, Store<Secret>)>,
    /// Stops the watches that fill [`Self::cluster_secrets`] when the context goes.
    _secrets_watches: Vec<AbortOnDrop>,
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the watch of cluster Secrets behind [`Context::cluster_secrets`] (without their
/// managed fields, which only cost memory here).
fn watch_cluster_secrets(client: &kube::Client, namespace: Option<&str>) -> (Store<Secret>, AbortOnDrop) {
    let api: kube::Api<Secret> = match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    };
    let config = watcher::Config::default()
        .labels(labels::CLUSTER_NAME)
        .timeout(crate::WATCH_TIMEOUT_SECS);
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|s: &mut Secret| s.managed_fields_mut().clear())
        .reflect(writer);
    let task = tokio::spawn(async move {
        stream.for_each(|_| async {}).await;
    });
    (store, AbortOnDrop(task.abort_handle()))
}

impl Context {
    /// Builds the context.
    pub fn new(client: kube::Client, config: Config, stores: Stores, metrics: Metrics) -> Arc<Self> {
        let reporter = Reporter {
            controller: config.instance.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        // Watched where the provider may read Secrets: the namespaces it is told about, else its
        // one namespace, else all.
        let namespaces: Vec<Option<String>> = if config.secret_namespaces.is_empty() {
            vec![config.namespace.clone()]
        } else {
            config.secret_namespaces.iter().cloned().map(Some).collect()
        };
        let mut cluster_secrets = Vec::new();
        let mut secrets_watches = Vec::new();
        for ns in namespaces {
            let (store, watch) = watch_cluster_secrets(&client, ns.as_deref());
            cluster_secrets.push((ns, store));
            secrets_watches.push(watch);
        }
        Arc::new(Self {
            client,
            config,
            hosts: stores.hosts,
            leases: stores.leases,
            byomachines: stores.byomachines,
            machines: stores.machines,
            clusters: stores.clusters,
            projects: stores.projects,
            claims: Book::default(),
            recorder,
            metrics,
            cluster_secrets,
            _secrets_watches: secrets_watches,
        })
    }

    /// Namespaces whose hosts a machine in `namespace` may use: its own, then the shared pools
    /// that allow it or, in a Project's namespace, the Project's host pools
    /// ([`bootsman_api::pools::pools_in`]).
    pub fn pools_for(&self, namespace: &str) -> Vec<String> {
        let projects = self.projects.as_ref().map(Store::state).unwrap_or_default();
        bootsman_api::pools::pools_in(
            &self.config.shared_pools,
            projects.iter().map(AsRef::as_ref),
            namespace,
        )
    }

    /// A Secret in `namespace`: from the cache of cluster Secrets when it is there, else from the
    /// API server (`None` when it does not exist).
    pub async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Arc<Secret>>, kube::Error> {
        let key = ObjectRef::new(name).within(namespace);
        let cached = self
            .cluster_secrets
            .iter()
            .filter(|(ns, _)| ns.as_deref().is_none_or(|ns| ns == namespace))
            .find_map(|(_, store)| store.get(&key));
        if let Some(s) = cached {
            return Ok(Some(s));
        }
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?.map(Arc::new))
    }

    /// The heartbeat Lease of a host.
    pub fn lease_of(&self, host: &ByoHost) -> Option<Arc<Lease>> {
        let ns = host.namespace()?;
        self.leases.get(&ObjectRef::new(&host.name_any()).within(&ns))
    }

    /// Whether the host's agent is alive right now.
    pub fn is_fresh(&self, host: &ByoHost) -> bool {
        pool::lease_fresh(self.lease_of(host).as_deref(), Timestamp::now())
    }

    /// Publishes an Event about `obj`; failures are logged, never fatal.
    pub async fn event<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning {
                kube::runtime::events::EventType::Warning
            } else {
                kube::runtime::events::EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "cannot publish Event");
        }
    }

    /// The retry of a failed reconcile of `obj` by `controller`: counted, quick after a lost race
    /// or while waiting, logged and retried after a pause otherwise.
    pub fn requeue_after_error<K: kube::Resource>(
        &self,
        controller: &'static str,
        obj: &K,
        err: &crate::error::Error,
    ) -> kube::runtime::controller::Action {
        // A step that must wait (a release in progress) is not a failure.
        if !crate::error::is_waiting(err) {
            self.metrics.failed(controller, err.label());
        }
        if let Some(after) = crate::error::retry_after(err) {
            return kube::runtime::controller::Action::requeue(after);
        }
        let meta = obj.meta();
        tracing::warn!(controller, name = ?meta.name, namespace = ?meta.namespace, error = %err, "reconcile failed");
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(5))
    }

    /// The owner Machine of a ByoMachine, from the Machine store.
    pub fn owner_machine(&self, bm: &ByoMachine) -> Option<Arc<Machine>> {
        let ns = bm.namespace()?;
        let owner = bm
            .owner_references()
            .iter()
            .find(|o| o.kind == "Machine" && o.api_version.starts_with("cluster.x-k8s.io/"))?;
        self.machines.get(&ObjectRef::new(&owner.name).within(&ns))
    }

    /// A Cluster by namespace and name, from the Cluster store.
    pub fn cluster(&self, namespace: &str, name: &str) -> Option<Arc<Cluster>> {
        self.clusters.get(&ObjectRef::new(name).within(namespace))
    }
}
