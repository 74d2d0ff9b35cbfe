//! `ByoCluster` and `ByoClusterTemplate`: the infrastructure side of a CAPI Cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ApiEndpoint, FailureDomain, Initialization, TemplateMeta};

/// Desired state of a ByoCluster (BYOH field names).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "ByoCluster",
    namespaced,
    status = "ByoClusterStatus",
    shortname = "byoc",
    category = "cluster-api",
    category = "bootsman",
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "The infrastructure of one CAPI Cluster built from hosts of the pool.",
    derive = "PartialEq",
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterSpec {
    /// Where the child cluster's API server is reached: a virtual IP (served by kube-vip on the
    /// control-plane hosts) or DNS name. The port defaults to 6443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,

    /// Accepted for compatibility with BYOH templates and ignored: BYOH used it for installer
    /// bundles, which Bootsman does not need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_lookup_base_registry: Option<String>,
}

/// Observed state of a ByoCluster (CAPI v1beta2 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterStatus {
    /// `provisioned` becomes true once the control-plane endpoint is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Zones the cluster's machines can be spread over, from the `topology.kubernetes.io/zone`
    /// labels of the hosts it may use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub failure_domains: Vec<FailureDomain>,
    /// `Ready`, `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// Template for ByoClusters, used by ClusterClass.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "ByoClusterTemplate",
    namespaced,
    shortname = "byoct",
    category = "cluster-api",
    category = "bootsman",
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "Template from which a ClusterClass creates ByoClusters.",
    derive = "PartialEq",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterTemplateSpec {
    /// The ByoClusters to create.
    pub template: ByoClusterTemplateResource,
}

/// The cluster part of a [`ByoClusterTemplate`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterTemplateResource {
    /// Labels and annotations for the created ByoClusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of the created ByoClusters.
    pub spec: ByoClusterSpec,
}
