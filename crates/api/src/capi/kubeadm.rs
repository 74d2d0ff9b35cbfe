//! `controlplane.cluster.x-k8s.io/v1beta2` KubeadmControlPlane and
//! `bootstrap.cluster.x-k8s.io/v1beta2` KubeadmConfigTemplate.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::{ContractVersionedObjectReference, Extra, Rollout, TemplateMeta};

/// Spec of a KubeadmControlPlane.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KubeadmControlPlane",
    namespaced,
    status = "KubeadmControlPlaneStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmControlPlaneSpec {
    /// Desired number of control-plane machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Kubernetes version of the control plane.
    pub version: String,
    /// The machines to create.
    pub machine_template: KubeadmControlPlaneMachineTemplate,
    /// kubeadm configuration of the control-plane machines.
    #[serde(default)]
    pub kubeadm_config_spec: KubeadmConfigSpec,
    /// How machines are replaced on a change (`maxSurge: 0` needs no spare host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.machineTemplate` of a KubeadmControlPlane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmControlPlaneMachineTemplate {
    /// Labels and annotations of the machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The infrastructure template (a ByoMachineTemplate).
    pub spec: KubeadmControlPlaneMachineTemplateSpec,
}

/// `spec.machineTemplate.spec` of a KubeadmControlPlane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmControlPlaneMachineTemplateSpec {
    /// The infrastructure machine template.
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// Fields not modelled here (deletion timeouts, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Status of a KubeadmControlPlane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmControlPlaneStatus {
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
    /// Lowest Kubernetes version among the machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// CAPI's conditions (`Available`, `Initialized`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Spec of a KubeadmConfigTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KubeadmConfigTemplate",
    namespaced,
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmConfigTemplateSpec {
    /// The KubeadmConfigs to create.
    pub template: KubeadmConfigTemplateResource,
}

/// `spec.template` of a KubeadmConfigTemplate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmConfigTemplateResource {
    /// Labels and annotations of the configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The kubeadm configuration.
    #[serde(default)]
    pub spec: KubeadmConfigSpec,
}

/// The parts of a `KubeadmConfigSpec` Bootsman renders; kubeadm's own configuration documents are
/// free-form JSON because their schema belongs to kubeadm.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmConfigSpec {
    /// kubeadm `ClusterConfiguration` (control plane only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_configuration: Option<serde_json::Value>,
    /// kubeadm `InitConfiguration` (first control-plane machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_configuration: Option<serde_json::Value>,
    /// kubeadm `JoinConfiguration` (every other machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_configuration: Option<serde_json::Value>,
    /// Files written before kubeadm runs (e.g. the kube-vip static pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<File>,
    /// Commands run before kubeadm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_kubeadm_commands: Vec<String>,
    /// Commands run after kubeadm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_kubeadm_commands: Vec<String>,
    /// Fields not modelled here (users, ntp, format, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A file written to the machine before kubeadm runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct File {
    /// Absolute path of the file.
    pub path: String,
    /// Content of the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// `user:group` owning the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Octal permissions, e.g. `0644`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// `base64`, `gzip` or `gzip+base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// Append to the file instead of replacing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<bool>,
}
