//! `status::compute` (and `status::invalid`) from fixtures, no API server: each file of
//! `tests/fixtures/status/` holds a BootsmanCluster (spec and stored status), what the operator
//! observed, and the phase, conditions (status, reason and, where given, message) and Events
//! expected. A case whose spec breaks a rule goes through `status::invalid`, as the controller
//! does.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::collections::BTreeMap;
use std::path::PathBuf;

use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_operator::status::{self, Observed};
use bootsman_operator::validate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    cluster: serde_json::Value,
    #[serde(default)]
    observed: Observed,
    expect: Expect,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Expect {
    phase: String,
    #[serde(default)]
    kubeconfig_secret: Option<String>,
    /// type -> [status, reason, message?]
    conditions: BTreeMap<String, Vec<String>>,
    events: Vec<String>,
}

fn cases() -> Vec<(PathBuf, Case)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/status");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let case: Case = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, case)
        })
        .collect()
}

#[test]
fn every_fixture_gives_its_conditions_phase_and_events() {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let cases = cases();
    assert!(cases.len() >= 6, "the fixtures are missing: {}", cases.len());
    for (path, case) in cases {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut cluster = case.cluster.clone();
        cluster["apiVersion"] = "bootsman.io/v1alpha1".into();
        cluster["kind"] = "BootsmanCluster".into();
        let bc: BootsmanCluster =
            serde_json::from_value(cluster).unwrap_or_else(|e| panic!("{file}: cluster: {e}"));
        let violations = validate(&bc.name_any(), &bc.spec);
        let report = if violations.is_empty() {
            status::compute(&bc, &case.observed, &now)
        } else {
            status::invalid(&bc, &violations, &now)
        };
        let st = &report.status;
        assert_eq!(
            st.phase.map(|p| format!("{p:?}")).as_deref(),
            Some(case.expect.phase.as_str()),
            "{file}: phase"
        );
        assert_eq!(
            st.observed_generation, bc.metadata.generation,
            "{file}: observedGeneration"
        );
        assert_eq!(
            st.kubeconfig_secret, case.expect.kubeconfig_secret,
            "{file}: kubeconfigSecret"
        );
        for (type_, want) in &case.expect.conditions {
            let c = st
                .conditions
                .iter()
                .find(|c| &c.type_ == type_)
                .unwrap_or_else(|| panic!("{file}: no condition {type_} in {:?}", st.conditions));
            assert_eq!(c.status, want[0], "{file}: {type_} status ({c:?})");
            assert_eq!(c.reason, want[1], "{file}: {type_} reason ({c:?})");
            if let Some(message) = want.get(2) {
                assert_eq!(&c.message, message, "{file}: {type_} message");
            }
            assert_eq!(
                c.observed_generation, bc.metadata.generation,
                "{file}: {type_} generation"
            );
        }
        let events: Vec<&str> = report.notes.iter().map(|n| n.reason).collect();
        assert_eq!(events, case.expect.events, "{file}: Events");

        // Computed again over its own result, nothing changes and nothing is published: a
        // cluster at rest makes no writes and no Events.
        if violations.is_empty() {
            let mut again = bc.clone();
            again.status = Some(st.clone());
            let second = status::compute(&again, &case.observed, &now);
            assert_eq!(
                &second.status, st,
                "{file}: a second computation changed the status"
            );
            assert!(
                second.notes.is_empty(),
                "{file}: a second computation published {:?}",
                second.notes
            );
        }
    }
}
