//! `bootsman-operator`: the provisioning operator of Bootsman. It turns a BootsmanCluster into the
//! Cluster API objects of a child cluster (fetch → validate → render → apply → status) and keeps
//! them matching the spec.

pub mod cache;
pub mod controller;
pub mod project;
pub mod render;
pub mod settings;
pub mod status;
pub mod validate;

pub use render::render;
pub use settings::OperatorSettings;
pub use validate::{Violation, validate};
