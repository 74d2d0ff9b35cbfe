//! Every CEL rule of our CRDs, enforced by a real kube-apiserver: the same cases as the
//! client-side unit tests, now as `kubectl apply` would meet them.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use bootsman_api::v1alpha1::{BootsmanCluster, MetalLbMode};
use bootsman_api::v1beta1::{ByoCluster, ByoHost, ByoHostSpec, ByoMachine, ByoMachineTemplate, MachineRef};
use bootsman_testenv::TestEnv;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

fn sample(name: &str) -> Vec<serde_json::Value> {
    let path = bootsman_testenv::repo_root().join("config/samples").join(name);
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn cluster(ns: &str, name: &str) -> BootsmanCluster {
    let mut c: BootsmanCluster = serde_json::from_value(sample("bootsmancluster.yaml").remove(0)).unwrap();
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c
}

/// The API server's message for a rejected write; panics unless it is a 422 Invalid.
fn rejected<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.is_invalid() => s.message,
        other => panic!("expected a 422 rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn control_plane_replicas_are_3_or_5() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-cp").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    for replicas in [1, 2, 4, 6, 7] {
        let mut c = cluster(&ns, &format!("cp{replicas}"));
        c.spec.control_plane.replicas = replicas;
        let msg = rejected(api.create(&PostParams::default(), &c).await);
        assert!(
            msg.contains("spec.controlPlane.replicas"),
            "names the field: {msg}"
        );
        assert!(msg.contains("controlPlane.replicas must be 3 or 5"), "{msg}");
        assert!(msg.contains("(rule: control-plane-replicas-3-or-5)"), "{msg}");
    }
    for replicas in [3, 5] {
        let mut c = cluster(&ns, &format!("cp{replicas}"));
        c.spec.control_plane.replicas = replicas;
        api.create(&PostParams::default(), &c).await.unwrap();
    }
}

#[tokio::test]
async fn worker_rules() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-workers").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    let pools = |replicas: &[i32]| {
        let template = cluster(&ns, "x").spec.workers[0].clone();
        replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut p = template.clone();
                p.name = format!("pool-{i}");
                p.replicas = *r;
                p
            })
            .collect::<Vec<_>>()
    };
    let mut c = cluster(&ns, "one-one");
    c.spec.workers = pools(&[1, 1]);
    let msg = rejected(api.create(&PostParams::default(), &c).await);
    assert!(msg.contains("(rule: worker-replicas-min-3)"), "{msg}");

    let mut c = cluster(&ns, "one-two");
    c.spec.workers = pools(&[1, 2]);
    api.create(&PostParams::default(), &c).await.unwrap();

    let mut c = cluster(&ns, "bad-name");
    c.spec.workers[0].name = "GPU_pool".into();
    let msg = rejected(api.create(&PostParams::default(), &c).await);
    assert!(msg.contains("(rule: worker-pool-name-dns1123)"), "{msg}");
}

#[tokio::test]
async fn metallb_l2_is_refused_with_the_reason() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-metallb").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    let mut c = cluster(&ns, "l2");
    c.spec.load_balancer.metallb.mode = MetalLbMode::L2;
    let msg = rejected(api.create(&PostParams::default(), &c).await);
    assert!(
        msg.contains("(rule: metallb-bgp-only)") && msg.contains("bottleneck"),
        "{msg}"
    );

    let mut c = cluster(&ns, "bgp-empty");
    c.spec.load_balancer.metallb.enabled = true;
    let msg = rejected(api.create(&PostParams::default(), &c).await);
    assert!(msg.contains("(rule: metallb-bgp-config)"), "{msg}");
}

#[tokio::test]
async fn version_format_and_no_downgrade() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-version").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    let mut c = cluster(&ns, "badver");
    c.spec.kubernetes_version = "1.33".into();
    let msg = rejected(api.create(&PostParams::default(), &c).await);
    assert!(msg.contains("(rule: version-format)"), "{msg}");

    let created = api
        .create(&PostParams::default(), &cluster(&ns, "ver"))
        .await
        .unwrap();
    for down in ["v1.33.3", "v1.32.9", "v0.40.0"] {
        let mut d = created.clone();
        d.spec.kubernetes_version = down.into();
        let msg = rejected(api.replace("ver", &PostParams::default(), &d).await);
        assert!(msg.contains("(rule: version-no-downgrade)"), "{down}: {msg}");
    }
    let mut up = created.clone();
    up.spec.kubernetes_version = "v1.33.10".into();
    let up = api.replace("ver", &PostParams::default(), &up).await.unwrap();
    assert_eq!(up.spec.kubernetes_version, "v1.33.10");
}

#[tokio::test]
async fn endpoint_port_and_networks() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-net").await;
    let client = env.client().await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    for port in [0, 65536] {
        let mut c = cluster(&ns, &format!("port{port}"));
        c.spec.control_plane.endpoint.port = port;
        let msg = rejected(api.create(&PostParams::default(), &c).await);
        assert!(msg.contains("(rule: endpoint-port-range)"), "{msg}");
    }
    let mut c = cluster(&ns, "overlap");
    c.spec.network.service_cidr = "10.244.128.0/20".into();
    let msg = rejected(api.create(&PostParams::default(), &c).await);
    assert!(msg.contains("(rule: network-cidrs-disjoint)"), "{msg}");

    let byoc: Api<ByoCluster> = Api::namespaced(client, &ns);
    let mut b: ByoCluster = serde_json::from_value(sample("byoh-cluster-template.yaml").remove(0)).unwrap();
    b.metadata.namespace = Some(ns.clone());
    b.spec.control_plane_endpoint.as_mut().unwrap().port = Some(70000);
    let msg = rejected(byoc.create(&PostParams::default(), &b).await);
    assert!(msg.contains("(rule: endpoint-port-range)"), "{msg}");
}

#[tokio::test]
async fn byoh_templates_apply_unchanged() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("byoh-compat").await;
    let client = env.client().await;
    let docs = sample("byoh-cluster-template.yaml");
    let mut byoc: ByoCluster = serde_json::from_value(docs[0].clone()).unwrap();
    byoc.metadata.namespace = Some(ns.clone());
    let mut tmpl: ByoMachineTemplate = serde_json::from_value(docs[1].clone()).unwrap();
    tmpl.metadata.namespace = Some(ns.clone());
    let byoc = Api::<ByoCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &byoc)
        .await
        .unwrap();
    let tmpl = Api::<ByoMachineTemplate>::namespaced(client, &ns)
        .create(&PostParams::default(), &tmpl)
        .await
        .unwrap();
    // Accepted-and-ignored BYOH fields survive the API server's pruning.
    assert!(byoc.spec.bundle_lookup_base_registry.is_some());
    assert!(tmpl.spec.template.spec.installer_ref.is_some());
}

#[tokio::test]
async fn provider_id_is_immutable_once_set() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-providerid").await;
    let api: Api<ByoMachine> = Api::namespaced(env.client().await, &ns);
    let m = api
        .create(&PostParams::default(), &ByoMachine::new("m", Default::default()))
        .await
        .unwrap();
    let mut set = m.clone();
    set.spec.provider_id = Some(format!("byoh://{ns}/h1"));
    let set = api.replace("m", &PostParams::default(), &set).await.unwrap();
    let mut changed = set.clone();
    changed.spec.provider_id = Some(format!("byoh://{ns}/h2"));
    let msg = rejected(api.replace("m", &PostParams::default(), &changed).await);
    assert!(msg.contains("(rule: providerid-immutable)"), "{msg}");
    let mut removed = set.clone();
    removed.spec.provider_id = None;
    let msg = rejected(api.replace("m", &PostParams::default(), &removed).await);
    assert!(msg.contains("(rule: providerid-immutable)"), "{msg}");
}

#[tokio::test]
async fn host_claim_never_moves_between_machines() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-claim").await;
    let api: Api<ByoHost> = Api::namespaced(env.client().await, &ns);
    let claim = |uid: &str| MachineRef {
        namespace: ns.clone(),
        name: format!("m-{uid}"),
        uid: uid.into(),
    };
    let h = api
        .create(
            &PostParams::default(),
            &ByoHost::new("h1", ByoHostSpec::default()),
        )
        .await
        .unwrap();
    let mut claimed = h.clone();
    claimed.spec.machine_ref = Some(claim("u1"));
    let claimed = api.replace("h1", &PostParams::default(), &claimed).await.unwrap();
    let mut stolen = claimed.clone();
    stolen.spec.machine_ref = Some(claim("u2"));
    let msg = rejected(api.replace("h1", &PostParams::default(), &stolen).await);
    assert!(msg.contains("(rule: claim-empty-to-machine-and-back)"), "{msg}");
    let mut released = claimed.clone();
    released.spec.machine_ref = None;
    let released = api
        .replace("h1", &PostParams::default(), &released)
        .await
        .unwrap();
    let mut reclaimed = released.clone();
    reclaimed.spec.machine_ref = Some(claim("u2"));
    let reclaimed = api
        .replace("h1", &PostParams::default(), &reclaimed)
        .await
        .unwrap();
    assert_eq!(reclaimed.name_any(), "h1");
    assert_eq!(reclaimed.spec.machine_ref.unwrap().uid, "u2");
}

#[tokio::test]
async fn image_repository_and_preflight_checks() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-nodes").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    for (i, bad) in [
        "https://registry.example.internal",
        "registry.example.internal/",
        "Reg.Example",
    ]
    .iter()
    .enumerate()
    {
        let mut c = cluster(&ns, &format!("repo{i}"));
        c.spec.image_repository = Some((*bad).into());
        let msg = rejected(api.create(&PostParams::default(), &c).await);
        assert!(msg.contains("spec.imageRepository"), "names the field: {msg}");
        assert!(msg.contains("(rule: image-repository-format)"), "{msg}");
    }
    for (i, bad) in ["all", "two words"].iter().enumerate() {
        let mut c = cluster(&ns, &format!("pre{i}"));
        c.spec.nodes.ignore_preflight_errors = vec![(*bad).into()];
        let msg = rejected(api.create(&PostParams::default(), &c).await);
        assert!(
            msg.contains("spec.nodes.ignorePreflightErrors"),
            "names the field: {msg}"
        );
        assert!(msg.contains("(rule: preflight-check-names)"), "{msg}");
    }
    let mut c = cluster(&ns, "mirror");
    c.spec.image_repository = Some("10.20.0.5:5000/k8s".into());
    c.spec.nodes.allow_cgroup_v1 = true;
    c.spec.nodes.ignore_preflight_errors = vec!["NumCPU".into()];
    let stored = api.create(&PostParams::default(), &c).await.unwrap();
    assert_eq!(
        stored.spec.image_repository.as_deref(),
        Some("10.20.0.5:5000/k8s")
    );
    assert!(stored.spec.nodes.allow_cgroup_v1);
}

#[tokio::test]
async fn isolation_rules() {
    use bootsman_api::v1alpha1::{Cni, IsolatedProject, Isolation};
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("cel-iso").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    let project = |name: &str, namespaces: &[&str]| IsolatedProject {
        name: name.into(),
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
    };
    let with = |name: &str, cni: Cni, projects: Vec<IsolatedProject>, nets: &[&str]| {
        let mut c = cluster(&ns, name);
        c.spec.network.cni = cni;
        c.spec.network.isolation = Some(Isolation {
            projects,
            host_networks: nets.iter().map(|n| n.to_string()).collect(),
        });
        c
    };
    let cases = [
        (
            with(
                "twice",
                Cni::Cilium,
                vec![project("a", &["web"]), project("b", &["web"])],
                &[],
            ),
            "isolation-namespace-once",
        ),
        (
            with(
                "same-name",
                Cni::Cilium,
                vec![project("a", &["x"]), project("a", &["y"])],
                &[],
            ),
            "isolation-project-names-unique",
        ),
        (
            with("system", Cni::Cilium, vec![project("a", &["kube-system"])], &[]),
            "isolation-namespace-reserved",
        ),
        (
            with("bad-ns", Cni::Cilium, vec![project("a", &["Web_1"])], &[]),
            "isolation-namespace-dns1123",
        ),
        (
            with("no-nets", Cni::KubeRouter, vec![project("a", &["web"])], &[]),
            "isolation-host-networks-required",
        ),
        (
            with(
                "pod-net",
                Cni::KubeRouter,
                vec![project("a", &["web"])],
                &["10.0.0.0/8"],
            ),
            "isolation-host-networks-outside-pods",
        ),
        (
            with(
                "not-cidr",
                Cni::KubeRouter,
                vec![project("a", &["web"])],
                &["hosts"],
            ),
            "isolation-host-networks-format",
        ),
    ];
    for (c, rule) in cases {
        let msg = rejected(api.create(&PostParams::default(), &c).await);
        assert!(msg.contains(&format!("(rule: {rule})")), "{rule}: {msg}");
        assert!(msg.contains("spec.network"), "names the field: {msg}");
    }
    for c in [
        with(
            "cilium",
            Cni::Cilium,
            vec![project("a", &["a-web"]), project("b", &["b-web"])],
            &[],
        ),
        with(
            "router",
            Cni::KubeRouter,
            vec![project("a", &["a-web", "a-db"])],
            &["172.31.77.0/24"],
        ),
    ] {
        api.create(&PostParams::default(), &c).await.unwrap();
    }
}
