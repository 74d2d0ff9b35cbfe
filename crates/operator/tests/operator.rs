//! The operator against the real control plane (our CRDs and CAPI's, without CAPI managers):
//! the sample renders into objects the API server accepts, reapplying writes nothing, scaling
//! touches only the replica fields, a short pool and a cluster stored before its rule existed show
//! in the status,
//! and deletion removes everything. HelmChartProxy objects meet a CRD stand-in (see `common`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bootsman_api::capi::{Cluster, KubeadmControlPlane, MachineDeployment};
use bootsman_api::pools::SharedPool;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_api::v1beta1::{ByoHost, ByoHostSpec};
use bootsman_operator::{OperatorSettings, render};
use bootsman_testenv::{TestEnv, wait_for};
use common::{Operator, sample};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::OnceCell;

const WAIT: Duration = Duration::from_secs(60);

/// Waits until `check` gives `Some`.
async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for(what, timeout, || {
        let f = check();
        async move { f.await.ok_or_else(|| "not yet".to_string()) }
    })
    .await
}

async fn env() -> &'static TestEnv {
    static CRD: OnceCell<()> = OnceCell::const_new();
    let env = TestEnv::shared().await;
    CRD.get_or_init(|| common::install_helm_chart_proxy_crd(env))
        .await;
    env
}

fn dynamic_api(client: &kube::Client, obj: &serde_json::Value, ns: &str) -> (Api<DynamicObject>, String) {
    let av = obj["apiVersion"].as_str().unwrap();
    let (g, v) = av.rsplit_once('/').unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(g, v, obj["kind"].as_str().unwrap()));
    (
        Api::namespaced_with(client.clone(), ns, &ar),
        obj["metadata"]["name"].as_str().unwrap().into(),
    )
}

/// resourceVersion of every rendered object, keyed by `Kind/name`.
async fn versions(client: &kube::Client, bc: &BootsmanCluster, ns: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for obj in render(bc, &OperatorSettings::default()) {
        let (api, name) = dynamic_api(client, &obj, ns);
        if let Some(o) = api.get_opt(&name).await.unwrap() {
            out.insert(
                format!("{}/{name}", obj["kind"].as_str().unwrap()),
                o.resource_version().unwrap(),
            );
        }
    }
    out
}

async fn all_rendered_exist(client: &kube::Client, bc: &BootsmanCluster, ns: &str) -> bool {
    versions(client, bc, ns).await.len() == render(bc, &OperatorSettings::default()).len()
}

async fn wait_condition(
    api: &Api<BootsmanCluster>,
    name: &str,
    type_: &str,
    status: &str,
) -> BootsmanCluster {
    until(&format!("{type_}={status}"), WAIT, || {
        let api = api.clone();
        let name = name.to_string();
        let type_ = type_.to_string();
        let status = status.to_string();
        async move {
            let bc = api.get(&name).await.ok()?;
            let c = bc.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
            (c.status == status && bc.status.as_ref()?.observed_generation == bc.metadata.generation)
                .then_some(bc)
        }
    })
    .await
}

#[tokio::test]
async fn sample_is_applied_reapplied_without_writes_scaled_and_deleted() {
    let env = env().await;
    let ns = env.create_namespace("op-sample").await;
    let client = env.client().await;
    let op = Operator::start(env, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    let bc = api.create(&PostParams::default(), &sample(&ns)).await.unwrap();

    // Every rendered object is accepted and stored.
    until("every rendered object exists", WAIT, || {
        let (client, bc, ns) = (client.clone(), bc.clone(), ns.clone());
        async move { all_rendered_exist(&client, &bc, &ns).await.then_some(()) }
    })
    .await;
    let bc = wait_condition(&api, "demo", "HostsAvailable", "False").await;
    let c = condition(&bc, "HostsAvailable");
    assert!(
        c.message.contains("control-plane: 3 more host(s) needed"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("workers/default: 3 more host(s) needed"),
        "{}",
        c.message
    );
    // Ready says what it waits for, the missing hosts included, without a `describe`.
    let ready = condition(&bc, "Ready");
    assert_eq!(ready.status, "False");
    for wanted in [
        "waiting for ControlPlaneReady: 0/3 control-plane machines ready",
        "HostsAvailable: control-plane: 3 more host(s) needed",
    ] {
        assert!(ready.message.contains(wanted), "{wanted}: {}", ready.message);
    }
    let cluster = Api::<Cluster>::namespaced(client.clone(), &ns)
        .get("demo")
        .await
        .unwrap();
    assert_eq!(
        cluster.labels().get("bootsman.io/addons").map(String::as_str),
        Some("demo")
    );
    assert_eq!(cluster.owner_references()[0].kind, "BootsmanCluster");

    // Reapplying the same spec (and several resyncs triggered by host events) writes nothing.
    let before = versions(&client, &bc, &ns).await;
    let patch = json!({"spec": bc.spec});
    api.patch(
        "demo",
        &PatchParams::apply("test").force(),
        &Patch::Apply(&json!({
            "apiVersion": "bootsman.io/v1alpha1", "kind": "BootsmanCluster",
            "metadata": {"name": "demo"}, "spec": patch["spec"],
        })),
    )
    .await
    .unwrap();
    // The reapply itself records the `test` manager; from then on nothing may write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bc_rv = api.get("demo").await.unwrap().resource_version();
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), &ns);
    for i in 0..3 {
        let mut h = ByoHost::new(&format!("noise-{i}"), ByoHostSpec::default());
        h.metadata.labels = Some(BTreeMap::from([("role".into(), "none".into())]));
        hosts.create(&PostParams::default(), &h).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(
        versions(&client, &bc, &ns).await,
        before,
        "rendered objects were rewritten"
    );
    let after_bc = api.get("demo").await.unwrap();
    assert_eq!(
        after_bc.resource_version(),
        bc_rv,
        "the BootsmanCluster was written again"
    );
    let rv_stable = after_bc.resource_version();

    // 3 → 5 control plane and 3 → 4 workers: only KCP and MachineDeployment change.
    api.patch("demo", &PatchParams::default(), &Patch::Merge(&json!({"spec": {
        "controlPlane": {"replicas": 5},
        "workers": [{"name": "default", "replicas": 4, "hostSelector": {"matchLabels": {"role": "worker"}}}],
    }}))).await.unwrap();
    assert_ne!(api.get("demo").await.unwrap().resource_version(), rv_stable);
    let kcps: Api<KubeadmControlPlane> = Api::namespaced(client.clone(), &ns);
    let mds: Api<MachineDeployment> = Api::namespaced(client.clone(), &ns);
    until("scaled replicas", WAIT, || {
        let (kcps, mds) = (kcps.clone(), mds.clone());
        async move {
            let k = kcps.get("demo-control-plane").await.ok()?;
            let m = mds.get("demo-default").await.ok()?;
            (k.spec.replicas == Some(5) && m.spec.replicas == Some(4)).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let scaled = versions(&client, &bc, &ns).await;
    for (k, rv) in &before {
        let changed = scaled.get(k) != Some(rv);
        let expect = k == "KubeadmControlPlane/demo-control-plane" || k == "MachineDeployment/demo-default";
        assert_eq!(changed, expect, "{k}: changed={changed}");
    }
    let k = kcps.get("demo-control-plane").await.unwrap();
    assert_eq!(k.spec.version, "v1.33.4");
    let managers: Vec<_> = k
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["bootsman-operator"]);

    // Deletion removes the CAPI Cluster, then (by ownerReferences, garbage collection) every
    // rendered object, then the BootsmanCluster itself.
    api.delete("demo", &DeleteParams::default()).await.unwrap();
    until("BootsmanCluster gone", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("demo").await.unwrap().is_none().then_some(()) }
    })
    .await;
    until("rendered objects gone", WAIT, || {
        let (client, bc, ns) = (client.clone(), bc.clone(), ns.clone());
        async move { versions(&client, &bc, &ns).await.is_empty().then_some(()) }
    })
    .await;
    op.stop().await;
}

/// Drops every CEL rule of the BootsmanCluster CRD whose message names `rule`, as an older CRD
/// without it would be.
async fn drop_crd_rule(client: &kube::Client, rule: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    fn strip(v: &mut serde_json::Value, rule: &str) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::Array(rules)) = m.get_mut("x-kubernetes-validations") {
                    rules.retain(|r| !r["message"].as_str().unwrap_or("").contains(rule));
                }
                m.values_mut().for_each(|c| strip(c, rule));
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|c| strip(c, rule)),
            _ => {}
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = serde_json::to_value(crds.get("bootsmanclusters.bootsman.io").await.unwrap()).unwrap();
    strip(&mut crd["spec"], rule);
    crds.replace(
        "bootsmanclusters.bootsman.io",
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
}

/// A cluster stored before a rule existed (an upgrade that added the rule) is not applied: the
/// operator's own validation stalls it with the rule named.
#[tokio::test]
async fn a_cluster_stored_before_its_rule_existed_stalls_without_applying() {
    // A control plane of its own: the CRD loses a rule, which no other test may see.
    let env = TestEnv::start(bootsman_testenv::Options::default())
        .await
        .unwrap();
    common::install_helm_chart_proxy_crd(&env).await;
    let ns = env.create_namespace("op-stall").await;
    let client = env.client().await;
    drop_crd_rule(&client, "rule: address-pool-range-order").await;
    let op = Operator::start(&env, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    let mut bc = sample(&ns);
    // A range from the higher address to the lower.
    bc.spec.load_balancer.metallb = serde_json::from_value(serde_json::json!({
        "enabled": true,
        "bgpPeers": [{"peerAddress": "10.0.0.1", "peerASN": 64500, "myASN": 64501}],
        "addressPools": [{"name": "lb", "addresses": ["10.0.10.9-10.0.10.5"]}],
    }))
    .unwrap();
    // The API server may take a moment to serve the CRD without the rule.
    until("the cluster stored without the rule", WAIT, || {
        let (api, bc) = (api.clone(), bc.clone());
        async move { api.create(&PostParams::default(), &bc).await.ok() }
    })
    .await;
    let got = wait_condition(&api, "demo", "Stalled", "True").await;
    let st = got.status.unwrap();
    let c = st.conditions.iter().find(|c| c.type_ == "Stalled").unwrap();
    assert!(
        c.message.contains("rule: address-pool-range-order"),
        "{}",
        c.message
    );
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False")
    );
    assert!(
        Api::<Cluster>::namespaced(client.clone(), &ns)
            .get_opt("demo")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<KubeadmControlPlane>::namespaced(client.clone(), &ns)
            .get_opt("demo-control-plane")
            .await
            .unwrap()
            .is_none()
    );
    api.delete("demo", &DeleteParams::default()).await.unwrap();
    op.stop().await;
}

#[tokio::test]
async fn cel_refuses_invalid_specs_with_our_messages() {
    let env = env().await;
    let ns = env.create_namespace("op-cel").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    type Breaks = Box<dyn Fn(&mut BootsmanCluster)>;
    let cases: Vec<(&str, Breaks)> = vec![
        (
            "control-plane-replicas-3-or-5",
            Box::new(|b| b.spec.control_plane.replicas = 4),
        ),
        (
            "worker-replicas-min-3",
            Box::new(|b| b.spec.workers[0].replicas = 2),
        ),
        (
            "worker-pool-names-unique",
            Box::new(|b| {
                let w = b.spec.workers[0].clone();
                b.spec.workers.push(w)
            }),
        ),
    ];
    for (rule, f) in cases {
        let mut bc = sample(&ns);
        f(&mut bc);
        let err = api.create(&PostParams::default(), &bc).await.unwrap_err();
        assert!(
            err.to_string().contains(&format!("rule: {rule}")),
            "{rule}: {err}"
        );
    }
}

/// Condition `type_` of `bc`; panics when it is missing.
fn condition<'a>(
    bc: &'a BootsmanCluster,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    bc.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap()
}

/// Creates a ByoHost `name` with `labels` that reports itself `Available`.
async fn available_host(client: &kube::Client, ns: &str, name: &str, role: &str) {
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns);
    let mut h = ByoHost::new(name, ByoHostSpec::default());
    h.metadata.labels = Some(BTreeMap::from([("role".into(), role.into())]));
    hosts.create(&PostParams::default(), &h).await.unwrap();
    hosts
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Available"}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_short_pool_reports_the_missing_hosts_per_role_and_then_enough() {
    let env = env().await;
    let ns = env.create_namespace("op-short").await;
    let client = env.client().await;
    for i in 0..2 {
        available_host(&client, &ns, &format!("cp-{i}"), "control-plane").await;
    }
    for i in 0..3 {
        available_host(&client, &ns, &format!("w-{i}"), "worker").await;
    }
    // A host in maintenance does not count.
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), &ns);
    let mut m = ByoHost::new(
        "cp-maint",
        ByoHostSpec {
            maintenance: Some(true),
            ..Default::default()
        },
    );
    m.metadata.labels = Some(BTreeMap::from([("role".into(), "control-plane".into())]));
    hosts.create(&PostParams::default(), &m).await.unwrap();

    let op = Operator::start(env, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &sample(&ns)).await.unwrap();
    let bc = wait_condition(&api, "demo", "HostsAvailable", "False").await;
    let c = condition(&bc, "HostsAvailable");
    assert_eq!(c.reason, "NotEnoughHosts");
    assert_eq!(c.message, "control-plane: 1 more host(s) needed", "{}", c.message);

    // One more free control-plane host: the watch on ByoHosts updates the condition.
    available_host(&client, &ns, "cp-2", "control-plane").await;
    wait_condition(&api, "demo", "HostsAvailable", "True").await;
    op.stop().await;
}

/// Hosts of a shared pool count for the namespaces the pool allows, and only for those.
#[tokio::test]
async fn a_shared_pool_counts_for_the_namespaces_it_allows() {
    let env = env().await;
    let ns = env.create_namespace("op-team").await;
    let pool = env.create_namespace("op-rack").await;
    let client = env.client().await;
    // The cluster's own namespace has one control-plane host; the shared pool has the rest.
    available_host(&client, &ns, "cp-0", "control-plane").await;
    for i in 1..3 {
        available_host(&client, &pool, &format!("cp-{i}"), "control-plane").await;
    }
    for i in 0..3 {
        available_host(&client, &pool, &format!("w-{i}"), "worker").await;
    }
    let other = SharedPool::parse(&format!("{pool}=someone-else")).unwrap();
    let op = Operator::start_with_pools(env, &ns, vec![other]).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &sample(&ns)).await.unwrap();
    let bc = wait_condition(&api, "demo", "HostsAvailable", "False").await;
    assert_eq!(
        condition(&bc, "HostsAvailable").message,
        "control-plane: 2 more host(s) needed; workers/default: 3 more host(s) needed",
        "a pool that does not allow the namespace does not count"
    );
    op.stop().await;

    let allowed = SharedPool::parse(&format!("{pool}={ns}")).unwrap();
    let op = Operator::start_with_pools(env, &ns, vec![allowed]).await;
    let bc = wait_condition(&api, "demo", "HostsAvailable", "True").await;
    assert_eq!(condition(&bc, "HostsAvailable").reason, "Enough");
    op.stop().await;
}

#[tokio::test]
async fn a_rendered_field_changed_by_someone_else_is_set_back() {
    let env = env().await;
    let ns = env.create_namespace("op-drift").await;
    let client = env.client().await;
    let op = Operator::start(env, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &sample(&ns)).await.unwrap();
    let mds: Api<MachineDeployment> = Api::namespaced(client.clone(), &ns);
    until("MachineDeployment rendered", WAIT, || {
        let mds = mds.clone();
        async move { mds.get_opt("demo-default").await.unwrap() }
    })
    .await;
    mds.patch(
        "demo-default",
        &PatchParams::apply("someone-else").force(),
        &Patch::Apply(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "demo-default"}, "spec": {"replicas": 7},
        })),
    )
    .await
    .unwrap();
    until("replicas set back to 3", WAIT, || {
        let mds = mds.clone();
        async move { (mds.get("demo-default").await.ok()?.spec.replicas == Some(3)).then_some(()) }
    })
    .await;
    op.stop().await;
}

/// `clusterctl move` as the operator meets it, on the source and then on the target: the Cluster
/// paused, the operator's `block-move` gone only once it has stopped (and the cluster marked
/// paused with its Cluster), the Cluster deleted without being recreated, the Cluster arriving
/// paused on the target, and the operator resuming only when it is unpaused.
#[tokio::test]
async fn a_move_pauses_the_operator_until_the_cluster_is_unpaused() {
    use bootsman_api::labels::{CLUSTERCTL_BLOCK_MOVE, PAUSED_WITH_CLUSTER};
    let env = env().await;
    let ns = env.create_namespace("op-move").await;
    let client = env.client().await;
    let op = Operator::start(env, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &sample(&ns)).await.unwrap();
    let annotated = |bc: &BootsmanCluster, key: &str| bc.annotations().contains_key(key);
    let paused = |bc: &BootsmanCluster| {
        let s = bc.status.as_ref()?;
        Some(s.conditions.iter().find(|c| c.type_ == "Paused")?.status.clone())
    };

    until("block-move while the operator reconciles", WAIT, || {
        let api = api.clone();
        async move { annotated(&api.get("demo").await.ok()?, CLUSTERCTL_BLOCK_MOVE).then_some(()) }
    })
    .await;
    let cluster = until("the Cluster", WAIT, || {
        let clusters = clusters.clone();
        async move { clusters.get_opt("demo").await.ok().flatten() }
    })
    .await;

    // Source: clusterctl pauses the Cluster and waits for block-move to go.
    let pause = |p: bool| Patch::Merge(json!({"spec": {"paused": p}}));
    clusters
        .patch("demo", &PatchParams::default(), &pause(true))
        .await
        .unwrap();
    let bc = until("the operator to let the move go on", WAIT, || {
        let api = api.clone();
        async move {
            let bc = api.get("demo").await.ok()?;
            let stopped = !annotated(&bc, CLUSTERCTL_BLOCK_MOVE)
                && annotated(&bc, PAUSED_WITH_CLUSTER)
                && paused(&bc).as_deref() == Some("True");
            stopped.then_some(bc)
        }
    })
    .await;
    assert!(
        condition(&bc, "Paused").message.contains("spec.paused"),
        "{:?}",
        condition(&bc, "Paused")
    );
    // clusterctl deletes the source's Cluster: the operator does not recreate it.
    clusters.delete("demo", &DeleteParams::default()).await.unwrap();
    until("the Cluster gone", WAIT, || {
        let clusters = clusters.clone();
        async move { clusters.get_opt("demo").await.unwrap().is_none().then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        clusters.get_opt("demo").await.unwrap().is_none(),
        "the paused operator recreated the Cluster"
    );
    let bc = api.get("demo").await.unwrap();
    assert!(annotated(&bc, PAUSED_WITH_CLUSTER) && !annotated(&bc, CLUSTERCTL_BLOCK_MOVE));

    // Target: the Cluster arrives as clusterctl creates it, paused, owned by the BootsmanCluster.
    let mut arriving = cluster.clone();
    arriving.metadata.uid = None;
    arriving.metadata.resource_version = None;
    arriving.metadata.creation_timestamp = None;
    arriving.metadata.managed_fields = None;
    arriving.metadata.owner_references.as_mut().unwrap()[0].uid = bc.uid().unwrap();
    arriving.spec.paused = Some(true);
    arriving.status = None;
    clusters.create(&PostParams::default(), &arriving).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bc = api.get("demo").await.unwrap();
    assert_eq!(condition(&bc, "Paused").status, "True");
    assert!(!annotated(&bc, CLUSTERCTL_BLOCK_MOVE));
    // clusterctl unpauses it: the operator resumes and holds block-move again.
    clusters
        .patch("demo", &PatchParams::default(), &pause(false))
        .await
        .unwrap();
    until("the operator to resume", WAIT, || {
        let api = api.clone();
        async move {
            let bc = api.get("demo").await.ok()?;
            let resumed = annotated(&bc, CLUSTERCTL_BLOCK_MOVE)
                && !annotated(&bc, PAUSED_WITH_CLUSTER)
                && paused(&bc).as_deref() == Some("False");
            resumed.then_some(())
        }
    })
    .await;
    api.delete("demo", &DeleteParams::default()).await.unwrap();
    until("BootsmanCluster gone", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("demo").await.unwrap().is_none().then_some(()) }
    })
    .await;
    op.stop().await;
}

/// `/readyz` turns ready on every start once the BootsmanClusters have listed. The controller
/// itself waits for that first list on its store, which keeps a single waker: a second task
/// waiting on the same store could sleep forever, leaving a Pod that leads and reconciles at 503.
/// Twelve starts on a multi-threaded runtime make a lost wake-up all but certain to show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_becomes_ready_once_the_clusters_have_listed() {
    let env = env().await;
    let ns = env.create_namespace("op-ready").await;
    let client = env.client().await;
    let bcs: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    bcs.create(&PostParams::default(), &sample(&ns)).await.unwrap();
    for start in 1..=12 {
        let metrics = std::sync::Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
        let ctx = std::sync::Arc::new(bootsman_operator::controller::Context::new(
            client.clone(),
            OperatorSettings::default(),
            metrics,
        ));
        let (tx, mut ready) = tokio::sync::watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(bootsman_operator::controller::run(
            ctx,
            Some(ns.clone()),
            bootsman_runtime::lifecycle::Readiness::new(tx),
            async move {
                let _ = stopped.await;
            },
        ));
        let became = tokio::time::timeout(Duration::from_secs(20), ready.wait_for(|r| *r)).await;
        let _ = stop.send(());
        let _ = task.await;
        assert!(
            matches!(became, Ok(Ok(_))),
            "start {start}: the operator listed its BootsmanClusters but never reported ready"
        );
    }
}
