//! `ByoHost`: one server of the pool of free hosts, created and kept current by its agent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ObjectReference;

/// Desired state of a host. Written by the provider (claim, bootstrap secret, release request,
/// quarantine) and by admins (`maintenance`, removing a quarantine); the host's own agent may set it
/// only when it creates the ByoHost. Everything `clusterctl move` must carry lives here.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "ByoHost",
    namespaced,
    status = "ByoHostStatus",
    shortname = "byoh",
    category = "cluster-api",
    category = "bootsman",
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    label("clusterctl.cluster.x-k8s.io/move", ""),
    doc = "A bare-metal server in the pool of free hosts, registered by its byoh-agent.",
    derive = "Default",
    derive = "PartialEq",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the host is in its lifecycle"
    ),
    printcolumn(
        name = "Machine",
        type_ = "string",
        json_path = ".spec.machineRef.name",
        description = "The ByoMachine that claimed the host"
    ),
    printcolumn(
        name = "OS",
        type_ = "string",
        json_path = ".status.hostInfo.osImage",
        priority = "1"
    ),
    printcolumn(
        name = "Arch",
        type_ = "string",
        json_path = ".status.hostInfo.architecture",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".status.phase"
)]
#[serde(rename_all = "camelCase")]
pub struct ByoHostSpec {
    /// The claim: the ByoMachine this host is bound to. Set by the provider with one optimistic
    /// write; cleared when the release completes. A claim goes from empty to a machine and back to
    /// empty, never straight from one machine to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message(
        "spec.machineRef cannot move straight from one machine to another: release the host first \
         (rule: claim-empty-to-machine-and-back)"
    ))]
    pub machine_ref: Option<MachineRef>,

    /// The Secret (in this host's namespace) holding the bootstrap data meant for this host only.
    /// Set by the provider after the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_secret: Option<SecretRef>,

    /// Set by the provider when the claiming machine goes away: the agent resets the host
    /// (`kubeadm reset`, removes what bootstrap wrote) and reports `CleanupSucceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseRequest>,

    /// An admin's switch: a host in maintenance is never chosen for a new machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<bool>,

    /// Set by the provider when a release did not finish cleanly in time or the agent went
    /// offline during it. A quarantined host is out of the pool until an admin removes this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,

    /// Set by an admin (`bootsmanctl hosts rehome`, as a pivot does) to move this host's agent to
    /// another management cluster: the Secret `bootsman-rehome-<host>` in this namespace holds a
    /// bootstrap kubeconfig of that cluster with a one-time token for this host's name. The agent
    /// enrols there, reports `Rehomed=True` here, and then talks only to the new cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rehome: Option<RehomeRequest>,

    /// Accepted for compatibility with BYOH manifests and ignored: Bootsman installs Kubernetes
    /// components from the bootstrap data, not from an installer bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation_secret: Option<ObjectReference>,

    /// Accepted for compatibility with BYOH manifests and ignored (see `installationSecret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstallation_script: Option<String>,
}

/// The ByoMachine a host is bound to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRef {
    /// Namespace of the ByoMachine.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the ByoMachine.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The binding id: the UID of the ByoMachine when it claimed the host. It never changes while
    /// the claim lasts (the agent's bootstrap journal is keyed by it). A machine moved by
    /// `clusterctl move` gets a new UID and keeps this one in its annotation
    /// `infrastructure.cluster.x-k8s.io/byohost-binding`, so it still holds the host; a machine
    /// recreated under the same name without it is a different claim.
    #[schemars(length(min = 1, max = 64))]
    pub uid: String,
}

/// A reference to a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    pub name: String,
    /// Namespace of the Secret; the host's own namespace when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A request to reset the host after its machine went away.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRequest {
    /// UID of the ByoMachine whose bootstrap is to be undone.
    #[serde(rename = "machineUID")]
    pub machine_uid: String,
    /// When the provider asked for the release; the release times out from here.
    pub requested_at: Time,
}

/// A request to move a host's agent to another management cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RehomeRequest {
    /// The API server the host moves to, as the rehome Secret names it (for the record; the
    /// agent connects to what the Secret says).
    #[schemars(length(min = 1, max = 2048))]
    pub server: String,
    /// When the admin asked.
    pub requested_at: Time,
}

/// Name of the Secret (in the host's namespace) that carries a host's rehome bootstrap
/// kubeconfig, under [`REHOME_SECRET_KEY`]; only that host may read it.
pub fn rehome_secret_name(host: &str) -> String {
    format!("bootsman-rehome-{host}")
}

/// Key of the bootstrap kubeconfig in the rehome Secret.
pub const REHOME_SECRET_KEY: &str = "bootstrap-kubeconfig";

/// Why and since when a host is out of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    /// Human-readable reason, e.g. that the reset did not finish within the release timeout.
    pub reason: String,
    /// When the host was quarantined.
    pub since: Time,
}

/// Observed state of a host, written by its agent (and rebuildable by it at any time).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ByoHostStatus {
    /// Hardware and operating-system inventory read from the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_info: Option<HostInfo>,
    /// Network interfaces with their addresses; one is marked as the default route's interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<NetworkInterface>,
    /// Version of the byoh-agent running on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Where the host is in its lifecycle, derived from spec, conditions and the heartbeat Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<HostPhase>,
    /// `Registered`, `AgentHealthy`, `BootstrapSucceeded`, `CleanupSucceeded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

impl ByoHost {
    /// A ByoHost as an agent registers it: `name` in pool `namespace`, an empty spec, no labels.
    /// (`ByoHost::new` also copies the CRD's own labels, the clusterctl ones, onto the object; a
    /// host may not set those, because labels outside `host.bootsman.io/` are admins'.)
    pub fn registered(name: &str, namespace: &str) -> Self {
        let mut h = Self::new(name, ByoHostSpec::default());
        h.metadata.labels = None;
        h.metadata.namespace = Some(namespace.into());
        h
    }
}

/// Lifecycle phase of a host.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HostPhase {
    /// Healthy, unclaimed, not in maintenance: may be chosen for a machine.
    Available,
    /// Bound to a machine; bootstrap data not yet handed over.
    Claimed,
    /// Running its bootstrap data.
    Bootstrapping,
    /// Bootstrap finished; the host serves its machine.
    Provisioned,
    /// Resetting after its machine went away.
    Releasing,
    /// Out of the pool until an admin re-admits it (see `spec.quarantine`).
    Quarantined,
    /// The agent's heartbeat Lease has expired.
    Offline,
    /// Excluded from selection by an admin (`spec.maintenance`).
    Maintenance,
}

/// Hardware and operating-system inventory of a host.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostInfo {
    /// Host name as the kernel reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Contents of `/etc/machine-id`.
    #[serde(default, rename = "machineID", skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// Operating system family (`ID` in `/etc/os-release`), e.g. `ubuntu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_name: Option<String>,
    /// Human-readable operating system (`PRETTY_NAME` in `/etc/os-release`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_image: Option<String>,
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_version: Option<String>,
    /// CPU architecture, e.g. `amd64` or `arm64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Number of logical CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Total memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Block devices (whole disks, not partitions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
}

/// One block device of a host.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Kernel name of the device, e.g. `sda` or `nvme0n1`.
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Model string reported by the device, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// True for spinning disks, false for solid-state ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
}

/// One network interface of a host (BYOH's field names).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Interface name, e.g. `eno1`.
    pub network_interface_name: String,
    /// Hardware address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_addr: Option<String>,
    /// Addresses in CIDR notation, e.g. `10.0.0.21/24`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addrs: Vec<String>,
    /// True for the interface that carries the default route.
    #[serde(default)]
    pub is_default: bool,
    /// True when the link is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
}
