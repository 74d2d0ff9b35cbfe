//! What every reconcile of the provider shares: the client, the reflector stores that form the
//! in-memory pool index, the machines waiting for a host, Events, metrics and settings.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pool;

/// How long a host whose claim started in this process is skipped by the other reconciles of
/// this process: long enough for the pool index to see the claim.
pub const CLAIM_MEMORY: std::time::Duration = std::time::Duration::from_secs(10);

/// An object's `resourceVersion` as a number (what etcd-backed API servers use).
fn revision<K: kube::Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

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
}

/// The machines waiting for a host, in the order they started waiting.
#[derive(Default, Debug)]
pub struct Waiting {
    next: u64,
    by_machine: HashMap<ObjectRef<ByoMachine>, u64>,
    by_order: BTreeMap<u64, ObjectRef<ByoMachine>>,
}

impl Waiting {
    /// Adds a machine (keeping its place when it already waits).
    pub fn insert(&mut self, machine: ObjectRef<ByoMachine>) {
        if self.by_machine.contains_key(&machine) {
            return;
        }
        self.next += 1;
        self.by_order.insert(self.next, machine.clone());
        self.by_machine.insert(machine, self.next);
    }

    /// Removes a machine.
    pub fn remove(&mut self, machine: &ObjectRef<ByoMachine>) {
        if let Some(seq) = self.by_machine.remove(machine) {
            self.by_order.remove(&seq);
        }
    }

    /// Removes and returns the longest-waiting machine for which `fits` holds.
    pub fn take_first(
        &mut self,
        mut fits: impl FnMut(&ObjectRef<ByoMachine>) -> bool,
    ) -> Option<ObjectRef<ByoMachine>> {
        let seq = self.by_order.iter().find(|(_, m)| fits(m)).map(|(seq, _)| *seq)?;
        let m = self.by_order.remove(&seq)?;
        self.by_machine.remove(&m);
        Some(m)
    }

    /// How many machines wait.
    pub fn len(&self) -> usize {
        self.by_machine.len()
    }

    /// Whether no machine waits.
    pub fn is_empty(&self) -> bool {
        self.by_machine.is_empty()
    }
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
    /// ByoMachines waiting for a free host, oldest first (by the order they started waiting);
    /// one is woken for each host that becomes claimable.
    pub waiting: Mutex<Waiting>,
    /// The newest `resourceVersion` of each ByoMachine (by uid) as returned by this provider's
    /// own writes, until the store has caught up with it.
    pub written: Mutex<HashMap<String, u64>>,
    /// Hosts this provider is claiming or has just claimed, with when: concurrent reconciles in
    /// this process pick other hosts instead of losing a race to each other.
    pub claiming: Mutex<HashMap<ObjectRef<ByoHost>, std::time::Instant>>,
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
            waiting: Mutex::new(Waiting::default()),
            written: Mutex::new(HashMap::new()),
            claiming: Mutex::new(HashMap::new()),
            recorder,
            metrics,
            cluster_secrets,
            _secrets_watches: secrets_watches,
        })
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

    /// Marks a machine as waiting for a host (or not).
    pub fn set_waiting(&self, machine: ObjectRef<ByoMachine>, waiting: bool) {
        if let Ok(mut w) = self.waiting.lock() {
            if waiting {
                w.insert(machine);
            } else {
                w.remove(&machine);
            }
        }
    }

    /// Remembers the version of a ByoMachine that one of our writes returned.
    pub fn note_written(&self, bm: &ByoMachine) {
        let (Some(uid), Some(rv)) = (bm.uid(), revision(bm)) else {
            return;
        };
        if let Ok(mut w) = self.written.lock() {
            let e = w.entry(uid).or_insert(rv);
            *e = (*e).max(rv);
        }
    }

    /// Whether `bm` is older than a version this provider wrote itself. Its watch event is on
    /// the way and will reconcile the machine again; acting on the old copy would only repeat
    /// writes. Versions that are not numbers are never called stale.
    pub fn is_stale(&self, bm: &ByoMachine) -> bool {
        let (Some(uid), Some(rv)) = (bm.uid(), revision(bm)) else {
            return false;
        };
        let Ok(mut w) = self.written.lock() else {
            return false;
        };
        match w.get(&uid) {
            Some(&newest) if rv < newest => true,
            Some(_) => {
                w.remove(&uid);
                false
            }
            None => false,
        }
    }

    /// Marks `host` as being claimed by this process. `false` when a claim of it started here
    /// less than [`CLAIM_MEMORY`] ago.
    pub fn start_claim(&self, host: &ByoHost) -> bool {
        let Ok(mut c) = self.claiming.lock() else {
            return true;
        };
        let now = std::time::Instant::now();
        c.retain(|_, t| now.duration_since(*t) < CLAIM_MEMORY);
        let key = ObjectRef::from_obj(host);
        if c.contains_key(&key) {
            return false;
        }
        c.insert(key, now);
        true
    }

    /// Whether a claim of `host` started in this process less than [`CLAIM_MEMORY`] ago.
    pub fn is_being_claimed(&self, host: &ByoHost) -> bool {
        self.claiming.lock().is_ok_and(|c| {
            c.get(&ObjectRef::from_obj(host))
                .is_some_and(|t| t.elapsed() < CLAIM_MEMORY)
        })
    }

    /// Forgets a claim that failed for a reason other than a lost race.
    pub fn forget_claim(&self, host: &ByoHost) {
        if let Ok(mut c) = self.claiming.lock() {
            c.remove(&ObjectRef::from_obj(host));
        }
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

    /// Takes the longest-waiting machine that may use `host` (its pools, selector and failure
    /// domain), so a host that becomes claimable wakes one machine that can take it, not all.
    pub fn take_waiting_for(&self, host: &ByoHost) -> Option<ObjectRef<ByoMachine>> {
        let mut w = self.waiting.lock().ok()?;
        if w.is_empty() {
            return None;
        }
        let hns = host.namespace()?;
        w.take_first(|r| {
            let ns = r.namespace.clone().unwrap_or_default();
            let pools = self.config.pools_for(&ns);
            if !pools.contains(&hns) {
                return false;
            }
            // A machine we cannot look at is woken anyway; its reconcile decides.
            let Some(bm) = self.byomachines.get(r) else {
                return true;
            };
            let fd = self
                .owner_machine(&bm)
                .and_then(|m| m.spec.failure_domain.clone());
            let uid = bm.uid().unwrap_or_default();
            let wanted = pool::Wanted {
                machine_uid: &uid,
                pools: &pools,
                selector: bm.spec.selector.as_ref(),
                failure_domain: fd.as_deref(),
            };
            !matches!(
                pool::choose(&[host], &wanted, |_| true),
                pool::Choice::NoMatchingHost
            )
        })
    }
}
