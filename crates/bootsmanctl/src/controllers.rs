//! The controllers step of `bootsmanctl install`: Cluster API's three managers and the Bootsman
//! chart run as Pods in the infrastructure cluster, every image from the site's registry.
//!
//! Cluster API is installed as `clusterctl init` leaves it, without cert-manager: its CRDs
//! (labelled with their contract and provider) and clusterctl's provider inventory; per manager
//! a namespace, ServiceAccount, its ClusterRole from the bundle and a binding, a Deployment of one
//! replica (`<registry>/cluster-api/<controller>:<version>`) and a webhook Service; the webhooks
//! and CRD conversions point at those Services. Their serving certificates come from a webhook
//! CA of the site's own (`<state>/infrastructure/pki/`), one year each; a later `install` issues
//! them again. Then the Bootsman chart with `helm upgrade --install`, images
//! `<registry>/bootsman-io/<controller>:<chart appVersion>`. The step ends when every Deployment
//! of the four namespaces is Available.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bootsman_controlplane::capi::{MANAGERS, Manager, Serve};
use bootsman_controlplane::pki::Pki;
use bootsman_controlplane::{Bundle, manifests};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::bootstrap::{self, NAMESPACE};
use crate::install::MANAGER;
use crate::site::Site;

/// Where the managers' webhook servers read their certificates.
const CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";

/// Installs Cluster API and Bootsman into the cluster of `client` (the infrastructure cluster,
/// whose admin kubeconfig is `kubeconfig`) and waits until they are Available.
pub async fn install(
    site: &Site,
    bundle: &Bundle,
    chart: &Path,
    client: &kube::Client,
    kubeconfig: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let version = bundle.capi_version()?;
    let dir = site.state_dir().join("infrastructure");
    let pki = Pki::open(
        &dir.join("pki"),
        &format!("{}-webhooks", site.infrastructure_name()),
        &[],
    )?;
    let ca = std::fs::read(&pki.files().server_ca.cert).context("read the webhook CA")?;

    let mut crds = bootsman_api::crdgen::all();
    crds.extend(bootsman_controlplane::capi::crds(
        bundle,
        Some(&Serve::InCluster),
        &ca,
    )?);
    manifests::install(client, &crds).await?;
    bootsman_controlplane::capi::write_inventory(client, &version).await?;
    say(&format!(
        "{} CRDs established and the clusterctl inventory written (Cluster API {version})",
        crds.len()
    ));

    for m in &MANAGERS {
        let dns = [
            format!("{}.{}.svc", m.service, m.namespace),
            format!("{}.{}.svc.cluster.local", m.service, m.namespace),
        ];
        let serving = pki.serving(&format!("{}-webhook", m.name), m.service, &dns)?;
        for doc in manager_objects(site, bundle, m, &version, &serving)? {
            apply(client, doc).await?;
        }
    }
    bootsman_controlplane::capi::register_webhooks(client, bundle, &Serve::InCluster, &ca).await?;
    say(&format!(
        "Cluster API managers deployed from {}/cluster-api (webhooks served in the cluster)",
        site.spec.registry
    ));

    bootstrap::helm_install(site, bundle, chart, kubeconfig, &dir, &[])?;
    say(&format!(
        "chart {} installed as release {} in {NAMESPACE}, images from {}/bootsman-io",
        chart.display(),
        bootstrap::RELEASE,
        site.spec.registry
    ));

    let namespaces: Vec<&str> = MANAGERS.iter().map(|m| m.namespace).chain([NAMESPACE]).collect();
    wait_available(client, &namespaces, Duration::from_secs(600), say).await
}

/// The objects of one manager: ServiceAccount, ClusterRole (the bundle's, renamed) and its
/// binding, the webhook certificate Secret and Service, and the Deployment.
fn manager_objects(
    site: &Site,
    bundle: &Bundle,
    m: &Manager,
    version: &str,
    serving: &bootsman_controlplane::CertPair,
) -> anyhow::Result<Vec<Value>> {
    let ns = m.namespace;
    let labels = json!({"app.kubernetes.io/name": m.name, "app.kubernetes.io/part-of": "cluster-api"});
    let role_file = bundle.dir.join(format!("crds/capi-rbac/{}.yaml", m.manifest));
    let mut role = manifests::read_file(&role_file)?
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .with_context(|| format!("{} holds no ClusterRole", role_file.display()))?;
    let role_name = format!("{}-manager", m.name);
    role["metadata"] = json!({"name": role_name, "labels": labels});
    let cert = std::fs::read_to_string(&serving.cert).context("read a webhook certificate")?;
    let key = std::fs::read_to_string(&serving.key).context("read a webhook key")?;
    let secret = format!("{}-webhook-cert", m.name);
    Ok(vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": m.name, "namespace": ns, "labels": labels}}),
        role,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": role_name, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
               "subjects": [{"kind": "ServiceAccount", "name": m.name, "namespace": ns}]}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": secret, "namespace": ns, "labels": labels},
               "stringData": {"tls.crt": cert, "tls.key": key}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": m.service, "namespace": ns, "labels": labels},
               "spec": {"selector": {"app.kubernetes.io/name": m.name},
                        "ports": [{"port": 443, "targetPort": "webhook-server"}]}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": m.name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": m.name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": m.name,
                    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "manager",
                        "image": format!("{}/{}:{version}", site.spec.registry, m.image),
                        "args": [
                            "--leader-elect=false",
                            "--webhook-port=9443",
                            format!("--webhook-cert-dir={CERT_DIR}"),
                            "--health-addr=:9440",
                            "--diagnostics-address=0",
                        ],
                        "env": [
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                        ],
                        "ports": [
                            {"name": "webhook-server", "containerPort": 9443},
                            {"name": "healthz", "containerPort": 9440},
                        ],
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "healthz"}},
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "healthz"}, "initialDelaySeconds": 15},
                        "volumeMounts": [{"name": "cert", "mountPath": CERT_DIR, "readOnly": true}],
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                            "capabilities": {"drop": ["ALL"]}},
                    }],
                    "volumes": [{"name": "cert", "secret": {"secretName": secret}}],
                },
            },
        }}),
    ])
}

/// Server-side apply of one object of a built-in kind.
async fn apply(client: &kube::Client, doc: Value) -> anyhow::Result<()> {
    let (group, version) = match doc["apiVersion"].as_str().unwrap_or_default().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (
            String::new(),
            doc["apiVersion"].as_str().unwrap_or_default().to_string(),
        ),
    };
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &kind));
    let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&doc))
        .await
        .with_context(|| format!("apply {kind} {name}"))?;
    Ok(())
}

/// Waits until every Deployment of `namespaces` is Available, reporting each as it becomes so.
async fn wait_available(
    client: &kube::Client,
    namespaces: &[&str],
    timeout: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut reported = std::collections::BTreeSet::new();
    loop {
        let mut waiting = Vec::new();
        for ns in namespaces {
            let list = Api::<Deployment>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("list the Deployments of {ns}"))?;
            for d in list.items {
                let name = format!("{ns}/{}", d.metadata.name.clone().unwrap_or_default());
                let status = d.status.unwrap_or_default();
                let want = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                if status.available_replicas.unwrap_or(0) >= want {
                    if reported.insert(name.clone()) {
                        say(&format!(
                            "{name} Available ({want} replica{})",
                            if want == 1 { "" } else { "s" }
                        ));
                    }
                } else {
                    waiting.push(format!(
                        "{name} {}/{want}",
                        status.available_replicas.unwrap_or(0)
                    ));
                }
            }
        }
        if waiting.is_empty() && !reported.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "not Available after {}s: {}; see `kubectl get pods -A` with the infrastructure kubeconfig",
                timeout.as_secs(),
                waiting.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}
