//! Types shared by several provider kinds.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the API server of a child cluster is reached (a virtual IP or DNS name and a port).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// DNS name or IP address of the API server endpoint. Empty until known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub host: String,
    /// TCP port of the API server endpoint; 6443 when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535")
        .message("endpoint port must be between 1 and 65535 (rule: endpoint-port-range)"))]
    pub port: Option<i32>,
}

impl ApiEndpoint {
    /// The port used when none is given.
    pub const DEFAULT_PORT: i32 = 6443;

    /// The port, or [`Self::DEFAULT_PORT`] when not set.
    pub fn port_or_default(&self) -> i32 {
        self.port.unwrap_or(Self::DEFAULT_PORT)
    }
}

/// Reports whether the provider finished creating the infrastructure (CAPI v1beta2 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Initialization {
    /// True once the infrastructure is ready; CAPI copies it to the owning Machine or Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// One address of a machine, as in CAPI's `MachineAddress`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// Address type: `Hostname`, `ExternalIP`, `InternalIP`, `ExternalDNS` or `InternalDNS`.
    #[serde(rename = "type")]
    pub type_: MachineAddressType,
    /// The address itself.
    pub address: String,
}

/// Kind of a [`MachineAddress`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MachineAddressType {
    /// The host name of the machine.
    Hostname,
    /// An address reachable from outside the cluster network.
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    /// An address on the cluster network.
    #[serde(rename = "InternalIP")]
    InternalIp,
    /// A DNS name reachable from outside.
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
    /// A DNS name on the cluster network.
    #[serde(rename = "InternalDNS")]
    InternalDns,
}

/// A failure domain (zone) the cluster's machines can be spread over (CAPI v1beta2: a list entry).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain: the value of the hosts' `topology.kubernetes.io/zone` label.
    pub name: String,
    /// Whether control-plane machines may be placed in this failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes of the failure domain.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// Labels and annotations a template stamps on the objects made from it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels for objects created from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations for objects created from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A reference to an object of any kind, as BYOH's `corev1.ObjectReference` fields had it.
/// Accepted for compatibility; see each field that uses it for whether it is read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// API version of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// UID of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Resource version of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// A path into the referent (e.g. a container in a Pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
}
