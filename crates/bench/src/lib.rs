//! # bootsman-bench
//!
//! Benchmark programs, each starting a real control plane of its own
//! ([`bootsman_testenv::TestEnv`]) and running the release build of a Bootsman controller
//! against it as a separate process. They print their numbers and write them as JSON under
//! `target/bench/`; nothing here asserts a time. Being a crate of their own, they keep the test
//! harness out of the controllers' builds.
//!
//! - `bench-bind` (`src/bin/bench_bind.rs`): N hosts bound to N machines by `bootsman-provider`,
//!   against the API server's floor for N sequential writes; requests per binding; the
//!   provider's peak RSS.
