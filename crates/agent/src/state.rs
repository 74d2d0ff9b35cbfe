//! The agent's state directory (`--state-dir`, default `/var/lib/byoh-agent`).
//!
//! One journal per machine uid (`bootstrap/<uid>.json`) records how many steps of that machine's
//! bootstrap are done, the files and directories it created, the files it found there before
//! (with a copy under `backup/<uid>/`), and the result once finished. A restarted agent resumes
//! after the last completed step and never runs a finished bootstrap again; a reset removes what
//! the bootstrap created and puts back what it changed. A step interrupted half way runs again on
//! resume, so every step is recorded as done only after it completed. Every write is atomic
//! (temporary file, fsync, rename, fsync of the directory).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A state-directory failure.
#[derive(Debug, thiserror::Error)]
#[error("state directory: {what} {path:?}: {source}")]
pub struct StateError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl StateError {
    /// An I/O failure on `path` while doing `what`.
    pub fn from_io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateError {
    let path = path.to_path_buf();
    move |source| StateError { what, path, source }
}

/// How a finished bootstrap ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// Whether every step succeeded.
    pub succeeded: bool,
    /// Condition reason.
    pub reason: String,
    /// Condition message (with the output tail of a failed command).
    pub message: String,
}

/// Progress of one machine's bootstrap.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    /// UID of the ByoMachine the bootstrap belongs to.
    pub machine_uid: String,
    /// Number of steps completed, in order.
    pub steps_done: usize,
    /// Description of each completed step.
    pub done: Vec<String>,
    /// Real paths of files the bootstrap wrote (recorded before each write).
    pub files: Vec<PathBuf>,
    /// Directories the bootstrap created, outermost first.
    pub dirs: Vec<PathBuf>,
    /// Files among [`Journal::files`] that existed before the bootstrap first wrote them: a
    /// reset puts them back as they were instead of removing them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preexisting: Vec<Preexisting>,
    /// Set once the bootstrap finished.
    pub outcome: Option<Outcome>,
}

/// A file that was there before the bootstrap wrote it, and how to put it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preexisting {
    /// Real path of the file.
    pub path: PathBuf,
    /// A copy of the file as it was (content, mode, owner), under the state directory.
    pub backup: PathBuf,
    /// Whether the bootstrap only appended to it: a reset then cuts it back to the length the
    /// copy has, keeping what others changed before, as long as the original is still its
    /// beginning; otherwise the copy is restored whole.
    pub appended_only: bool,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    /// Opens (creating, mode 0700) the state directory.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        for d in [dir.to_path_buf(), dir.join("bootstrap"), dir.join("logs")] {
            std::fs::create_dir_all(&d).map_err(io("create", &d))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io("restrict", dir))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the output of a step of a machine's bootstrap is kept.
    pub fn log_path(&self, uid: &str, step: usize) -> PathBuf {
        self.dir.join("logs").join(format!("{}-{step}.log", safe(uid)))
    }

    /// Where the copies of files a machine's bootstrap overwrote or appended to are kept.
    pub fn backup_dir(&self, uid: &str) -> PathBuf {
        self.dir.join("backup").join(safe(uid))
    }

    fn journal_path(&self, uid: &str) -> PathBuf {
        self.dir.join("bootstrap").join(format!("{}.json", safe(uid)))
    }

    /// The journal of a machine's bootstrap, if one was started.
    pub fn journal(&self, uid: &str) -> Result<Option<Journal>, StateError> {
        let path = self.journal_path(uid);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io("parse", &path)(std::io::Error::other(e))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    /// Every journal kept (for a reset that must undo all bootstraps).
    pub fn journals(&self) -> Result<Vec<Journal>, StateError> {
        let dir = self.dir.join("bootstrap");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io("list", &dir))? {
            let entry = entry.map_err(io("list", &dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(uid) = name.strip_suffix(".json")
                && let Some(j) = self.journal(uid)?
            {
                out.push(j);
            }
        }
        Ok(out)
    }

    /// Saves a journal atomically.
    pub fn save(&self, j: &Journal) -> Result<(), StateError> {
        let bytes =
            serde_json::to_vec_pretty(j).map_err(|e| io("encode", &self.dir)(std::io::Error::other(e)))?;
        write_atomic(&self.journal_path(&j.machine_uid), &bytes)
    }

    /// Forgets a machine's bootstrap (after its reset) and its logs.
    pub fn remove(&self, uid: &str) -> Result<(), StateError> {
        let path = self.journal_path(uid);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", &path)(e)),
            _ => {}
        }
        match std::fs::remove_dir_all(self.backup_dir(uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("remove", &self.backup_dir(uid))(e));
            }
            _ => {}
        }
        let logs = self.dir.join("logs");
        let prefix = format!("{}-", safe(uid));
        if let Ok(entries) = std::fs::read_dir(&logs) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        sync_dir(&self.dir.join("bootstrap"))
    }
}

/// File in the state directory holding the uid of the ByoHost the current enrolment registered.
/// While it names a ByoHost that no longer exists, the host was removed from its pool: the
/// agent does not create the ByoHost again until a new token enrols the host.
pub const REGISTRATION_FILE: &str = "registration";

impl StateDir {
    /// The uid of the ByoHost this enrolment registered, if it registered one.
    pub fn registration(&self) -> Result<Option<String>, StateError> {
        let path = self.dir.join(REGISTRATION_FILE);
        match std::fs::read_to_string(&path) {
            Ok(uid) => Ok(Some(uid.trim().to_string()).filter(|u| !u.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    /// Records that this enrolment registered the ByoHost `uid`.
    pub fn record_registration(&self, uid: &str) -> Result<(), StateError> {
        write_atomic(&self.dir.join(REGISTRATION_FILE), uid.as_bytes())
    }
}

/// Forgets the registration of the enrolment before (a new token enrolled the host, which may
/// then create its ByoHost again).
pub fn forget_registration(dir: &Path) -> Result<(), StateError> {
    let path = dir.join(REGISTRATION_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &path)(e)),
        _ => Ok(()),
    }
}

/// A uid as a file name (uids are `[0-9a-f-]`; anything else is replaced).
fn safe(uid: &str) -> String {
    uid.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `bytes` to `path` atomically (see [`replace_file`]), private to root (0600).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    replace_file(path, bytes, 0o600).map_err(io("write atomically", path))
}

pub use bootsman_runtime::fs::replace_file;

fn sync_dir(dir: &Path) -> Result<(), StateError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn journal_round_trip() {
        let tmp = std::env::temp_dir().join(format!("byoh-state-{}", std::process::id()));
        let s = StateDir::open(&tmp).unwrap();
        assert_eq!(s.journal("u1").unwrap(), None);
        let j = Journal {
            machine_uid: "u1".into(),
            steps_done: 2,
            files: vec!["/a".into()],
            ..Default::default()
        };
        s.save(&j).unwrap();
        assert_eq!(s.journal("u1").unwrap(), Some(j.clone()));
        assert_eq!(s.journals().unwrap(), vec![j]);
        s.remove("u1").unwrap();
        assert_eq!(s.journal("u1").unwrap(), None);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
