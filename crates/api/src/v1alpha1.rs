//! `bootsman.io/v1alpha1`: the provisioning operator's `BootsmanCluster` and `Project`.

mod bootsman_cluster;
mod project;

pub use bootsman_cluster::*;
pub use project::*;

/// API group of the operator's kinds.
pub const GROUP: &str = "bootsman.io";
/// API version of the operator's kinds.
pub const VERSION: &str = "v1alpha1";
