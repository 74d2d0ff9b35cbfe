//! A pool namespace of the real control plane and real `byoh-agent` processes serving hosts in
//! it: [`bootsman_fixtures::agent`], run with the agent binary cargo built for these tests.

#![allow(dead_code, unused_imports)] // shared by several test binaries

pub use bootsman_fixtures::agent::{Host, Pool, Relay, message, wait_condition};
pub use bootsman_fixtures::{WAIT, eventually, grant, read};
