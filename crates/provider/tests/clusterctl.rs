//! The clusterctl artifacts that `hack/release` writes: exactly one Namespace, the provider label
//! on every object, every `${VAR}` documented in `config/clusterctl/variables.md`, the v1beta2
//! contract in `metadata.yaml`, and, with the variables filled in, objects that the real API
//! server (with the CAPI CRDs and webhooks) accepts.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use bootsman_testenv::{TestEnv, repo_root};

/// Runs `hack/release` once per test binary (both tests read what it writes).
fn release() -> PathBuf {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let root = repo_root();
    ONCE.call_once(|| {
        let out = Command::new(root.join("hack/release"))
            .env(
                "CLUSTERCTL_COMPONENTS",
                env!("CARGO_BIN_EXE_clusterctl-components"),
            )
            .output()
            .expect("run hack/release");
        assert!(
            out.status.success(),
            "hack/release: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    root.join("target/release")
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `${NAME}` and `${NAME:=default}` references, by name.
fn variables(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let tail = &rest[start + 2..];
        let end = tail.find('}').expect("unterminated ${");
        let name = tail[..end].split(":=").next().unwrap();
        out.insert(name.to_string());
        rest = &tail[end..];
    }
    out
}

/// What clusterctl does: `${NAME}` from `values`, `${NAME:=default}` from `values` or the default.
fn substitute(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let tail = &rest[start + 2..];
        let end = tail.find('}').unwrap();
        let (name, default) = match tail[..end].split_once(":=") {
            Some((n, d)) => (n, Some(d)),
            None => (&tail[..end], None),
        };
        let value = values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .or(default);
        out.push_str(value.unwrap_or_else(|| panic!("required variable {name} not given")));
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

fn docs(text: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(text)
        .expect("YAML parses")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn components_have_one_namespace_the_provider_label_and_documented_variables() {
    let dir = release();
    let components = read(dir.join("infrastructure-components.yaml"));
    let template = read(dir.join("cluster-template.yaml"));
    let documented = read(repo_root().join("config/clusterctl/variables.md"));

    let objects = docs(&components);
    let namespaces: Vec<_> = objects.iter().filter(|d| d["kind"] == "Namespace").collect();
    assert_eq!(
        namespaces.len(),
        1,
        "infrastructure-components.yaml must hold exactly one Namespace"
    );
    let ns = namespaces[0]["metadata"]["name"].as_str().unwrap();
    for d in &objects {
        let what = format!("{} {}", d["kind"], d["metadata"]["name"]);
        assert_eq!(
            d["metadata"]["labels"]["cluster.x-k8s.io/provider"], "infrastructure-byoh",
            "{what} lacks the provider label"
        );
        if let Some(other) = d["metadata"]["namespace"].as_str() {
            assert_eq!(other, ns, "{what} is outside the provider's Namespace");
        }
    }
    let deployment = objects
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["name"],
        "manager"
    );
    let crds = objects
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .count();
    assert_eq!(
        crds, 5,
        "ByoHost, ByoMachine, ByoMachineTemplate, ByoCluster, ByoClusterTemplate"
    );

    for (file, text) in [
        ("infrastructure-components.yaml", &components),
        ("cluster-template.yaml", &template),
    ] {
        let vars = variables(text);
        assert!(!vars.is_empty(), "{file} has no variables");
        for v in vars {
            assert!(
                documented.contains(&format!("`{v}`")),
                "{file}: ${{{v}}} is not documented in variables.md"
            );
        }
    }

    let metadata = docs(&read(dir.join("metadata.yaml")));
    assert_eq!(metadata[0]["kind"], "Metadata");
    assert!(
        metadata[0]["releaseSeries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["contract"] == "v1beta2"),
        "every release series speaks contract v1beta2"
    );
}

fn kubectl_apply(env: &TestEnv, text: &str, dry_run: bool) {
    let mut cmd = env.kubectl();
    cmd.args([
        "apply",
        "--server-side",
        "--field-manager",
        "clusterctl-test",
        "-f",
        "-",
    ]);
    if dry_run {
        cmd.arg("--dry-run=server");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}{}\n---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_are_accepted_by_the_api_server_with_capi() {
    let env = TestEnv::shared_with_capi().await;
    let dir = release();
    let ns = env.create_namespace("clusterctl").await;

    let components = substitute(&read(dir.join("infrastructure-components.yaml")), &[]);
    // The Namespace first, for real; the rest as a server-side dry run (the CRDs are installed).
    let (namespace, rest): (Vec<_>, Vec<_>) = docs(&components)
        .into_iter()
        .partition(|d| d["kind"] == "Namespace");
    kubectl_apply(env, &serde_json::to_string(&namespace[0]).unwrap(), false);
    for d in rest {
        kubectl_apply(env, &serde_json::to_string(&d).unwrap(), true);
    }

    let template = substitute(
        &read(dir.join("cluster-template.yaml")),
        &[
            ("CLUSTER_NAME", "c1"),
            ("NAMESPACE", &ns),
            ("KUBERNETES_VERSION", "v1.33.4"),
            ("CONTROL_PLANE_ENDPOINT_IP", "10.0.0.10"),
        ],
    );
    for d in docs(&template) {
        kubectl_apply(env, &serde_json::to_string(&d).unwrap(), true);
    }
}
