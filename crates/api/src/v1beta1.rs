//! `infrastructure.cluster.x-k8s.io/v1beta1`: the bare-metal infrastructure provider's kinds.
//!
//! The API version is `v1beta1` (the name BYOH used, so BYOH manifests apply unchanged) while the
//! kinds implement the Cluster API **v1beta2 contract**: every CRD carries the label
//! `cluster.x-k8s.io/v1beta2: v1beta1`, status reports `initialization.provisioned`, failure domains
//! are a list and conditions are `metav1.Condition`s.

mod byo_cluster;
mod byo_host;
mod byo_machine;
mod common;

pub use byo_cluster::*;
pub use byo_host::*;
pub use byo_machine::*;
pub use common::*;

/// API group of the provider's kinds.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// API version of the provider's kinds.
pub const VERSION: &str = "v1beta1";
