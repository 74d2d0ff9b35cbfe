//! # bootsman-api
//!
//! The Kubernetes API of Bootsman, as Rust types that are the single source of truth for the CRDs
//! under `config/crd/`:
//!
//! - [`v1beta1`]: the bare-metal infrastructure provider's kinds in
//!   `infrastructure.cluster.x-k8s.io/v1beta1` (ByoHost, ByoMachine, ByoMachineTemplate, ByoCluster,
//!   ByoClusterTemplate). Spec field names follow VMware BYOH so existing BYOH cluster templates apply
//!   unchanged; status follows the Cluster API v1beta2 provider contract.
//! - [`v1alpha1`]: the provisioning operator's `BootsmanCluster` in `bootsman.io/v1alpha1`.
//! - [`capi`]: typed views of the Cluster API v1beta2 objects (and CAAPH `HelmChartProxy`) that the
//!   provider and operator read and write. No CRDs are generated for these; CAPI ships its own.
//! - [`pools`]: shared host pools (which namespaces may use a pool's hosts).
//! - [`crdgen`]: deterministic CRD YAML generation, used by the `crdgen` binary and the drift test.
//!
//! Validation lives in the CRDs as CEL rules (so `kubectl apply` fails at once with a message naming
//! the rule); the operator and provider enforce the same rules again. This crate depends on nothing
//! else of ours and has no runtime: no client calls, no tokio.

// `#[kube(printcolumn(.., type_ = "string", ..))]` repeats keys across columns, which this lint
// mistakes for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

pub mod capi;
pub mod condition;
pub mod crdgen;
pub mod identity;
pub mod labels;
pub mod pools;
pub mod v1alpha1;
pub mod v1beta1;

#[cfg(test)]
mod cel_tests;
#[cfg(test)]
mod fixtures;
