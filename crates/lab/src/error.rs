//! The one error type of the lab.

use std::path::PathBuf;

/// Why the lab could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A helper program (ip, nsenter, hack/labbin, ...) failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its exit status and output tail.
        detail: String,
    },
    /// A lab host did not come up or stopped.
    #[error("lab host {host}: {problem}\n{tail}")]
    Host {
        /// Host name.
        host: String,
        /// What went wrong.
        problem: String,
        /// The end of its console and init logs.
        tail: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        secs: u64,
    },
    /// The test control plane failed.
    #[error(transparent)]
    Testenv(#[from] bootsman_testenv::Error),
    /// A request to an API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The machine cannot run a lab (not root, no namespaces, a package missing, ...).
    #[error("the lab cannot run here: {0}")]
    Unsupported(String),
}

/// Result of the lab.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Maps an I/O error with what was done and where.
pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { what, path, source }
}

/// Maps a kube error with what was done.
pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}
