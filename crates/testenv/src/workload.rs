//! A stand-in for a child cluster's own control plane: what `kubeadm init` brings up on the first
//! control-plane host of a real site.
//!
//! Simulated hosts run the bootstrap data Cluster API produces, but their `kubeadm` only records
//! its arguments, so no API server ever answers at the cluster's endpoint, and Cluster API waits
//! forever for the control plane to be initialized: the kubeadm control-plane manager reads the
//! `kubeadm-config` ConfigMap through the endpoint, and the kubeadm bootstrap manager creates the
//! workers' join tokens there. [`Workload`] fills that gap with real components: etcd and
//! kube-apiserver on the endpoint address (a loopback address in tests and the demo), serving with
//! a certificate signed by the cluster CA that Cluster API generated (`<cluster>-ca`), so the
//! `<cluster>-kubeconfig` Cluster API wrote works unchanged. It then uploads the `kubeadm-config`
//! ConfigMap as `kubeadm init` does, and [`Workload::sync_nodes`] registers a Node for each host
//! that reports its bootstrap done, as the kubelet of a real host would.
//!
//! What it does not do: no kubelet, no static Pods, no etcd membership of the hosts. Cluster API
//! therefore sees the control plane initialized and the workers joined, and stops at the
//! preflight checks of a second control-plane machine (which look at etcd members and static Pods).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use bootsman_controlplane::{
    ApiserverFlags, CertPair, client_from, etcd_flags, free_port, process, wait_for_readyz, write_kubeconfig,
};

use bootsman_controlplane::pki;

use crate::Testbin;
use crate::error::{self, Error, Result};

const MANAGER: &str = "bootsman-testenv";

/// The stand-in control plane of one child cluster.
#[derive(Debug)]
pub struct Workload {
    namespace: String,
    cluster: String,
    version: String,
    url: String,
    kubeconfig: PathBuf,
    /// etcd, then kube-apiserver; stopped in reverse.
    components: Vec<process::Component>,
}

/// Where the Cluster API objects of a cluster say its control plane lives.
#[derive(Debug)]
struct Endpoint {
    host: String,
    port: u16,
    pod_cidr: String,
    service_cidr: String,
    version: String,
}

impl Workload {
    /// Starts etcd and kube-apiserver at the endpoint of CAPI Cluster `namespace/cluster`, with the
    /// cluster CA from `<cluster>-ca`, and uploads `kubeadm-config`. Files and logs go under `dir`.
    pub async fn start(
        mgmt: &kube::Client,
        testbin: &Testbin,
        dir: &Path,
        namespace: &str,
        cluster: &str,
    ) -> Result<Self> {
        let started = Instant::now();
        let ep = endpoint(mgmt, namespace, cluster).await?;
        let pki_dir = dir.join("pki");
        let logs = dir.join("logs");
        for d in [&pki_dir, &logs] {
            std::fs::create_dir_all(d).map_err(error::io("create directory", d))?;
        }
        let ca = cluster_ca(mgmt, namespace, cluster, &pki_dir).await?;
        let ip = ep.host.parse::<std::net::IpAddr>().is_ok();
        let sans: Vec<String> = [
            ep.host.as_str(),
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        let serving = pki::sign_with(&ca, &pki_dir, "apiserver", "kube-apiserver", &[], &sans)?;
        let admin = pki::sign_with(
            &ca,
            &pki_dir,
            "admin",
            "kubernetes-admin",
            &["system:masters"],
            &[],
        )?;
        let (sa_key, sa_pub) = (pki_dir.join("sa.key"), pki_dir.join("sa.pub"));
        pki::key_pair(&sa_key, &sa_pub)?;

        let mut components = Vec::new();
        let (mut etcd_args, etcd_url) = etcd_flags("workload", &dir.join("etcd"), free_port()?, free_port()?);
        etcd_args.push("--unsafe-no-fsync=true".into());
        components.push(process::Component::spawn(
            "workload-etcd",
            &testbin.bin("etcd"),
            &etcd_args,
            &[],
            logs.join("workload-etcd.log"),
        )?);
        let address = if ip { ep.host.as_str() } else { "127.0.0.1" };
        let apiserver_args = ApiserverFlags {
            etcd_url: &etcd_url,
            address,
            port: ep.port,
            serving: &serving,
            client_ca: &ca.cert,
            cert_dir: dir.join("apiserver"),
            service_cidr: &ep.service_cidr,
            service_account_pub: &sa_pub,
            service_account_key: &sa_key,
        }
        .args();
        components.push(process::Component::spawn(
            "workload-kube-apiserver",
            &testbin.bin("kube-apiserver"),
            &apiserver_args,
            &[],
            logs.join("workload-kube-apiserver.log"),
        )?);
        let url = format!("https://{}:{}", ep.host, ep.port);
        let kubeconfig = dir.join("workload-admin.kubeconfig");
        write_kubeconfig(&kubeconfig, cluster, &url, &ca.cert, &admin)?;
        let workload = Self {
            namespace: namespace.into(),
            cluster: cluster.into(),
            version: ep.version.clone(),
            url,
            kubeconfig,
            components,
        };
        let client = wait_for_readyz(
            &workload.kubeconfig,
            &workload.components,
            "workload-kube-apiserver",
        )
        .await?;
        upload_kubeadm_config(&client, cluster, &ep).await?;
        eprintln!(
            "testenv: stand-in control plane of {namespace}/{cluster} up at {} in {:.1}s",
            workload.url,
            started.elapsed().as_secs_f64()
        );
        Ok(workload)
    }

    /// The API server URL (the cluster's endpoint).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// An admin kubeconfig (`system:masters`, signed by the cluster CA).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// An admin client of the child cluster.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig).await
    }

    /// Fails with the log tail of a component that has stopped.
    pub fn check_running(&self) -> Result<()> {
        self.components
            .iter()
            .try_for_each(process::Component::check_running)
    }

    /// Registers a Node, Ready, for every host of this cluster that reports `BootstrapSucceeded`
    /// (as its kubelet would after `kubeadm init` or `kubeadm join`), named after the host name the
    /// agent reported. Returns the names of all Nodes registered so far.
    pub async fn sync_nodes(&self, mgmt: &kube::Client) -> Result<BTreeSet<String>> {
        let nodes: Api<Node> = Api::all(self.client().await?);
        let mut registered: BTreeSet<String> = nodes
            .list(&ListParams::default())
            .await
            .map_err(error::kube("list workload Nodes"))?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        for host in bootstrapped_hosts(mgmt, &self.namespace, &self.cluster).await? {
            if !registered.contains(&host.node_name) {
                self.register_node(&nodes, &host).await?;
                registered.insert(host.node_name);
            }
        }
        Ok(registered)
    }

    async fn register_node(&self, nodes: &Api<Node>, host: &BootstrappedHost) -> Result<()> {
        let name = host.node_name.as_str();
        let address = host.address.as_str();
        let mut labels = json!({
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
        });
        if host.control_plane {
            labels["node-role.kubernetes.io/control-plane"] = "".into();
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
        }))
        .map_err(|e| Error::Invalid {
            what: format!("Node {name}"),
            detail: e.to_string(),
        })?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(error::kube(format!("register workload Node {name}")))?;
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "registered by the Bootsman stand-in control plane (no kubelet runs)",
                 "lastHeartbeatTime": now, "lastTransitionTime": now},
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "message": "", "lastHeartbeatTime": now, "lastTransitionTime": now},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "message": "", "lastHeartbeatTime": now, "lastTransitionTime": now},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                 "message": "", "lastHeartbeatTime": now, "lastTransitionTime": now},
            ],
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "kubeletVersion": self.version, "kubeProxyVersion": "", "architecture": std::env::consts::ARCH,
                "operatingSystem": "linux", "osImage": "simulated", "kernelVersion": "", "containerRuntimeVersion": "",
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        }});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(error::kube(format!("set status of workload Node {name}")))?;
        Ok(())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for c in self.components.iter().rev() {
            c.stop();
        }
    }
}

/// A host bound to a machine of the cluster whose agent reports its bootstrap done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrappedHost {
    /// The ByoHost.
    pub host: String,
    /// The host name its agent reported (the Node name kubeadm would register).
    pub node_name: String,
    /// Whether its machine is a control-plane machine.
    pub control_plane: bool,
    /// The first address of its default-route interface.
    pub address: String,
}

/// The hosts of CAPI Cluster `ns/cluster` whose bootstrap data has run: on a real site, those a
/// kubelet has registered as Nodes, and (for a control-plane host) where `kubeadm init` has
/// brought up the cluster's API server.
pub async fn bootstrapped_hosts(
    mgmt: &kube::Client,
    ns: &str,
    cluster: &str,
) -> Result<Vec<BootstrappedHost>> {
    let hosts = dynamic(mgmt, ns, "infrastructure.cluster.x-k8s.io", "v1beta1", "ByoHost");
    let machines = dynamic(
        mgmt,
        ns,
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "ByoMachine",
    );
    let of_cluster = ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}"));
    // ByoMachine name → whether it is a control-plane machine.
    let machines: std::collections::BTreeMap<String, bool> = machines
        .list(&of_cluster)
        .await
        .map_err(error::kube(format!("list ByoMachines of {ns}/{cluster}")))?
        .items
        .into_iter()
        .filter_map(|bm| {
            let control_plane = bm
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("cluster.x-k8s.io/control-plane"));
            Some((bm.metadata.name?, control_plane))
        })
        .collect();
    let list = hosts
        .list(&ListParams::default())
        .await
        .map_err(error::kube(format!("list ByoHosts in {ns}")))?;
    let mut out = Vec::new();
    for host in list.items {
        let Some(&control_plane) = host.data["spec"]["machineRef"]["name"]
            .as_str()
            .and_then(|m| machines.get(m))
        else {
            continue;
        };
        if !condition_true(&host.data, "BootstrapSucceeded") {
            continue;
        }
        let name = host.metadata.name.clone().unwrap_or_default();
        out.push(BootstrappedHost {
            node_name: host.data["status"]["hostInfo"]["hostname"]
                .as_str()
                .map_or_else(|| name.clone(), str::to_string),
            host: name,
            control_plane,
            address: default_address(&host.data).unwrap_or_else(|| "127.0.0.1".into()),
        });
    }
    Ok(out)
}

fn dynamic(client: &kube::Client, ns: &str, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn condition_true(obj: &Value, type_: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

/// The first address of the host's default-route interface, without its prefix length.
fn default_address(host: &Value) -> Option<String> {
    let ifaces = host["status"]["network"].as_array()?;
    let iface = ifaces
        .iter()
        .find(|i| i["isDefault"] == true)
        .or(ifaces.first())?;
    let addr = iface["ipAddrs"].as_array()?.first()?.as_str()?;
    Some(addr.split('/').next().unwrap_or(addr).to_string())
}

async fn endpoint(mgmt: &kube::Client, ns: &str, cluster: &str) -> Result<Endpoint> {
    let clusters = dynamic(mgmt, ns, "cluster.x-k8s.io", "v1beta2", "Cluster");
    let c = clusters
        .get(cluster)
        .await
        .map_err(error::kube(format!("get Cluster {ns}/{cluster}")))?;
    let spec = &c.data["spec"];
    let invalid = |detail: &str| Error::Invalid {
        what: format!("Cluster {ns}/{cluster}"),
        detail: detail.into(),
    };
    let host = spec["controlPlaneEndpoint"]["host"]
        .as_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| invalid("spec.controlPlaneEndpoint.host is not set"))?;
    let port = spec["controlPlaneEndpoint"]["port"].as_u64().unwrap_or(6443);
    let port = u16::try_from(port).map_err(|_| invalid("spec.controlPlaneEndpoint.port is out of range"))?;
    let cidr = |key: &str, default: &str| {
        spec["clusterNetwork"][key]["cidrBlocks"][0]
            .as_str()
            .unwrap_or(default)
            .to_string()
    };
    let mut version = String::from("v1.33.0");
    if let Some(kcp) = spec["controlPlaneRef"]["name"].as_str() {
        let kcps = dynamic(
            mgmt,
            ns,
            "controlplane.cluster.x-k8s.io",
            "v1beta2",
            "KubeadmControlPlane",
        );
        if let Some(k) = kcps
            .get_opt(kcp)
            .await
            .map_err(error::kube(format!("get KubeadmControlPlane {ns}/{kcp}")))?
            && let Some(v) = k.data["spec"]["version"].as_str()
        {
            version = v.to_string();
        }
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
        pod_cidr: cidr("pods", "192.168.0.0/16"),
        service_cidr: cidr("services", "10.96.0.0/12"),
        version,
    })
}

/// Writes the cluster CA that Cluster API generated (`<cluster>-ca`: `tls.crt`, `tls.key`).
async fn cluster_ca(mgmt: &kube::Client, ns: &str, cluster: &str, dir: &Path) -> Result<CertPair> {
    let name = format!("{cluster}-ca");
    let secret = Api::<Secret>::namespaced(mgmt.clone(), ns)
        .get(&name)
        .await
        .map_err(error::kube(format!("get Secret {ns}/{name} (the cluster CA)")))?;
    let data = secret.data.unwrap_or_default();
    let pair = CertPair {
        cert: dir.join("ca.crt"),
        key: dir.join("ca.key"),
    };
    for (key, path) in [("tls.crt", &pair.cert), ("tls.key", &pair.key)] {
        let value = data.get(key).ok_or_else(|| Error::Invalid {
            what: format!("Secret {ns}/{name}"),
            detail: format!("has no {key}"),
        })?;
        std::fs::write(path, &value.0).map_err(error::io("write the cluster CA", path))?;
    }
    Ok(pair)
}

/// `kube-system/kubeadm-config`, as `kubeadm init` uploads it: the kubeadm control-plane manager
/// takes its presence as the sign that the control plane is initialized.
async fn upload_kubeadm_config(client: &kube::Client, cluster: &str, ep: &Endpoint) -> Result<()> {
    let config = format!(
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nclusterName: {cluster}\n\
         kubernetesVersion: {}\ncontrolPlaneEndpoint: {}:{}\ncertificatesDir: /etc/kubernetes/pki\n\
         imageRepository: registry.k8s.io\netcd:\n  local:\n    dataDir: /var/lib/etcd\n\
         networking:\n  dnsDomain: cluster.local\n  podSubnet: {}\n  serviceSubnet: {}\n",
        ep.version, ep.host, ep.port, ep.pod_cidr, ep.service_cidr
    );
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {"ClusterConfiguration": config},
    }))
    .map_err(|e| Error::Invalid {
        what: "kubeadm-config".into(),
        detail: e.to_string(),
    })?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    // kube-system is created by the API server shortly after it reports ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api
            .patch(
                "kubeadm-config",
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&cm),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(error::kube("upload kube-system/kubeadm-config")(e)),
        }
    }
}
