//! Deterministic generation of the CRD YAML committed under `config/crd/`.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::v1alpha1::{BootsmanCluster, Project};
use crate::v1beta1::{ByoCluster, ByoClusterTemplate, ByoHost, ByoMachine, ByoMachineTemplate};

/// The command that regenerates the committed CRD files.
pub const REGENERATE: &str = "cargo run -p bootsman-api --bin crdgen";

/// A failure to render or write a CRD file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CRD could not be serialized to YAML.
    #[error("cannot render CRD {name} as YAML")]
    Render {
        /// CRD name.
        name: String,
        /// Cause.
        #[source]
        source: serde_saphyr::SerializeError,
    },
    /// The file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// Destination.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Every CRD Bootsman owns, in a fixed order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        ByoHost::crd(),
        ByoMachine::crd(),
        ByoMachineTemplate::crd(),
        ByoCluster::crd(),
        ByoClusterTemplate::crd(),
        BootsmanCluster::crd(),
        Project::crd(),
    ]
}

/// File name of a CRD: `<plural>.<group>.yaml` (which is also the CRD's `metadata.name`).
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.{}.yaml", crd.spec.names.plural, crd.spec.group)
}

/// The YAML text committed for one CRD.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, Error> {
    let body = serde_saphyr::to_string(crd).map_err(|source| Error::Render {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    Ok(format!(
        "# Generated from the Rust types in crates/api; do not edit.\n# Regenerate: {REGENERATE}\n{body}"
    ))
}

/// `config/crd/` of the workspace this crate was built in.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/crd")
}

/// `charts/bootsman/crds/` of the same workspace: the chart ships the very same files.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/bootsman/crds")
}

/// Writes every CRD into `dir`, returning the paths written.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    all()
        .iter()
        .map(|crd| {
            let path = dir.join(file_name(crd));
            std::fs::write(&path, render(crd)?).map_err(|source| Error::Write {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crds_are_current() {
        let mut stale = Vec::new();
        for crd in all() {
            let path = default_dir().join(file_name(&crd));
            let want = render(&crd).unwrap();
            match std::fs::read_to_string(&path) {
                Ok(have) if have == want => {}
                Ok(_) => stale.push(format!("{} is stale", path.display())),
                Err(e) => stale.push(format!("{} cannot be read: {e}", path.display())),
            }
        }
        assert!(
            stale.is_empty(),
            "{}\nregenerate with: {REGENERATE}",
            stale.join("\n")
        );
    }

    #[test]
    fn committed_crds_round_trip_through_the_types() {
        for crd in all() {
            let path = default_dir().join(file_name(&crd));
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
            assert_eq!(
                parsed,
                crd,
                "{} does not parse back into the CRD the types generate",
                path.display()
            );
        }
    }

    #[test]
    fn file_names_are_plural_dot_group_and_match_the_crd_name() {
        let names: Vec<String> = all().iter().map(file_name).collect();
        assert_eq!(
            names,
            [
                "byohosts.infrastructure.cluster.x-k8s.io.yaml",
                "byomachines.infrastructure.cluster.x-k8s.io.yaml",
                "byomachinetemplates.infrastructure.cluster.x-k8s.io.yaml",
                "byoclusters.infrastructure.cluster.x-k8s.io.yaml",
                "byoclustertemplates.infrastructure.cluster.x-k8s.io.yaml",
                "bootsmanclusters.bootsman.io.yaml",
                "projects.bootsman.io.yaml",
            ]
        );
        for crd in all() {
            assert_eq!(
                format!("{}.yaml", crd.metadata.name.as_deref().unwrap()),
                file_name(&crd)
            );
        }
    }

    #[test]
    fn every_crd_carries_the_clusterctl_and_contract_labels() {
        for crd in all() {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            let name = crd.metadata.name.clone().unwrap();
            assert_eq!(
                labels.get(crate::labels::CLUSTERCTL).map(String::as_str),
                Some(""),
                "{name}"
            );
            let infra = crd.spec.group == crate::v1beta1::GROUP;
            let contract = labels
                .get(crate::labels::CAPI_CONTRACT_V1BETA2)
                .map(String::as_str);
            assert_eq!(contract, infra.then_some("v1beta1"), "{name}: contract label");
            let moves = labels.get(crate::labels::CLUSTERCTL_MOVE).map(String::as_str);
            assert_eq!(
                moves,
                // Cluster-scoped kinds clusterctl moves as a whole (it finds no owner chain
                // leading to them from a Cluster).
                matches!(crd.spec.names.kind.as_str(), "ByoHost" | "Project").then_some(""),
                "{name}: move label"
            );
            let categories = crd.spec.names.categories.clone().unwrap_or_default();
            assert!(
                categories.iter().any(|c| c == "bootsman"),
                "{name}: categories {categories:?}"
            );
            assert_eq!(
                categories.iter().any(|c| c == "cluster-api"),
                infra,
                "{name}: categories {categories:?}"
            );
        }
    }

    #[test]
    fn short_names() {
        let short: Vec<(String, Vec<String>)> = all()
            .into_iter()
            .map(|c| (c.spec.names.kind, c.spec.names.short_names.unwrap_or_default()))
            .collect();
        for (kind, want) in [
            ("ByoHost", "byoh"),
            ("ByoMachine", "byom"),
            ("ByoCluster", "byoc"),
            ("BootsmanCluster", "bmc"),
        ] {
            let got = &short.iter().find(|(k, _)| k == kind).unwrap().1;
            assert_eq!(got, &vec![want.to_string()], "{kind}");
        }
    }

    /// `kubectl explain` is only useful when every field has a description.
    #[test]
    fn every_field_is_documented() {
        fn walk(name: &str, path: &str, v: &serde_json::Value, missing: &mut Vec<String>) {
            let Some(props) = v.get("properties").and_then(|p| p.as_object()) else {
                if let Some(items) = v.get("items") {
                    walk(name, &format!("{path}[]"), items, missing);
                }
                return;
            };
            for (k, child) in props {
                let p = format!("{path}.{k}");
                let top_level = path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&k.as_str());
                if !top_level && child.get("description").is_none() {
                    missing.push(format!("{name}: {p}"));
                }
                // metav1 types (conditions, selectors) come documented from k8s-openapi.
                walk(name, &p, child, missing);
            }
        }
        let mut missing = Vec::new();
        for crd in all() {
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
            walk(
                crd.metadata.name.as_deref().unwrap(),
                "",
                &schema["openAPIV3Schema"],
                &mut missing,
            );
        }
        assert!(
            missing.is_empty(),
            "fields without a description:\n{}",
            missing.join("\n")
        );
    }
}
