//! The Cluster API managers (core, kubeadm bootstrap, kubeadm control plane), run as local
//! processes against the local API server, with their admission and conversion webhooks served on
//! loopback and registered by URL (the way controller-runtime's envtest does it), and the Cluster
//! API CRDs labelled and inventoried as `clusterctl init` leaves them.

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

use crate::bundle::Bundle;
use crate::error::{Result, io, kube};
use crate::pki::CertPair;
use crate::{FIELD_MANAGER, manifests, process::Component};

/// One Cluster API manager.
#[derive(Debug)]
pub struct Manager {
    /// Its name here (`capi-core`, ...): component, log and webhook-configuration prefix.
    pub name: &'static str,
    /// Its program in the bundle.
    pub binary: &'static str,
    /// Its webhook manifest and ClusterRole in the bundle (`crds/capi-webhooks/<manifest>.yaml`,
    /// `crds/capi-rbac/<manifest>.yaml`).
    pub manifest: &'static str,
    /// Its namespace in a cluster where it runs as a Pod (as `clusterctl init` names it).
    pub namespace: &'static str,
    /// Its webhook Service there.
    pub service: &'static str,
    /// Its image, below a registry (as Cluster API publishes it).
    pub image: &'static str,
}

/// Core, kubeadm bootstrap, kubeadm control plane: the index used everywhere below.
pub const MANAGERS: [Manager; 3] = [
    Manager {
        name: "capi-core",
        binary: "capi-manager",
        manifest: "core",
        namespace: "capi-system",
        service: "capi-webhook-service",
        image: "cluster-api/cluster-api-controller",
    },
    Manager {
        name: "capi-kubeadm-bootstrap",
        binary: "capi-kubeadm-bootstrap-manager",
        manifest: "bootstrap",
        namespace: "capi-kubeadm-bootstrap-system",
        service: "capi-kubeadm-bootstrap-webhook-service",
        image: "cluster-api/kubeadm-bootstrap-controller",
    },
    Manager {
        name: "capi-kubeadm-control-plane",
        binary: "capi-kubeadm-control-plane-manager",
        manifest: "controlplane",
        namespace: "capi-kubeadm-control-plane-system",
        service: "capi-kubeadm-control-plane-webhook-service",
        image: "cluster-api/kubeadm-control-plane-controller",
    },
];

/// Where the managers serve their webhooks.
#[derive(Clone, Copy, Debug)]
pub enum Serve {
    /// As local processes, on these loopback ports.
    Loopback(Ports),
    /// As Pods, behind their Services (port 443).
    InCluster,
}

impl Serve {
    /// The `clientConfig` that reaches manager `i` at `path`, trusting `ca` (PEM).
    fn client_config(&self, i: usize, path: &str, ca: &[u8]) -> apiext::WebhookClientConfig {
        match self {
            Serve::Loopback(ports) => apiext::WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{}{path}", ports.webhook[i])),
                ca_bundle: Some(ByteString(ca.to_vec())),
                service: None,
            },
            Serve::InCluster => apiext::WebhookClientConfig {
                url: None,
                ca_bundle: Some(ByteString(ca.to_vec())),
                service: Some(apiext::ServiceReference {
                    name: MANAGERS[i].service.into(),
                    namespace: MANAGERS[i].namespace.into(),
                    path: Some(path.into()),
                    port: Some(443),
                }),
            },
        }
    }
}

/// Loopback ports of the three managers: `webhook[i]` and `health[i]` of manager `i` (core,
/// kubeadm bootstrap, kubeadm control plane), chosen before the CRDs are installed so the
/// conversion webhooks can point at them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ports {
    /// Webhook servers.
    pub webhook: [u16; 3],
    /// Health probes (`/readyz`).
    pub health: [u16; 3],
}

/// Which manager converts a CRD of this group.
fn manager_for_group(group: &str) -> usize {
    match group {
        "bootstrap.cluster.x-k8s.io" => 1,
        "controlplane.cluster.x-k8s.io" => 2,
        _ => 0,
    }
}

/// The Cluster API CRDs of `bundle` and clusterctl's inventory CRD, as `clusterctl init` leaves
/// them (labelled with their contract and provider): with `serve`, every multi-version CRD
/// converts through the manager that serves it (trusting `ca`, PEM); without, only the storage
/// version is served.
pub fn crds(
    bundle: &Bundle,
    serve: Option<&Serve>,
    ca: &[u8],
) -> Result<Vec<apiext::CustomResourceDefinition>> {
    let mut crds = manifests::read_dir(&bundle.capi_crds())?;
    match serve {
        Some(serve) => route_conversion_to_managers(&mut crds, serve, ca),
        None => serve_storage_version_only(&mut crds),
    }
    label_contract_versions(&mut crds);
    label_for_clusterctl(&mut crds);
    crds.extend(manifests::read_dir(&bundle.clusterctl_crds())?);
    Ok(crds)
}

/// Points the conversion of every multi-version CAPI CRD at the manager that serves it.
fn route_conversion_to_managers(crds: &mut [apiext::CustomResourceDefinition], serve: &Serve, ca: &[u8]) {
    for crd in crds.iter_mut().filter(|c| c.spec.versions.len() > 1) {
        let i = manager_for_group(&crd.spec.group);
        crd.spec.conversion = Some(apiext::CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(apiext::WebhookConversion {
                client_config: Some(serve.client_config(i, "/convert", ca)),
                conversion_review_versions: vec!["v1".into(), "v1beta1".into()],
            }),
        });
    }
}

/// Without the managers nothing can convert between versions, so only the storage version is
/// served: every client sees the same shape of object.
fn serve_storage_version_only(crds: &mut [apiext::CustomResourceDefinition]) {
    for crd in crds {
        for v in &mut crd.spec.versions {
            v.served = v.storage;
        }
    }
}

/// Where the managers run from and what they use.
pub(crate) struct Setup<'a> {
    pub bundle: &'a Bundle,
    /// The control plane's folder (the webhook certificates go under it).
    pub dir: &'a std::path::Path,
    pub logs: &'a std::path::Path,
    pub kubeconfig: &'a std::path::Path,
    /// Serving certificate of the webhooks on loopback.
    pub webhook: &'a CertPair,
    pub server_ca: &'a std::path::Path,
    pub ports: &'a Ports,
    pub isolation: crate::Isolation,
}

/// Starts the three managers, waits until each one's webhook server is ready, then registers
/// their admission webhooks.
pub(crate) async fn start(setup: &Setup<'_>, client: &kube::Client) -> Result<Vec<Component>> {
    let Setup {
        bundle,
        dir,
        logs,
        kubeconfig,
        webhook,
        server_ca,
        ports,
        isolation,
    } = setup;
    let certs = dir.join("capi-webhook-certs");
    std::fs::create_dir_all(&certs).map_err(io("create", &certs))?;
    for (from, to) in [(&webhook.cert, "tls.crt"), (&webhook.key, "tls.key")] {
        std::fs::copy(from, certs.join(to)).map_err(io("copy webhook certificate", certs.join(to)))?;
    }
    let kubeconfig = kubeconfig.to_string_lossy().to_string();

    let mut started = Vec::new();
    for (i, m) in MANAGERS.iter().enumerate() {
        let args = vec![
            "--leader-elect=false".to_string(),
            format!("--webhook-port={}", ports.webhook[i]),
            format!("--webhook-cert-dir={}", certs.display()),
            format!("--health-addr=127.0.0.1:{}", ports.health[i]),
            "--diagnostics-address=0".into(),
            format!("--kubeconfig={kubeconfig}"),
        ];
        let log = logs.join(format!("{}.log", m.name));
        let binary = bundle.require(m.binary)?;
        started.push(Component::spawn_with(
            m.name,
            &binary,
            &args,
            &[("KUBECONFIG", kubeconfig.as_str())],
            log,
            *isolation,
        )?);
    }
    for (i, c) in started.iter().enumerate() {
        c.wait_ready(ports.health[i]).await?;
    }
    let ca = std::fs::read(server_ca).map_err(io("read server CA", *server_ca))?;
    register_webhooks(client, bundle, &Serve::Loopback(**ports), &ca).await?;
    Ok(started)
}

/// Applies every manager's webhook configurations with each `clientConfig` pointed where `serve`
/// says, trusting `ca` (PEM), each under a name of its own (the manifests share default names).
pub async fn register_webhooks(
    client: &kube::Client,
    bundle: &Bundle,
    serve: &Serve,
    ca: &[u8],
) -> Result<()> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for (i, m) in MANAGERS.iter().enumerate() {
        for mut doc in manifests::read_file(&bundle.capi_webhooks(m.manifest))? {
            let kind = doc
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or_default()
                .to_string();
            if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
                continue;
            }
            let name = format!(
                "{}-{}",
                m.name,
                doc["metadata"]["name"].as_str().unwrap_or_default()
            );
            doc["metadata"]["name"] = name.clone().into();
            for hook in doc["webhooks"].as_array_mut().into_iter().flatten() {
                let path = hook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                hook["clientConfig"] =
                    serde_json::to_value(serve.client_config(i, &path, ca)).unwrap_or_default();
            }
            let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", &kind);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
            api.patch(&name, &pp, &Patch::Apply(&doc))
                .await
                .map_err(kube(format!("register {name}")))?;
        }
    }
    Ok(())
}

/// Labels the Cluster API CRDs with the contract they implement, as CAPI's release manifests do
/// (`cluster.x-k8s.io/v1beta2: v1beta2`): the CRD files in the Go module lack the label, and CAPI
/// looks a referenced kind's API version up by it (a KubeadmControlPlane without it is never
/// scaled up).
fn label_contract_versions(crds: &mut [apiext::CustomResourceDefinition]) {
    for crd in crds {
        let served: Vec<String> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.served)
            .map(|v| v.name.clone())
            .collect();
        let mut contract = served
            .iter()
            .filter(|v| v.starts_with("v1beta"))
            .cloned()
            .collect::<Vec<_>>();
        contract.sort();
        if contract.is_empty() {
            continue;
        }
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels
            .entry("cluster.x-k8s.io/v1beta2".into())
            .or_insert_with(|| contract.join("_"));
    }
}

/// The providers `clusterctl init` would have installed: (inventory name, provider name, type,
/// namespace, CRD groups). Ours is registered as `byoh` (see `hack/release`).
const INVENTORY: [(&str, &str, &str, &str, &[&str]); 4] = [
    (
        "cluster-api",
        "cluster-api",
        "CoreProvider",
        "capi-system",
        &[
            "cluster.x-k8s.io",
            "addons.cluster.x-k8s.io",
            "ipam.cluster.x-k8s.io",
            "runtime.cluster.x-k8s.io",
        ],
    ),
    (
        "bootstrap-kubeadm",
        "kubeadm",
        "BootstrapProvider",
        "capi-kubeadm-bootstrap-system",
        &["bootstrap.cluster.x-k8s.io"],
    ),
    (
        "control-plane-kubeadm",
        "kubeadm",
        "ControlPlaneProvider",
        "capi-kubeadm-control-plane-system",
        &["controlplane.cluster.x-k8s.io"],
    ),
    (
        "infrastructure-byoh",
        "byoh",
        "InfrastructureProvider",
        "bootsman-system",
        &["infrastructure.cluster.x-k8s.io"],
    ),
];

/// Labels the Cluster API CRDs as `clusterctl init` leaves them (`clusterctl.cluster.x-k8s.io`,
/// which `clusterctl move` looks for, and `cluster.x-k8s.io/provider`).
fn label_for_clusterctl(crds: &mut [apiext::CustomResourceDefinition]) {
    for crd in crds {
        let Some((provider, ..)) = INVENTORY
            .iter()
            .find(|(.., groups)| groups.contains(&crd.spec.group.as_str()))
        else {
            continue;
        };
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels.insert("clusterctl.cluster.x-k8s.io".into(), String::new());
        labels.insert("cluster.x-k8s.io/provider".into(), (*provider).to_string());
    }
}

/// Writes clusterctl's provider inventory (the `Provider` objects `clusterctl init` leaves, one
/// per provider, in its namespace), so that `clusterctl move` finds the providers it checks
/// for. The inventory CRD must be installed.
pub async fn write_inventory(client: &kube::Client, capi_version: &str) -> Result<()> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "clusterctl.cluster.x-k8s.io",
        "v1alpha3",
        "Provider",
    ));
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for (name, provider, type_, ns, _) in INVENTORY {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        namespaces
            .patch(ns, &pp, &Patch::Apply(&body))
            .await
            .map_err(kube(format!("create namespace {ns}")))?;
        let version = if provider == "byoh" {
            concat!("v", env!("CARGO_PKG_VERSION"))
        } else {
            capi_version
        };
        let body = serde_json::json!({
            "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
            "kind": "Provider",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"clusterctl.cluster.x-k8s.io": "", "cluster.x-k8s.io/provider": name},
            },
            "providerName": provider,
            "type": type_,
            "version": version,
        });
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
            .patch(name, &pp, &Patch::Apply(&body))
            .await
            .map_err(kube(format!("write the clusterctl inventory entry {ns}/{name}")))?;
    }
    Ok(())
}
