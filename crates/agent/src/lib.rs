//! `byoh-agent`: the host agent of Bootsman. It runs as root on every server of a pool, enrols the
//! server with a one-time bootstrap token, registers it as a ByoHost with its inventory, renews
//! its Lease, runs the bootstrap data of the machine it is claimed for and resets the server when
//! the machine is released.
//!
//! Modules: [`cloudinit`] parses bootstrap data, [`executor`] runs it (and undoes it) under a
//! [`root::Root`] with progress in the [`state`] directory, [`inventory`] reads the machine, and
//! [`agent`] speaks the protocol with the provider.

pub mod agent;
pub mod cloudinit;
pub mod enroll;
pub mod executor;
pub mod inventory;
pub mod root;
pub mod state;
