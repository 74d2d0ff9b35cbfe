//! Render fixtures: each `tests/fixtures/<case>/input.yaml` (with an optional `settings.yaml`)
//! renders exactly to `expected.yaml`. After an intended change to the rendering, rewrite them
//! with `BOOTSMAN_REGENERATE=1 cargo test -p bootsman-operator --test render` and review the diff.

#![allow(clippy::unwrap_used)] // test code

use std::path::Path;

use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_operator::{OperatorSettings, render};

fn check(case: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(case);
    let input = std::fs::read_to_string(dir.join("input.yaml")).unwrap();
    let bc: BootsmanCluster = serde_saphyr::from_str(&input).unwrap();
    assert_eq!(
        bootsman_operator::validate::validate(bc.metadata.name.as_deref().unwrap_or_default(), &bc.spec),
        vec![],
        "fixture {case} is a valid spec"
    );
    let settings_path = dir.join("settings.yaml");
    let settings = if settings_path.exists() {
        OperatorSettings::from_file(&settings_path).unwrap()
    } else {
        OperatorSettings::default()
    };
    let objects = render(&bc, &settings);
    let got = serde_saphyr::to_string_multiple(&objects).unwrap();
    let expected_path = dir.join("expected.yaml");
    if std::env::var_os("BOOTSMAN_REGENERATE").is_some() {
        std::fs::write(&expected_path, &got).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    assert!(
        got == expected,
        "{case}: render output differs from {}; if the change is intended, run \
         BOOTSMAN_REGENERATE=1 cargo test -p bootsman-operator --test render\n--- got ---\n{got}",
        expected_path.display()
    );
}

#[test]
fn minimal() {
    check("minimal");
}

#[test]
fn five_control_plane_two_pools() {
    check("five-control-plane-two-pools");
}

#[test]
fn all_addons() {
    check("all-addons");
}

#[test]
fn isolated_cilium() {
    check("isolated-cilium");
}

#[test]
fn isolated_kube_router() {
    check("isolated-kube-router");
}

#[test]
fn air_gapped() {
    check("air-gapped");
}

#[test]
fn own_mirror_external_lb() {
    check("own-mirror-external-lb");
}

#[test]
fn every_object_is_owned_and_labelled() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/all-addons");
    let bc: BootsmanCluster =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("input.yaml")).unwrap()).unwrap();
    for o in render(&bc, &OperatorSettings::default()) {
        let o: kube::api::DynamicObject = serde_json::from_value(o).unwrap();
        let owners = o.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].uid, "00000000-0000-0000-0000-000000000003");
        let labels = o.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("bootsman.io/cluster").map(String::as_str),
            Some("full")
        );
        assert_eq!(o.metadata.namespace.as_deref(), Some("team-c"));
    }
}

#[test]
fn settings_errors_name_the_field() {
    let err = OperatorSettings::from_yaml(
        "addons:\n  cilium:\n    repoURL: ''\n    chartName: c\n    version: '1'\n",
        "s.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("addons.cilium.repoURL"), "{err}");
    let err = OperatorSettings::from_yaml("kubeVipImag: x\n", "s.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kubeVipImag"), "{err}");
}

#[test]
fn infrastructure() {
    check("infrastructure");
}
