//! `ByoMachine` and `ByoMachineTemplate`: the infrastructure side of a CAPI Machine, satisfied by
//! binding one host of the pool.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Initialization, MachineAddress, ObjectReference, TemplateMeta};

/// Desired state of a ByoMachine (BYOH field names).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "ByoMachine",
    namespaced,
    status = "ByoMachineStatus",
    shortname = "byom",
    category = "cluster-api",
    category = "bootsman",
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "The infrastructure of one CAPI Machine: a host of the pool bound to it.",
    derive = "PartialEq",
    printcolumn(
        name = "Host",
        type_ = "string",
        json_path = ".status.hostRef.name",
        description = "The bound ByoHost"
    ),
    printcolumn(name = "ProviderID", type_ = "string", json_path = ".spec.providerID"),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("!has(oldSelf.providerID) || has(self.providerID)")
    .message("spec.providerID cannot be removed once set (rule: providerid-immutable)"))]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineSpec {
    /// Which hosts may serve this machine: a label selector over ByoHosts. Empty selects any
    /// healthy free host of the pools this machine's namespace may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// `byoh://<namespace>/<host>`, set by the provider once a host is bound; the workload Node
    /// carries the same value. Immutable once set.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message("spec.providerID is immutable once set (rule: providerid-immutable)"))]
    pub provider_id: Option<String>,

    /// Accepted for compatibility with BYOH templates and ignored: Bootsman installs Kubernetes
    /// components from the bootstrap data, not through an installer object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer_ref: Option<ObjectReference>,
}

/// Observed state of a ByoMachine (CAPI v1beta2 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineStatus {
    /// `provisioned` becomes true once the bound host has bootstrapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses of the bound host, from the interfaces its agent reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// The ByoHost bound to this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ref: Option<HostRef>,
    /// The failure domain (zone) of the bound host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// `Ready`, `HostAssigned`, `HostBootstrapped`, `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// A reference to the ByoHost bound to a machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostRef {
    /// Namespace of the ByoHost (its pool).
    pub namespace: String,
    /// Name of the ByoHost.
    pub name: String,
    /// UID of the ByoHost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// Template for the ByoMachines of a MachineDeployment or KubeadmControlPlane.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "ByoMachineTemplate",
    namespaced,
    shortname = "byomt",
    category = "cluster-api",
    category = "bootsman",
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "Template from which CAPI creates ByoMachines.",
    derive = "PartialEq",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineTemplateSpec {
    /// The ByoMachines to create.
    pub template: ByoMachineTemplateResource,
}

/// The machine part of a [`ByoMachineTemplate`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineTemplateResource {
    /// Labels and annotations for the created ByoMachines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of the created ByoMachines.
    pub spec: ByoMachineSpec,
}
