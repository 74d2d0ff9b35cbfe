//! Every CEL rule of our CRDs, evaluated client-side with kube's CEL engine. The same rules are
//! checked against a real API server in the integration tests.

use kube::core::cel::ValidationErrors;

use crate::fixtures::sample_documents;
use crate::v1alpha1::{BootsmanCluster, MetalLbMode};
use crate::v1beta1::{ByoCluster, ByoHost, ByoMachine, MachineRef};

/// kube's CEL engine evaluates recursively; the address-ordering rules nest deeper than a test
/// thread's default stack, so each evaluation runs on a thread with a larger one.
const CEL_STACK: usize = 256 << 20;

fn validate_cel<T>(obj: &T) -> Result<(), ValidationErrors>
where
    T: kube::CustomResourceExt + serde::Serialize + Sync,
{
    on_big_stack(|| kube::core::cel::validate_cel(obj))
}

fn validate_cel_update<T>(obj: &T, old: &T) -> Result<(), ValidationErrors>
where
    T: kube::CustomResourceExt + serde::Serialize + Sync,
{
    on_big_stack(|| kube::core::cel::validate_cel_update(obj, old))
}

fn on_big_stack<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(CEL_STACK)
            .spawn_scoped(s, f)
            .unwrap()
            .join()
            .unwrap()
    })
}

fn sample_cluster() -> BootsmanCluster {
    serde_json::from_value(sample_documents("bootsmancluster.yaml").remove(0)).unwrap()
}

/// The messages of the failures, so tests can check that the right rule fired.
fn messages(result: Result<(), ValidationErrors>) -> Vec<String> {
    match result {
        Ok(()) => Vec::new(),
        Err(errs) => errs.iter().map(|e| e.message.clone()).collect(),
    }
}

fn assert_rejected_by(result: Result<(), ValidationErrors>, rule: &str) {
    let msgs = messages(result);
    assert!(
        msgs.iter().any(|m| m.contains(&format!("(rule: {rule})"))),
        "expected rule {rule} to reject; got {msgs:?}"
    );
}

#[test]
fn sample_cluster_is_valid() {
    assert_eq!(messages(validate_cel(&sample_cluster())), Vec::<String>::new());
}

#[test]
fn control_plane_replicas_must_be_3_or_5() {
    for replicas in [1, 2, 4, 6, 7] {
        let mut c = sample_cluster();
        c.spec.control_plane.replicas = replicas;
        let msgs = messages(validate_cel(&c));
        assert_eq!(
            msgs,
            vec![
                "controlPlane.replicas must be 3 or 5: etcd needs an odd number of members, and 3 or 5 keep \
                 quorum when 1 or 2 fail (rule: control-plane-replicas-3-or-5)"
                    .to_string()
            ],
            "replicas {replicas}"
        );
    }
    for replicas in [3, 5] {
        let mut c = sample_cluster();
        c.spec.control_plane.replicas = replicas;
        assert_eq!(
            messages(validate_cel(&c)),
            Vec::<String>::new(),
            "replicas {replicas}"
        );
    }
}

#[test]
fn workers_need_at_least_three_replicas_in_total() {
    let pool = |name: &str, replicas| {
        let mut p = sample_cluster().spec.workers[0].clone();
        p.name = name.into();
        p.replicas = replicas;
        p
    };
    let mut c = sample_cluster();
    c.spec.workers = vec![pool("a", 1), pool("b", 1)];
    assert_eq!(
        messages(validate_cel(&c)),
        vec![
            "the worker pools must have at least 3 replicas in total, or none when controlPlane.schedulable \
             is true (rule: worker-replicas-min-3)"
                .to_string()
        ]
    );
    c.spec.workers = vec![pool("a", 1), pool("b", 2)];
    assert_eq!(messages(validate_cel(&c)), Vec::<String>::new());
    // None at all only when the control plane takes the workloads; 1 or 2 never.
    c.spec.workers = vec![pool("a", 0)];
    assert_eq!(messages(validate_cel(&c)).len(), 1);
    c.spec.control_plane.schedulable = true;
    assert_eq!(messages(validate_cel(&c)), Vec::<String>::new());
    c.spec.workers = vec![pool("a", 2)];
    assert_eq!(messages(validate_cel(&c)).len(), 1);
}

#[test]
fn worker_pool_names_are_unique_dns1123_labels() {
    let mut c = sample_cluster();
    let mut second = c.spec.workers[0].clone();
    second.replicas = 1;
    c.spec.workers.push(second);
    assert_rejected_by(validate_cel(&c), "worker-pool-names-unique");

    for bad in ["Default", "-edge", "edge-", "gpu_pool", "a.b"] {
        let mut c = sample_cluster();
        c.spec.workers[0].name = bad.into();
        assert_rejected_by(validate_cel(&c), "worker-pool-name-dns1123");
    }
    for good in ["a", "gpu-1", "edge0"] {
        let mut c = sample_cluster();
        c.spec.workers[0].name = good.into();
        assert_eq!(messages(validate_cel(&c)), Vec::<String>::new(), "{good}");
    }
}

#[test]
fn metallb_l2_mode_is_refused_and_says_why() {
    let mut c = sample_cluster();
    c.spec.load_balancer.metallb.mode = MetalLbMode::L2;
    let msgs = messages(validate_cel(&c));
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].contains("(rule: metallb-bgp-only)"), "{msgs:?}");
    assert!(
        msgs[0].contains("bottleneck"),
        "the message must say why L2 is refused: {msgs:?}"
    );
}

#[test]
fn metallb_in_bgp_mode_needs_peers_and_pools() {
    let mut c = sample_cluster();
    c.spec.load_balancer.metallb.enabled = true;
    assert_rejected_by(validate_cel(&c), "metallb-bgp-config");
    c.spec.load_balancer.metallb.bgp_peers = vec![
        serde_json::from_value(
            serde_json::json!({"peerAddress": "10.0.0.1", "peerASN": 64500, "myASN": 64501}),
        )
        .unwrap(),
    ];
    c.spec.load_balancer.metallb.address_pools = vec![
        serde_json::from_value(serde_json::json!({"name": "default", "addresses": ["10.0.10.0/24"]}))
            .unwrap(),
    ];
    assert_eq!(messages(validate_cel(&c)), Vec::<String>::new());
}

/// The sample with MetalLB on and one pool of `addresses`.
fn with_pool(addresses: &[&str]) -> BootsmanCluster {
    let mut c = sample_cluster();
    c.spec.load_balancer.metallb.enabled = true;
    c.spec.load_balancer.metallb.bgp_peers = vec![
        serde_json::from_value(
            serde_json::json!({"peerAddress": "10.0.0.1", "peerASN": 64500, "myASN": 64501}),
        )
        .unwrap(),
    ];
    c.spec.load_balancer.metallb.address_pools =
        vec![serde_json::from_value(serde_json::json!({"name": "lb", "addresses": addresses})).unwrap()];
    c
}

/// The rule names among the failures.
fn rules(result: Result<(), ValidationErrors>) -> Vec<String> {
    let mut out: Vec<String> = messages(result)
        .iter()
        .filter_map(|m| m.split("(rule: ").nth(1)?.split(')').next().map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// CEL has no ordering of addresses; the rule derives it from prefixes. Checked against Rust's
/// ordering for addresses that differ in every bit position, of both families.
#[test]
fn a_range_must_go_from_the_lower_address_to_the_higher() {
    let mut pairs: Vec<(std::net::IpAddr, std::net::IpAddr)> = Vec::new();
    let v4 = u32::from(std::net::Ipv4Addr::new(172, 20, 7, 9));
    let v6 = u128::from("fd00:aa::1234:5678".parse::<std::net::Ipv6Addr>().unwrap());
    for bit in (0..32).step_by(3).chain([31]) {
        let other = std::net::Ipv4Addr::from(v4 ^ (1 << bit));
        pairs.push((std::net::Ipv4Addr::from(v4).into(), other.into()));
    }
    for bit in (0..128).step_by(16).chain([1, 63, 127]) {
        let other = std::net::Ipv6Addr::from(v6 ^ (1 << bit));
        pairs.push((std::net::Ipv6Addr::from(v6).into(), other.into()));
    }
    pairs.push(("172.20.7.9".parse().unwrap(), "172.20.7.9".parse().unwrap()));
    for (a, b) in pairs {
        for (first, last) in [(a, b), (b, a)] {
            let range = format!("{first}-{last}");
            let got = rules(validate_cel(&with_pool(&[&range])));
            let want: Vec<String> = if first > last {
                vec!["address-pool-range-order".into()]
            } else {
                vec![]
            };
            assert_eq!(got, want, "{range}");
        }
    }
}

/// A range whose two ends lie outside a cluster network may still span it.
#[test]
fn a_range_spanning_a_cluster_network_or_the_endpoint_is_refused() {
    // The sample: pods 10.244.0.0/16, services 10.96.0.0/12, endpoint 10.0.0.10.
    for (range, overlap) in [
        ("10.243.255.250-10.245.0.5", true),
        ("10.95.0.1-10.112.0.1", true),
        ("10.0.0.5-10.0.0.20", true),
        ("10.0.0.11-10.0.0.20", false),
        ("10.245.0.1-10.245.0.9", false),
        ("10.0.0.1-10.0.0.9", false),
    ] {
        let got = rules(validate_cel(&with_pool(&[range])));
        let want: Vec<String> = if overlap {
            vec!["address-pool-overlap".into()]
        } else {
            vec![]
        };
        assert_eq!(got, want, "{range}");
    }
}

#[test]
fn kubernetes_version_must_be_vxyz() {
    for bad in ["1.33.4", "v1.33", "v1.33.4-rc.0", "latest"] {
        let mut c = sample_cluster();
        c.spec.kubernetes_version = bad.into();
        assert_rejected_by(validate_cel(&c), "version-format");
    }
}

#[test]
fn kubernetes_version_never_goes_down() {
    let old = sample_cluster(); // v1.33.4
    for (new, ok) in [
        ("v1.33.4", true),
        ("v1.33.5", true),
        ("v1.34.0", true),
        ("v2.0.0", true),
        ("v1.33.10", true),
        ("v1.33.3", false),
        ("v1.32.9", false),
        ("v0.99.99", false),
    ] {
        let mut c = old.clone();
        c.spec.kubernetes_version = new.into();
        let result = validate_cel_update(&c, &old);
        if ok {
            assert_eq!(messages(result), Vec::<String>::new(), "{new}");
        } else {
            assert_eq!(
                messages(result),
                vec!["kubernetesVersion cannot go down; downgrades are not supported (rule: version-no-downgrade)"
                    .to_string()],
                "{new}"
            );
        }
    }
}

#[test]
fn endpoint_port_is_1_to_65535() {
    for (port, ok) in [
        (0, false),
        (1, true),
        (6443, true),
        (65535, true),
        (65536, false),
        (-1, false),
    ] {
        let mut c = sample_cluster();
        c.spec.control_plane.endpoint.port = port;
        let msgs = messages(validate_cel(&c));
        assert_eq!(msgs.is_empty(), ok, "port {port}: {msgs:?}");
        if !ok {
            assert!(msgs[0].contains("(rule: endpoint-port-range)"), "{msgs:?}");
        }
    }
    let mut byoc: ByoCluster =
        serde_json::from_value(sample_documents("byoh-cluster-template.yaml").remove(0)).unwrap();
    byoc.spec.control_plane_endpoint.as_mut().unwrap().port = Some(70000);
    assert_rejected_by(validate_cel(&byoc), "endpoint-port-range");
}

#[test]
fn image_repository_is_a_host_and_path_without_scheme() {
    for (repo, ok) in [
        ("registry.example.internal/k8s", true),
        ("10.20.0.5:5000", true),
        ("172.31.77.1:5000/mirror/registry.k8s.io", true),
        ("https://registry.example.internal", false),
        ("registry.example.internal/", false),
        ("Registry.Example", false),
        ("reg:port", false),
        ("", false),
    ] {
        let mut c = sample_cluster();
        c.spec.image_repository = Some(repo.into());
        let msgs = messages(validate_cel(&c));
        assert_eq!(msgs.is_empty(), ok, "{repo:?}: {msgs:?}");
        if !ok && !repo.is_empty() {
            assert!(msgs[0].contains("(rule: image-repository-format)"), "{msgs:?}");
        }
    }
}

#[test]
fn preflight_checks_are_named_one_by_one() {
    let mut c = sample_cluster();
    c.spec.nodes.ignore_preflight_errors = vec!["NumCPU".into(), "SystemVerification".into()];
    assert_eq!(messages(validate_cel(&c)), Vec::<String>::new());
    for bad in ["all", "ALL", "two words", "-x"] {
        let mut c = sample_cluster();
        c.spec.nodes.ignore_preflight_errors = vec![bad.into()];
        assert_rejected_by(validate_cel(&c), "preflight-check-names");
    }
}

#[test]
fn pod_and_service_cidrs_are_cidrs_and_disjoint() {
    let mut c = sample_cluster();
    c.spec.network.pod_cidr = "10.244.0.0".into();
    assert_rejected_by(validate_cel(&c), "pod-cidr-format");
    let mut c = sample_cluster();
    c.spec.network.service_cidr = "10.244.128.0/20".into();
    assert_rejected_by(validate_cel(&c), "network-cidrs-disjoint");
}

fn machine(provider_id: Option<&str>) -> ByoMachine {
    let mut m = ByoMachine::new("m", Default::default());
    m.spec.provider_id = provider_id.map(Into::into);
    m
}

#[test]
fn provider_id_is_immutable_once_set() {
    assert_eq!(
        messages(validate_cel_update(
            &machine(Some("byoh://pool/h1")),
            &machine(None)
        )),
        Vec::<String>::new()
    );
    assert_eq!(
        messages(validate_cel_update(
            &machine(Some("byoh://pool/h1")),
            &machine(Some("byoh://pool/h1"))
        )),
        Vec::<String>::new()
    );
    assert_rejected_by(
        validate_cel_update(&machine(Some("byoh://pool/h2")), &machine(Some("byoh://pool/h1"))),
        "providerid-immutable",
    );
    assert_rejected_by(
        validate_cel_update(&machine(None), &machine(Some("byoh://pool/h1"))),
        "providerid-immutable",
    );
}

fn host(claim: Option<&str>) -> ByoHost {
    let mut h = ByoHost::new("h1", Default::default());
    h.spec.machine_ref = claim.map(|uid| MachineRef {
        namespace: "team-a".into(),
        name: format!("m-{uid}"),
        uid: uid.into(),
    });
    h
}

#[test]
fn host_claim_goes_from_empty_to_a_machine_and_back() {
    let ok = |new, old| {
        assert_eq!(
            messages(validate_cel_update(&host(new), &host(old))),
            Vec::<String>::new()
        )
    };
    ok(Some("u1"), None); // claim
    ok(Some("u1"), Some("u1")); // unchanged
    ok(None, Some("u1")); // release
    assert_rejected_by(
        validate_cel_update(&host(Some("u2")), &host(Some("u1"))),
        "claim-empty-to-machine-and-back",
    );
}

#[test]
fn samples_parse_into_the_types() {
    let c = sample_cluster();
    assert_eq!(c.spec.control_plane.replicas, 3);
    assert_eq!(c.spec.workers.iter().map(|w| w.replicas).sum::<i32>(), 3);

    let docs = sample_documents("byoh-cluster-template.yaml");
    assert_eq!(docs.len(), 2);
    let byoc: ByoCluster = serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(
        byoc.spec
            .control_plane_endpoint
            .as_ref()
            .unwrap()
            .port_or_default(),
        6443
    );
    assert!(byoc.spec.bundle_lookup_base_registry.is_some());
    let tmpl: crate::v1beta1::ByoMachineTemplate = serde_json::from_value(docs[1].clone()).unwrap();
    assert!(tmpl.spec.template.spec.installer_ref.is_some());
    assert!(tmpl.spec.template.spec.selector.is_some());
    // Nothing a BYOH template says is dropped on the way through our types.
    assert_eq!(serde_json::to_value(&tmpl).unwrap(), docs[1]);
    assert_eq!(serde_json::to_value(&byoc).unwrap(), docs[0]);
}
