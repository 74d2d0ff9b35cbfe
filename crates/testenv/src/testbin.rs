//! Finds the control-plane binaries built by `hack/testbin`, building them first when missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The repository this crate was built from.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The binaries and CAPI manifests of one `hack/testbin` cache entry.
#[derive(Clone, Debug)]
pub struct Testbin {
    /// The cache entry, e.g. `~/.cache/bootsman/testbin/<versions>/`.
    pub dir: PathBuf,
}

impl Testbin {
    /// `$BOOTSMAN_TESTBIN` when set, otherwise what `hack/testbin --print-dir` reports; runs
    /// `hack/testbin` to build the binaries first when they are not there yet (that can take many
    /// minutes on a cold machine; its progress is printed).
    pub fn locate() -> Result<Self> {
        if let Some(dir) = std::env::var_os("BOOTSMAN_TESTBIN") {
            let t = Self { dir: dir.into() };
            return t.verify();
        }
        let script = repo_root().join("hack/testbin");
        if let Some(dir) = print_dir(&script)? {
            return Self { dir }.verify();
        }
        eprintln!(
            "testenv: control-plane binaries missing; running {} (first run only)",
            script.display()
        );
        let status = Command::new(&script)
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status()
            .map_err(|e| Error::Command {
                what: script.display().to_string(),
                detail: e.to_string(),
            })?;
        if !status.success() {
            return Err(Error::Command {
                what: script.display().to_string(),
                detail: status.to_string(),
            });
        }
        match print_dir(&script)? {
            Some(dir) => Self { dir }.verify(),
            None => Err(Error::Command {
                what: format!("{} --print-dir", script.display()),
                detail: "still incomplete after a successful build".into(),
            }),
        }
    }

    /// Path of one binary.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// Folder of the Cluster API CRDs.
    pub fn capi_crds(&self) -> PathBuf {
        self.dir.join("crds/capi")
    }

    /// Folder of clusterctl's provider inventory CRD.
    pub fn clusterctl_crds(&self) -> PathBuf {
        self.dir.join("crds/clusterctl")
    }

    /// The Cluster API version of this cache entry (`v1.13.6`), from its `VERSIONS` file.
    pub fn capi_version(&self) -> Result<String> {
        let path = self.dir.join("VERSIONS");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Invalid {
            what: path.display().to_string(),
            detail: e.to_string(),
        })?;
        text.lines()
            .find_map(|l| l.strip_prefix("sigs.k8s.io/cluster-api="))
            .map(String::from)
            .ok_or_else(|| Error::Invalid {
                what: path.display().to_string(),
                detail: "no sigs.k8s.io/cluster-api= line".into(),
            })
    }

    /// The webhook manifest of one Cluster API manager (`core`, `bootstrap`, `controlplane`).
    pub fn capi_webhooks(&self, manager: &str) -> PathBuf {
        self.dir
            .join("crds/capi-webhooks")
            .join(format!("{manager}.yaml"))
    }

    fn verify(self) -> Result<Self> {
        for b in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            if !self.bin(b).is_file() {
                return Err(Error::Invalid {
                    what: format!("testbin {}", self.dir.display()),
                    detail: format!("{b} is missing; run hack/testbin"),
                });
            }
        }
        Ok(self)
    }
}

fn print_dir(script: &Path) -> Result<Option<PathBuf>> {
    let out = Command::new(script)
        .arg("--print-dir")
        .output()
        .map_err(|e| Error::Command {
            what: format!("{} --print-dir", script.display()),
            detail: e.to_string(),
        })?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !dir.is_empty()).then(|| PathBuf::from(dir)))
}
