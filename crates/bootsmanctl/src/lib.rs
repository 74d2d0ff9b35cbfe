//! `bootsmanctl`: the command-line tool of Bootsman. It installs the platform and manages the
//! hosts of a pool; for example, it issues the one-time bootstrap tokens hosts enrol with
//! ([`token`]) and lists the hosts of a pool ([`hosts`]).
//!
//! Every command is a library function taking a [`kube::Client`], so the binary only parses flags
//! ([`cli`]) and prints.

pub mod cli;
pub mod hosts;
pub mod token;
