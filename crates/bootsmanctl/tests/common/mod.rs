//! What the bootsmanctl tests share of [`bootsman_fixtures::enroll`]: host RBAC and raw CSRs.

#![allow(dead_code, unused_imports)] // shared by several test binaries

pub use bootsman_fixtures::enroll::{apply_host_rbac, csr_pem};
