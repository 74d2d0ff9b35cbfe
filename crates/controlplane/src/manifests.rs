//! Reading manifests (multi-document YAML) and installing CRDs, waiting until the API server
//! serves them.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::error::{Error, Result, io, kube};

/// Every CRD in the `*.yaml` files of `dir` (sorted by file name).
pub fn read_dir(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io("read CRD directory", dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for f in files {
        crds.extend(
            read_file(&f)?
                .into_iter()
                .filter_map(|v| {
                    (v.get("kind").and_then(|k| k.as_str()) == Some("CustomResourceDefinition")).then_some(v)
                })
                .map(|v| {
                    serde_json::from_value(v).map_err(|e| Error::Invalid {
                        what: f.display().to_string(),
                        detail: e.to_string(),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        );
    }
    Ok(crds)
}

/// The YAML documents of one file, as JSON values (empty documents dropped).
pub fn read_file(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).map_err(io("read manifest", path))?;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Invalid {
        what: path.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Applies the CRDs (server-side apply) and waits until each one is Established.
pub async fn install(client: &kube::Client, crds: &[CustomResourceDefinition]) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(crate::FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .map_err(kube(format!("apply CRD {name}")))?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let cond = kube::runtime::wait::await_condition(
            api.clone(),
            &name,
            kube::runtime::conditions::is_crd_established(),
        );
        match tokio::time::timeout(Duration::from_secs(60), cond).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(Error::Invalid {
                    what: format!("CRD {name}"),
                    detail: e.to_string(),
                });
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("CRD {name} to be established"),
                    secs: 60,
                });
            }
        }
    }
    Ok(())
}
