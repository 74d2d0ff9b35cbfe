//! `cluster.x-k8s.io/v1beta2` Machine and MachineDeployment.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::{ContractVersionedObjectReference, Extra, Rollout, TemplateMeta};

/// Spec of a CAPI Machine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// Name of the Cluster this machine belongs to.
    pub cluster_name: String,
    /// Where the bootstrap data comes from.
    #[serde(default)]
    pub bootstrap: Bootstrap,
    /// The infrastructure machine (a ByoMachine).
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// Kubernetes version of the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Copied from the infrastructure machine once provisioned.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Failure domain the machine should be placed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.bootstrap` of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    /// The bootstrap config object (e.g. a KubeadmConfig).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractVersionedObjectReference>,
    /// Name of the Secret (key `value`) holding the bootstrap data, once generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// Status of a CAPI Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// The workload Node of this machine, once it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<MachineNodeReference>,
    /// `Pending`, `Provisioning`, `Provisioned`, `Running`, `Deleting`, `Failed`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// CAPI's conditions (`Available`, `Ready`, `InfrastructureReady`, `BootstrapConfigReady`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status.nodeRef` of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineNodeReference {
    /// Name of the Node.
    pub name: String,
}

/// Spec of a CAPI MachineDeployment.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachineDeployment",
    namespaced,
    status = "MachineDeploymentStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// Name of the Cluster this deployment belongs to.
    pub cluster_name: String,
    /// Desired number of machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Selects the machines this deployment owns; must match the template's labels.
    #[serde(default)]
    pub selector: LabelSelector,
    /// The machines to create.
    pub template: MachineTemplateSpec,
    /// How machines are replaced on a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.template` of a MachineDeployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateSpec {
    /// Labels and annotations of the machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of the machines.
    pub spec: MachineSpec,
}

/// Status of a CAPI MachineDeployment (v1beta2 replica counters).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStatus {
    /// Machines that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Machines whose Node is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Machines that are available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    /// Machines matching the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    /// `ScalingUp`, `ScalingDown`, `Running`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// CAPI's conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}
