//! The crate's one error type. Every variant is named after what failed and has a short, stable
//! [`Error::label`] for metrics and events.

use std::net::SocketAddr;

/// What went wrong in the shared runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A metric could not be built or registered (bad name, duplicate registration).
    #[error("failed to register metric {metric}")]
    RegisterMetric {
        /// The metric's name without the `bootsman_` prefix.
        metric: &'static str,
        /// What the registry said.
        #[source]
        source: prometheus::Error,
    },

    /// The metrics could not be encoded in the text exposition format.
    #[error("failed to encode metrics")]
    EncodeMetrics(#[source] prometheus::Error),

    /// The health and metrics server could not listen on its address.
    #[error("failed to bind the health and metrics server to {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("failed to install the signal handlers")]
    Signals(#[source] std::io::Error),

    /// The leader election was configured with impossible durations or empty names.
    #[error("invalid leader election configuration: {0}")]
    LeaderConfig(String),

    /// Reading the leader election Lease failed.
    #[error("failed to read Lease {namespace}/{name}")]
    GetLease {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// Creating the leader election Lease failed.
    #[error("failed to create Lease {namespace}/{name}")]
    CreateLease {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// Writing the leader election Lease (acquire, renew or release) failed.
    #[error("failed to update Lease {namespace}/{name}")]
    UpdateLease {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },

    /// The leader election task panicked or was cancelled.
    #[error("the leader election task died")]
    LeaderTask(#[source] tokio::task::JoinError),
}

impl Error {
    /// A short, stable, low-cardinality label for metrics and events.
    pub fn label(&self) -> &'static str {
        match self {
            Self::RegisterMetric { .. } => "register_metric",
            Self::EncodeMetrics(_) => "encode_metrics",
            Self::Bind { .. } => "bind",
            Self::Signals(_) => "signals",
            Self::LeaderConfig(_) => "leader_config",
            Self::GetLease { .. } => "get_lease",
            Self::CreateLease { .. } => "create_lease",
            Self::UpdateLease { .. } => "update_lease",
            Self::LeaderTask(_) => "leader_task",
        }
    }

    /// The API server's error behind a Lease failure, if this is one.
    pub fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Self::GetLease { source, .. }
            | Self::CreateLease { source, .. }
            | Self::UpdateLease { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short_and_static() {
        let errors = [
            Error::LeaderConfig("x".into()),
            Error::EncodeMetrics(prometheus::Error::Msg("x".into())),
            Error::RegisterMetric {
                metric: "x",
                source: prometheus::Error::AlreadyReg,
            },
            Error::Bind {
                addr: SocketAddr::from(([127, 0, 0, 1], 1)),
                source: std::io::Error::other("x"),
            },
        ];
        for e in &errors {
            let label = e.label();
            assert!(!label.is_empty() && label.len() < 32, "{label}");
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
        assert_eq!(errors[0].to_string(), "invalid leader election configuration: x");
        assert!(errors[0].kube_error().is_none());
    }
}
