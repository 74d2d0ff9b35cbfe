//! The Helm chart `charts/bootsman`: its copies of the CRDs and host manifests match `config/`,
//! `helm lint` and `helm template` pass and reject values that break `values.schema.json`, and an
//! installed chart's ServiceAccounts get from the real API server exactly what their component
//! needs and are refused what it does not.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use bootsman_testenv::{Options, TestEnv, repo_root};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

fn chart() -> PathBuf {
    repo_root().join("charts/bootsman")
}

fn helm(env: Option<&TestEnv>, args: &[&str]) -> std::process::Output {
    let testbin = bootsman_testenv::Testbin::locate().expect("control-plane binaries (hack/testbin)");
    let mut cmd = Command::new(testbin.bin("helm"));
    let scratch = std::env::temp_dir().join(format!("bootsman-helm-{}", std::process::id()));
    cmd.args(args)
        .env("HELM_CACHE_HOME", scratch.join("cache"))
        .env("HELM_CONFIG_HOME", scratch.join("config"))
        .env("HELM_DATA_HOME", scratch.join("data"));
    if let Some(env) = env {
        cmd.env("KUBECONFIG", env.kubeconfig());
    }
    cmd.output().expect("run helm")
}

fn files(dir: &Path, skip: &[&str]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| !skip.contains(&p.file_name().unwrap().to_str().unwrap()))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn chart_carries_the_same_crds_and_host_manifests_as_config() {
    let root = repo_root();
    for (ours, chart_copy, skip) in [
        ("config/crd", "charts/bootsman/crds", &[][..]),
        (
            "config/rbac",
            "charts/bootsman/files/rbac",
            &["kustomization.yaml"][..],
        ),
    ] {
        let a = files(&root.join(ours), skip);
        let b = files(&root.join(chart_copy), &[]);
        assert!(!a.is_empty(), "{ours} is empty");
        let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a), names(&b), "{chart_copy} is stale: run hack/sync-chart");
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert!(
                x == y,
                "{chart_copy}/{name} differs from {ours}/{name}: run hack/sync-chart"
            );
        }
    }
}

#[test]
fn helm_lint_and_template_pass_with_the_defaults() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let lint = helm(None, &["lint", "--strict", chart]);
    assert!(
        lint.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    let out = helm(
        None,
        &["template", "bootsman", chart, "--namespace", "bootsman-system"],
    );
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("rendered YAML parses");
    let docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let kinds = |kind: &str| docs.iter().filter(|d| d["kind"] == kind).count();
    assert_eq!(kinds("Deployment"), 2);
    assert_eq!(kinds("ServiceAccount"), 2);
    assert_eq!(
        kinds("ValidatingAdmissionPolicy"),
        2,
        "the host policy ships with the chart"
    );
    for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
        let name = d["metadata"]["name"].as_str().unwrap();
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(
            c["name"], "manager",
            "{name}: clusterctl expects the container `manager`"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
        assert!(c["livenessProbe"]["httpGet"]["path"] == "/livez", "{name}");
        assert!(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "{name}");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{name}");
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(args.contains(&"--leader-elect=true"), "{name}: {args:?}");
    }
}

#[test]
fn values_that_break_the_schema_are_refused_with_the_field_named() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for (set, field) in [
        ("provider.replicas=0", "replicas"),
        ("provider.releaseTimeout=soon", "releaseTimeout"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("operator.unknownKnob=1", "unknownKnob"),
    ] {
        let out = helm(None, &["template", "bootsman", chart, "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} was accepted");
        assert!(
            err.contains(field),
            "--set {set}: the error does not name {field}: {err}"
        );
    }
}

async fn token_client(env: &TestEnv, admin: &Client, ns: &str, sa: &str) -> Client {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("token for {ns}/{sa}: {e}"))
        .status
        .expect("token status")
        .token;
    let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).unwrap()
}

fn forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

/// The chart installs into a real API server (its own control plane: the chart's cluster-scoped
/// objects must not meet other tests'), and each ServiceAccount can do its component's work and
/// nothing outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_chart_grants_each_component_what_it_needs_and_no_more() {
    let env = TestEnv::start(Options::default())
        .await
        .expect("start the control plane");
    let admin = env.client().await;
    let chart = chart();
    let out = helm(
        Some(&env),
        &[
            "install",
            "bootsman",
            chart.to_str().unwrap(),
            "--namespace",
            "bootsman-system",
            "--create-namespace",
            "--skip-crds",
            "--wait=false",
        ],
    );
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let provider = token_client(&env, &admin, "bootsman-system", "bootsman-provider").await;
    let operator = token_client(&env, &admin, "bootsman-system", "bootsman-operator").await;

    // What the provider needs: hosts, machines, CAPI owners, Secrets, CSRs.
    let hosts: Api<bootsman_api::v1beta1::ByoHost> = Api::all(provider.clone());
    hosts
        .list(&ListParams::default())
        .await
        .expect("provider lists ByoHosts");
    let machines: Api<bootsman_api::capi::Machine> = Api::all(provider.clone());
    machines
        .list(&ListParams::default())
        .await
        .expect("provider lists Machines");
    let csrs: Api<CertificateSigningRequest> = Api::all(provider.clone());
    csrs.list(&ListParams::default())
        .await
        .expect("provider lists CSRs (host enrollment)");
    let secrets: Api<Secret> = Api::namespaced(provider.clone(), "default");
    secrets
        .list(&ListParams::default())
        .await
        .expect("provider reads bootstrap data Secrets");

    // What the provider does not need.
    let bcs: Api<bootsman_api::v1alpha1::BootsmanCluster> = Api::all(provider.clone());
    forbidden(
        "provider lists BootsmanClusters",
        bcs.list(&ListParams::default()).await,
    );
    let sas: Api<ServiceAccount> = Api::namespaced(provider.clone(), "kube-system");
    forbidden(
        "provider lists ServiceAccounts",
        sas.list(&ListParams::default()).await,
    );

    // What the operator needs: its clusters, hosts to count, kubeconfig Secrets to find.
    let bcs: Api<bootsman_api::v1alpha1::BootsmanCluster> = Api::all(operator.clone());
    bcs.list(&ListParams::default())
        .await
        .expect("operator lists BootsmanClusters");
    let hosts: Api<bootsman_api::v1beta1::ByoHost> = Api::all(operator.clone());
    hosts
        .list(&ListParams::default())
        .await
        .expect("operator lists ByoHosts");

    // What the operator does not need: writing Secrets, hosts, CSRs.
    let secrets: Api<Secret> = Api::namespaced(operator.clone(), "default");
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("stolen".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    forbidden(
        "operator creates a Secret",
        secrets.create(&PostParams::default(), &secret).await,
    );
    let csrs: Api<CertificateSigningRequest> = Api::all(operator.clone());
    forbidden("operator lists CSRs", csrs.list(&ListParams::default()).await);
    let host = hosts.list(&ListParams::default()).await.unwrap();
    assert!(host.items.is_empty());
    let hosts_ns: Api<bootsman_api::v1beta1::ByoHost> = Api::namespaced(operator.clone(), "default");
    forbidden(
        "operator deletes ByoHosts",
        hosts_ns
            .delete_collection(&Default::default(), &ListParams::default())
            .await,
    );
}
