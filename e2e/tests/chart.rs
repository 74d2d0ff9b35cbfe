//! The Helm chart `charts/bootsman`: its copies of the CRDs and host manifests match `config/`,
//! `helm lint` and `helm template` pass and reject values that break `values.schema.json`, and an
//! installed chart's ServiceAccounts get from the real API server exactly what their component
//! needs and are refused what it does not, and suffice for the real work: the provider (with its
//! CSR approver) and the operator, run in-process with their chart ServiceAccounts' tokens, bind a
//! host to a machine and release it, and turn a BootsmanCluster into CAPI objects and back.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use bootsman_api::capi::{Cluster, KubeadmControlPlane, Machine, MachineDeployment};
use bootsman_api::v1alpha1::{BootsmanCluster, Project};
use bootsman_api::v1beta1::{ByoCluster, ByoHost, ByoMachine, HostPhase};
use bootsman_runtime::leader::{LeaderElection, LeaderHandle};
use bootsman_runtime::metrics::Metrics;
use bootsman_testenv::{CertPair, Options, TestEnv, repo_root, wait_for};
use common::{Host, WAIT, condition, create_byo_cluster, create_cluster, create_machine, role};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

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
        (
            "config/projects",
            "charts/bootsman/files/projects",
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
    let policies: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        policies.len(),
        5,
        "the host policies and the project policies ship with the chart: {policies:?}"
    );
    for name in [
        "bootsman-project-admin-fields",
        "bootsman-project-quotas",
        "bootsman-project-pools",
    ] {
        assert!(policies.contains(&name), "{name}: {policies:?}");
    }
    // The operator keeps the Projects, and the provider restricts their clusters to their pools.
    for deployment in ["bootsman-operator", "bootsman-provider"] {
        let args = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == deployment)
            .map(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].clone())
            .unwrap();
        assert!(
            args.as_array().unwrap().iter().any(|a| a == "--projects=true"),
            "{deployment}: {args}"
        );
    }
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
        ("namespaces={Pool_A}", "namespaces"),
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

/// The chart creates the Projects of `projects.items` and the one of Rancher's form, kept on
/// uninstall, and the real API server accepts each of them (a server-side dry run against the
/// Project CRD and its rules).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_creates_the_projects_of_its_values_and_form() {
    let chart = chart();
    let values = std::env::temp_dir().join(format!("bootsman-project-values-{}.yaml", std::process::id()));
    std::fs::write(
        &values,
        "projects:\n  items:\n    - name: search\n      spec:\n        namespaces: [search, search-dev]\n\
         \x20       members: [{kind: User, name: sam, role: viewer}]\n",
    )
    .unwrap();
    let out = helm(
        None,
        &[
            "template",
            "bootsman",
            chart.to_str().unwrap(),
            "--show-only",
            "templates/project-objects.yaml",
            "-f",
            values.to_str().unwrap(),
            "--set",
            "projects.form.name=payments,projects.form.displayName=Payments team,projects.form.hostPool=rack-a",
            "--set",
            "projects.form.ownerGroup=pay-admins,projects.form.clusters=2,projects.form.workerHosts=12",
        ],
    );
    std::fs::remove_file(&values).ok();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).expect("rendered YAML parses");
    let projects: Vec<_> = docs.into_iter().filter(|d| d["kind"] == "Project").collect();
    assert_eq!(projects.len(), 2, "{projects:?}");
    let form = projects
        .iter()
        .find(|p| p["metadata"]["name"] == "payments")
        .unwrap();
    assert_eq!(
        form["spec"],
        serde_json::json!({
            "displayName": "Payments team", "namespaces": ["payments"], "hostPools": ["rack-a"],
            "members": [{"kind": "Group", "name": "pay-admins", "role": "owner"}],
            "quotas": {"clusters": 2, "workerHosts": 12},
        })
    );
    let env = TestEnv::shared().await;
    let api: Api<DynamicObject> = Api::all_with(
        env.client().await,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("bootsman.io", "v1alpha1", "Project")),
    );
    for p in &projects {
        assert_eq!(p["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
        let name = p["metadata"]["name"].as_str().unwrap();
        api.patch(name, &PatchParams::apply("helm").dry_run(), &Patch::Apply(p))
            .await
            .unwrap_or_else(|e| panic!("the API server refuses Project {name}: {e}"));
    }
    // Without a name, the form creates nothing.
    let out = helm(None, &["template", "bootsman", chart.to_str().unwrap()]);
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).expect("rendered YAML parses");
    assert!(!docs.iter().any(|d| d["kind"] == "Project"));
}

/// A control plane of its own (the chart's cluster-scoped objects must not meet other tests')
/// with the chart installed into `bootsman-system` as an operator would (CRDs are already there).
async fn installed_chart() -> TestEnv {
    installed_chart_for(&[]).await.0
}

/// [`installed_chart`] with a namespace made for each of `prefixes` first and the chart told
/// about them (`--set namespaces={...}`): Secrets rights in those namespaces only. Returns the
/// namespaces' names too.
async fn installed_chart_for(prefixes: &[&str]) -> (TestEnv, Vec<String>) {
    let env = TestEnv::start(Options::default())
        .await
        .expect("start the control plane");
    let mut namespaces = Vec::new();
    for p in prefixes {
        namespaces.push(env.create_namespace(p).await);
    }
    let chart = chart();
    let set = format!("namespaces={{{}}}", namespaces.join(","));
    let mut args = vec![
        "install",
        "bootsman",
        chart.to_str().unwrap(),
        "--namespace",
        "bootsman-system",
        "--create-namespace",
        "--skip-crds",
        "--wait=false",
    ];
    if !namespaces.is_empty() {
        args.extend(["--set", set.as_str()]);
    }
    let out = helm(Some(&env), &args);
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (env, namespaces)
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

/// Allowed by RBAC: the object may or may not exist.
#[track_caller]
fn allowed_or_missing<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        other => panic!("{what}: expected it allowed, got {other:?}"),
    }
}

#[track_caller]
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
    let env = installed_chart().await;
    let admin = env.client().await;

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
    // It asks for a kubeconfig Secret by name; it never lists or watches Secrets.
    allowed_or_missing(
        "operator reads a kubeconfig Secret by name",
        secrets.get_metadata_opt("c1-kubeconfig").await,
    );
    forbidden(
        "operator lists Secrets",
        secrets.list_metadata(&ListParams::default()).await,
    );
    forbidden(
        "operator lists the Secrets of every namespace",
        Api::<Secret>::all(operator.clone())
            .list_metadata(&ListParams::default())
            .await,
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

/// Told its pool and cluster namespaces (`namespaces`), the chart gives the controllers Secrets
/// there and nowhere else: not in another namespace, not across all namespaces, and in
/// kube-system only the approver's get, update and delete of bootstrap tokens. The provider
/// (and its approver) writes Roles and RoleBindings in those namespaces only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_chart_keeps_the_controllers_out_of_other_secrets() {
    let (env, namespaces) = installed_chart_for(&["pool", "clusters"]).await;
    let (pool, clusters) = (&namespaces[0], &namespaces[1]);
    let admin = env.client().await;
    let elsewhere = env.create_namespace("team-secrets").await;
    let provider = token_client(&env, &admin, RELEASE_NS, "bootsman-provider").await;
    let operator = token_client(&env, &admin, RELEASE_NS, "bootsman-operator").await;
    let secret = |name: &str| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };

    // The provider: everything with Secrets of its namespaces.
    for ns in [pool, clusters] {
        let api: Api<Secret> = Api::namespaced(provider.clone(), ns);
        api.list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("provider lists Secrets in {ns}: {e}"));
        api.create(&PostParams::default(), &secret("host-copy"))
            .await
            .unwrap_or_else(|e| panic!("provider writes a Secret in {ns}: {e}"));
    }
    // Nothing elsewhere.
    let other: Api<Secret> = Api::namespaced(provider.clone(), &elsewhere);
    forbidden(
        "provider lists another namespace's Secrets",
        other.list(&ListParams::default()).await,
    );
    forbidden(
        "provider reads another namespace's Secret",
        other.get("anything").await,
    );
    forbidden(
        "provider writes a Secret in another namespace",
        other.create(&PostParams::default(), &secret("planted")).await,
    );
    forbidden(
        "provider lists the Secrets of every namespace",
        Api::<Secret>::all(provider.clone())
            .list(&ListParams::default())
            .await,
    );
    // Roles and RoleBindings: written in its namespaces (a host's reader Role and binding, the
    // approver's pool bindings), read everywhere, written nowhere else. The objects grant nothing,
    // so a refusal is RBAC's, not the escalation check's.
    let empty_role = |name: &str| Role {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        rules: Some(vec![]),
    };
    let binding_to = |name: &str| RoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: k8s_openapi::api::rbac::v1::RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![k8s_openapi::api::rbac::v1::Subject {
            kind: "User".into(),
            name: "byoh:host:nobody".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    for ns in [pool, clusters] {
        Api::<Role>::namespaced(provider.clone(), ns)
            .create(&PostParams::default(), &empty_role("reader"))
            .await
            .unwrap_or_else(|e| panic!("provider writes a Role in {ns}: {e}"));
        let bindings = Api::<RoleBinding>::namespaced(provider.clone(), ns);
        bindings
            .create(&PostParams::default(), &binding_to("reader"))
            .await
            .unwrap_or_else(|e| panic!("provider writes a RoleBinding in {ns}: {e}"));
        bindings
            .delete("reader", &Default::default())
            .await
            .unwrap_or_else(|e| panic!("provider deletes a RoleBinding in {ns}: {e}"));
    }
    Api::<RoleBinding>::all(provider.clone())
        .list(&ListParams::default())
        .await
        .expect("provider reads the RoleBindings of every namespace");
    forbidden(
        "provider writes a Role in another namespace",
        Api::<Role>::namespaced(provider.clone(), &elsewhere)
            .create(&PostParams::default(), &empty_role("planted"))
            .await,
    );
    forbidden(
        "provider writes a RoleBinding in another namespace",
        Api::<RoleBinding>::namespaced(provider.clone(), &elsewhere)
            .create(&PostParams::default(), &binding_to("planted"))
            .await,
    );
    forbidden(
        "provider writes a RoleBinding in kube-system",
        Api::<RoleBinding>::namespaced(provider.clone(), "kube-system")
            .create(&PostParams::default(), &binding_to("planted"))
            .await,
    );

    // kube-system: a bootstrap token by name, never a list.
    let tokens: Api<Secret> = Api::namespaced(provider.clone(), "kube-system");
    allowed_or_missing(
        "the approver reads a bootstrap token by name",
        tokens.get("bootstrap-token-abcdef").await,
    );
    forbidden(
        "the approver lists kube-system's Secrets",
        tokens.list(&ListParams::default()).await,
    );
    forbidden(
        "the approver writes a Secret in kube-system",
        tokens.create(&PostParams::default(), &secret("planted")).await,
    );

    // The operator: a kubeconfig Secret by name in a cluster namespace, nothing more.
    let kubeconfigs: Api<Secret> = Api::namespaced(operator.clone(), clusters);
    allowed_or_missing(
        "operator reads a kubeconfig Secret by name",
        kubeconfigs.get_metadata_opt("c1-kubeconfig").await,
    );
    forbidden(
        "operator lists Secrets of a cluster namespace",
        kubeconfigs.list_metadata(&ListParams::default()).await,
    );
    forbidden(
        "operator reads a Secret in another namespace",
        Api::<Secret>::namespaced(operator.clone(), &elsewhere)
            .get_metadata_opt("c1-kubeconfig")
            .await,
    );
}

/// The namespace the chart runs its components in, and where their leader Leases live.
const RELEASE_NS: &str = "bootsman-system";

/// A component run in the test's runtime as its binary runs it: once it holds its leader Lease in
/// the release namespace (with its own client, so the chart's leader-election Role is what lets
/// it), until [`Component::stop`].
struct Component {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    election: LeaderHandle,
}

impl Component {
    async fn start<F, Fut>(client: &Client, lease: &str, work: F) -> Self
    where
        F: FnOnce(Client, std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (mut held, election) = LeaderElection::new(client.clone(), RELEASE_NS, lease, "test-pod")
            .start()
            .await
            .unwrap_or_else(|e| panic!("{lease}: leader election: {e}"));
        held.wait_for(|h| *h).await.unwrap();
        let (stop, stopped) = watch::channel(false);
        let shutdown = async move {
            let mut stopped = stopped;
            let _ = stopped.wait_for(|s| *s).await;
        };
        let task = tokio::spawn(work(client.clone(), Box::pin(shutdown)));
        Self { stop, task, election }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
        self.election.stop().await.unwrap();
    }
}

/// The provider as `bootsman-provider` runs it from the chart: every namespace, Secrets of
/// `secret_namespaces` (the chart's `namespaces`), the default release timeout, and the host CSR
/// approver next to the controllers.
async fn start_provider(client: &Client, secret_namespaces: Vec<String>) -> Component {
    Component::start(client, "bootsman-provider", |client, shutdown| async move {
        let shutdown = futures::FutureExt::shared(shutdown);
        let metrics = Arc::new(Metrics::new().unwrap());
        let (controllers, approver) = tokio::join!(
            bootsman_provider::run(
                client.clone(),
                bootsman_provider::Config {
                    secret_namespaces,
                    ..Default::default()
                },
                metrics.clone(),
                shutdown.clone(),
            ),
            bootsman_provider::enrollment::run(client, metrics, Default::default(), shutdown),
        );
        controllers.unwrap();
        approver.unwrap();
    })
    .await
}

/// The operator as `bootsman-operator` runs it: every namespace, the default settings.
async fn start_operator(client: &Client) -> Component {
    Component::start(client, "bootsman-operator", |client, shutdown| async move {
        let metrics = Arc::new(Metrics::new().unwrap());
        let ctx = Arc::new(bootsman_operator::controller::Context::new(
            client,
            bootsman_operator::OperatorSettings::default(),
            metrics,
        ));
        bootsman_operator::controller::run(
            ctx,
            None,
            bootsman_runtime::lifecycle::Readiness::detached(),
            shutdown,
        )
        .await;
    })
    .await
}

/// Renews host `name`'s certificate as its agent does (a CSR with its current identity, a fresh
/// key), so the approver must decide it with the chart's rights; returns the renewed identity.
async fn renewed_identity(env: &TestEnv, current: &Client, name: &str) -> Client {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("byoh:host:{name}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "byoh:hosts");
    let request = params.serialize_request(&key).unwrap().pem().unwrap();
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("byoh-host-{name}-")),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["client auth".into()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        status: None,
    };
    let csrs: Api<CertificateSigningRequest> = Api::all(current.clone());
    let csr = csrs.create(&PostParams::default(), &csr).await.unwrap();
    let csr_name = csr.name_any();
    let cert = wait_for("the renewal to be approved and signed", WAIT, || async {
        let st = csrs
            .get(&csr_name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        match st.certificate.filter(|c| !c.0.is_empty()) {
            Some(c) => Ok(c.0),
            None => Err(format!("{:?}", st.conditions)),
        }
    })
    .await;
    let dir = env.dir().join(format!("renewed-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let pair = CertPair {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&pair.cert, cert).unwrap();
    std::fs::write(&pair.key, key.serialize_pem()).unwrap();
    env.client_with_cert(&pair).await
}

/// Waits until the ByoHost, as its host reads it, satisfies `ok`.
async fn host_until(host: &Host, what: &str, ok: impl Fn(&ByoHost) -> bool) -> ByoHost {
    wait_for(what, WAIT, || async {
        let h = Api::<ByoHost>::namespaced(host.client.clone(), &host.ns)
            .get(&host.name)
            .await
            .map_err(|e| e.to_string())?;
        if ok(&h) {
            Ok(h)
        } else {
            Err(format!("{:?}", (&h.spec, &h.status)))
        }
    })
    .await
}

/// Waits until `api` no longer has `name`.
async fn gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(&format!("{name} to be gone"), WAIT, || async {
        match api.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(o) => Err(format!("still there: {:?}", o.meta())),
        }
    })
    .await
}

/// Waits for an Event with `reason` in `ns` reported by `controller` (publishing is best effort,
/// so a missing Events permission would show nowhere else).
async fn event_seen(admin: &Client, ns: &str, controller: &str, reason: &str) {
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    wait_for(&format!("a {reason} Event from {controller}"), WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let seen: Vec<_> = list
            .items
            .iter()
            .map(|e| (e.reporting_controller.clone(), e.reason.clone()))
            .collect();
        if seen
            .iter()
            .any(|(c, r)| c.as_deref() == Some(controller) && r.as_deref() == Some(reason))
        {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await
}

fn provisioned(bm: &ByoMachine) -> bool {
    bm.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true)
}

/// With nothing but the installed chart's RBAC, the provider and its CSR approver (token of
/// `bootsman-provider`) and the operator (token of `bootsman-operator`) do their whole job: a host
/// with its own identity renews its certificate, registers, is claimed, reads its bootstrap data,
/// is provisioned and released clean; a BootsmanCluster is rendered into CAPI objects and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_rbac_suffices_to_bind_and_release_a_host_and_to_render_a_cluster() {
    // The chart confines Secrets to the pool and cluster namespaces it is told about.
    let (env, namespaces) = installed_chart_for(&["pool", "clusters"]).await;
    let (pool, clusters_ns) = (namespaces[0].clone(), namespaces[1].clone());
    let admin = env.client().await;

    // The chart ships the host roles and admission policies of config/rbac.
    let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
    for name in [
        "bootsman:host",
        "bootsman:host-renewal",
        "bootsman:host-bootstrapper",
        "bootsman:host-csr-approver",
    ] {
        cluster_roles
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("ClusterRole {name}: {e}"));
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    for name in ["bootsman-host-own-objects", "bootsman-host-spec-fields"] {
        policies
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("ValidatingAdmissionPolicy {name}: {e}"));
    }

    let provider_sa = token_client(&env, &admin, RELEASE_NS, "bootsman-provider").await;
    let operator_sa = token_client(&env, &admin, RELEASE_NS, "bootsman-operator").await;
    let provider = start_provider(&provider_sa, namespaces.clone()).await;
    let operator = start_operator(&operator_sa).await;

    // A host of pool `pool`: the rights the approver grants at enrollment (bootsman:host in the
    // pool only, bound with the provider's own rights), then a renewal the approver decides.
    bootsman_provider::enrollment::pool_access::grant_pool_access(&provider_sa, &pool, "h1")
        .await
        .expect("the provider binds bootsman:host in a pool");
    let enrolled = env.client_for("byoh:host:h1", &["byoh:hosts"]).await;
    let mut host = Host::register(enrolled.clone(), &pool, "h1", &[], true).await;
    // Placement is the admin's: the role label that the Machine's selector asks for.
    Api::<ByoHost>::namespaced(admin.clone(), &pool)
        .patch(
            "h1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"role": "worker"}}})),
        )
        .await
        .unwrap();
    // The provider hands the binding to the ByoHost; only then may the host renew.
    let uid = host.get().await.uid().unwrap();
    wait_for("the ByoHost to own its pool RoleBinding", WAIT, || async {
        let rb = Api::<RoleBinding>::namespaced(admin.clone(), &pool)
            .get("byoh:host:h1")
            .await
            .map_err(|e| e.to_string())?;
        if rb.owner_references().iter().any(|o| o.uid == uid) {
            Ok(())
        } else {
            Err(format!("{:?}", rb.owner_references()))
        }
    })
    .await;
    host.client = renewed_identity(&env, &enrolled, "h1").await;

    // CAPI's objects, written as admin: the Cluster, its ByoCluster and a worker Machine.
    let cluster = create_cluster(&admin, &pool, "c1", false).await;
    create_byo_cluster(&admin, &cluster, "10.0.0.40").await;
    let byoclusters: Api<ByoCluster> = Api::namespaced(admin.clone(), &pool);
    create_machine(&admin, &pool, "c1", "m0", Some(role("worker"))).await;

    // Claimed, with its providerID, bootstrap data the host alone may read, and provisioned once
    // the host reports its bootstrap done.
    let byomachines: Api<ByoMachine> = Api::namespaced(admin.clone(), &pool);
    let claimed = host_until(&host, "the host to be claimed with bootstrap data", |h| {
        h.spec.machine_ref.as_ref().is_some_and(|r| r.name == "m0") && h.spec.bootstrap_secret.is_some()
    })
    .await;
    let bm = byomachines.get("m0").await.unwrap();
    assert_eq!(
        bm.spec.provider_id.as_deref(),
        Some(format!("byoh://{pool}/h1").as_str())
    );
    let secret_name = claimed.spec.bootstrap_secret.unwrap().name;
    let data = Api::<Secret>::namespaced(host.client.clone(), &pool)
        .get(&secret_name)
        .await
        .expect("the host reads its bootstrap Secret");
    assert!(String::from_utf8_lossy(&data.data.unwrap()["value"].0).contains("echo m0"));
    host.report("BootstrapSucceeded", true, "Done").await;
    let bm = wait_for("m0 to be provisioned", WAIT, || async {
        let bm = byomachines.get("m0").await.map_err(|e| e.to_string())?;
        if provisioned(&bm) {
            Ok(bm)
        } else {
            Err(format!("{:?}", bm.status))
        }
    })
    .await;
    assert_eq!(
        condition(&bm, "Ready"),
        Some(("True".into(), "Provisioned".into()))
    );
    wait_for("the ByoCluster to be provisioned", WAIT, || async {
        let bc = byoclusters.get("c1").await.map_err(|e| e.to_string())?;
        let p = bc
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned);
        if p == Some(true) {
            Ok(())
        } else {
            Err(format!("{:?}", bc.status))
        }
    })
    .await;

    // The Machine goes: the host is asked to reset, reports it clean, and is free again.
    Api::<Machine>::namespaced(admin.clone(), &pool)
        .delete("m0", &DeleteParams::default())
        .await
        .unwrap();
    match byomachines.delete("m0", &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {} // the garbage collector was first
        Err(e) => panic!("delete ByoMachine m0: {e}"),
    }
    host_until(&host, "the release request", |h| h.spec.release.is_some()).await;
    host.report("CleanupSucceeded", true, "Reset").await;
    gone(&byomachines, "m0").await;
    let free = host_until(&host, "the host to be available again", |h| {
        h.status.as_ref().and_then(|s| s.phase) == Some(HostPhase::Available)
    })
    .await;
    assert!(free.spec.machine_ref.is_none() && free.spec.bootstrap_secret.is_none());
    assert!(free.spec.release.is_none() && free.spec.quarantine.is_none());
    event_seen(&admin, &pool, "bootsman-provider", "HostReleased").await;
    gone(&Api::<Secret>::namespaced(admin.clone(), &pool), &secret_name).await;
    let reader = bootsman_provider::byo_machine::bootstrap::role_name("h1");
    gone(&Api::<Role>::namespaced(admin.clone(), &pool), &reader).await;
    gone(&Api::<RoleBinding>::namespaced(admin.clone(), &pool), &reader).await;

    // The operator renders the sample into CAPI objects without a refusal, and lets it go.
    common::install_helm_chart_proxy_crd(&env).await;
    let bcs: Api<BootsmanCluster> = Api::namespaced(admin.clone(), &clusters_ns);
    let sample = bcs
        .create(&PostParams::default(), &common::sample(&clusters_ns))
        .await
        .unwrap();
    let name = sample.name_any();
    let rendered = bootsman_operator::render(&sample, &bootsman_operator::OperatorSettings::default());
    wait_for("every rendered object to exist", WAIT, || async {
        let mut missing = Vec::new();
        for obj in &rendered {
            let (group, version) = obj["apiVersion"].as_str().unwrap().rsplit_once('/').unwrap();
            let kind = obj["kind"].as_str().unwrap();
            let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
            let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &clusters_ns, &ar);
            let obj_name = obj["metadata"]["name"].as_str().unwrap();
            if api.get_opt(obj_name).await.map_err(|e| e.to_string())?.is_none() {
                missing.push(format!("{kind}/{obj_name}"));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing {missing:?}"))
        }
    })
    .await;
    let status = wait_for("the BootsmanCluster's status", WAIT, || async {
        let bc = bcs.get(&name).await.map_err(|e| e.to_string())?;
        match bc.status {
            Some(st) if st.observed_generation == bc.metadata.generation && !st.conditions.is_empty() => {
                Ok(st)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for c in &status.conditions {
        assert!(
            !c.message.to_lowercase().contains("forbidden"),
            "{}: {}",
            c.type_,
            c.message
        );
    }
    Api::<Cluster>::namespaced(admin.clone(), &clusters_ns)
        .get(&name)
        .await
        .unwrap();
    Api::<KubeadmControlPlane>::namespaced(admin.clone(), &clusters_ns)
        .get(&format!("{name}-control-plane"))
        .await
        .unwrap();
    Api::<MachineDeployment>::namespaced(admin.clone(), &clusters_ns)
        .get(&format!("{name}-default"))
        .await
        .unwrap();
    event_seen(&admin, &clusters_ns, "bootsman-operator", "Applied").await;
    bcs.delete(&name, &DeleteParams::default()).await.unwrap();
    gone(&bcs, &name).await;
    gone(&Api::<Cluster>::namespaced(admin.clone(), &clusters_ns), &name).await;

    // The Project controller with the operator's chart identity: a new namespace, a quota, the
    // member and host-pool RoleBindings and the per-project ClusterRoles, all allowed.
    let projects = Component::start(
        &operator_sa,
        "bootsman-operator-projects",
        |client, shutdown| async move {
            bootsman_operator::project::run(client, shutdown).await;
        },
    )
    .await;
    let project = format!("{clusters_ns}-team");
    let team_ns = format!("{clusters_ns}-team");
    let body = serde_json::json!({
        "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
        "metadata": {"name": project},
        "spec": {
            "namespaces": [team_ns],
            "hostPools": [pool],
            "members": [
                {"kind": "User", "name": "team-owner", "role": "owner"},
                {"kind": "Group", "name": "team-devs", "role": "member"},
                {"kind": "ServiceAccount", "name": "ci", "namespace": "default", "role": "viewer"},
            ],
            "quotas": {"clusters": 2, "resourceQuota": {"hard": {"configmaps": "10"}}},
        },
    });
    let project_api: Api<Project> = Api::all(admin.clone());
    project_api
        .patch(
            &project,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    let ready = wait_for("the Project reconciled with the chart's rights", WAIT, || async {
        let p = project_api.get(&project).await.map_err(|e| e.to_string())?;
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
        match ready {
            Some(c) if c.status == "True" => Ok(p),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(ready.status.unwrap().namespaces, vec![team_ns.clone()]);
    for role in ["owner", "member", "viewer"] {
        Api::<RoleBinding>::namespaced(admin.clone(), &team_ns)
            .get(&format!("bootsman:project:{role}"))
            .await
            .unwrap_or_else(|e| panic!("RoleBinding for {role}: {e}"));
    }
    Api::<RoleBinding>::namespaced(admin.clone(), &pool)
        .get(&format!("bootsman:project:{project}:hosts"))
        .await
        .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .get(&format!("bootsman:project:{project}:owner"))
        .await
        .unwrap();
    // Its rights to RoleBindings do not let it hand out more than the project roles.
    let escalate: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "escalate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": "team-owner", "apiGroup": "rbac.authorization.k8s.io"}],
    }))
    .unwrap();
    let refused = Api::<RoleBinding>::namespaced(operator_sa.clone(), &team_ns)
        .create(&PostParams::default(), &escalate)
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "the operator bound cluster-admin: {refused:?}"
    );
    projects.stop().await;

    operator.stop().await;
    provider.stop().await;
}
