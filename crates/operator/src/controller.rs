//! The BootsmanCluster controller: fetch → validate → render → apply → status.
//!
//! - Apply is server-side apply as field manager [`MANAGER`], forced, and only for an object
//!   whose stored form lacks a rendered field or holds another value there: reapplying the
//!   same spec makes no writes, a replica change writes only the objects whose replicas changed
//!   (SSA changes only that field), and a field someone else changed is set back.
//! - A spec that breaks a rule gets `Ready=False`, `Stalled=True` naming the rule; nothing is
//!   applied.
//! - Deletion: the finalizer [`FINALIZER`] (kept with kube's `finalizer()` helper) stays until the
//!   CAPI Cluster (deleted in the foreground, so CAPI tears the machines down and the provider
//!   releases the hosts) is gone.
//! - Status: `observe` gathers what CAPI, the host pools and the add-ons report into
//!   [`status::Observed`]; [`status::compute`] (pure) makes the conditions, phase and Events;
//!   the status is written only when it changed.
//! - Reads: the objects the controller watches are read from its reflector caches, the others
//!   only while they are not done yet and in a periodic thorough reconcile ([`crate::cache`]), so
//!   a cluster at rest costs no request.
//! - Pause: a BootsmanCluster with the `cluster.x-k8s.io/paused` annotation, or whose CAPI Cluster
//!   has `spec.paused` (as `clusterctl move` sets it), is not reconciled (`Paused=True`). While it
//!   reconciles, the operator keeps `clusterctl.cluster.x-k8s.io/block-move` on it, and removes it
//!   only in a reconcile that saw the pause, so `clusterctl move` copies nothing before the
//!   operator has stopped. Paused with its Cluster, it also gets `bootsman.io/paused-with-cluster`,
//!   which travels with the move: the source stays still while clusterctl deletes its Cluster, the
//!   target waits for its Cluster to arrive and be unpaused, and only then resumes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bootsman_api::capi::{Cluster, KubeadmControlPlane, Machine, MachineDeployment};
use bootsman_api::labels;
use bootsman_api::pools::{self, SharedPool};
use bootsman_api::v1alpha1::{BootsmanCluster, BootsmanClusterStatus, ClusterPhase, Cni, Project};
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use bootsman_runtime::conditions::{self, Status};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PropagationPolicy,
};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::cache::{self, Memo, StoreBuilder, Stores, lookup};
use crate::render::{control_plane_name, pool_object_name, render, resource_set_name};
use crate::settings::OperatorSettings;
use crate::status::{self, CONTROL_PLANE_ROLE, Observed, set};
use crate::validate::validate;

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "bootsman-operator";
/// Finalizer that keeps a BootsmanCluster until its CAPI Cluster is gone.
pub const FINALIZER: &str = "bootsman.io/cluster-cleanup";
/// The value of the operator's `clusterctl.cluster.x-k8s.io/block-move` annotation.
const BLOCK_MOVE_REASON: &str = "reconciled by bootsman-operator: pause the Cluster to move it";
/// How often a healthy cluster is looked at again (status counts come from CAPI).
const RESYNC: Duration = Duration::from_secs(60);
/// How soon a cluster is looked at again while it is being deleted or is not ready (doubling, up
/// to [`RESYNC`], while its status stays the same: see [`next_look`]).
const SOON: Duration = Duration::from_secs(5);

/// When to look at a cluster again after a reconcile: a Ready cluster after [`RESYNC`]; one that
/// is not Ready after [`SOON`], doubled for each reconcile in a row that left its status as it
/// was (`quiet`), up to [`RESYNC`]. What the status follows wakes the cluster anyway (its CAPI
/// Cluster, control plane and MachineDeployments, its Machines and ByoMachines, the hosts), so a
/// cluster that waits for nothing else costs little.
pub fn next_look(ready: bool, quiet: u32) -> Duration {
    if ready {
        return RESYNC;
    }
    SOON.saturating_mul(1u32 << quiet.min(8)).min(RESYNC)
}

/// What a reconcile needs.
pub struct Context {
    /// Client of the management cluster.
    pub client: kube::Client,
    /// Addon sources and the kube-vip image.
    pub settings: OperatorSettings,
    /// Reconcile counters and durations.
    pub metrics: Arc<bootsman_runtime::metrics::Metrics>,
    /// Publishes Events on BootsmanClusters.
    pub recorder: Recorder,
    /// Host pools in other namespaces the provider lets machines use (its `--pool` flags), counted
    /// for `HostsAvailable` besides the cluster's own namespace.
    pub shared_pools: Vec<SharedPool>,
    /// Count hosts as the provider's `--projects` lets a Project's clusters use them: only the
    /// Project's host pools (cluster-wide runs only).
    pub projects: bool,
    /// Per BootsmanCluster uid, what its reconciles found ([`Memo`]).
    memos: Mutex<HashMap<String, Memo>>,
    /// The controller's caches, set by [`run`].
    stores: OnceLock<Stores>,
}

impl Context {
    /// A context for `client` with `settings`.
    pub fn new(
        client: kube::Client,
        settings: OperatorSettings,
        metrics: Arc<bootsman_runtime::metrics::Metrics>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.into(),
                instance: None,
            },
        );
        Self {
            client,
            settings,
            metrics,
            recorder,
            shared_pools: Vec::new(),
            projects: false,
            memos: Default::default(),
            stores: OnceLock::new(),
        }
    }

    /// What earlier reconciles of `bc` found (empty for a cluster not seen yet).
    fn memo(&self, bc: &BootsmanCluster) -> Memo {
        match (bc.uid(), self.memos.lock()) {
            (Some(uid), Ok(memos)) => memos.get(&uid).cloned().unwrap_or_default(),
            _ => Memo::default(),
        }
    }

    /// Keeps what this reconcile of `bc` found.
    fn keep_memo(&self, bc: &BootsmanCluster, memo: Memo) {
        if let (Some(uid), Ok(mut memos)) = (bc.uid(), self.memos.lock()) {
            memos.insert(uid, memo);
        }
    }

    /// Forgets what was found about a cluster that is going.
    fn forget_memo(&self, bc: &BootsmanCluster) {
        if let (Some(uid), Ok(mut memos)) = (bc.uid(), self.memos.lock()) {
            memos.remove(&uid);
        }
    }

    /// The controller's caches once every one has listed; until then a reconcile waits.
    fn stores(&self) -> Result<&Stores, Error> {
        match self.stores.get() {
            Some(stores) if stores.synced() => Ok(stores),
            _ => Err(Error::Waiting {
                why: "the operator's caches to list".into(),
                after: Duration::from_secs(1),
            }),
        }
    }

    /// The same, counting the hosts of these shared pools too.
    pub fn with_shared_pools(mut self, pools: Vec<SharedPool>) -> Self {
        self.shared_pools = pools;
        self
    }

    /// The same, honouring Projects' host pools (see [`Self::projects`]).
    pub fn with_projects(mut self, projects: bool) -> Self {
        self.projects = projects;
        self
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// Not a failure: a step waits for something (the CAPI Cluster to go) and is looked at again
    /// after `after`. Returned from the finalizer's cleanup, it keeps the finalizer.
    #[error("waiting for {why}")]
    Waiting {
        /// What the step waits for.
        why: String,
        /// When to look again.
        after: Duration,
    },
    /// The finalizer helper failed: adding or removing the finalizer, or the reconcile or cleanup
    /// it ran.
    #[error(transparent)]
    Finalizer(Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// Short label for the errors metric.
    pub fn metric_label(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Kube { .. } => "kube",
            Self::Waiting { .. } => "waiting",
            Self::Finalizer(inner) => match inner.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.metric_label(),
                _ => "finalizer",
            },
        }
    }

    /// The wait this error stands for, when it only says that a step must wait.
    fn waiting(&self) -> Option<Duration> {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Waiting { after, .. } => Some(*after),
            Self::Finalizer(inner) => match inner.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.waiting(),
                _ => None,
            },
            Self::Kube { .. } => None,
        }
    }
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

fn is_not_found(e: &kube::Error) -> bool {
    bootsman_runtime::api_errors::is_not_found(e)
}

/// Reconciles one BootsmanCluster.
pub async fn reconcile(bc: Arc<BootsmanCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let timer = ctx.metrics.reconcile_timer("bootsmancluster");
    let r = reconcile_inner(bc, &ctx).await;
    timer.observe();
    if let Err(e) = &r
        && e.waiting().is_none()
    {
        ctx.metrics.reconcile_failed("bootsmancluster", e.metric_label());
    }
    r
}

async fn reconcile_inner(bc: Arc<BootsmanCluster>, ctx: &Context) -> Result<Action, Error> {
    let ns = bc.namespace().unwrap_or_default();
    let name = bc.name_any();
    let api: Api<BootsmanCluster> = Api::namespaced(ctx.client.clone(), &ns);

    let stores = ctx.stores()?;
    // Deletion decides from the Cluster as the API server has it: a cache that has not seen a
    // Cluster created a moment ago must not end the cleanup.
    let cluster = if bc.metadata.deletion_timestamp.is_some() {
        Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("reading Cluster {ns}/{name}")))?
    } else {
        lookup(&stores.clusters, &ns, &name).map(|c| (*c).clone())
    };
    let pause = pause_state(&bc, cluster.as_ref());
    if let Some(action) = honour_pause(&bc, ctx, &api, &pause).await? {
        return Ok(action);
    }
    finalizer(&api, FINALIZER, bc, |event| async {
        match event {
            FinalizerEvent::Apply(bc) => apply(&bc, ctx, stores, &api).await,
            FinalizerEvent::Cleanup(bc) => cleanup(&bc, ctx, &api, cluster).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Validates, renders and applies the cluster's objects, then writes its status.
async fn apply(
    bc: &BootsmanCluster,
    ctx: &Context,
    stores: &Stores,
    api: &Api<BootsmanCluster>,
) -> Result<Action, Error> {
    let violations = validate(&bc.name_any(), &bc.spec);
    if !violations.is_empty() {
        let report = status::invalid(bc, &violations, &conditions::now());
        write_status(bc, api, report.status).await?;
        publish(ctx, bc, &report.notes).await;
        return Ok(Action::await_change());
    }

    let now = Instant::now();
    let mut memo = ctx.memo(bc);
    let spread = cache::spread(&bc.uid().unwrap_or_default());
    let thorough = memo.thorough_due(bc.metadata.generation, now, spread);
    let desired = render(bc, &ctx.settings);
    let mut addons_missing = false;
    let mut written = Vec::new();
    let mut rendered = HashMap::new();
    for obj in desired {
        // Add-ons need the Helm add-on provider's CRD; without it they wait (AddonsReady).
        let addon = obj["kind"] == "HelmChartProxy";
        let key = object_key(&obj);
        let hash = cache::hash(&obj);
        let in_place = match stored(stores, &obj) {
            Some(current) => Some(current.is_some_and(|c| contains(&c, &obj))),
            None if !thorough && memo.rendered.get(&key) == Some(&hash) => Some(true),
            None => None,
        };
        match apply_if_changed(&ctx.client, obj, in_place).await {
            Ok(Some(kind_name)) => written.push(kind_name),
            Ok(None) => {}
            Err(Error::Kube { source, .. }) if addon && is_not_found(&source) => {
                addons_missing = true;
                continue;
            }
            Err(e) => return Err(e),
        }
        rendered.insert(key, hash);
    }
    memo.rendered = rendered;
    if !written.is_empty() {
        event(
            ctx,
            bc,
            EventType::Normal,
            "Applied",
            &format!("applied {}", written.join(", ")),
        )
        .await;
    }

    let observed = observe(bc, ctx, stores, &mut memo, thorough, addons_missing).await?;
    let report = status::compute(bc, &observed, &conditions::now());
    memo.quiet = if bc.status.as_ref() == Some(&report.status) {
        memo.quiet.saturating_add(1)
    } else {
        0
    };
    let requeue = next_look(
        conditions::is_true(&report.status.conditions, "Ready"),
        memo.quiet,
    );
    publish(ctx, bc, &report.notes).await;
    write_status(bc, api, report.status).await?;
    if thorough {
        memo.generation = bc.metadata.generation;
        memo.thorough_at = Some(now);
    }
    ctx.keep_memo(bc, memo);
    Ok(Action::requeue(requeue))
}

/// Whether a BootsmanCluster is reconciled (see the module docs).
#[derive(Debug, PartialEq, Eq)]
enum Pause {
    /// Reconciled; `resumed` when it was paused with its Cluster until now.
    Running {
        /// The `bootsman.io/paused-with-cluster` annotation is still there.
        resumed: bool,
    },
    /// Not reconciled, for this reason.
    Paused {
        /// Why, for the `Paused` condition.
        reason: String,
        /// Paused because of its Cluster: marked with `bootsman.io/paused-with-cluster`.
        with_cluster: bool,
    },
}

/// Decides the pause from the BootsmanCluster's annotations and its Cluster (`None`: missing).
fn pause_state(bc: &BootsmanCluster, cluster: Option<&Cluster>) -> Pause {
    let annotations = bc.annotations();
    let marked = annotations.contains_key(labels::PAUSED_WITH_CLUSTER);
    if annotations.contains_key(labels::PAUSED) {
        return Pause::Paused {
            reason: format!("the BootsmanCluster has the {} annotation", labels::PAUSED),
            with_cluster: false,
        };
    }
    match cluster {
        Some(c) if c.spec.paused == Some(true) => Pause::Paused {
            reason: format!(
                "Cluster {} has spec.paused set (clusterctl move pauses it while it moves the cluster)",
                c.name_any()
            ),
            with_cluster: true,
        },
        None if marked => Pause::Paused {
            reason: format!(
                "paused with its Cluster, which does not exist now (clusterctl move deletes it from \
                 the source and creates it, paused, in the target); remove the annotation {} to \
                 recreate it",
                labels::PAUSED_WITH_CLUSTER
            ),
            with_cluster: true,
        },
        _ => Pause::Running { resumed: marked },
    }
}

/// Keeps the annotations of the pause protocol (see the module docs) and, while paused, records
/// `Paused=True` and stops the reconcile (`Some`).
async fn honour_pause(
    bc: &BootsmanCluster,
    ctx: &Context,
    api: &Api<BootsmanCluster>,
    pause: &Pause,
) -> Result<Option<Action>, Error> {
    let name = bc.name_any();
    let annotations = bc.annotations();
    let blocking = annotations.contains_key(labels::CLUSTERCTL_BLOCK_MOVE);
    let marked = annotations.contains_key(labels::PAUSED_WITH_CLUSTER);
    match pause {
        Pause::Running { resumed } => {
            // A new cluster gets block-move in the reconcile after the one that added its
            // finalizer, before anything is rendered.
            let has_finalizer = bc.finalizers().iter().any(|f| f == FINALIZER);
            if (!blocking && has_finalizer) || *resumed {
                let patch = json!({"metadata": {"annotations": {
                    labels::CLUSTERCTL_BLOCK_MOVE: BLOCK_MOVE_REASON,
                    labels::PAUSED_WITH_CLUSTER: null,
                }}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube_err(format!("marking {name} as reconciled")))?;
            }
            if *resumed {
                event(
                    ctx,
                    bc,
                    EventType::Normal,
                    "Resumed",
                    "its Cluster is no longer paused",
                )
                .await;
            }
            Ok(None)
        }
        Pause::Paused { reason, with_cluster } => {
            if blocking || (*with_cluster && !marked) {
                let mut a = serde_json::Map::new();
                a.insert(labels::CLUSTERCTL_BLOCK_MOVE.into(), Value::Null);
                if *with_cluster {
                    a.insert(labels::PAUSED_WITH_CLUSTER.into(), json!("true"));
                }
                let patch = json!({"metadata": {"annotations": a}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube_err(format!("marking {name} as paused")))?;
            }
            let mut status = bc.status.clone().unwrap_or_default();
            let was_paused = conditions::is_true(&status.conditions, "Paused");
            let now = conditions::now();
            let generation = bc.metadata.generation;
            set(
                &mut status.conditions,
                "Paused",
                Status::True,
                "Paused",
                reason,
                generation,
                &now,
            );
            write_status(bc, api, status).await?;
            if !was_paused {
                event(ctx, bc, EventType::Normal, "Paused", reason).await;
            }
            Ok(Some(Action::await_change()))
        }
    }
}

/// `Kind/namespace/name` of a rendered object.
fn object_key(obj: &Value) -> String {
    format!(
        "{}/{}/{}",
        obj["kind"].as_str().unwrap_or_default(),
        obj["metadata"]["namespace"].as_str().unwrap_or_default(),
        obj["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// The stored form of a rendered object of a kind the controller watches, from its cache:
/// `Some(None)` when the cache has no such object, `None` for a kind no cache holds.
fn stored(stores: &Stores, obj: &Value) -> Option<Option<Value>> {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let group = obj["apiVersion"].as_str().unwrap_or_default().split('/').next();
    if group != Some("cluster.x-k8s.io") && group != Some("controlplane.cluster.x-k8s.io") {
        return None;
    }
    let value = |o: Option<Value>| Some(o);
    match obj["kind"].as_str() {
        Some("Cluster") => {
            value(lookup(&stores.clusters, ns, name).and_then(|o| serde_json::to_value(&*o).ok()))
        }
        Some("KubeadmControlPlane") => {
            value(lookup(&stores.control_planes, ns, name).and_then(|o| serde_json::to_value(&*o).ok()))
        }
        Some("MachineDeployment") => {
            value(lookup(&stores.machine_deployments, ns, name).and_then(|o| serde_json::to_value(&*o).ok()))
        }
        _ => None,
    }
}

/// Applies `obj` unless every field it sets already has that value in the stored object (so a
/// resync writes nothing, and a field changed by someone else is set back). `in_place` is what a
/// cache or an earlier reconcile already knows about that (`None`: read the object first).
/// Returns `Some("Kind/name")` when it wrote.
async fn apply_if_changed(
    client: &kube::Client,
    obj: Value,
    in_place: Option<bool>,
) -> Result<Option<String>, Error> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ns = obj["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let in_place = match in_place {
        Some(known) => known,
        None => api
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("reading {kind} {ns}/{name}")))?
            .and_then(|c| serde_json::to_value(&c).ok())
            .is_some_and(|observed| contains(&observed, &obj)),
    };
    if in_place {
        return Ok(None);
    }
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&obj))
        .await
        .map_err(kube_err(format!("applying {kind} {ns}/{name}")))?;
    Ok(Some(format!("{kind}/{name}")))
}

/// How many hosts already serve cluster `name`: for each role (the control plane, or a worker
/// pool's MachineDeployment name), the Machines whose ByoMachine has a host bound. A Machine that
/// exists but still waits for a host needs one as much as a Machine not yet created.
fn serving_hosts(stores: &Stores, ns: &str, name: &str) -> BTreeMap<String, i32> {
    let bound: std::collections::BTreeSet<String> = stores
        .byomachines_of(ns, name)
        .iter()
        .filter(|bm| bm.status.as_ref().is_some_and(|s| s.host_ref.is_some()))
        .map(|bm| bm.name_any())
        .collect();
    let mut out = BTreeMap::new();
    for m in stores.machines_of(ns, name) {
        if !bound.contains(&m.spec.infrastructure_ref.name) {
            continue;
        }
        let machine_labels = m.labels();
        let role = if machine_labels.contains_key(labels::CONTROL_PLANE) {
            CONTROL_PLANE_ROLE.to_string()
        } else if let Some(md) = machine_labels.get(labels::DEPLOYMENT_NAME) {
            md.clone()
        } else {
            continue;
        };
        *out.entry(role).or_insert(0) += 1;
    }
    out
}

/// Whether `observed` holds every field of `desired` with the same value (objects may carry
/// more keys, such as server defaults; lists must match element by element).
pub fn contains(observed: &Value, desired: &Value) -> bool {
    match (observed, desired) {
        (Value::Object(o), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| o.get(k).is_some_and(|ov| contains(ov, dv))),
        (Value::Array(o), Value::Array(d)) => {
            o.len() == d.len() && o.iter().zip(d).all(|(ov, dv)| contains(ov, dv))
        }
        (o, d) => o == d,
    }
}

/// Whether the ClusterResourceSet `name` in `ns` reports `ResourcesApplied=True` (false while it
/// does not exist).
async fn resources_applied(ctx: &Context, ns: &str, name: &str) -> Result<bool, Error> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "addons.cluster.x-k8s.io",
        "v1beta2",
        "ClusterResourceSet",
    ));
    let crs = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &ar)
        .get_opt(name)
        .await
        .map_err(kube_err("reading ClusterResourceSet"))?;
    Ok(crs.as_ref().is_some_and(|c| {
        c.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "ResourcesApplied" && c["status"] == "True")
        })
    }))
}

/// Gathers what CAPI reports, the host pools and the add-ons' objects for `bc`: the observation
/// [`status::compute`] turns into the status. Watched objects come from `stores`; the kubeconfig
/// Secret, the CNI's ClusterResourceSet and the HelmChartProxies are read in a `thorough`
/// reconcile and, once the control plane has initialized, while they are not done yet; otherwise
/// `memo` keeps what was read last. `chart_api_missing`: applying a HelmChartProxy found no such
/// API.
async fn observe(
    bc: &BootsmanCluster,
    ctx: &Context,
    stores: &Stores,
    memo: &mut Memo,
    thorough: bool,
    chart_api_missing: bool,
) -> Result<Observed, Error> {
    let ns = bc.namespace().unwrap_or_default();
    let name = bc.name_any();
    let control_plane = lookup(&stores.control_planes, &ns, &control_plane_name(&name))
        .map(|k| k.status.clone().unwrap_or_default());
    let serving = serving_hosts(stores, &ns, &name);
    let mut machine_deployments = BTreeMap::new();
    for pool in &bc.spec.workers {
        let md_name = pool_object_name(&name, &pool.name);
        if let Some(md) = lookup(&stores.machine_deployments, &ns, &md_name) {
            machine_deployments.insert(md_name, md.status.clone().unwrap_or_default());
        }
    }
    let mut hosts = Vec::new();
    for pool_ns in stores.pools_for(&ctx.shared_pools, &ns) {
        hosts.extend(stores.hosts_in(&pool_ns));
    }
    // The kubeconfig and the add-ons come after the control plane's initialization (the
    // Cluster's status says when); before it, only a thorough reconcile looks.
    let initialized = lookup(&stores.clusters, &ns, &name).is_some_and(|c| {
        c.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.control_plane_initialized)
            == Some(true)
    });
    let waiting = |done: bool| thorough || (initialized && !done);

    if waiting(memo.kubeconfig) {
        memo.kubeconfig = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
            .get_metadata_opt(&format!("{name}-kubeconfig"))
            .await
            .map_err(kube_err("reading kubeconfig Secret"))?
            .is_some();
    }

    if bc.spec.network.cni != Cni::KubeRouter {
        memo.cni_resources_applied = false;
    } else if waiting(memo.cni_resources_applied) {
        memo.cni_resources_applied = resources_applied(ctx, &ns, &resource_set_name(&name, "cni")).await?;
    }
    if bc.spec.network.isolation.is_none() {
        memo.isolation_resources_applied = false;
    } else if waiting(memo.isolation_resources_applied) {
        memo.isolation_resources_applied =
            resources_applied(ctx, &ns, &resource_set_name(&name, "isolation")).await?;
    }

    let addons = status::chart_addons(bc);
    let all_ready = addons
        .iter()
        .all(|a| memo.ready_chart_proxies.contains(&format!("{name}-{a}")));
    if chart_api_missing || addons.is_empty() {
        memo.ready_chart_proxies.clear();
    } else if waiting(all_ready) {
        let api = Api::<bootsman_api::capi::HelmChartProxy>::namespaced(ctx.client.clone(), &ns);
        let lp = ListParams::default().labels(&format!("{}={name}", labels::BOOTSMAN_CLUSTER));
        let proxies = match api.list(&lp).await {
            Ok(l) => l.items,
            Err(e) if is_not_found(&e) => Vec::new(),
            Err(e) => return Err(kube_err("listing HelmChartProxies")(e)),
        };
        memo.ready_chart_proxies = proxies
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
            })
            .map(ResourceExt::name_any)
            .collect();
    }
    Ok(Observed {
        control_plane,
        machine_deployments,
        serving,
        hosts,
        kubeconfig: memo.kubeconfig,
        cni_resources_applied: memo.cni_resources_applied,
        isolation_resources_applied: memo.isolation_resources_applied,
        chart_proxy_api_missing: chart_api_missing,
        ready_chart_proxies: memo.ready_chart_proxies.clone(),
    })
}

/// Publishes the Events of a status change.
async fn publish(ctx: &Context, bc: &BootsmanCluster, notes: &[status::Note]) {
    for n in notes {
        let type_ = if n.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        event(ctx, bc, type_, n.reason, &n.message).await;
    }
}

/// Writes `status` unless it equals what is stored (conditions compared without timestamps,
/// which `conditions::set` leaves alone when nothing flips).
async fn write_status(
    bc: &BootsmanCluster,
    api: &Api<BootsmanCluster>,
    status: BootsmanClusterStatus,
) -> Result<(), Error> {
    if bc.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let body = bootsman_runtime::ssa::body::<BootsmanCluster>(
        &bc.name_any(),
        bc.namespace().as_deref(),
        json!({"status": status}),
    );
    bootsman_runtime::ssa::apply_status(api, MANAGER, &bc.name_any(), &body)
        .await
        .map_err(kube_err(format!("writing status of {}", bc.name_any())))?;
    Ok(())
}

/// The finalizer's cleanup: deletes the CAPI Cluster (`cluster`, as this reconcile read it) in
/// the foreground and waits ([`Error::Waiting`], which keeps the finalizer) until it is gone.
async fn cleanup(
    bc: &BootsmanCluster,
    ctx: &Context,
    api: &Api<BootsmanCluster>,
    cluster: Option<Cluster>,
) -> Result<Action, Error> {
    let ns = bc.namespace().unwrap_or_default();
    let name = bc.name_any();
    ctx.forget_memo(bc);
    let Some(c) = cluster else {
        event(ctx, bc, EventType::Normal, "Deleted", "the CAPI Cluster is gone").await;
        return Ok(Action::await_change());
    };
    if c.metadata.deletion_timestamp.is_none() {
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..Default::default()
        };
        match Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
            .delete(&name, &dp)
            .await
        {
            Ok(_) => {
                event(
                    ctx,
                    bc,
                    EventType::Normal,
                    "Deleting",
                    "deleting the CAPI Cluster",
                )
                .await;
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(kube_err(format!("deleting Cluster {ns}/{name}"))(e)),
        }
    }
    let mut status = bc.status.clone().unwrap_or_default();
    status.phase = Some(ClusterPhase::Deleting);
    write_status(bc, api, status).await?;
    Err(Error::Waiting {
        why: format!("Cluster {ns}/{name} to be deleted"),
        after: SOON,
    })
}

async fn event(ctx: &Context, bc: &BootsmanCluster, type_: EventType, reason: &str, note: &str) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &bc.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing event");
    }
}

/// Requeue policy on error: after the wait a waiting step asked for, else soon (a conflict of
/// the finalizer helper's guarded patch included: the next reconcile reads the new version).
pub fn error_policy(bc: Arc<BootsmanCluster>, err: &Error, _ctx: Arc<Context>) -> Action {
    if let Some(after) = err.waiting() {
        tracing::debug!(name = %bc.name_any(), "{err}");
        return Action::requeue(after);
    }
    tracing::warn!(name = %bc.name_any(), namespace = ?bc.namespace(), error = %err, "reconcile failed");
    Action::requeue(SOON)
}

/// Runs the controller until `shutdown` resolves. Watches BootsmanClusters, the objects it
/// renders (by owner), their Machines and ByoMachines (by the cluster-name label) and ByoHosts
/// (every cluster that may use the host's namespace is looked at again); with `namespace`, hosts
/// of that namespace and of the shared pools it may use.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    ready: bootsman_runtime::lifecycle::Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::StreamExt;
    use kube::runtime::{Controller, WatchStreamExt, watcher};
    let client = ctx.client.clone();
    // Every watch but the hosts' covers `namespace`, or all namespaces without it.
    fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let scope = namespace.as_deref();
    // Namespaced, the operator still reads the shared pools its namespace may use: one watch
    // per pool namespace, so a host arriving there wakes the clusters too.
    let hosts: Vec<Api<ByoHost>> = match &namespace {
        Some(ns) => pools::pools_for(&ctx.shared_pools, ns)
            .iter()
            .map(|pool| Api::namespaced(client.clone(), pool))
            .collect(),
        None => vec![Api::all(client.clone())],
    };
    // The BootsmanClusters' watch is built here rather than by `Controller::new` so that
    // readiness can be read off the stream: the controller's store allows only one task to wait
    // for its first list (`Store::wait_until_ready` keeps one waker, and the controller itself
    // waits on it), so a second waiter could sleep forever and keep `/readyz` at 503.
    let (reader, writer) = kube::runtime::reflector::store();
    let clusters = watcher(
        scoped::<BootsmanCluster>(&client, scope),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .inspect(move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            ready.ready();
        }
    })
    .applied_objects();
    // Every other watch both wakes clusters and fills a cache a reconcile reads.
    let mut builder = StoreBuilder::new();
    let all = watcher::Config::default;
    let (capi_store, capi_clusters) = builder.watch(scoped::<Cluster>(&client, scope), all());
    let (kcp_store, kcps) = builder.watch(scoped::<KubeadmControlPlane>(&client, scope), all());
    let (md_store, mds) = builder.watch(scoped::<MachineDeployment>(&client, scope), all());
    // Machines and ByoMachines (which CAPI labels with their cluster's name, the
    // BootsmanCluster's) wake their cluster: the serving host counts follow them.
    let labelled = || watcher::Config::default().labels(labels::CLUSTER_NAME);
    let (machine_store, machines) = builder.watch(scoped::<Machine>(&client, scope), labelled());
    let (byomachine_store, byomachines) = builder.watch(scoped::<ByoMachine>(&client, scope), labelled());
    let mut host_stores = Vec::new();
    let mut host_streams = Vec::new();
    for api in hosts {
        let (store, stream) = builder.watch(api, all());
        host_stores.push(store);
        host_streams.push(stream);
    }
    let (project_store, project_stream) = if ctx.projects && namespace.is_none() {
        let (store, stream) = builder.watch(Api::<Project>::all(client.clone()), all());
        (Some(store), Some(stream))
    } else {
        (None, None)
    };
    let stores = builder.finish(
        capi_store,
        kcp_store,
        md_store,
        machine_store,
        byomachine_store,
        host_stores,
        project_store.clone(),
    );
    if ctx.stores.set(stores).is_err() {
        tracing::warn!("the controller runs a second time on one context; it reads the first run's caches");
    }
    fn of_cluster<K: kube::Resource>(o: K) -> Option<kube::runtime::reflector::ObjectRef<BootsmanCluster>> {
        let name = o.meta().labels.as_ref()?.get(labels::CLUSTER_NAME)?;
        Some(kube::runtime::reflector::ObjectRef::new(name).within(o.meta().namespace.as_deref()?))
    }
    let mut controller = Controller::for_stream(clusters, reader)
        .owns_stream(capi_clusters)
        .owns_stream(kcps)
        .owns_stream(mds)
        .watches_stream(machines, of_cluster::<Machine>)
        .watches_stream(byomachines, of_cluster::<ByoMachine>);
    for hosts in host_streams {
        let store = controller.store();
        let shared = ctx.shared_pools.clone();
        let projects = project_store.clone();
        controller = controller.watches_stream(hosts, move |h: ByoHost| {
            // A host wakes the clusters of its namespace and of every namespace its pool serves.
            let ns = h.namespace().unwrap_or_default();
            store
                .state()
                .into_iter()
                .filter(|b| {
                    crate::cache::pools_in(&shared, projects.as_ref(), &b.namespace().unwrap_or_default())
                        .contains(&ns)
                })
                .map(|b| kube::runtime::reflector::ObjectRef::from_obj(&*b))
                .collect::<Vec<_>>()
        });
    }
    if let Some(projects) = project_stream {
        // A Project's change (its pools, its namespaces) wakes the clusters of its namespaces.
        let store = controller.store();
        controller = controller.watches_stream(projects, move |p: Project| {
            let namespaces = p.named_namespaces();
            store
                .state()
                .into_iter()
                .filter(|b| b.namespace().is_some_and(|n| namespaces.contains(n.as_str())))
                .map(|b| kube::runtime::reflector::ObjectRef::from_obj(&*b))
                .collect::<Vec<_>>()
        });
    }
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            // Reconcile errors are logged by `error_policy`; a failing watch is logged here.
            if let Err(kube::runtime::controller::Error::QueueError(e)) = result {
                tracing::warn!(error = %e, "a watch failed; retrying with backoff");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_cluster_is_looked_at_less_and_less_often() {
        assert_eq!(next_look(true, 0), RESYNC);
        assert_eq!(next_look(true, 5), RESYNC);
        let secs: Vec<u64> = (0..6).map(|q| next_look(false, q).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 60, 60]);
        assert_eq!(next_look(false, u32::MAX), RESYNC);
    }

    fn bootsman_cluster(annotations: &[&str]) -> BootsmanCluster {
        let mut bc: BootsmanCluster = serde_json::from_value(json!({
            "apiVersion": "bootsman.io/v1alpha1",
            "kind": "BootsmanCluster",
            "metadata": {"name": "c1", "namespace": "team"},
            "spec": {
                "kubernetesVersion": "v1.36.3",
                "controlPlane": {"replicas": 3, "endpoint": {"host": "10.0.0.10"}},
                "workers": [{"name": "pool", "replicas": 3}],
            },
        }))
        .unwrap();
        bc.metadata.annotations = Some(
            annotations
                .iter()
                .map(|a| ((*a).to_string(), String::new()))
                .collect(),
        );
        bc
    }

    fn capi_cluster(paused: Option<bool>) -> Cluster {
        let mut c: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "team"},
            "spec": {},
        }))
        .unwrap();
        c.spec.paused = paused;
        c
    }

    #[test]
    fn the_pause_follows_the_annotation_and_the_cluster_and_outlives_a_moved_cluster() {
        let running = |resumed| Pause::Running { resumed };
        let paused =
            |p: &Pause, with: bool| matches!(p, Pause::Paused { with_cluster, .. } if *with_cluster == with);
        // Ordinary life: reconciled, with or without a Cluster yet.
        assert_eq!(pause_state(&bootsman_cluster(&[]), None), running(false));
        assert_eq!(
            pause_state(&bootsman_cluster(&[]), Some(&capi_cluster(None))),
            running(false)
        );
        assert_eq!(
            pause_state(&bootsman_cluster(&[]), Some(&capi_cluster(Some(false)))),
            running(false)
        );
        // An admin's pause: whatever the Cluster says.
        let admin = bootsman_cluster(&[labels::PAUSED]);
        assert!(paused(
            &pause_state(&admin, Some(&capi_cluster(Some(false)))),
            false
        ));
        assert!(paused(&pause_state(&admin, None), false));
        // clusterctl move: the Cluster paused, then deleted from the source; the target's
        // BootsmanCluster arrives marked before its Cluster, which arrives paused.
        assert!(paused(
            &pause_state(&bootsman_cluster(&[]), Some(&capi_cluster(Some(true)))),
            true
        ));
        let marked = bootsman_cluster(&[labels::PAUSED_WITH_CLUSTER]);
        assert!(paused(&pause_state(&marked, None), true));
        assert!(paused(
            &pause_state(&marked, Some(&capi_cluster(Some(true)))),
            true
        ));
        // ... and resumes once its Cluster is unpaused.
        assert_eq!(
            pause_state(&marked, Some(&capi_cluster(Some(false)))),
            running(true)
        );
        assert_eq!(pause_state(&marked, Some(&capi_cluster(None))), running(true));
    }
}
