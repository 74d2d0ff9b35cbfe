//! The Site file of `bootsmanctl install -f site.yaml` (`bootsman.io/v1alpha1`, kind `Site`):
//! what a platform team declares about its site before anything runs, the preflight that
//! checks it ([`check`] for the file, [`probe`] for this machine and the network), and the
//! install's plan ([`plan`]).
//!
//! `bootsmanctl init` prints [`EXAMPLE`], a commented Site. Every finding names the field and
//! the rule (`(rule: …)`), as the BootsmanCluster's admission does, and preflight refuses before
//! anything is started or written.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use bootsman_api::identity::{is_dns_label, is_dns_subdomain, validate_host_name, validate_pool};
use bootsman_api::v1alpha1::{EndpointLoadBalancer, KubeProxy, Nodes};

/// The Site file's `apiVersion`.
pub const API_VERSION: &str = "bootsman.io/v1alpha1";
/// The Site file's `kind`.
pub const KIND: &str = "Site";
/// Kubernetes minor versions an infrastructure cluster may run: from the oldest the API
/// objects are built for to the control plane this release ships.
pub const KUBERNETES_MINORS: std::ops::RangeInclusive<u32> = 33..=36;
/// Label on the objects `install` creates: the Site's name.
pub const SITE_LABEL: &str = "bootsman.io/site";
/// Longest Site name: the bootstrap control plane is `<name>-control-plane` and the
/// infrastructure cluster `<name>-infra`, both within a 49-character BootsmanCluster name.
pub const MAX_NAME: usize = 34;

/// A Site file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Site {
    /// `bootsman.io/v1alpha1`.
    pub api_version: String,
    /// `Site`.
    pub kind: String,
    /// Its name.
    pub metadata: SiteMeta,
    /// What the site is.
    pub spec: SiteSpec,
}

/// A Site's name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteMeta {
    /// A DNS-1123 label of at most [`MAX_NAME`] characters.
    pub name: String,
}

/// What a site is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteSpec {
    /// The bootstrap control plane on this machine.
    pub bootstrap: Bootstrap,
    /// The site's OCI registry (`host:port`), the mirror every image comes from.
    pub registry: String,
    /// The pool (namespace) hosts enrol into.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// The servers of the site as the team knows them (name, address, placement labels).
    pub hosts: Vec<SiteHost>,
    /// The infrastructure cluster.
    pub infrastructure: Infrastructure,
}

fn default_pool() -> String {
    "bootsman-hosts".into()
}

/// Where the bootstrap control plane serves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bootstrap {
    /// An address of this machine that the hosts reach.
    pub address: String,
    /// The API server's port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Where the site's state lives; `~/.local/share/bootsman/<site>` when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
}

fn default_port() -> u16 {
    6443
}

/// A server of the site.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteHost {
    /// Its host name (the ByoHost's name).
    pub name: String,
    /// Its address on the hosts' network.
    pub address: String,
    /// Placement labels the admin sets on its ByoHost once it has enrolled.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The infrastructure cluster: Cluster API and Bootsman on the site's own hosts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Infrastructure {
    /// Its Kubernetes version (`vX.Y.Z`, minor within [`KUBERNETES_MINORS`]).
    pub kubernetes_version: String,
    /// Its control plane; the controllers run on these nodes.
    pub control_plane: InfraControlPlane,
    /// Its Pod and Service networks.
    #[serde(default)]
    pub network: InfraNetwork,
    /// kubeadm and kubelet settings of its machines, as a BootsmanCluster's `spec.nodes`
    /// (cgroup v1 hosts, preflight checks to ignore, eviction and image GC thresholds).
    #[serde(default)]
    pub nodes: Nodes,
}

/// The infrastructure cluster's control plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InfraControlPlane {
    /// 3 or 5.
    pub replicas: u32,
    /// Labels a host must carry to serve it (matched against `spec.hosts[].labels`).
    pub host_labels: BTreeMap<String, String>,
    /// The API endpoint: a free address on the hosts' network, and a port.
    pub endpoint: Endpoint,
}

/// The infrastructure cluster's API endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Endpoint {
    /// An IP address.
    pub host: String,
    /// The port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Who holds the address: `kubeVip` (announced from the control-plane hosts; its image in
    /// the site's registry) or `external` (a load balancer of the site forwards it to port 6443
    /// of each control-plane host), as a BootsmanCluster's `controlPlane.endpoint.loadBalancer`.
    #[serde(default)]
    pub load_balancer: EndpointLoadBalancer,
}

/// Cluster networks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InfraNetwork {
    /// The Pod network.
    #[serde(rename = "podCIDR")]
    pub pod_cidr: String,
    /// The Service network.
    #[serde(rename = "serviceCIDR")]
    pub service_cidr: String,
    /// kube-proxy's settings, as a BootsmanCluster's `network.kubeProxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy: Option<KubeProxy>,
}

impl Default for InfraNetwork {
    fn default() -> Self {
        Self {
            pod_cidr: "10.244.0.0/16".into(),
            service_cidr: "10.96.0.0/12".into(),
            kube_proxy: None,
        }
    }
}

/// A commented Site, as `bootsmanctl init` prints it.
pub const EXAMPLE: &str = r#"# A Bootsman site: `bootsmanctl install -f site.yaml` reads this file.
# `bootsmanctl install -f site.yaml --validate` checks it and this machine; `--dry-run` prints the plan.
apiVersion: bootsman.io/v1alpha1
kind: Site
metadata:
  # A DNS-1123 label of at most 34 characters. The bootstrap control plane is named
  # <name>-control-plane, the infrastructure cluster <name>-infra.
  name: dc1
spec:
  # The bootstrap control plane runs on this machine until the pivot: etcd, kube-apiserver,
  # kube-controller-manager, the Cluster API managers and Bootsman, as local processes.
  bootstrap:
    # An address of this machine that every host reaches, and the API server's port.
    address: 10.0.0.5
    port: 6443
    # stateDir: /var/lib/bootsman/dc1   # default: ~/.local/share/bootsman/<name>
  # The site's OCI registry (host:port): every image of every cluster comes from it.
  registry: 10.0.0.5:5000
  # The pool (namespace) hosts enrol into.
  pool: bootsman-hosts
  # The servers of the site. Addresses must be unique and outside the cluster networks; the
  # labels are set on each host's ByoHost once it has enrolled.
  hosts:
    - name: srv-01
      address: 10.0.0.11
      labels: {bootsman.io/infrastructure: "true"}
    - name: srv-02
      address: 10.0.0.12
      labels: {bootsman.io/infrastructure: "true"}
    - name: srv-03
      address: 10.0.0.13
      labels: {bootsman.io/infrastructure: "true"}
    - name: srv-04
      address: 10.0.0.14
  # The infrastructure cluster: Cluster API and Bootsman run on its control-plane nodes.
  infrastructure:
    kubernetesVersion: v1.36.3
    controlPlane:
      replicas: 3                 # 3 or 5
      hostLabels: {bootsman.io/infrastructure: "true"}
      endpoint:
        host: 10.0.0.10           # a free address on the hosts' network
        port: 6443
        loadBalancer: kubeVip     # or external: the site's load balancer forwards it to port 6443 of each host
    network:
      podCIDR: 10.244.0.0/16
      serviceCIDR: 10.96.0.0/12
      # kubeProxy: {conntrackMaxPerCore: 0}   # leave nf_conntrack_max as the hosts have it
    # kubeadm and kubelet settings of its machines, as a BootsmanCluster's spec.nodes:
    # nodes:
    #   allowCgroupV1: false
    #   kubelet: {evictionHard: {nodefs.available: 10%}}
"#;

/// One thing preflight refuses: the field and a message that names the rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Path of the field, e.g. `spec.hosts[2].address`.
    pub field: String,
    /// What is wrong, ending with `(rule: <name>)`.
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn finding(field: impl Into<String>, message: impl Into<String>) -> Finding {
    Finding {
        field: field.into(),
        message: message.into(),
    }
}

/// Reads a Site file; an error names the file, and the field where serde can tell it.
pub fn load(path: &Path) -> anyhow::Result<Site> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("-f: cannot read {}: {e}", path.display()))?;
    serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("-f: {} is not a valid Site: {e}", path.display()))
}

impl Site {
    /// Where the site's state lives.
    pub fn state_dir(&self) -> PathBuf {
        self.spec.bootstrap.state_dir.clone().unwrap_or_else(|| {
            let base = std::env::var_os("XDG_DATA_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
                .unwrap_or_else(|| PathBuf::from("/var/lib"));
            base.join("bootsman").join(&self.metadata.name)
        })
    }

    /// The bootstrap control plane's name.
    pub fn bootstrap_name(&self) -> String {
        format!("{}-control-plane", self.metadata.name)
    }

    /// The infrastructure cluster's (BootsmanCluster's) name.
    pub fn infrastructure_name(&self) -> String {
        format!("{}-infra", self.metadata.name)
    }

    /// The infrastructure cluster as the BootsmanCluster `install` creates in the pool
    /// namespace: the Site's control plane, schedulable (Cluster API and Bootsman run on it; no
    /// workers), the hosts chosen by `hostLabels`, images from the site's registry, kube-router
    /// as the CNI (installed by Cluster API's own ClusterResourceSet: the bootstrap side runs no
    /// add-on provider), no storage, ingress or MetalLB.
    pub fn infrastructure_cluster(&self) -> serde_json::Value {
        let infra = &self.spec.infrastructure;
        let cp = &infra.control_plane;
        let mut network = serde_json::json!({
            "cni": "kube-router",
            "podCIDR": infra.network.pod_cidr,
            "serviceCIDR": infra.network.service_cidr,
        });
        if let Some(kp) = &infra.network.kube_proxy {
            network["kubeProxy"] = serde_json::to_value(kp).unwrap_or_default();
        }
        serde_json::json!({
            "apiVersion": "bootsman.io/v1alpha1",
            "kind": "BootsmanCluster",
            "metadata": {
                "name": self.infrastructure_name(),
                "namespace": self.spec.pool,
                "labels": {SITE_LABEL: self.metadata.name},
            },
            "spec": {
                "kubernetesVersion": infra.kubernetes_version,
                "imageRepository": self.spec.registry,
                "controlPlane": {
                    "replicas": cp.replicas,
                    "schedulable": true,
                    "hostSelector": {"matchLabels": cp.host_labels},
                    "endpoint": {
                        "host": cp.endpoint.host,
                        "port": cp.endpoint.port,
                        "loadBalancer": cp.endpoint.load_balancer,
                    },
                },
                "workers": [{"name": "default", "replicas": 0}],
                "network": network,
                "storage": {"longhorn": {"enabled": false}},
                "ingress": {"nginx": {"enabled": false}},
                "nodes": infra.nodes,
            },
        })
    }

    /// The hosts whose labels carry every one of the control plane's `hostLabels`.
    pub fn infrastructure_hosts(&self) -> Vec<&SiteHost> {
        let want = &self.spec.infrastructure.control_plane.host_labels;
        self.spec
            .hosts
            .iter()
            .filter(|h| want.iter().all(|(k, v)| h.labels.get(k) == Some(v)))
            .collect()
    }
}

fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.strip_prefix('v')?.split('.').map(|p| {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<u32>().ok())
            .flatten()
    });
    let v = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(v)
}

/// `host:port` with a DNS name or an IP address and a port.
fn is_registry(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    port.parse::<u16>().is_ok_and(|p| p > 0) && (host.parse::<IpAddr>().is_ok() || is_dns_subdomain(host))
}

/// Every rule the Site breaks, in field order; empty when the file is sound. Nothing is
/// probed: see [`probe`] for this machine and the network.
pub fn check(site: &Site) -> Vec<Finding> {
    let mut out = Vec::new();
    if site.api_version != API_VERSION || site.kind != KIND {
        out.push(finding(
            "apiVersion",
            format!(
                "this bootsmanctl reads apiVersion {API_VERSION}, kind {KIND}; the file says {}, {} (rule: site-version)",
                site.api_version, site.kind
            ),
        ));
    }
    let name = &site.metadata.name;
    if !is_dns_label(name) || name.len() > MAX_NAME {
        out.push(finding(
            "metadata.name",
            format!(
                "{name:?} must be a DNS-1123 label of at most {MAX_NAME} characters: lower-case letters, digits \
                 and '-' (rule: site-name)"
            ),
        ));
    }
    let spec = &site.spec;
    let bootstrap: Option<IpAddr> = spec.bootstrap.address.parse().ok();
    if bootstrap.is_none() {
        out.push(finding(
            "spec.bootstrap.address",
            format!(
                "{:?} must be an IP address of this machine (rule: address-format)",
                spec.bootstrap.address
            ),
        ));
    }
    if spec.bootstrap.port == 0 {
        out.push(finding(
            "spec.bootstrap.port",
            "the port must be between 1 and 65535 (rule: port-range)",
        ));
    }
    if !is_registry(&spec.registry) {
        out.push(finding(
            "spec.registry",
            format!(
                "{:?} must be host:port of an OCI registry, e.g. 10.0.0.5:5000 (rule: registry-address)",
                spec.registry
            ),
        ));
    }
    if let Err(m) = validate_pool(&spec.pool) {
        out.push(finding("spec.pool", format!("{m} (rule: pool-name)")));
    }

    // Every address the site uses, by the field that holds it.
    let mut addresses: Vec<(String, IpAddr)> = Vec::new();
    if let Some(a) = bootstrap {
        addresses.push(("spec.bootstrap.address".into(), a));
    }
    if let Some(Ok(a)) = spec.registry.rsplit_once(':').map(|(h, _)| h.parse::<IpAddr>()) {
        // The registry may live on the bootstrap machine: that is not a conflict.
        if Some(a) != bootstrap {
            addresses.push(("spec.registry".into(), a));
        }
    }
    let mut names = BTreeSet::new();
    for (i, h) in spec.hosts.iter().enumerate() {
        if let Err(m) = validate_host_name(&h.name) {
            out.push(finding(
                format!("spec.hosts[{i}].name"),
                format!("{m} (rule: host-name)"),
            ));
        }
        if !names.insert(h.name.as_str()) {
            out.push(finding(
                format!("spec.hosts[{i}].name"),
                format!(
                    "host {:?} is listed twice; host names are unique in a site (rule: host-names-unique)",
                    h.name
                ),
            ));
        }
        match h.address.parse::<IpAddr>() {
            Ok(a) => addresses.push((format!("spec.hosts[{i}].address"), a)),
            Err(_) => out.push(finding(
                format!("spec.hosts[{i}].address"),
                format!("{:?} must be an IP address (rule: address-format)", h.address),
            )),
        }
    }

    let infra = &spec.infrastructure;
    match parse_version(&infra.kubernetes_version) {
        None => out.push(finding(
            "spec.infrastructure.kubernetesVersion",
            format!("{:?} must look like vX.Y.Z, e.g. v1.36.3 (rule: version-format)", infra.kubernetes_version),
        )),
        Some((major, minor, _)) if major != 1 || !KUBERNETES_MINORS.contains(&minor) => out.push(finding(
            "spec.infrastructure.kubernetesVersion",
            format!(
                "{} is not supported: this release runs Kubernetes v1.{} to v1.{} (rule: kubernetes-version-supported)",
                infra.kubernetes_version,
                KUBERNETES_MINORS.start(),
                KUBERNETES_MINORS.end()
            ),
        )),
        Some(_) => {}
    }
    let cp = &infra.control_plane;
    if cp.replicas != 3 && cp.replicas != 5 {
        out.push(finding(
            "spec.infrastructure.controlPlane.replicas",
            format!(
                "{} control-plane hosts: it must be 3 or 5, an odd number of etcd members that keeps quorum when \
                 1 or 2 fail (rule: control-plane-replicas-3-or-5)",
                cp.replicas
            ),
        ));
    }
    if cp.host_labels.is_empty() {
        out.push(finding(
            "spec.infrastructure.controlPlane.hostLabels",
            "at least one label must say which hosts serve the infrastructure cluster (rule: infrastructure-hosts-labelled)",
        ));
    }
    let chosen = site.infrastructure_hosts();
    if !cp.host_labels.is_empty() && chosen.len() < cp.replicas as usize {
        let labels: Vec<String> = cp.host_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push(finding(
            "spec.hosts",
            format!(
                "too few hosts: the infrastructure cluster needs {} control-plane hosts labelled {}, and the site \
                 lists {}{} (rule: enough-infrastructure-hosts)",
                cp.replicas,
                labels.join(","),
                chosen.len(),
                if chosen.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", chosen.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(", "))
                }
            ),
        ));
    }
    match cp.endpoint.host.parse::<IpAddr>() {
        Ok(a) => addresses.push(("spec.infrastructure.controlPlane.endpoint.host".into(), a)),
        Err(_) => out.push(finding(
            "spec.infrastructure.controlPlane.endpoint.host",
            format!(
                "{:?} must be an IP address (rule: address-format)",
                cp.endpoint.host
            ),
        )),
    }
    if cp.endpoint.port == 0 {
        out.push(finding(
            "spec.infrastructure.controlPlane.endpoint.port",
            "the port must be between 1 and 65535 (rule: port-range)",
        ));
    }
    // One address, one holder.
    for (i, (field, a)) in addresses.iter().enumerate() {
        if let Some((first, _)) = addresses[..i].iter().find(|(_, b)| b == a) {
            out.push(finding(
                field.clone(),
                format!("{a} is also {first}: each address has one holder (rule: address-conflict)"),
            ));
        }
    }
    // The cluster networks: well formed, apart, and holding none of the site's addresses.
    let nets: Vec<(&str, Option<IpNet>)> = [
        ("spec.infrastructure.network.podCIDR", &infra.network.pod_cidr),
        (
            "spec.infrastructure.network.serviceCIDR",
            &infra.network.service_cidr,
        ),
    ]
    .into_iter()
    .map(|(f, s)| (f, s.parse::<IpNet>().ok()))
    .collect();
    for ((field, net), raw) in nets
        .iter()
        .zip([&infra.network.pod_cidr, &infra.network.service_cidr])
    {
        match net {
            None => out.push(finding(
                *field,
                format!("{raw:?} must be a CIDR such as 10.244.0.0/16 (rule: cidr-format)"),
            )),
            Some(n) => {
                for (holder, a) in &addresses {
                    if n.contains(a) {
                        out.push(finding(
                            holder.clone(),
                            format!("{a} lies inside {field} {n}: cluster networks must not hold the site's addresses (rule: address-conflict)"),
                        ));
                    }
                }
            }
        }
    }
    if let [(_, Some(pod)), (_, Some(svc))] = nets.as_slice()
        && (pod.contains(&svc.network()) || svc.contains(&pod.network()))
    {
        out.push(finding(
            "spec.infrastructure.network.serviceCIDR",
            format!("{svc} overlaps podCIDR {pod} (rule: cluster-networks-disjoint)"),
        ));
    }
    out
}

/// What preflight asks of this machine and the network: the bootstrap API server's address is
/// one of this machine's and its port is free, and the registry answers on its port. Nothing
/// is left behind (the port is bound and released at once).
pub fn probe(site: &Site) -> Vec<Finding> {
    let mut out = Vec::new();
    let b = &site.spec.bootstrap;
    if let Ok(addr) = b.address.parse::<IpAddr>() {
        let at = SocketAddr::new(addr, b.port);
        if let Err(e) = TcpListener::bind(at) {
            let why = match e.kind() {
                std::io::ErrorKind::AddrInUse => format!("port {} of {addr} is in use", b.port),
                std::io::ErrorKind::AddrNotAvailable => format!("{addr} is not an address of this machine"),
                _ => format!("cannot listen on {at}: {e}"),
            };
            out.push(finding(
                "spec.bootstrap",
                format!("{why}; the bootstrap API server must listen there (rule: bootstrap-port-free)"),
            ));
        }
    }
    if is_registry(&site.spec.registry) {
        let reached = site
            .spec
            .registry
            .to_socket_addrs()
            .ok()
            .into_iter()
            .flatten()
            .any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(3)).is_ok());
        if !reached {
            out.push(finding(
                "spec.registry",
                format!(
                    "registry {} does not answer: every image comes from it, so it must be up before the install \
                     (rule: registry-reachable)",
                    site.spec.registry
                ),
            ));
        }
    }
    out
}

/// Where the install stands, as saved under the state folder (`state.json`): the steps done.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// Names of the steps that finished, in order.
    pub done: Vec<String>,
}

impl State {
    /// The saved state of `site`; empty when nothing was saved.
    pub fn load(site: &Site) -> anyhow::Result<State> {
        let path = site.state_dir().join("state.json");
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| anyhow::anyhow!("{} is not a saved install state: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(anyhow::anyhow!("read {}: {e}", path.display())),
        }
    }

    /// Whether step (or part of a step) `name` is recorded as done.
    pub fn is_done(&self, name: &str) -> bool {
        self.done.iter().any(|d| d == name)
    }

    /// Records step (or part of a step) `name` as done, once, and saves the state of `site`
    /// atomically.
    pub fn mark(&mut self, site: &Site, name: &str) -> anyhow::Result<()> {
        if self.is_done(name) {
            return Ok(());
        }
        self.done.push(name.to_string());
        let path = site.state_dir().join("state.json");
        bootsman_runtime::fs::replace_file(&path, &serde_json::to_vec_pretty(self)?, 0o600)
            .map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))
    }
}

/// One step of the install.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Its name, as the saved state records it.
    pub name: &'static str,
    /// What it does, for this site.
    pub what: String,
    /// Whether the saved state says it is done.
    pub done: bool,
}

/// The install of `site` step by step, each marked done when `state` says so. A re-run starts
/// at the first step not done.
pub fn plan(site: &Site, state: &State) -> Vec<Step> {
    let cp = &site.spec.infrastructure.control_plane;
    let hosts: Vec<&str> = site
        .infrastructure_hosts()
        .iter()
        .map(|h| h.name.as_str())
        .collect();
    let steps = [
        (
            "preflight",
            "check the Site file, this machine's address and port, and the registry".to_string(),
        ),
        (
            "bootstrap",
            format!(
                "start the bootstrap control plane {} at https://{}:{} (etcd, kube-apiserver, kube-controller-manager, \
                 Cluster API, bootsman-provider, bootsman-operator), state in {}",
                site.bootstrap_name(),
                site.spec.bootstrap.address,
                site.spec.bootstrap.port,
                site.state_dir().display()
            ),
        ),
        (
            "enrol",
            format!(
                "print the enrolment command for pool {} and wait for {} hosts labelled {} ({})",
                site.spec.pool,
                cp.replicas,
                cp.host_labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                hosts.join(", ")
            ),
        ),
        (
            "infrastructure",
            format!(
                "create BootsmanCluster {} ({} control-plane hosts, Kubernetes {}, endpoint {}:{}) and wait until it is Ready",
                site.infrastructure_name(),
                cp.replicas,
                site.spec.infrastructure.kubernetes_version,
                cp.endpoint.host,
                cp.endpoint.port
            ),
        ),
        (
            "controllers",
            format!(
                "install Cluster API and the Bootsman chart into {} as Pods from {} and wait until they are Ready",
                site.infrastructure_name(),
                site.spec.registry
            ),
        ),
        (
            "pivot",
            format!(
                "pause the bootstrap side's controllers, move the Cluster API, Bootsman and host objects to {} with \
                 every host-machine binding intact, re-home every agent to its API endpoint, and verify there",
                site.infrastructure_name()
            ),
        ),
        (
            "teardown",
            format!(
                "stop and delete the bootstrap control plane {}",
                site.bootstrap_name()
            ),
        ),
    ];
    steps
        .into_iter()
        .map(|(name, what)| Step {
            name,
            what,
            done: state.is_done(name),
        })
        .collect()
}

/// The plan as text: one numbered line per step, `done` or `next` or blank.
pub fn render_plan(steps: &[Step]) -> String {
    let next = steps.iter().position(|s| !s.done);
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mark = if s.done {
                "done"
            } else if Some(i) == next {
                "next"
            } else {
                ""
            };
            format!("{:>2}. {:<4}  {:<14} {}\n", i + 1, mark, s.name, s.what)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn example() -> Site {
        serde_saphyr::from_str(EXAMPLE).unwrap()
    }

    fn rules(site: &Site) -> Vec<String> {
        check(site)
            .iter()
            .map(|f| {
                format!(
                    "{} {}",
                    f.field,
                    f.message.rsplit("(rule: ").next().unwrap().trim_end_matches(')')
                )
            })
            .collect()
    }

    #[test]
    fn the_example_is_a_sound_site() {
        let s = example();
        assert_eq!(check(&s), []);
        assert_eq!(s.infrastructure_hosts().len(), 3);
        assert_eq!(s.bootstrap_name(), "dc1-control-plane");
    }

    #[test]
    fn each_rule_names_its_field() {
        let mut s = example();
        s.spec.hosts.truncate(2);
        assert_eq!(rules(&s), ["spec.hosts enough-infrastructure-hosts"]);
        assert!(
            check(&s)[0].message.contains("lists 2 (srv-01, srv-02)"),
            "{:?}",
            check(&s)
        );

        let mut s = example();
        s.spec.infrastructure.kubernetes_version = "v1.40.0".into();
        assert_eq!(
            rules(&s),
            ["spec.infrastructure.kubernetesVersion kubernetes-version-supported"]
        );
        s.spec.infrastructure.kubernetes_version = "1.36".into();
        assert_eq!(
            rules(&s),
            ["spec.infrastructure.kubernetesVersion version-format"]
        );

        let mut s = example();
        s.spec.infrastructure.control_plane.endpoint.host = "10.0.0.12".into();
        assert_eq!(
            rules(&s),
            ["spec.infrastructure.controlPlane.endpoint.host address-conflict"]
        );
        assert!(check(&s)[0].message.contains("is also spec.hosts[1].address"));

        let mut s = example();
        s.spec.hosts[3].address = "10.96.0.20".into();
        assert_eq!(rules(&s), ["spec.hosts[3].address address-conflict"]);

        let mut s = example();
        s.spec.infrastructure.network.service_cidr = "10.244.128.0/20".into();
        assert_eq!(
            rules(&s),
            ["spec.infrastructure.network.serviceCIDR cluster-networks-disjoint"]
        );

        let mut s = example();
        s.metadata.name = "DC_1".into();
        s.spec.infrastructure.control_plane.replicas = 1;
        s.spec.hosts[1].name = "srv-01".into();
        s.spec.registry = "registry".into();
        assert_eq!(
            rules(&s),
            [
                "metadata.name site-name",
                "spec.registry registry-address",
                "spec.hosts[1].name host-names-unique",
                "spec.infrastructure.controlPlane.replicas control-plane-replicas-3-or-5",
            ]
        );
    }

    #[test]
    fn the_infrastructure_cluster_is_a_valid_schedulable_bootsman_cluster() {
        let s = example();
        let doc = s.infrastructure_cluster();
        let bc: bootsman_api::v1alpha1::BootsmanCluster = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(bc.metadata.name.as_deref(), Some("dc1-infra"));
        assert_eq!(bc.metadata.namespace.as_deref(), Some("bootsman-hosts"));
        let cp = &bc.spec.control_plane;
        assert_eq!((cp.replicas, cp.schedulable), (3, true));
        assert_eq!(cp.endpoint.host, "10.0.0.10");
        assert_eq!(
            doc["spec"]["controlPlane"]["hostSelector"]["matchLabels"]["bootsman.io/infrastructure"],
            "true"
        );
        assert_eq!(bc.spec.workers.iter().map(|w| w.replicas).sum::<i32>(), 0);
        assert_eq!(bc.spec.image_repository.as_deref(), Some("10.0.0.5:5000"));
        assert_eq!(doc["spec"]["network"]["cni"], "kube-router");
        assert_eq!(doc["spec"]["controlPlane"]["endpoint"]["loadBalancer"], "kubeVip");
    }

    #[test]
    fn a_typo_in_a_field_is_refused_by_name() {
        let text = EXAMPLE.replace("podCIDR", "podCidr");
        let err = serde_saphyr::from_str::<Site>(&text).unwrap_err().to_string();
        assert!(err.contains("podCidr"), "{err}");
    }

    #[test]
    fn the_plan_starts_at_the_first_step_not_done() {
        let s = example();
        let state = State {
            done: vec!["preflight".into(), "bootstrap".into()],
        };
        let p = plan(&s, &state);
        assert_eq!(p.len(), 7);
        let text = render_plan(&p);
        let marks: Vec<&str> = text
            .lines()
            .map(|l| l.split_whitespace().nth(1).unwrap())
            .collect();
        assert_eq!(marks[..3], ["done", "done", "next"]);
        assert!(
            text.contains(
                "wait for 3 hosts labelled bootsman.io/infrastructure=true (srv-01, srv-02, srv-03)"
            ),
            "{text}"
        );
    }
}
