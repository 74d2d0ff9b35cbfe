//! Small types shared by the CAPI v1beta2 views.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Free-form fields a view does not model, kept so that nothing is lost on a round trip.
pub type Extra = BTreeMap<String, serde_json::Value>;

/// A v1beta2 reference to a provider object: group, kind and name, with the version resolved by
/// CAPI from the CRD's contract label.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// API group of the referent, e.g. `infrastructure.cluster.x-k8s.io`.
    pub api_group: String,
    /// Kind of the referent.
    pub kind: String,
    /// Name of the referent, in the referrer's namespace.
    pub name: String,
}

/// A `host:port` API endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// DNS name or IP address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// Labels and annotations for objects made from a template (CAPI's `ObjectMeta`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Rollout strategy shared by MachineDeployment and KubeadmControlPlane (`spec.rollout`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// How machines are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<RolloutStrategy>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.rollout.strategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// `RollingUpdate` (the only type KCP accepts) or, for MachineDeployments, `OnDelete`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Surge and unavailability bounds of a rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// Bounds of a rolling update; each is a count or a percentage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Machines that may exist above the desired count during a rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// Machines that may be unavailable during a rollout (MachineDeployment only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
}
