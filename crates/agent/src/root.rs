//! `--root DIR`: every path a bootstrap or a reset touches is resolved inside DIR.
//!
//! A path is taken relative to the root; `..` components are refused outright, and every
//! existing prefix of the result is checked after resolving symlinks, so a symlink planted by an
//! earlier step cannot lead a write outside the root.
//!
//! That check alone leaves a window: a process started by an earlier command could swap a
//! directory for a symlink between the check and the write. So a file is written through
//! [`Root::open_for_write`], which never hands a path to the kernel: it walks from a descriptor
//! of the root, one component at a time with `O_NOFOLLOW`, and follows a symlink it meets itself,
//! as if the root were `/` (an absolute target starts again at the root, `..` stops there). Mode
//! and owner are then set on the descriptor, never by path.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// Most symlinks followed in one walk, as the kernel allows (`ELOOP` beyond).
const MAX_SYMLINKS: usize = 40;

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

    /// Opens host path `path` for writing beneath the root without ever leaving it: created with
    /// `mode` (before the umask) when missing, truncated unless `append`. Directories missing on
    /// the way are created with mode 0755. See the module documentation for how symlinks are
    /// followed; a path that names no regular file (a directory, a device) is refused.
    pub fn open_for_write(&self, path: &str, append: bool, mode: u32) -> Result<std::fs::File, RootError> {
        let io = |source: std::io::Error| RootError::Io {
            path: PathBuf::from(path),
            source,
        };
        let root = nix::fcntl::open(
            &self.dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(e.into()))?;
        let mut todo = VecDeque::new();
        for c in Path::new(path).components() {
            match c {
                Component::Normal(part) => todo.push_back(part.to_os_string()),
                Component::ParentDir => return Err(RootError::DotDot(path.into())),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        // The directories from the root down to the current one (the root itself not included).
        let mut dirs: Vec<OwnedFd> = Vec::new();
        let mut links = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                dirs.pop();
                continue;
            }
            if part == "." || part.is_empty() {
                continue;
            }
            let here = dirs.last().unwrap_or(&root);
            let last = todo.is_empty();
            let opened = if last {
                // O_NONBLOCK: a FIFO planted at the path fails the open instead of hanging it.
                let mut flags = OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_NONBLOCK
                    | OFlag::O_CLOEXEC;
                flags |= if append { OFlag::O_APPEND } else { OFlag::O_TRUNC };
                nix::fcntl::openat(here, part.as_os_str(), flags, Mode::from_bits_truncate(mode))
            } else {
                open_dir(here, &part)
            };
            match opened {
                Ok(fd) if last => {
                    let stat = nix::sys::stat::fstat(&fd).map_err(|e| io(e.into()))?;
                    if !is(&stat, SFlag::S_IFREG) {
                        return Err(io(std::io::Error::other("not a regular file")));
                    }
                    return Ok(std::fs::File::from(fd));
                }
                Ok(fd) => dirs.push(fd),
                Err(Errno::ENOENT) if !last => {
                    nix::sys::stat::mkdirat(here, part.as_os_str(), Mode::from_bits_truncate(0o755))
                        .or_else(|e| if e == Errno::EEXIST { Ok(()) } else { Err(e) })
                        .map_err(|e| io(e.into()))?;
                    let fd = open_dir(here, &part).map_err(|e| io(e.into()))?;
                    // Whatever the agent's umask: a directory must stay reachable by the
                    // non-root users that read what is below it.
                    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o755)).map_err(|e| io(e.into()))?;
                    dirs.push(fd);
                }
                // A symlink (O_NOFOLLOW) or not a directory: which one, fstatat says.
                Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                    let stat = nix::sys::stat::fstatat(here, part.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_err(|e| io(e.into()))?;
                    if !is(&stat, SFlag::S_IFLNK) {
                        return Err(io(e.into()));
                    }
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(io(Errno::ELOOP.into()));
                    }
                    let target = nix::fcntl::readlinkat(here, part.as_os_str()).map_err(|e| io(e.into()))?;
                    let target = Path::new(&target);
                    if target.has_root() {
                        dirs.clear();
                    }
                    for c in target.components().rev() {
                        match c {
                            Component::Normal(p) => todo.push_front(p.to_os_string()),
                            Component::ParentDir => todo.push_front(OsString::from("..")),
                            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                        }
                    }
                }
                Err(e) => return Err(io(e.into())),
            }
        }
        Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path names the root itself",
        )))
    }
}

/// Opens directory `name` of `dir`, not following a symlink.
fn open_dir(dir: &OwnedFd, name: &OsStr) -> nix::Result<OwnedFd> {
    debug_assert!(!name.as_bytes().contains(&b'/'));
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Whether `stat` is of file type `kind`.
fn is(stat: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == kind
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

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

    #[test]
    fn writes_never_leave_the_root() {
        let base = std::env::temp_dir().join(format!("byoh-beneath-{}", std::process::id()));
        let (tmp, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(tmp.join("etc")).unwrap();
        std::fs::create_dir_all(tmp.join("run")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let root = Root::new(&tmp).unwrap();
        let real = root.dir().to_path_buf();
        let write = |path: &str, content: &str| {
            use std::io::Write;
            let mut f = root.open_for_write(path, false, 0o644)?;
            f.write_all(content.as_bytes()).unwrap();
            Ok::<_, RootError>(())
        };

        // As a swapped-in directory would be after `resolve` checked it: an absolute link out
        // of the root is followed as if the root were `/`.
        std::os::unix::fs::symlink(&outside, tmp.join("escape")).unwrap();
        write("/escape/x", "in").unwrap();
        assert!(!outside.join("x").exists(), "a write left the root");
        let inside = real.join(outside.strip_prefix("/").unwrap()).join("x");
        assert_eq!(std::fs::read_to_string(&inside).unwrap(), "in");
        // `..` in a link stops at the root.
        std::os::unix::fs::symlink("../../../../../../..", tmp.join("etc/up")).unwrap();
        write("/etc/up/etc/y", "up").unwrap();
        assert_eq!(std::fs::read_to_string(real.join("etc/y")).unwrap(), "up");
        // A link as the last component is followed; the link stays.
        std::os::unix::fs::symlink("../run/resolv.conf", tmp.join("etc/resolv.conf")).unwrap();
        write("/etc/resolv.conf", "nameserver 10.0.0.53\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(real.join("run/resolv.conf")).unwrap(),
            "nameserver 10.0.0.53\n"
        );
        assert!(
            std::fs::symlink_metadata(tmp.join("etc/resolv.conf"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // Missing directories are made on the way, 0755 whatever the umask.
        write("/var/lib/new/z", "z").unwrap();
        let mode = std::fs::metadata(real.join("var/lib/new"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o755);
        // A loop, a directory, a FIFO (which would block a plain open), `..` in the request.
        std::os::unix::fs::symlink("loop", tmp.join("loop")).unwrap();
        assert!(write("/loop/a", "").is_err());
        assert!(write("/etc", "").is_err());
        nix::unistd::mkfifo(&tmp.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(write("/fifo", "").is_err());
        assert!(matches!(write("/etc/../x", ""), Err(RootError::DotDot(_))));
        assert!(write("/", "").is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
