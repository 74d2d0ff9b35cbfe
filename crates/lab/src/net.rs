//! The lab network: a bridge in the run's own network namespace, with the lab gateway's
//! address on it, one veth per host, and extra addresses for the services the lab runs on the
//! gateway side (the registry, the infrastructure API server, load balancers at child cluster
//! endpoints). Nothing is routed out: traffic stays in the namespace the run created.
//!
//! Addresses (`172.31.77.0/24`): `.1` the gateway (registry `:5000`, the infrastructure
//! cluster's API server), `.10`–`.19` control-plane endpoints (HAProxy), `.101`… hosts.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::error::Result;
use crate::run;

/// The bridge all hosts are plugged into.
pub const BRIDGE: &str = "lab0";
/// The lab subnet's prefix length.
pub const PREFIX: u8 = 24;
/// Gateway address: the run's side of the bridge.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(172, 31, 77, 1);
/// Port of the lab registry on the gateway.
pub const REGISTRY_PORT: u16 = 5000;

/// The `n`-th control-plane endpoint address (`n` from 0).
pub fn endpoint(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(172, 31, 77, 10 + n.min(9))
}

/// The address of host number `n` (from 1).
pub fn host_address(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(172, 31, 77, 100 + n)
}

/// `host:port` of the lab registry.
pub fn registry() -> String {
    format!("{GATEWAY}:{REGISTRY_PORT}")
}

fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args), &format!("ip {}", args.join(" ")))
}

/// Brings up loopback and the bridge with the gateway address in the current network
/// namespace (the run's own; see [`crate::ns`]). Forwarding is enabled in this namespace only.
pub fn up() -> Result<()> {
    ip(&["link", "set", "lo", "up"])?;
    ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{GATEWAY}/{PREFIX}"), "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])?;
    std::fs::write("/proc/sys/net/ipv4/ip_forward", b"1").map_err(crate::error::io(
        "enable forwarding in the lab namespace",
        "/proc/sys/net/ipv4/ip_forward",
    ))?;
    Ok(())
}

/// Adds an address of the lab subnet on the gateway side (a load balancer's VIP).
pub fn add_address(addr: Ipv4Addr) -> Result<()> {
    ip(&["addr", "add", &format!("{addr}/32"), "dev", BRIDGE])?;
    Ok(())
}

/// Plugs the network namespace of process `pid` into the bridge: a veth pair whose far end is
/// `eth0` in that namespace.
pub fn plug(veth: &str, pid: u32) -> Result<()> {
    ip(&[
        "link",
        "add",
        veth,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &pid.to_string(),
    ])?;
    ip(&["link", "set", veth, "master", BRIDGE, "up"])?;
    Ok(())
}
