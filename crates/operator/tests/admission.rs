//! Admission and the operator agree: for every BootsmanCluster below, the CRD's CEL rules (as a
//! real kube-apiserver enforces them, with a server-side dry run) and the operator's own
//! validation (which catches objects stored before a rule existed) refuse it with the same rule
//! names, or both accept it.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;

use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_operator::validate::validate;
use bootsman_testenv::TestEnv;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

fn sample() -> serde_json::Value {
    let path = bootsman_testenv::repo_root().join("config/samples/bootsmancluster.yaml");
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every `(rule: name)` in `text`.
fn rule_names(text: &str) -> BTreeSet<String> {
    text.split("(rule: ")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(r, _)| r.to_string()))
        .collect()
}

/// JSON merge patch (RFC 7386): objects merge key by key, anything else replaces.
fn merge(doc: &mut serde_json::Value, patch: &serde_json::Value) {
    match (doc, patch) {
        (serde_json::Value::Object(d), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(d.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (d, p) => *d = p.clone(),
    }
}

/// Applies `patch` (a JSON merge patch) to the sample, named `name`.
fn cluster(name: &str, patch: serde_json::Value) -> BootsmanCluster {
    let mut doc = sample();
    merge(&mut doc, &patch);
    doc["metadata"]["name"] = json!(name);
    serde_json::from_value(doc).unwrap()
}

fn metallb(pools: serde_json::Value) -> serde_json::Value {
    json!({"spec": {"loadBalancer": {"metallb": {
        "enabled": true,
        "bgpPeers": [{"peerAddress": "10.0.0.1", "peerASN": 64500, "myASN": 64501}],
        "addressPools": pools,
    }}}})
}

/// A merge patch setting `spec.nodes.kubelet`.
fn kubelet(settings: serde_json::Value) -> serde_json::Value {
    json!({"spec": {"nodes": {"kubelet": settings}}})
}

#[tokio::test]
async fn admission_and_the_operator_refuse_the_same_clusters() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("parity").await;
    let api: Api<BootsmanCluster> = Api::namespaced(env.client().await, &ns);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pools = |addresses: serde_json::Value| metallb(json!([{"name": "lb", "addresses": addresses}]));
    let long = "c".repeat(50);
    // (name, patch, the rules both must name; empty: both accept)
    let cases: Vec<(String, serde_json::Value, &[&str])> = vec![
        ("ok".into(), json!({}), &[]),
        ("c".repeat(49), json!({}), &[]),
        (
            "no-workers".into(),
            json!({"spec": {"workers": [{"name": "default", "replicas": 0}]}}),
            &["worker-replicas-min-3"],
        ),
        (
            "schedulable-no-workers".into(),
            json!({"spec": {"controlPlane": {"schedulable": true}, "workers": [{"name": "default", "replicas": 0}]}}),
            &[],
        ),
        (
            "schedulable-two-workers".into(),
            json!({"spec": {"controlPlane": {"schedulable": true}, "workers": [{"name": "default", "replicas": 2}]}}),
            &["worker-replicas-min-3"],
        ),
        (long.clone(), json!({}), &["cluster-name-length"]),
        (
            "c".repeat(40),
            json!({"spec": {"workers": [{"name": "p".repeat(23), "replicas": 3}]}}),
            &["worker-pool-name-length"],
        ),
        (
            "wide-services".into(),
            json!({"spec": {"network": {"serviceCIDR": "10.64.0.0/11"}}}),
            &["service-cidr-size"],
        ),
        (
            "v6-wide-services".into(),
            json!({"spec": {"network": {"podCIDR": "fd00:10::/56", "serviceCIDR": "fd00:20::/100"},
                            "controlPlane": {"endpoint": {"host": "fd00::10"}}}}),
            &["service-cidr-size"],
        ),
        (
            "v6".into(),
            json!({"spec": {"network": {"podCIDR": "fd00:10::/56", "serviceCIDR": "fd00:20::/112"},
                            "controlPlane": {"endpoint": {"host": "fd00::10"}}}}),
            &[],
        ),
        (
            "mixed-families".into(),
            json!({"spec": {"network": {"podCIDR": "fd00:10::/56"}}}),
            &["network-cidrs-same-family"],
        ),
        (
            "overlapping-networks".into(),
            json!({"spec": {"network": {"serviceCIDR": "10.244.128.0/20"}}}),
            &["network-cidrs-disjoint"],
        ),
        (
            "endpoint-in-pods".into(),
            json!({"spec": {"controlPlane": {"endpoint": {"host": "10.244.1.1"}}}}),
            &["endpoint-outside-cluster-networks"],
        ),
        (
            "metallb-ok".into(),
            pools(json!(["10.0.10.0/24", "10.0.11.5-10.0.11.9"])),
            &[],
        ),
        (
            "peer-not-ip".into(),
            json!({"spec": {"loadBalancer": {"metallb": {
                "enabled": true,
                "bgpPeers": [{"peerAddress": "router.example", "peerASN": 64500, "myASN": 64501}],
                "addressPools": [{"name": "lb", "addresses": ["10.0.10.0/24"]}],
            }}}}),
            &["metallb-peer-address"],
        ),
        (
            "pool-name".into(),
            metallb(json!([{"name": "Public_IPs", "addresses": ["10.0.10.0/24"]}])),
            &["address-pool-name-dns1123"],
        ),
        (
            "pool-names-twice".into(),
            metallb(json!([
                {"name": "lb", "addresses": ["10.0.10.0/24"]},
                {"name": "lb", "addresses": ["10.0.11.0/24"]},
            ])),
            &["address-pool-names-unique"],
        ),
        (
            "pool-garbage".into(),
            pools(json!(["ten-dot-zero"])),
            &["address-pool-addresses"],
        ),
        (
            "pool-half-range".into(),
            pools(json!(["10.0.10.5-"])),
            &["address-pool-addresses"],
        ),
        (
            "pool-mixed-range".into(),
            pools(json!(["10.0.10.5-fd00::9"])),
            &["address-pool-addresses"],
        ),
        (
            "pool-in-pods".into(),
            pools(json!(["10.244.3.0/24"])),
            &["address-pool-overlap"],
        ),
        (
            "pool-holds-services".into(),
            pools(json!(["10.0.0.0/8"])),
            &["address-pool-overlap"],
        ),
        (
            "pool-holds-endpoint".into(),
            pools(json!(["10.0.0.0/24"])),
            &["address-pool-overlap"],
        ),
        (
            "range-in-services".into(),
            pools(json!(["10.96.0.5-10.96.0.9"])),
            &["address-pool-overlap"],
        ),
        (
            "range-ends-at-endpoint".into(),
            pools(json!(["10.0.0.5-10.0.0.10"])),
            &["address-pool-overlap"],
        ),
        (
            "range-spans-services".into(),
            pools(json!(["10.95.0.1-10.112.0.1"])),
            &["address-pool-overlap"],
        ),
        (
            "range-spans-endpoint".into(),
            pools(json!(["10.0.0.5-10.0.0.20"])),
            &["address-pool-overlap"],
        ),
        (
            "reversed-range".into(),
            pools(json!(["10.0.10.9-10.0.10.5"])),
            &["address-pool-range-order"],
        ),
        (
            "v6-reversed-range".into(),
            json!({"spec": {"network": {"podCIDR": "fd00:10::/56", "serviceCIDR": "fd00:20::/112"},
            "controlPlane": {"endpoint": {"host": "fd00::10"}},
            "loadBalancer": {"metallb": {
                "enabled": true,
                "bgpPeers": [{"peerAddress": "fd00::1", "peerASN": 64500, "myASN": 64501}],
                "addressPools": [{"name": "lb", "addresses": ["fd00:30::9-fd00:30::5", "fd00:40::1-fd00:40::8"]}],
            }}}}),
            &["address-pool-range-order"],
        ),
        (
            "lab-disk".into(),
            kubelet(
                json!({"evictionHard": {"nodefs.available": "2Gi", "imagefs.available": "2Gi"},
                           "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 95}),
            ),
            &[],
        ),
        (
            "eviction-forms".into(),
            kubelet(
                json!({"evictionHard": {"memory.available": "+500M", "nodefs.available": "7.5%",
                "imagefs.available": "0%", "pid.available": "1e3", "nodefs.inodesFree": ".5Ki"}}),
            ),
            &[],
        ),
        (
            "eviction-signal".into(),
            kubelet(json!({"evictionHard": {"disk.available": "1Gi"}})),
            &["eviction-signal"],
        ),
        (
            "eviction-over-100".into(),
            kubelet(json!({"evictionHard": {"memory.available": "101%"}})),
            &["eviction-threshold"],
        ),
        (
            "eviction-zero".into(),
            kubelet(json!({"evictionHard": {"memory.available": "0Gi"}})),
            &["eviction-threshold"],
        ),
        (
            "eviction-negative".into(),
            kubelet(json!({"evictionHard": {"memory.available": "-1Gi"}})),
            &["eviction-threshold"],
        ),
        (
            "eviction-units".into(),
            kubelet(json!({"evictionHard": {"nodefs.available": "1GB"}})),
            &["eviction-threshold"],
        ),
        (
            "gc-high-below-default-low".into(),
            kubelet(json!({"imageGCHighThresholdPercent": 80})),
            &["image-gc-thresholds"],
        ),
        (
            "gc-equal".into(),
            kubelet(json!({"imageGCHighThresholdPercent": 70, "imageGCLowThresholdPercent": 70})),
            &["image-gc-thresholds"],
        ),
    ];
    for (name, patch, want) in cases {
        let mut c = cluster(&name, patch.clone());
        c.metadata.namespace = Some(ns.clone());
        let want: BTreeSet<String> = want.iter().map(|r| r.to_string()).collect();
        let server = match api.create(&dry_run, &c).await {
            Ok(_) => BTreeSet::new(),
            Err(kube::Error::Api(s)) if s.is_invalid() => {
                let found = rule_names(&s.message);
                assert!(
                    !found.is_empty(),
                    "{name}: refused without a rule name: {}",
                    s.message
                );
                found
            }
            Err(e) => panic!("{name}: {e}"),
        };
        let ours: Vec<_> = validate(&name, &c.spec);
        let operator: BTreeSet<String> = ours.iter().flat_map(|v| rule_names(&v.message)).collect();
        assert_eq!(server, want, "{name}: the API server's rules for {patch}");
        assert_eq!(
            operator, want,
            "{name}: the operator's rules for {patch}: {ours:?}"
        );
        for v in &ours {
            assert!(v.field.starts_with("spec") || v.field == "metadata.name", "{v}");
        }
    }
}

#[test]
fn an_ipv6_endpoint_is_one_address() {
    let v6 = cluster(
        "v6",
        json!({"spec": {"network": {"podCIDR": "fd00:10::/56", "serviceCIDR": "fd00:20::/112"},
                        "controlPlane": {"endpoint": {"host": "fd00::10"}}}}),
    );
    let manifest = bootsman_operator::render::kube_vip_manifest(&v6, "kube-vip");
    assert!(
        manifest.contains("value: '128'") || manifest.contains("value: \"128\""),
        "{manifest}"
    );
    let v4 = cluster("v4", json!({}));
    let manifest = bootsman_operator::render::kube_vip_manifest(&v4, "kube-vip");
    assert!(
        manifest.contains("value: '32'") || manifest.contains("value: \"32\""),
        "{manifest}"
    );
}
