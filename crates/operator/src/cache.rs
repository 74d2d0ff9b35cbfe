//! What the operator remembers between reconciles, so that a cluster at rest costs the API
//! server nothing but the watches.
//!
//! - [`Stores`]: reflector caches of the objects the controller watches anyway (CAPI Clusters,
//!   KubeadmControlPlanes, MachineDeployments, Machines, ByoMachines, ByoHosts), filled by the
//!   same watch streams that wake the clusters. A reconcile reads status and compares rendered
//!   objects against them instead of sending a GET or LIST. `managedFields` are dropped before
//!   an object is stored. A reconcile waits until every store has listed once.
//! - [`Memo`]: per BootsmanCluster, what its last reconciles found about the objects no watch
//!   covers: the rendered objects of other kinds as they were last applied or seen in place, the
//!   kubeconfig Secret, the CNI's ClusterResourceSet and the add-ons' HelmChartProxies. Those
//!   are read again only while they are not done yet, and every object is read again in a
//!   *thorough* reconcile: the first in a process, after a spec change, and every
//!   [`THOROUGH_EVERY`] (so a rendered object of an unwatched kind deleted or changed by someone
//!   else is set back within that time; one of a watched kind at once).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bootsman_api::capi::{Cluster, KubeadmControlPlane, Machine, MachineDeployment};
use bootsman_api::labels;
use bootsman_api::pools::{self, SharedPool};
use bootsman_api::v1alpha1::Project;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store, store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// How often every object of a cluster is read from the API server again, whatever the caches
/// and memos say.
pub const THOROUGH_EVERY: Duration = Duration::from_secs(600);

/// The reflector caches a reconcile reads (see the module docs).
#[derive(Clone)]
pub struct Stores {
    pub(crate) clusters: Store<Cluster>,
    pub(crate) control_planes: Store<KubeadmControlPlane>,
    pub(crate) machine_deployments: Store<MachineDeployment>,
    pub(crate) machines: Store<Machine>,
    pub(crate) byomachines: Store<ByoMachine>,
    pub(crate) hosts: Vec<Store<ByoHost>>,
    /// Projects, when the operator honours them: they decide the pools of their namespaces.
    pub(crate) projects: Option<Store<Project>>,
    /// How many of the watch streams have finished their first list.
    listed: Arc<AtomicUsize>,
    /// How many watch streams fill these stores.
    streams: usize,
}

impl Stores {
    /// Whether every store has been filled by a first list.
    pub fn synced(&self) -> bool {
        self.listed.load(Ordering::Acquire) >= self.streams
    }

    /// The Machines of cluster `name` in `ns` (by the CAPI cluster-name label).
    pub fn machines_of(&self, ns: &str, name: &str) -> Vec<Arc<Machine>> {
        of_cluster(&self.machines, ns, name)
    }

    /// The ByoMachines of cluster `name` in `ns` (by the CAPI cluster-name label).
    pub fn byomachines_of(&self, ns: &str, name: &str) -> Vec<Arc<ByoMachine>> {
        of_cluster(&self.byomachines, ns, name)
    }

    /// Namespaces whose hosts the machines of namespace `ns` may use, as the provider decides
    /// it ([`pools_in`]; without Projects, the `--pool` flags alone).
    pub fn pools_for(&self, shared: &[SharedPool], ns: &str) -> Vec<String> {
        pools_in(shared, self.projects.as_ref(), ns)
    }

    /// The ByoHosts of namespace `ns`.
    pub fn hosts_in(&self, ns: &str) -> Vec<ByoHost> {
        self.hosts
            .iter()
            .flat_map(Store::state)
            .filter(|h| h.namespace().as_deref() == Some(ns))
            .map(|h| (*h).clone())
            .collect()
    }
}

/// [`pools::pools_in`] over the Projects of `projects` (none when the operator does not honour
/// them).
pub fn pools_in(shared: &[SharedPool], projects: Option<&Store<Project>>, ns: &str) -> Vec<String> {
    let projects = projects.map(Store::state).unwrap_or_default();
    pools::pools_in(shared, projects.iter().map(AsRef::as_ref), ns)
}

/// Objects of `store` in `ns` labelled as belonging to cluster `name`.
fn of_cluster<K>(store: &Store<K>, ns: &str, name: &str) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .into_iter()
        .filter(|o| {
            o.meta().namespace.as_deref() == Some(ns)
                && o.labels().get(labels::CLUSTER_NAME).map(String::as_str) == Some(name)
        })
        .collect()
}

/// Looks up `name` in `ns` in `store`.
pub fn lookup<K>(store: &Store<K>, ns: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(ns))
}

/// Builds [`Stores`] and the watch streams that fill them; each stream must be polled (the
/// controller does, as its triggers).
pub struct StoreBuilder {
    listed: Arc<AtomicUsize>,
    streams: usize,
}

impl StoreBuilder {
    /// No stream yet.
    pub fn new() -> Self {
        Self {
            listed: Arc::default(),
            streams: 0,
        }
    }

    /// A watch of `api` (with `config`) reflected into a new store: returns the store and the
    /// stream of touched objects for the controller.
    pub fn watch<K>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
    ) -> (
        Store<K>,
        impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    )
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let (reader, writer) = store();
        let listed = self.listed.clone();
        let once = AtomicBool::new(false);
        self.streams += 1;
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None)
            .reflect(writer)
            .inspect(move |event| {
                if matches!(event, Ok(watcher::Event::InitDone)) && !once.swap(true, Ordering::AcqRel) {
                    listed.fetch_add(1, Ordering::AcqRel);
                }
            })
            .touched_objects();
        (reader, stream)
    }

    /// The stores, once every watch has been made.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        self,
        clusters: Store<Cluster>,
        control_planes: Store<KubeadmControlPlane>,
        machine_deployments: Store<MachineDeployment>,
        machines: Store<Machine>,
        byomachines: Store<ByoMachine>,
        hosts: Vec<Store<ByoHost>>,
        projects: Option<Store<Project>>,
    ) -> Stores {
        Stores {
            clusters,
            control_planes,
            machine_deployments,
            machines,
            byomachines,
            hosts,
            projects,
            listed: self.listed,
            streams: self.streams,
        }
    }
}

impl Default for StoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// What the reconciles of one BootsmanCluster found (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Memo {
    /// The generation the last thorough reconcile saw.
    pub generation: Option<i64>,
    /// When the last thorough reconcile ran.
    pub thorough_at: Option<Instant>,
    /// Rendered objects of unwatched kinds (`Kind/namespace/name`) → hash of the rendered form
    /// last applied or found in place.
    pub rendered: HashMap<String, u64>,
    /// The kubeconfig Secret was there.
    pub kubeconfig: bool,
    /// The CNI's ClusterResourceSet reported `ResourcesApplied`.
    pub cni_resources_applied: bool,
    /// The isolation policies' ClusterResourceSet reported `ResourcesApplied`.
    pub isolation_resources_applied: bool,
    /// HelmChartProxies reporting Ready.
    pub ready_chart_proxies: BTreeSet<String>,
    /// Reconciles in a row that left the status unchanged.
    pub quiet: u32,
}

impl Memo {
    /// Whether a reconcile of a cluster at `generation` must read everything again. `spread` (up
    /// to a tenth of [`THOROUGH_EVERY`], see [`spread`]) keeps clusters created together from
    /// being read again all at once.
    pub fn thorough_due(&self, generation: Option<i64>, now: Instant, spread: Duration) -> bool {
        self.generation != generation
            || self
                .thorough_at
                .is_none_or(|at| now.duration_since(at) >= THOROUGH_EVERY + spread)
    }
}

/// A cluster's own share of the thorough period's spread, from its uid: between 0 and a tenth
/// of [`THOROUGH_EVERY`].
pub fn spread(uid: &str) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uid.hash(&mut h);
    let tenth = THOROUGH_EVERY.as_millis() as u64 / 10;
    Duration::from_millis(h.finish() % tenth.max(1))
}

/// A stable hash of a rendered object.
pub fn hash(obj: &serde_json::Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    obj.to_string().hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thorough_reconcile_is_due_first_after_a_spec_change_and_after_the_period() {
        let now = Instant::now();
        let fresh = Memo::default();
        let none = Duration::ZERO;
        assert!(fresh.thorough_due(Some(1), now, none));
        let done = Memo {
            generation: Some(1),
            thorough_at: Some(now),
            ..Default::default()
        };
        assert!(!done.thorough_due(Some(1), now + Duration::from_secs(1), none));
        assert!(done.thorough_due(Some(2), now + Duration::from_secs(1), none));
        assert!(done.thorough_due(Some(1), now + THOROUGH_EVERY, none));
        let later = spread("some-uid");
        assert!(later < THOROUGH_EVERY / 10);
        assert_eq!(later, spread("some-uid"));
        assert!(!done.thorough_due(
            Some(1),
            now + THOROUGH_EVERY + later - Duration::from_millis(1),
            later
        ));
    }

    #[test]
    fn the_hash_follows_the_content() {
        let a = serde_json::json!({"spec": {"replicas": 3}});
        let b = serde_json::json!({"spec": {"replicas": 4}});
        assert_eq!(hash(&a), hash(&a.clone()));
        assert_ne!(hash(&a), hash(&b));
    }
}
