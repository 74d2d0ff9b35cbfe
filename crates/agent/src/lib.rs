//! `byoh-agent`: the host agent of Bootsman. It runs as root on every server of a pool, enrols the
//! server with a one-time bootstrap token, registers it as a ByoHost with its inventory, renews
//! its Lease, runs the bootstrap data of the machine it is claimed for and resets the server when
//! the machine is released.

pub mod enroll;
