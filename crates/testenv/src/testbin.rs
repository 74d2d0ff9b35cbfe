//! Finds the control-plane binaries built by `hack/testbin`, building them first when missing.
//! A cache entry is laid out as a [`Bundle`].

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bootsman_controlplane::Bundle;

use crate::error::{Error, Result};

/// The repository this crate was built from.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The binaries and CAPI manifests of one `hack/testbin` cache entry.
#[derive(Clone, Debug)]
pub struct Testbin(Bundle);

impl std::ops::Deref for Testbin {
    type Target = Bundle;
    fn deref(&self) -> &Bundle {
        &self.0
    }
}

impl Testbin {
    /// `$BOOTSMAN_TESTBIN` when set, otherwise what `hack/testbin --print-dir` reports; runs
    /// `hack/testbin` to build the binaries first when they are not there yet (that can take many
    /// minutes on a cold machine; its progress is printed).
    pub fn locate() -> Result<Self> {
        if let Some(dir) = std::env::var_os("BOOTSMAN_TESTBIN") {
            return Self::open(dir.into());
        }
        let script = repo_root().join("hack/testbin");
        if let Some(dir) = print_dir(&script)? {
            return Self::open(dir);
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
            Some(dir) => Self::open(dir),
            None => Err(Error::Command {
                what: format!("{} --print-dir", script.display()),
                detail: "still incomplete after a successful build".into(),
            }),
        }
    }

    fn open(dir: PathBuf) -> Result<Self> {
        Bundle::open(dir).map(Self).map_err(|e| Error::Invalid {
            what: "hack/testbin".into(),
            detail: format!("{e}; run hack/testbin"),
        })
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
