//! `cluster.x-k8s.io/v1beta2` Cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::{ApiEndpoint, ContractVersionedObjectReference, Extra};

/// Spec of a CAPI Cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Stops reconciliation of the cluster and its objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Pod and service networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_network: Option<ClusterNetwork>,
    /// The API endpoint of the workload cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// The control-plane provider object (e.g. a KubeadmControlPlane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractVersionedObjectReference>,
    /// The infrastructure provider object (a ByoCluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    /// Fields not modelled here (e.g. `topology`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.clusterNetwork`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// Pod network blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NetworkRanges>,
    /// Service network blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<NetworkRanges>,
    /// DNS domain of services, e.g. `cluster.local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_domain: Option<String>,
    /// Port the API server listens on, on each control-plane machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_port: Option<i32>,
}

/// A list of CIDR blocks.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRanges {
    /// CIDR blocks.
    #[serde(default)]
    pub cidr_blocks: Vec<String>,
}

/// Status of a CAPI Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Which initialization steps are done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// `Pending`, `Provisioning`, `Provisioned`, `Deleting`, `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// CAPI's conditions (`Available`, `InfrastructureReady`, `ControlPlaneAvailable`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status.initialization` of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// Copied from the infrastructure cluster's `status.initialization.provisioned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// True once the first control-plane machine is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}
