//! Operator settings: where addon charts and images come from (so an air-gapped site can point
//! every chart and image at its own mirror) and the kube-vip image. Read from the YAML file given
//! by `--settings`; every field has a default that uses the public upstream locations.

use serde::{Deserialize, Serialize};

/// Settings of the operator that are not part of any BootsmanCluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorSettings {
    /// Image of kube-vip, the static pod that holds the control-plane endpoint address.
    #[serde(default = "default_kube_vip_image")]
    pub kube_vip_image: String,
    /// Image of kube-router, the CNI of clusters with `network.cni: kube-router`.
    #[serde(default = "default_kube_router_image")]
    pub kube_router_image: String,
    /// Where each addon's chart and images come from.
    #[serde(default)]
    pub addons: AddonSources,
}

impl Default for OperatorSettings {
    fn default() -> Self {
        Self {
            kube_vip_image: default_kube_vip_image(),
            kube_router_image: default_kube_router_image(),
            addons: AddonSources::default(),
        }
    }
}

fn default_kube_vip_image() -> String {
    "ghcr.io/kube-vip/kube-vip:v0.9.2".into()
}

fn default_kube_router_image() -> String {
    "docker.io/cloudnativelabs/kube-router:v2.1.0".into()
}

/// Chart sources of every addon.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddonSources {
    /// Cilium (always installed).
    #[serde(default = "cilium")]
    pub cilium: ChartSource,
    /// Longhorn.
    #[serde(default = "longhorn")]
    pub longhorn: ChartSource,
    /// ingress-nginx.
    #[serde(default = "ingress_nginx")]
    pub ingress_nginx: ChartSource,
    /// MetalLB.
    #[serde(default = "metallb")]
    pub metallb: ChartSource,
    /// A chart that installs the Kubernetes objects listed in its `resources` value (the
    /// `bedag/raw` chart or a compatible mirror); it carries MetalLB's BGPPeer, IPAddressPool and
    /// BGPAdvertisement objects, because CAAPH installs charts only.
    #[serde(default = "raw")]
    pub raw: ChartSource,
}

impl Default for AddonSources {
    fn default() -> Self {
        Self {
            cilium: cilium(),
            longhorn: longhorn(),
            ingress_nginx: ingress_nginx(),
            metallb: metallb(),
            raw: raw(),
        }
    }
}

/// Where one chart and its images come from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartSource {
    /// Chart repository, `https://` or `oci://`.
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    /// Chart name in the repository.
    pub chart_name: String,
    /// Chart version.
    pub version: String,
    /// Registry the chart's images are pulled from instead of the upstream ones (e.g.
    /// `registry.example.internal`). Upstream registries when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_registry: Option<String>,
}

fn source(repo: &str, chart: &str, version: &str) -> ChartSource {
    ChartSource {
        repo_url: repo.into(),
        chart_name: chart.into(),
        version: version.into(),
        image_registry: None,
    }
}

fn cilium() -> ChartSource {
    source("https://helm.cilium.io", "cilium", "1.18.2")
}
fn longhorn() -> ChartSource {
    source("https://charts.longhorn.io", "longhorn", "1.9.1")
}
fn ingress_nginx() -> ChartSource {
    source(
        "https://kubernetes.github.io/ingress-nginx",
        "ingress-nginx",
        "4.13.3",
    )
}
fn metallb() -> ChartSource {
    source("https://metallb.github.io/metallb", "metallb", "0.15.2")
}
fn raw() -> ChartSource {
    source("https://bedag.github.io/helm-charts", "raw", "2.0.0")
}

/// A settings file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be read.
    #[error("reading settings file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid settings YAML.
    #[error("settings file {path}: {detail}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, naming the field.
        detail: String,
    },
    /// A field is present but empty.
    #[error("settings file {path}: {field} must not be empty")]
    Empty {
        /// The file.
        path: String,
        /// The field.
        field: String,
    },
}

impl OperatorSettings {
    /// Reads and checks a settings file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, SettingsError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: p.clone(),
            source,
        })?;
        Self::from_yaml(&text, &p)
    }

    /// Parses and checks settings YAML; `origin` names the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, SettingsError> {
        let s: Self = serde_saphyr::from_str(text).map_err(|e| SettingsError::Parse {
            path: origin.into(),
            detail: e.to_string(),
        })?;
        let empty = |field: &str| SettingsError::Empty {
            path: origin.into(),
            field: field.into(),
        };
        if s.kube_vip_image.trim().is_empty() {
            return Err(empty("kubeVipImage"));
        }
        if s.kube_router_image.trim().is_empty() {
            return Err(empty("kubeRouterImage"));
        }
        for (name, c) in s.addons.all() {
            for (f, v) in [
                ("repoURL", &c.repo_url),
                ("chartName", &c.chart_name),
                ("version", &c.version),
            ] {
                if v.trim().is_empty() {
                    return Err(empty(&format!("addons.{name}.{f}")));
                }
            }
        }
        Ok(s)
    }
}

impl AddonSources {
    fn all(&self) -> [(&'static str, &ChartSource); 5] {
        [
            ("cilium", &self.cilium),
            ("longhorn", &self.longhorn),
            ("ingressNginx", &self.ingress_nginx),
            ("metallb", &self.metallb),
            ("raw", &self.raw),
        ]
    }
}
