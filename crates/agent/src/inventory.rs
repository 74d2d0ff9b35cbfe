//! The host's inventory as the ByoHost status reports it: OS, machine id, kernel, architecture,
//! CPUs, memory, whole disks and network interfaces with addresses, MACs and the default route's
//! interface. Read from an inventory root (`/` on a real host; tests point `/etc` files elsewhere)
//! and from `/proc` and `/sys`.

use std::collections::BTreeMap;
use std::path::Path;

use bootsman_api::v1beta1::{Disk, HostInfo, NetworkInterface};

/// Reads the inventory. `etc_root` holds `etc/os-release` and `etc/machine-id`; `/proc` and
/// `/sys` are the live ones.
pub fn collect(etc_root: &Path, hostname: &str) -> (HostInfo, Vec<NetworkInterface>) {
    let os = parse_os_release(&read(&etc_root.join("etc/os-release")).unwrap_or_default());
    let info = HostInfo {
        hostname: Some(hostname.to_string()),
        machine_id: read(&etc_root.join("etc/machine-id"))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
        os_name: os.get("ID").cloned(),
        os_image: os.get("PRETTY_NAME").or_else(|| os.get("NAME")).cloned(),
        kernel_version: read(Path::new("/proc/sys/kernel/osrelease")).map(|s| s.trim().to_string()),
        architecture: Some(arch().to_string()),
        cpus: cpus(),
        memory_bytes: read(Path::new("/proc/meminfo")).and_then(|m| mem_total(&m)),
        disks: disks(Path::new("/sys/block")),
    };
    (info, interfaces())
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The kernel's host name.
pub fn kernel_hostname() -> Option<String> {
    read(Path::new("/proc/sys/kernel/hostname"))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Kubernetes' name for the CPU architecture.
pub fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `KEY=value` pairs of os-release (quotes removed).
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_string(),
                v.trim().trim_matches(|c| c == '"' || c == '\'').to_string(),
            )
        })
        .collect()
}

fn cpus() -> Option<u32> {
    let from_cpuinfo = read(Path::new("/proc/cpuinfo"))
        .map(|t| t.lines().filter(|l| l.starts_with("processor")).count() as u32)
        .filter(|n| *n > 0);
    from_cpuinfo.or_else(|| std::thread::available_parallelism().ok().map(|n| n.get() as u32))
}

/// `MemTotal` of /proc/meminfo in bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn disks(sys_block: &Path) -> Vec<Disk> {
    let Ok(entries) = std::fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut out: Vec<Disk> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if ["loop", "ram", "zram", "dm-", "sr", "fd"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                return None;
            }
            let dir = e.path();
            // /sys/block lists whole disks only; a `partition` file marks one anyway.
            if dir.join("partition").exists() {
                return None;
            }
            let sectors: u64 = read(&dir.join("size"))?.trim().parse().ok()?;
            if sectors == 0 {
                return None;
            }
            Some(Disk {
                name,
                size_bytes: sectors * 512,
                model: read(&dir.join("device/model"))
                    .map(|m| m.trim().to_string())
                    .filter(|m| !m.is_empty()),
                rotational: read(&dir.join("queue/rotational")).map(|r| r.trim() == "1"),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The interface of the default route in /proc/net/route.
pub fn default_route_iface(route: &str) -> Option<String> {
    route.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
    })
}

fn interfaces() -> Vec<NetworkInterface> {
    let default = read(Path::new("/proc/net/route")).and_then(|r| default_route_iface(&r));
    let mut addrs = ip_addrs().unwrap_or_else(proc_addrs);
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    let mut out: Vec<NetworkInterface> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "lo" {
                return None;
            }
            let dir = e.path();
            let mac = read(&dir.join("address"))
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty() && m != "00:00:00:00:00:00");
            let connected = read(&dir.join("operstate")).map(|s| s.trim() == "up");
            Some(NetworkInterface {
                is_default: default.as_deref() == Some(name.as_str()),
                ip_addrs: addrs.remove(&name).unwrap_or_default(),
                network_interface_name: name,
                mac_addr: mac,
                connected,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (!a.is_default, &a.network_interface_name).cmp(&(!b.is_default, &b.network_interface_name))
    });
    out
}

/// Addresses per interface from `ip -j addr`, when iproute2 is there.
fn ip_addrs() -> Option<BTreeMap<String, Vec<String>>> {
    let out = std::process::Command::new("ip")
        .args(["-j", "addr"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_ip_json(&out.stdout)
}

/// Parses `ip -j addr` output into CIDR addresses per interface.
pub fn parse_ip_json(bytes: &[u8]) -> Option<BTreeMap<String, Vec<String>>> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let mut map = BTreeMap::new();
    for link in v.as_array()? {
        let Some(name) = link["ifname"].as_str() else {
            continue;
        };
        let addrs = link["addr_info"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| Some(format!("{}/{}", i["local"].as_str()?, i["prefixlen"].as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        map.insert(name.to_string(), addrs);
    }
    Some(map)
}

/// Addresses without iproute2: IPv4 from /proc/net/fib_trie is hard to attribute, so only IPv6
/// (from /proc/net/if_inet6) is read; interfaces still carry their MACs.
fn proc_addrs() -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in read(Path::new("/proc/net/if_inet6")).unwrap_or_default().lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[0].len() != 32 {
            continue;
        }
        let groups: Vec<&str> = (0..8).filter_map(|i| f[0].get(i * 4..i * 4 + 4)).collect();
        let Ok(addr) = groups.join(":").parse::<std::net::Ipv6Addr>() else {
            continue;
        };
        let Ok(prefix) = u8::from_str_radix(f[2], 16) else {
            continue;
        };
        map.entry(f[5].to_string())
            .or_default()
            .push(format!("{addr}/{prefix}"));
    }
    map
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_sources() {
        let os = parse_os_release("ID=ubuntu\nPRETTY_NAME=\"Ubuntu 24.04 LTS\"\n");
        assert_eq!(os["PRETTY_NAME"], "Ubuntu 24.04 LTS");
        assert_eq!(mem_total("MemTotal:       16314800 kB\n"), Some(16314800 * 1024));
        let route = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                     eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n\
                     eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\n";
        assert_eq!(default_route_iface(route).as_deref(), Some("eth0"));
        let ip = br#"[{"ifname":"eth0","addr_info":[{"local":"10.0.0.2","prefixlen":24},{"local":"fe80::1","prefixlen":64}]}]"#;
        assert_eq!(
            parse_ip_json(ip).unwrap()["eth0"],
            vec!["10.0.0.2/24", "fe80::1/64"]
        );
    }

    #[test]
    fn reads_this_machine() {
        let (info, _) = collect(Path::new("/"), "h");
        assert!(info.cpus.unwrap() > 0);
        assert!(info.memory_bytes.unwrap() > 0);
        assert!(info.kernel_version.is_some());
    }
}
