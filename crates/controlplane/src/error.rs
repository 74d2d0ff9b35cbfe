//! The one error type of the control plane.

use std::path::PathBuf;

/// Why the control plane could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory operation failed.
    #[error("{what}: {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A helper program (helm, hack/testbin) failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its exit status and output tail.
        detail: String,
    },
    /// A component stopped or never became ready.
    #[error("{component} {problem}; last lines of {}:\n{tail}", log.display())]
    Component {
        /// Component name, e.g. `kube-apiserver`.
        component: String,
        /// What went wrong.
        problem: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A kubeconfig or manifest could not be read.
    #[error("{what}: {detail}")]
    Invalid {
        /// What was being read.
        what: String,
        /// Why it is invalid.
        detail: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        secs: u64,
    },
}

/// Result of the control plane's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Maps an I/O error to [`Error::Io`] naming what was being done and the path.
pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { what, path, source }
}

/// Maps a client error to [`Error::Kube`] naming what was being done.
pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}
