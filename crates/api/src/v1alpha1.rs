//! `bootsman.io/v1alpha1`: the provisioning operator's `BootsmanCluster`.

mod bootsman_cluster;

pub use bootsman_cluster::*;

/// API group of the operator's kinds.
pub const GROUP: &str = "bootsman.io";
/// API version of the operator's kinds.
pub const VERSION: &str = "v1alpha1";
