//! Typed views of the Cluster API objects Bootsman reads and writes: `cluster.x-k8s.io/v1beta2`
//! Cluster, Machine and MachineDeployment, `controlplane.cluster.x-k8s.io/v1beta2`
//! KubeadmControlPlane, `bootstrap.cluster.x-k8s.io/v1beta2` KubeadmConfigTemplate, and CAAPH's
//! `addons.cluster.x-k8s.io/v1alpha1` HelmChartProxy.
//!
//! These are *views*: they model the fields our controllers use, and keep every other field in an
//! `extra` map so a read-modify-write loses nothing. No CRDs are generated from them (CAPI ships its
//! own); their schema is disabled.

mod addons;
mod cluster;
mod common;
mod kubeadm;
mod machine;

pub use addons::*;
pub use cluster::*;
pub use common::*;
pub use kubeadm::*;
pub use machine::*;
