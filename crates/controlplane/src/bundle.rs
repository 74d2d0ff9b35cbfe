//! The programs and manifests a control plane runs from: one folder laid out as `hack/testbin`
//! leaves its cache entries and as an offline bundle ships them.
//!
//! ```text
//! <bundle>/bin/                 etcd, kube-apiserver, kube-controller-manager, kubectl, helm,
//!                               capi-manager, capi-kubeadm-bootstrap-manager,
//!                               capi-kubeadm-control-plane-manager (and, in a release bundle,
//!                               bootsman-provider and bootsman-operator)
//! <bundle>/crds/capi/           the Cluster API CRDs
//! <bundle>/crds/clusterctl/     clusterctl's provider inventory CRD
//! <bundle>/crds/capi-webhooks/  each Cluster API manager's webhook manifest
//! <bundle>/crds/capi-rbac/      each Cluster API manager's ClusterRole (to run it as a Pod)
//! <bundle>/VERSIONS             `module=version` lines, e.g. `sigs.k8s.io/cluster-api=v1.13.6`
//! ```

use std::path::PathBuf;

use crate::error::{Error, Result};

/// A bundle folder.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// The folder, e.g. `~/.cache/bootsman/testbin/<versions>/`.
    pub dir: PathBuf,
}

/// What every control plane runs.
const REQUIRED: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

impl Bundle {
    /// The bundle in `dir`, checked to hold the control plane's programs.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        let b = Self { dir: dir.into() };
        for name in REQUIRED {
            b.require(name)?;
        }
        Ok(b)
    }

    /// Path of one program.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// Path of one program, or an error naming the bundle when it is not there.
    pub fn require(&self, name: &str) -> Result<PathBuf> {
        let path = self.bin(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Invalid {
                what: format!("bundle {}", self.dir.display()),
                detail: format!("{name} is missing from {}", self.dir.join("bin").display()),
            })
        }
    }

    /// Folder of the Cluster API CRDs.
    pub fn capi_crds(&self) -> PathBuf {
        self.dir.join("crds/capi")
    }

    /// Folder of clusterctl's provider inventory CRD.
    pub fn clusterctl_crds(&self) -> PathBuf {
        self.dir.join("crds/clusterctl")
    }

    /// The webhook manifest of one Cluster API manager (`core`, `bootstrap`, `controlplane`).
    pub fn capi_webhooks(&self, manager: &str) -> PathBuf {
        self.dir
            .join("crds/capi-webhooks")
            .join(format!("{manager}.yaml"))
    }

    /// The version of one Go module the bundle was built from, from its `VERSIONS` file.
    pub fn version_of(&self, module: &str) -> Result<String> {
        let path = self.dir.join("VERSIONS");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Invalid {
            what: path.display().to_string(),
            detail: e.to_string(),
        })?;
        text.lines()
            .find_map(|l| l.strip_prefix(module)?.strip_prefix('='))
            .map(String::from)
            .ok_or_else(|| Error::Invalid {
                what: path.display().to_string(),
                detail: format!("no {module}= line"),
            })
    }

    /// The Cluster API version (`v1.13.6`).
    pub fn capi_version(&self) -> Result<String> {
        self.version_of("sigs.k8s.io/cluster-api")
    }
}
