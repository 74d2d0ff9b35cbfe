//! CAAPH's `addons.cluster.x-k8s.io/v1alpha1` HelmChartProxy: one Helm chart installed into every
//! workload cluster its selector matches.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::Extra;

/// Spec of a HelmChartProxy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "addons.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "HelmChartProxy",
    namespaced,
    status = "HelmChartProxyStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct HelmChartProxySpec {
    /// Selects the CAPI Clusters (in the same namespace) that get the chart.
    pub cluster_selector: LabelSelector,
    /// Chart repository, `https://` or `oci://`.
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    /// Chart name in the repository.
    pub chart_name: String,
    /// Chart version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Helm release name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_name: Option<String>,
    /// Namespace the chart is installed into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Values as a Go template over `.Cluster`, `.ControlPlane` and `.InfraCluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_template: Option<String>,
    /// `Continuous` (default) or `InstallOnce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile_strategy: Option<String>,
    /// Helm options (`wait`, `timeout`, `install.createNamespace`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<serde_json::Value>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Status of a HelmChartProxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HelmChartProxyStatus {
    /// `Ready`, `HelmReleaseProxiesReady`, `HelmReleaseProxySpecsUpToDate`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Fields not modelled here (`matchingClusters`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}
