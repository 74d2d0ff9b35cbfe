//! `--root DIR`: every path a bootstrap or a reset touches is resolved inside DIR.
//!
//! A path is taken relative to the root; `..` components are refused outright, and every
//! existing prefix of the result is checked after resolving symlinks, so a symlink planted by an
//! earlier step cannot lead a write outside the root.

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// The path climbs with `..`.
    #[error("path {0:?} is refused: `..` components are not allowed")]
    DotDot(String),
    /// A symlink leads outside the root.
    #[error("path {path:?} is refused: it resolves to {target:?}, outside the root {root:?}")]
    Escape {
        /// The path asked for.
        path: String,
        /// Where it resolves to.
        target: PathBuf,
        /// The root.
        root: PathBuf,
    },
    /// The root or a prefix could not be resolved.
    #[error("cannot resolve {path:?}: {source}")]
    Io {
        /// The path being resolved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The directory every host path is confined to (`/` on a real host).
#[derive(Debug, Clone)]
pub struct Root {
    dir: PathBuf,
}

impl Root {
    /// A root at `dir`, which must exist.
    pub fn new(dir: &Path) -> Result<Self, RootError> {
        let dir = dir.canonicalize().map_err(|source| RootError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self { dir })
    }

    /// The root directory (canonical).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the root is the real `/`.
    pub fn is_host_root(&self) -> bool {
        self.dir == Path::new("/")
    }

    /// The real location of host path `path` (absolute or not, read relative to the root).
    pub fn resolve(&self, path: &str) -> Result<PathBuf, RootError> {
        let mut out = self.dir.clone();
        for c in Path::new(path).components() {
            match c {
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                Component::ParentDir => return Err(RootError::DotDot(path.into())),
                Component::Normal(part) => {
                    out.push(part);
                    // An existing prefix (a symlink included) must stay under the root.
                    if std::fs::symlink_metadata(&out).is_ok() {
                        match out.canonicalize() {
                            Ok(real) if real.starts_with(&self.dir) => {}
                            Ok(real) => {
                                return Err(RootError::Escape {
                                    path: path.into(),
                                    target: real,
                                    root: self.dir.clone(),
                                });
                            }
                            // A dangling symlink: refuse, its target is unknown.
                            Err(_) => {
                                let target = std::fs::read_link(&out).unwrap_or_default();
                                return Err(RootError::Escape {
                                    path: path.into(),
                                    target,
                                    root: self.dir.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn confines_paths() {
        let tmp = std::env::temp_dir().join(format!("byoh-root-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("etc")).unwrap();
        let root = Root::new(&tmp).unwrap();
        let real = root.dir().to_path_buf();
        assert_eq!(root.resolve("/etc/a").unwrap(), real.join("etc/a"));
        assert_eq!(root.resolve("x/y").unwrap(), real.join("x/y"));
        assert!(matches!(root.resolve("/etc/../../x"), Err(RootError::DotDot(_))));
        std::os::unix::fs::symlink("/tmp", tmp.join("out")).unwrap();
        assert!(matches!(root.resolve("/out/x"), Err(RootError::Escape { .. })));
        std::os::unix::fs::symlink(tmp.join("etc"), tmp.join("in")).unwrap();
        assert!(root.resolve("/in/x").is_ok());
        std::os::unix::fs::symlink("/nowhere", tmp.join("dangling")).unwrap();
        assert!(root.resolve("/dangling").is_err());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
