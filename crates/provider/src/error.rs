//! Errors of the provider's controllers.

use bootsman_runtime::api_errors;

/// Why a reconcile failed. Every variant is retried with backoff; `label` names it in metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done, naming the object.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A write lost an optimistic-concurrency race; the next attempt re-reads.
    #[error("conflict while {0}")]
    Conflict(String),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object is not as the contract requires.
    #[error("{0}")]
    Invalid(String),
    /// Deletion must wait (the finalizer stays until the next attempt succeeds).
    #[error("waiting: {why}")]
    Waiting {
        /// What is awaited.
        why: String,
        /// When to look again.
        after: std::time::Duration,
    },
}

impl Error {
    /// A short, stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Conflict(_) => "conflict",
            Self::Finalizer(_) => "finalizer",
            Self::Invalid(_) => "invalid",
            Self::Waiting { .. } => "waiting",
        }
    }
}

/// The pause after a lost optimistic-concurrency race: 50 ms plus a random share of 200 ms, so
/// the writers that collided do not collide again on the next attempt.
pub fn conflict_backoff() -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    std::time::Duration::from_millis(50 + random % 200)
}

/// Whether the error only says that a step must wait (not a failure).
pub fn is_waiting(err: &Error) -> bool {
    use kube::runtime::finalizer::Error as F;
    match err {
        Error::Waiting { .. } => true,
        Error::Finalizer(inner) => matches!(
            inner.as_ref(),
            F::ApplyFailed(e) | F::CleanupFailed(e) if is_waiting(e)
        ),
        _ => false,
    }
}

/// How soon a failed reconcile should be retried, for errors that say so.
pub fn retry_after(err: &Error) -> Option<std::time::Duration> {
    use kube::runtime::finalizer::Error as F;
    match err {
        Error::Conflict(_) => Some(conflict_backoff()),
        Error::Waiting { after, .. } => Some(*after),
        Error::Finalizer(inner) => match inner.as_ref() {
            F::ApplyFailed(e) | F::CleanupFailed(e) => retry_after(e),
            // The finalizer helper's JSON-patch `test` fails (422) when another writer changed
            // the finalizers first: a lost race like any other.
            F::AddFinalizer(kube::Error::Api(s)) | F::RemoveFinalizer(kube::Error::Api(s))
                if api_errors::conflict(s) || api_errors::invalid(s) =>
            {
                Some(conflict_backoff())
            }
            _ => None,
        },
        _ => None,
    }
}

/// Wraps a kube error with what was being done; a 409 becomes [`Error::Conflict`].
pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| match &source {
        kube::Error::Api(s) if api_errors::conflict(s) => Error::Conflict(what),
        _ => Error::Kube { what, source },
    }
}

/// Whether an API error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    api_errors::is_not_found(e)
}

/// Result of the provider.
pub type Result<T, E = Error> = std::result::Result<T, E>;
