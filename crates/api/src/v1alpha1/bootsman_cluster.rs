//! `BootsmanCluster`: one child cluster, described by what a platform team cares about (how many
//! control-plane nodes and workers, which hosts may serve, which addons) rather than by CAPI objects.
//!
//! The rules below are enforced by CEL in the CRD, so `kubectl apply` fails at once with a message
//! that names the rule; the operator checks them again before it renders anything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a child cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "bootsman.io",
    version = "v1alpha1",
    kind = "BootsmanCluster",
    namespaced,
    status = "BootsmanClusterStatus",
    shortname = "bmc",
    category = "bootsman",
    label("clusterctl.cluster.x-k8s.io", ""),
    label("clusterctl.cluster.x-k8s.io/move-hierarchy", ""),
    doc = "A Kubernetes cluster built from hosts of the pool, managed by the Bootsman operator.",
    derive = "PartialEq",
    validation = Rule::new("size(self.metadata.name) <= 49").message(
        "metadata.name must be at most 49 characters: the kubeadm control plane is named \
         <name>-control-plane, and Cluster API puts that name in a label of at most 63 characters \
         (rule: cluster-name-length)"
    ),
    validation = Rule::new("self.spec.workers.all(w, size(self.metadata.name) + size(w.name) <= 62)").message(
        "metadata.name and each spec.workers[].name together must be at most 62 characters: the \
         pool's MachineDeployment is named <name>-<pool>, and Cluster API puts that name in a label \
         of at most 63 characters (rule: worker-pool-name-length)"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.kubernetesVersion"),
    printcolumn(
        name = "CP-Ready",
        type_ = "integer",
        json_path = ".status.controlPlane.ready",
        description = "Ready control-plane machines"
    ),
    printcolumn(
        name = "CP-Desired",
        type_ = "integer",
        json_path = ".spec.controlPlane.replicas",
        description = "Desired control-plane machines"
    ),
    printcolumn(
        name = "Workers-Ready",
        type_ = "integer",
        json_path = ".status.workers.ready",
        description = "Ready worker machines, all pools"
    ),
    printcolumn(
        name = "Workers-Desired",
        type_ = "integer",
        json_path = ".status.workers.desired",
        description = "Desired worker machines, all pools"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Waiting-For",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        description = "What the cluster waits for before it is Ready",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new(
    "self.workers.map(w, w.replicas).sum() >= 3 || (has(self.controlPlane.schedulable) && \
     self.controlPlane.schedulable && self.workers.map(w, w.replicas).sum() == 0)"
)
    .message("the worker pools must have at least 3 replicas in total, or none when controlPlane.schedulable \
              is true (rule: worker-replicas-min-3)")
    .field_path(".workers"))]
#[x_kube(validation = Rule::new(ENDPOINT_OUTSIDE_CLUSTER_NETWORKS).message(
    "controlPlane.endpoint.host lies inside network.podCIDR or network.serviceCIDR; the endpoint \
     must be an address on the hosts' network (rule: endpoint-outside-cluster-networks)"
))]
#[x_kube(validation = Rule::new(address_pools_outside_cluster()).message(
    "a metallb address pool overlaps network.podCIDR, network.serviceCIDR or the control-plane \
     endpoint; service IPs must come from the hosts' network, apart from both (rule: address-pool-overlap)"
))]
#[serde(rename_all = "camelCase")]
pub struct BootsmanClusterSpec {
    /// Kubernetes version of the child cluster, `vX.Y.Z` (e.g. `v1.33.4`). It may go up (an
    /// upgrade, rolled out one machine at a time) but never down.
    #[schemars(length(max = 32))]
    #[x_kube(
        validation = Rule::new(r"self.matches('^v[0-9]+\\.[0-9]+\\.[0-9]+$')")
            .message("kubernetesVersion must look like vX.Y.Z, e.g. v1.33.4 (rule: version-format)"),
        validation = Rule::new(VERSION_NOT_DOWN)
            .message("kubernetesVersion cannot go down; downgrades are not supported (rule: version-no-downgrade)")
    )]
    pub kubernetes_version: String,

    /// The control plane: how many machines, which hosts may serve, and the API endpoint.
    pub control_plane: ControlPlane,

    /// Worker pools; each becomes a MachineDeployment. Names are unique DNS-1123 labels.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(
        validation = Rule::new("self.all(w, self.exists_one(x, x.name == w.name))")
            .message("worker pool names must be unique (rule: worker-pool-names-unique)"),
        merge_strategy = ListMerge::Map(vec!["name".into()])
    )]
    pub workers: Vec<WorkerPool>,

    /// Pod and service networks and the CNI.
    #[serde(default)]
    pub network: Network,

    /// Persistent storage for the child cluster.
    #[serde(default)]
    pub storage: Storage,

    /// Ingress controller for the child cluster.
    #[serde(default)]
    pub ingress: Ingress,

    /// Service load balancer for the child cluster.
    #[serde(default)]
    pub load_balancer: LoadBalancer,

    /// Rancher integration.
    #[serde(default)]
    pub rancher: Rancher,

    /// Registry and path prefix the machines pull the Kubernetes images from (kube-apiserver,
    /// kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS; kubeadm's
    /// `imageRepository`), and the images the operator renders itself (kube-vip, kube-router,
    /// under their last path element): an air-gapped site's mirror, e.g.
    /// `registry.example.internal/k8s` or `10.0.0.5:5000`. `registry.k8s.io` (and each image's
    /// upstream registry) when not set. The hosts' container runtime must be able to pull from
    /// it (for a plain-HTTP mirror, its `hosts.toml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = Rule::new(IMAGE_REPOSITORY_FORMAT).message(
        "imageRepository must be a registry host (with an optional port) and an optional path, \
         without a scheme or a trailing '/', e.g. registry.example.internal/k8s (rule: image-repository-format)"
    ))]
    pub image_repository: Option<String>,

    /// How every machine runs kubeadm and the kubelet.
    #[serde(default)]
    pub nodes: Nodes,
}

impl BootsmanClusterSpec {
    /// Worker hosts the cluster asks for: the replicas of every pool.
    pub fn worker_replicas(&self) -> i32 {
        self.workers.iter().map(|w| w.replicas).sum()
    }
}

/// CEL: `host[:port][/path...]` in lower case, no scheme, no trailing slash.
const IMAGE_REPOSITORY_FORMAT: &str =
    r"self.matches('^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$')";

/// Settings of kubeadm and the kubelet on every machine of the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Nodes {
    /// Let the kubelet run on hosts still on cgroup v1 (RHEL 8, Ubuntu 20.04, machines booted
    /// with `systemd.unified_cgroup_hierarchy=0`): the kubelet gets `failCgroupV1: false` and
    /// kubeadm's `SystemVerification` preflight check, which refuses cgroup v1 since Kubernetes
    /// 1.35, is downgraded to a warning. Kubernetes plans to remove cgroup v1 support; move the
    /// hosts to cgroup v2.
    #[serde(default)]
    pub allow_cgroup_v1: bool,
    /// Further kubeadm preflight checks to downgrade to warnings on every machine (kubeadm's
    /// `ignorePreflightErrors`, e.g. `NumCPU`). `all` is refused: name each check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 64)))]
    #[x_kube(validation = Rule::new(
        "self.all(c, c.matches('^[A-Za-z0-9][A-Za-z0-9.-]*$') && c.lowerAscii() != 'all')"
    )
    .message("each ignorePreflightErrors entry must name one kubeadm preflight check, e.g. NumCPU; 'all' is refused (rule: preflight-check-names)"))]
    pub ignore_preflight_errors: Vec<String>,
    /// Settings of the kubelet on every machine.
    #[serde(default)]
    pub kubelet: Kubelet,
}

/// The kubelet's eviction signals (`evictionHard` keys) on Linux.
pub const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// The kubelet's own hard eviction thresholds on Linux; a signal that
/// [`Kubelet::eviction_hard`] does not name keeps its value from here.
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// The kubelet's image garbage collection thresholds when not set: (high, low) percent.
pub const DEFAULT_IMAGE_GC_PERCENT: (i32, i32) = (85, 80);

/// CEL (on the map): every key is one of [`EVICTION_SIGNALS`].
const EVICTION_SIGNAL_NAMES: &str = "self.all(k, k in ['memory.available', \
    'allocatableMemory.available', 'nodefs.available', 'nodefs.inodesFree', 'imagefs.available', \
    'imagefs.inodesFree', 'containerfs.available', 'containerfs.inodesFree', 'pid.available'])";

/// CEL (on the map): every threshold is a percentage from 0% to 100% or a positive quantity.
const EVICTION_THRESHOLDS: &str = "self.all(k, self[k].matches('^[0-9]{1,3}(\\\\.[0-9]+)?%$') ? \
    double(self[k].substring(0, size(self[k]) - 1)) <= 100.0 : \
    (isQuantity(self[k]) && quantity(self[k]).isGreaterThan(quantity('0'))))";

/// CEL (on [`Kubelet`]): the low image GC threshold lies below the high one, either taken from
/// the kubelet's defaults when not set.
const IMAGE_GC_ORDER: &str = "(has(self.imageGCLowThresholdPercent) ? self.imageGCLowThresholdPercent : 80) < \
    (has(self.imageGCHighThresholdPercent) ? self.imageGCHighThresholdPercent : 85)";

/// Kubelet settings of every machine, written into the kubelet's configuration through a
/// kubeadm patch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(IMAGE_GC_ORDER).message(
    "imageGCLowThresholdPercent must be below imageGCHighThresholdPercent (the kubelet's defaults are 80 and 85 \
     when one is not set) (rule: image-gc-thresholds)"
))]
pub struct Kubelet {
    /// Hard eviction thresholds: eviction signal → the least that must stay available, as a
    /// quantity (`500Mi`, `2Gi`, `1000` for `pid.available`) or a percentage of the whole
    /// (`10%`). When a signal crosses its threshold the node gets a pressure taint and the
    /// kubelet evicts pods. Signals not named keep the kubelet's defaults (`memory.available`
    /// 100Mi, `nodefs.available` 10%, `nodefs.inodesFree` 5%, `imagefs.available` 15%,
    /// `imagefs.inodesFree` 5%); `0%` turns a signal off. Lower the disk thresholds on hosts
    /// whose disk is shared with data the cluster does not own, where a percentage of the whole
    /// disk says little about the room left for pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 9, "additionalProperties" = {"type": "string", "maxLength": 32}))]
    #[x_kube(
        validation = Rule::new(EVICTION_SIGNAL_NAMES).message(
            "each evictionHard key must be a kubelet eviction signal: memory.available, allocatableMemory.available, \
             nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, containerfs.available, \
             containerfs.inodesFree or pid.available (rule: eviction-signal)"
        ),
        validation = Rule::new(EVICTION_THRESHOLDS).message(
            "each evictionHard threshold must be a percentage from 0% to 100% or a positive quantity such as 500Mi \
             (rule: eviction-threshold)"
        )
    )]
    pub eviction_hard: BTreeMap<String, String>,
    /// Disk usage of the image filesystem, in percent, at which the kubelet starts deleting
    /// unused images (the kubelet's default: 85). `100` leaves images alone until the disk is
    /// full.
    #[serde(
        default,
        rename = "imageGCHighThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// Disk usage, in percent, down to which image garbage collection deletes (the kubelet's
    /// default: 80). Must be below the high threshold.
    #[serde(
        default,
        rename = "imageGCLowThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 99))]
    pub image_gc_low_threshold_percent: Option<i32>,
}

/// CEL (on the spec): an endpoint given as an IP address lies in neither cluster network.
const ENDPOINT_OUTSIDE_CLUSTER_NETWORKS: &str = concat!(
    "!isIP(self.controlPlane.endpoint.host) || (",
    "(!isCIDR(self.network.podCIDR) || !cidr(self.network.podCIDR).containsIP(self.controlPlane.endpoint.host)) && ",
    "(!isCIDR(self.network.serviceCIDR) || !cidr(self.network.serviceCIDR).containsIP(self.controlPlane.endpoint.host)))"
);

/// CEL (on the spec): no MetalLB address pool entry overlaps a cluster network or holds the
/// endpoint. A CIDR entry is compared whole; a `first-last` range by its two ends, and by whether
/// it spans a network from below to above.
fn address_pools_outside_cluster() -> String {
    // A range `f-l` whose ends both lie outside network `n` still overlaps it when it starts at
    // or below the network's first address and ends above it.
    let spans = |n: &str| {
        format!(
            "(!isCIDR({n}) || ip(f).family() != cidr({n}).ip().family() || \
             !({le_start} && !{l_le_start}))",
            le_start = ip_le("f", &format!("cidr({n}).masked().ip()")),
            l_le_start = ip_le("l", &format!("cidr({n}).masked().ip()")),
        )
    };
    format!(
        "self.loadBalancer.metallb.addressPools.all(p, p.addresses.all(a, \
         (!isCIDR(a) || (\
         (!isCIDR(self.network.podCIDR) || (!cidr(a).containsCIDR(self.network.podCIDR) && !cidr(self.network.podCIDR).containsCIDR(a))) && \
         (!isCIDR(self.network.serviceCIDR) || (!cidr(a).containsCIDR(self.network.serviceCIDR) && !cidr(self.network.serviceCIDR).containsCIDR(a))) && \
         (!isIP(self.controlPlane.endpoint.host) || !cidr(a).containsIP(self.controlPlane.endpoint.host)))) && \
         (isCIDR(a) || !a.matches('^[^-]+-[^-]+$') || (a.split('-').all(e, \
         (!isCIDR(self.network.podCIDR) || !isIP(e.trim()) || !cidr(self.network.podCIDR).containsIP(e.trim())) && \
         (!isCIDR(self.network.serviceCIDR) || !isIP(e.trim()) || !cidr(self.network.serviceCIDR).containsIP(e.trim())) && \
         e.trim() != self.controlPlane.endpoint.host) && \
         ({not_range} || [a.split('-')[0].trim()].all(f, [a.split('-')[1].trim()].all(l, \
         {spans_pods} && {spans_services} && \
         (!isIP(self.controlPlane.endpoint.host) || ip(f).family() != ip(self.controlPlane.endpoint.host).family() || \
         !({f_le_ep} && !{l_le_ep})))))))))",
        not_range = NOT_A_VALID_RANGE,
        spans_pods = spans("self.network.podCIDR"),
        spans_services = spans("self.network.serviceCIDR"),
        f_le_ep = ip_le("f", "ip(self.controlPlane.endpoint.host)"),
        l_le_ep = ip_le("l", "ip(self.controlPlane.endpoint.host)"),
    )
}

/// CEL (on an address `a`): true unless `a` is `first-last` of two IPs of one family.
const NOT_A_VALID_RANGE: &str = concat!(
    "!isIP(a.split('-')[0].trim()) || !isIP(a.split('-')[1].trim()) || ",
    "ip(a.split('-')[0].trim()).family() != ip(a.split('-')[1].trim()).family()"
);

/// CEL (on an address list): each `first-last` range goes from the lower address to the higher.
fn ranges_in_order() -> String {
    format!(
        "self.all(a, isCIDR(a) || !a.matches('^[^-]+-[^-]+$') || {NOT_A_VALID_RANGE} || \
         [a.split('-')[0].trim()].all(f, [a.split('-')[1].trim()].all(l, {})))",
        ip_le("f", "ip(l)")
    )
}

/// CEL: the address in the string `x` is at most the IP value `y`, both valid and of one family.
/// CEL has no ordering of addresses, so this finds the length `n` of the prefix they share, by a
/// binary search over prefix lengths (each step bound to a name with a one-element list): `x`
/// is lower when its bit `n` is 0, that is when `x/(n+1)` holds the first address of `x/n`.
fn ip_le(x: &str, y: &str) -> String {
    let width = format!("(ip({x}).family() == 4 ? 32 : 128)");
    let mut expr = format!(
        "(n7 == {width} || cidr({x} + {}).containsIP(cidr({x} + {}).masked().ip()))",
        prefix_suffix("n7 + 1"),
        prefix_suffix("n7")
    );
    // Innermost first: n7 = n6 + 1, ..., n1 = 0 + 64; each grows by its step when x and y
    // still share that longer prefix.
    for k in (1..=7).rev() {
        let step = 1 << (7 - k);
        let to = format!("n{k}");
        let from = if k == 1 {
            "0".to_string()
        } else {
            format!("n{}", k - 1)
        };
        let longer = format!("{from} + {step}");
        expr = format!(
            "[{longer} <= {width} && cidr({x} + {}).containsIP({y}) ? {longer} : {from}].all({to}, {expr})",
            prefix_suffix(&longer)
        );
    }
    format!("({expr})")
}

/// CEL: `'/'` and the decimal digits of the prefix length `n` (0 to 128). Spelled with literal
/// digit lists: `string(int)` has no size bound the API server's cost estimate could use.
fn prefix_suffix(n: &str) -> String {
    let tens: Vec<String> = (0..=12).map(|d| format!("'{d}'")).collect();
    let ones: Vec<String> = (0..=9).map(|d| format!("'{d}'")).collect();
    format!(
        "('/' + ({n} >= 10 ? [{}][({n}) / 10] : '') + [{}][({n}) % 10])",
        tens.join(","),
        ones.join(",")
    )
}

/// CEL (on an address list): each entry a CIDR or `first-last` of two IPs of one family.
const ADDRESS_FORMAT: &str = concat!(
    "self.all(a, isCIDR(a) || (a.matches('^[^-]+-[^-]+$') && ",
    "isIP(a.split('-')[0].trim()) && isIP(a.split('-')[1].trim()) && ",
    "ip(a.split('-')[0].trim()).family() == ip(a.split('-')[1].trim()).family()))"
);

/// CEL: the new `vX.Y.Z` is not lower than the old one (skipped when either is malformed, which
/// the format rule reports).
const VERSION_NOT_DOWN: &str = concat!(
    r"!self.matches('^v[0-9]+\\.[0-9]+\\.[0-9]+$') || !oldSelf.matches('^v[0-9]+\\.[0-9]+\\.[0-9]+$') || ",
    "int(self.substring(1).split('.')[0]) > int(oldSelf.substring(1).split('.')[0]) || ",
    "(int(self.substring(1).split('.')[0]) == int(oldSelf.substring(1).split('.')[0]) && ",
    "(int(self.substring(1).split('.')[1]) > int(oldSelf.substring(1).split('.')[1]) || ",
    "(int(self.substring(1).split('.')[1]) == int(oldSelf.substring(1).split('.')[1]) && ",
    "int(self.substring(1).split('.')[2]) >= int(oldSelf.substring(1).split('.')[2]))))"
);

/// The control plane of a child cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlane {
    /// Number of control-plane machines: 3 or 5. etcd needs an odd member count; 3 survives the
    /// loss of one member, 5 the loss of two.
    #[x_kube(validation = Rule::new("self == 3 || self == 5").message(
        "controlPlane.replicas must be 3 or 5: etcd needs an odd number of members, and 3 or 5 keep \
         quorum when 1 or 2 fail (rule: control-plane-replicas-3-or-5)"
    ))]
    pub replicas: i32,

    /// Which ByoHosts may serve as control-plane machines. Empty selects any free host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_selector: Option<LabelSelector>,

    /// The API server endpoint: a virtual IP held by kube-vip on the control-plane hosts, or
    /// the address of a load balancer of the site.
    pub endpoint: Endpoint,

    /// Run workloads on the control-plane machines too: they register without kubeadm's
    /// `node-role.kubernetes.io/control-plane:NoSchedule` taint. For a small cluster whose
    /// control plane carries everything, such as a site's infrastructure cluster (Cluster API
    /// and Bootsman on three or five hosts); the worker pools may then total 0 replicas.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub schedulable: bool,
}

/// Where the child cluster's API server is reached.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// A free IP address on the hosts' network (or a DNS name resolving to it).
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// TCP port; 6443 when not set.
    #[serde(default = "default_port")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535")
        .message("endpoint port must be between 1 and 65535 (rule: endpoint-port-range)"))]
    pub port: i32,
    /// Who holds the endpoint address: `kubeVip` (a kube-vip static pod on the control-plane
    /// machines announces it by ARP; the default) or `external` (a load balancer of the site,
    /// e.g. HAProxy or an appliance, forwards `host:port` to port 6443 of every control-plane
    /// host; nothing is rendered for it).
    #[serde(default)]
    pub load_balancer: EndpointLoadBalancer,
}

/// Who holds a control-plane endpoint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum EndpointLoadBalancer {
    /// A kube-vip static pod on the control-plane machines (ARP, leader election).
    #[default]
    #[serde(rename = "kubeVip")]
    KubeVip,
    /// A load balancer the site runs.
    #[serde(rename = "external")]
    External,
}

fn default_port() -> i32 {
    6443
}

/// One pool of identical worker machines.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPool {
    /// Name of the pool, a DNS-1123 label; part of the MachineDeployment's name.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message(
        "worker pool name must be a DNS-1123 label: lower-case letters, digits and '-', starting \
         and ending with a letter or digit (rule: worker-pool-name-dns1123)"
    ))]
    pub name: String,
    /// Number of machines in the pool.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Which ByoHosts may serve in this pool. Empty selects any free host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_selector: Option<LabelSelector>,
}

/// Pod and service networks of a child cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!isCIDR(self.podCIDR) || !isCIDR(self.serviceCIDR) || \
     (!cidr(self.podCIDR).containsCIDR(self.serviceCIDR) && !cidr(self.serviceCIDR).containsCIDR(self.podCIDR))"
).message("network.podCIDR and network.serviceCIDR must not overlap (rule: network-cidrs-disjoint)"))]
#[x_kube(validation = Rule::new(
    "!isCIDR(self.podCIDR) || !isCIDR(self.serviceCIDR) || \
     cidr(self.podCIDR).ip().family() == cidr(self.serviceCIDR).ip().family()"
).message("network.podCIDR and network.serviceCIDR must be of one address family; dual-stack is not supported (rule: network-cidrs-same-family)"))]
#[x_kube(validation = Rule::new(
    "!has(self.isolation) || (has(self.cni) && self.cni == 'cilium') || !has(self.cni) || \
     (has(self.isolation.hostNetworks) && size(self.isolation.hostNetworks) > 0)"
).message("network.isolation.hostNetworks must list the hosts' networks when the CNI is not cilium: NetworkPolicies admit a hostNetwork ingress controller and the kubelets' probes by address (rule: isolation-host-networks-required)"))]
#[x_kube(validation = Rule::new(
    "!has(self.isolation) || !has(self.isolation.hostNetworks) || !isCIDR(self.podCIDR) || \
     self.isolation.hostNetworks.all(c, !isCIDR(c) || \
       (!cidr(c).containsCIDR(self.podCIDR) && !cidr(self.podCIDR).containsCIDR(c)))"
).message("network.isolation.hostNetworks must not overlap network.podCIDR: every pod would be admitted into every project (rule: isolation-host-networks-outside-pods)"))]
pub struct Network {
    /// The CNI plugin: `cilium` (the default; installed as a Helm chart through the Cluster API
    /// add-on provider for Helm, replacing kube-proxy) or `kube-router` (installed from plain
    /// manifests through a ClusterResourceSet of Cluster API itself, beside kube-proxy; routes
    /// pods between nodes over BGP and enforces NetworkPolicy).
    #[serde(default)]
    pub cni: Cni,
    /// Pod network (CIDR).
    #[serde(default = "default_pod_cidr", rename = "podCIDR")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("isCIDR(self)")
        .message("network.podCIDR must be a CIDR such as 10.244.0.0/16 (rule: pod-cidr-format)"))]
    pub pod_cidr: String,
    /// Service network (CIDR).
    #[serde(default = "default_service_cidr", rename = "serviceCIDR")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("isCIDR(self)")
        .message("network.serviceCIDR must be a CIDR such as 10.96.0.0/12 (rule: service-cidr-format)"))]
    #[x_kube(validation = Rule::new(
        "!isCIDR(self) || cidr(self).prefixLength() >= (cidr(self).ip().family() == 4 ? 12 : 108)"
    )
    .message("network.serviceCIDR may be at most a /12 (IPv4) or a /108 (IPv6): kube-apiserver refuses larger service ranges (rule: service-cidr-size)"))]
    pub service_cidr: String,
    /// kube-proxy settings (with `cni: kube-router`; Cilium replaces kube-proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy: Option<KubeProxy>,
    /// Network isolation between the projects of the child cluster: the pods of a project's
    /// namespaces are reached only from the same project, from the ingress controller and from
    /// the hosts. None when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

/// Projects inside the child cluster, each a set of namespaces, isolated from one another.
///
/// The operator creates the namespaces in the child cluster, labelled `bootsman.io/project:
/// <project>`, and renders ingress policies through a ClusterResourceSet (`<cluster>-isolation`,
/// re-applied when they change): with `cni: cilium` one CiliumClusterwideNetworkPolicy per
/// project (its namespaces' pods admit the same project, the `ingress-nginx` namespace and the
/// `host` and `remote-node` entities, which a hostNetwork ingress DaemonSet and the kubelets'
/// probes come from); with another CNI one NetworkPolicy `bootsman-project-isolation` per
/// namespace (the same project's namespaces, `ingress-nginx`, and `hostNetworks`). Egress is not
/// restricted. Removing a project or namespace from the list leaves what was applied in the
/// child cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.projects.all(p, p.namespaces.all(n, self.projects.filter(q, n in q.namespaces).size() == 1))"
).message("a namespace belongs to one project of network.isolation (rule: isolation-namespace-once)"))]
pub struct Isolation {
    /// The projects; names unique.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(
        validation = Rule::new("self.all(p, self.exists_one(q, q.name == p.name))")
            .message("network.isolation project names must be unique (rule: isolation-project-names-unique)"),
        merge_strategy = ListMerge::Map(vec!["name".into()])
    )]
    pub projects: Vec<IsolatedProject>,
    /// Networks (CIDRs) of the hosts, admitted into every project: where a hostNetwork ingress
    /// controller and the kubelets' probes come from. Needed with a CNI other than `cilium`
    /// (Cilium tells host traffic apart itself); never overlapping `podCIDR`, or every pod would
    /// be admitted.
    #[serde(default)]
    #[schemars(length(max = 16), inner(length(max = 64)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))")
        .message("network.isolation.hostNetworks entries must be CIDRs such as 10.0.0.0/24 (rule: isolation-host-networks-format)"))]
    pub host_networks: Vec<String>,
}

/// One project of the child cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IsolatedProject {
    /// Name of the project: a DNS-1123 label, the value of the namespaces' `bootsman.io/project`
    /// label.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message(
        "network.isolation project name must be a DNS-1123 label (rule: isolation-project-name-dns1123)"
    ))]
    pub name: String,
    /// Namespaces of the child cluster in the project (DNS-1123 labels; not `kube-system`,
    /// `kube-public`, `kube-node-lease` or `ingress-nginx`).
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 63)))]
    #[x_kube(
        merge_strategy = ListMerge::Set,
        validation = Rule::new("self.all(n, n.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))")
            .message("network.isolation namespaces must be DNS-1123 labels (rule: isolation-namespace-dns1123)"),
        validation = Rule::new(
            "self.all(n, !(n in ['kube-system', 'kube-public', 'kube-node-lease', 'ingress-nginx']))"
        )
        .message("network.isolation cannot isolate kube-system, kube-public, kube-node-lease or ingress-nginx: the cluster's own components live there (rule: isolation-namespace-reserved)")
    )]
    pub namespaces: Vec<String>,
}

impl Default for Network {
    fn default() -> Self {
        Self {
            cni: Cni::default(),
            pod_cidr: default_pod_cidr(),
            service_cidr: default_service_cidr(),
            kube_proxy: None,
            isolation: None,
        }
    }
}

/// kube-proxy settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxy {
    /// Connection-tracking entries kube-proxy asks the kernel for, per CPU
    /// (`conntrack.maxPerCore`; 32768 when not set). `0` leaves `nf_conntrack_max` as the host
    /// has it: for hosts whose sysctls are managed elsewhere, or where kube-proxy may not write
    /// them (nodes in containers or network namespaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1048576))]
    pub conntrack_max_per_core: Option<i32>,
}

fn default_pod_cidr() -> String {
    "10.244.0.0/16".into()
}

fn default_service_cidr() -> String {
    "10.96.0.0/12".into()
}

/// Supported CNI plugins.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Cni {
    /// Cilium, installed as a Helm chart (CAAPH) before nodes can become ready; replaces
    /// kube-proxy.
    #[default]
    #[serde(rename = "cilium")]
    Cilium,
    /// kube-router, installed from manifests by a ClusterResourceSet; kube-proxy stays.
    #[serde(rename = "kube-router")]
    KubeRouter,
}

/// Persistent storage addons.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// Longhorn distributed block storage on the workers' disks.
    #[serde(default)]
    pub longhorn: Longhorn,
}

/// Longhorn settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Longhorn {
    /// Whether Longhorn is installed.
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for Longhorn {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Ingress addons.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ingress {
    /// ingress-nginx, run as a DaemonSet on every worker.
    #[serde(default)]
    pub nginx: Nginx,
}

/// ingress-nginx settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Nginx {
    /// Whether ingress-nginx is installed.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Expect the PROXY protocol from the load balancer in front of the workers.
    #[serde(default)]
    pub proxy_protocol: bool,
}

impl Default for Nginx {
    fn default() -> Self {
        Self {
            enabled: true,
            proxy_protocol: false,
        }
    }
}

fn yes() -> bool {
    true
}

/// Service load-balancer addons.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    /// MetalLB, in BGP mode only.
    #[serde(default)]
    pub metallb: MetalLb,
}

/// MetalLB settings. Only BGP mode is offered: in L2 mode one node answers for each service IP,
/// so all of that service's traffic funnels through a single node and fails over slowly.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.enabled || (size(self.bgpPeers) > 0 && size(self.addressPools) > 0)")
    .message("metallb.enabled needs at least one bgpPeers entry and one addressPools entry (rule: metallb-bgp-config)"))]
pub struct MetalLb {
    /// Whether MetalLB is installed.
    #[serde(default)]
    pub enabled: bool,
    /// Announcement mode. Only `BGP` is accepted.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == 'BGP'").message(
        "metallb.mode must be BGP: L2 mode is refused because one node answers for each service IP, \
         making it a traffic bottleneck and a slow failover point (rule: metallb-bgp-only)"
    ))]
    pub mode: MetalLbMode,
    /// BGP routers the nodes peer with.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub bgp_peers: Vec<BgpPeer>,
    /// Address pools MetalLB assigns service IPs from; names unique.
    #[serde(default)]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(x, x.name == p.name))")
        .message("address pool names must be unique (rule: address-pool-names-unique)"))]
    pub address_pools: Vec<AddressPool>,
}

/// MetalLB announcement modes. `L2` is listed only so that it can be refused with a clear message.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MetalLbMode {
    /// Announce service IPs to BGP peers.
    #[default]
    #[serde(rename = "BGP")]
    Bgp,
    /// Not supported (see the `mode` field).
    L2,
}

/// A BGP router the cluster nodes peer with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpPeer {
    /// IP address of the router.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("isIP(self)")
        .message("bgpPeers[].peerAddress must be an IP address such as 10.0.0.1 (rule: metallb-peer-address)"))]
    pub peer_address: String,
    /// Autonomous system number of the router.
    #[serde(rename = "peerASN")]
    pub peer_asn: u32,
    /// Autonomous system number the nodes announce from.
    #[serde(rename = "myASN")]
    pub my_asn: u32,
    /// TCP port of the router's BGP session; 179 when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_port: Option<u16>,
}

/// A pool of service IPs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressPool {
    /// Name of the pool: a DNS-1123 label (it names MetalLB's IPAddressPool).
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("address pool name must be a DNS-1123 label (rule: address-pool-name-dns1123)"))]
    pub name: String,
    /// CIDRs (`10.0.10.0/24`) or `first-last` ranges (`10.0.10.5-10.0.10.9`) of addresses, of
    /// one family each; at least one.
    #[schemars(length(min = 1, max = 8), inner(length(max = 64)))]
    #[x_kube(validation = Rule::new(ADDRESS_FORMAT).message(
        "each addresses entry must be a CIDR such as 10.0.10.0/24 or a range first-last of two IP \
         addresses of one family, such as 10.0.10.5-10.0.10.9 (rule: address-pool-addresses)"
    ))]
    #[x_kube(validation = Rule::new(ranges_in_order()).message(
        "a range first-last must go from the lower address to the higher, such as \
         10.0.10.5-10.0.10.9 (rule: address-pool-range-order)"
    ))]
    pub addresses: Vec<String>,
    /// Whether services get addresses from this pool without asking for it by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_assign: Option<bool>,
}

/// Rancher integration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rancher {
    /// Label the CAPI Cluster so Rancher Turtles imports it into Rancher automatically.
    #[serde(default)]
    pub auto_import: bool,
}

/// Observed state of a child cluster, following the kstatus conventions so Flux and Argo CD read
/// its health right.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootsmanClusterStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// A one-word summary of the cluster's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,
    /// `Ready`, `ControlPlaneReady`, `WorkersReady`, `HostsAvailable`, `AddonsReady`,
    /// `Reconciling`, `Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Control-plane machines: desired and ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ReplicaCounts>,
    /// Worker machines of all pools: desired and ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<ReplicaCounts>,
    /// Name of the Secret (in this namespace) holding the child cluster's admin kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret: Option<String>,
}

/// Desired and ready machine counts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaCounts {
    /// Machines the spec asks for.
    pub desired: i32,
    /// Machines that are ready.
    pub ready: i32,
}

/// One-word summary of a child cluster's state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ClusterPhase {
    /// Accepted; waiting for hosts or for CAPI to start.
    Pending,
    /// Machines are being created and bootstrapped.
    Provisioning,
    /// Every machine is ready.
    Ready,
    /// Replica counts changed; lasts until every machine is ready again.
    Scaling,
    /// A Kubernetes version change is rolling out.
    Upgrading,
    /// Being deleted; hosts are returning to the pool.
    Deleting,
    /// Cannot make progress without a change (see the `Stalled` condition).
    Failed,
}
