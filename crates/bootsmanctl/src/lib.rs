//! `bootsmanctl`: the command-line tool of Bootsman. It issues the one-time bootstrap tokens
//! hosts enrol with ([`token`]), lists the hosts of a pool ([`hosts`]), moves hosts' agents to another
//! management cluster ([`rehome`]), shows a cluster's
//! objects as a tree ([`status`]), shows the Projects and their quotas ([`projects`]), writes
//! redacted support bundles ([`diagnose`]), reads
//! and checks the Site file a site is installed from ([`site`]), and installs a site
//! ([`install`]) from its bootstrap control plane ([`bootstrap`]) on.
//!
//! Every command is a library function taking a [`kube::Client`], so the binary only parses flags
//! ([`cli`]) and prints.

pub mod bootstrap;
pub mod cli;
pub mod controllers;
pub mod diagnose;
pub mod hosts;
pub mod install;
pub mod pivot;
pub mod projects;
pub mod rehome;
pub mod site;
pub mod status;
pub mod token;
