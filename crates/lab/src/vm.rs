//! Emulated virtual machines on the lab network, for what a lab host only imitates: a real
//! systemd as PID 1 reading a unit file with its hardening (`UMask`, `Protect*`, `Restrict*`),
//! and a kernel of the machine's own.
//!
//! The image is Debian 12 with systemd, built by `hack/vm-image` into a cache (a raw ext4 root
//! file system, the kernel and its initrd). Each VM boots QEMU with TCG (this machine has no
//! usable hardware virtualisation; a boot to `multi-user.target` takes 15–30 s) from a
//! copy-on-write overlay of that image, so the cached image is never written. It is plugged into
//! the lab bridge through a tap device of the run's own network namespace, with the address
//! [`crate::net::host_address`] gives its number.
//!
//! What a VM is told comes on a second, read-only disk labelled `seed`: the image's
//! `bootsman-seed.service` mounts it at `/seed` early in the boot and runs `/seed/seed.sh`, which
//! [`Vm::boot`] writes as the network setup followed by the caller's script. The serial console
//! (where the journal is forwarded) goes to the VM's `console.log` in the run's folder.
//!
//! QEMU runs as a [`Component`]: it is killed when the [`Vm`] drops and, should the run die first,
//! by the kernel. The tap device lives in the run's network namespace and goes with it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bootsman_testenv::process::Component;

use crate::error::{Error, Result, io};
use crate::{Lab, net, run};

/// Memory of a VM (MiB). The image's systemd, the agent and a bootstrap's commands fit in it.
pub const MEMORY_MIB: u32 = 1024;

/// The cached image (`hack/vm-image --print-dir`).
#[derive(Debug, Clone)]
pub struct VmImage {
    /// The cache entry.
    pub dir: PathBuf,
}

impl VmImage {
    /// Finds the complete cache entry of the current recipe.
    pub fn locate() -> Result<VmImage> {
        let script = bootsman_testenv::repo_root().join("hack/vm-image");
        let out = Command::new(&script)
            .arg("--print-dir")
            .output()
            .map_err(io("run", &script))?;
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if !out.status.success() {
            return Err(Error::Unsupported(format!(
                "the VM image is not built ({}): run hack/vm-image",
                dir.display()
            )));
        }
        Ok(VmImage { dir })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// A running VM.
#[derive(Debug)]
pub struct Vm {
    name: String,
    address: Ipv4Addr,
    dir: PathBuf,
    tap: String,
    qemu: Option<Component>,
}

/// The script that gives the VM its lab address: the first Ethernet interface, the address, the
/// default route through the lab gateway and the host name.
fn network_script(name: &str, address: Ipv4Addr) -> String {
    format!(
        "#!/bin/sh
# Written by bootsman-lab: the lab network, then what the run asked for.
set -eu
hostnamectl set-hostname {name} 2>/dev/null || hostname {name}
nic=
for d in /sys/class/net/*; do
  n=${{d##*/}}
  [ \"$n\" = lo ] && continue
  [ -e \"$d/device\" ] || continue
  nic=$n; break
done
[ -n \"$nic\" ] || {{ echo 'seed: no network interface'; exit 1; }}
ip link set \"$nic\" up
ip addr add {address}/{prefix} dev \"$nic\"
ip route add default via {gateway}
echo \"seed: $nic has {address}\"
",
        prefix = net::PREFIX,
        gateway = net::GATEWAY,
    )
}

impl Vm {
    /// Boots VM number `n` (its address is [`net::host_address`]`(n)`) named `name`. `files` are
    /// copied onto the seed disk (`/seed/<file name>` inside); `script` runs as root once the
    /// network is up, from `bootsman-seed.service`.
    pub fn boot(lab: &Lab, image: &VmImage, n: u8, name: &str, files: &[&Path], script: &str) -> Result<Vm> {
        let dir = lab.dir().join("vms").join(name);
        let seed = dir.join("seed");
        std::fs::create_dir_all(&seed).map_err(io("create", &seed))?;
        for f in files {
            let to = seed.join(f.file_name().unwrap_or_default());
            std::fs::copy(f, &to).map_err(io("copy", f))?;
        }
        let address = net::host_address(n);
        let seed_sh = seed.join("seed.sh");
        let body = format!("{}\n{script}\n", network_script(name, address));
        std::fs::write(&seed_sh, body).map_err(io("write", &seed_sh))?;

        let seed_img = dir.join("seed.img");
        run(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-L", "seed", "-d"])
                .arg(&seed)
                .arg(&seed_img)
                .arg(format!("{}M", 32 + dir_size_mib(&seed))),
            "mkfs.ext4 the seed disk",
        )?;
        let overlay = dir.join("root.qcow2");
        run(
            Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                .arg(image.file("rootfs.raw"))
                .arg(&overlay),
            "qemu-img create the root overlay",
        )?;

        let cmdline_file = image.file("cmdline");
        let cmdline = std::fs::read_to_string(&cmdline_file)
            .map_err(io("read", &cmdline_file))?
            .trim()
            .to_string();
        let tap = format!("vmtap{n}");
        run(
            Command::new("ip").args(["tuntap", "add", "dev", &tap, "mode", "tap"]),
            &format!("ip tuntap add {tap}"),
        )?;
        run(
            Command::new("ip").args(["link", "set", &tap, "master", net::BRIDGE, "up"]),
            &format!("ip link set {tap} master {}", net::BRIDGE),
        )?;
        let mut vm = Vm {
            name: name.into(),
            address,
            dir: dir.clone(),
            tap: tap.clone(),
            qemu: None,
        };
        let args: Vec<String> = vec![
            "-name".into(),
            name.into(),
            "-accel".into(),
            "tcg,tb-size=64".into(),
            "-m".into(),
            MEMORY_MIB.to_string(),
            "-smp".into(),
            "2".into(),
            "-nographic".into(),
            "-no-reboot".into(),
            "-kernel".into(),
            image.file("vmlinuz").display().to_string(),
            "-initrd".into(),
            image.file("initrd.img").display().to_string(),
            "-append".into(),
            cmdline,
            "-drive".into(),
            format!("file={},if=virtio,format=qcow2", overlay.display()),
            "-drive".into(),
            format!("file={},if=virtio,format=raw,readonly=on", seed_img.display()),
            "-netdev".into(),
            format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mac=52:54:00:77:00:{n:02x}"),
            // Without it systemd-random-seed waits for entropy.
            "-device".into(),
            "virtio-rng-pci".into(),
        ];
        vm.qemu = Some(Component::spawn(
            &format!("qemu {name}"),
            Path::new("qemu-system-x86_64"),
            &args,
            &[],
            dir.join("console.log"),
        )?);
        Ok(vm)
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address on the lab network.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// Its folder in the run (overlay, seed, `console.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Everything the serial console printed so far.
    pub fn console(&self) -> String {
        std::fs::read(self.dir.join("console.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `n` lines of the console.
    pub fn console_tail(&self, n: usize) -> String {
        let text = self.console();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until the console shows `marker`; fails when QEMU exits or after `timeout`.
    pub async fn wait_console(&self, marker: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.console().contains(marker) {
                return Ok(start.elapsed());
            }
            if let Some(q) = &self.qemu {
                q.check_running()?;
            }
            if start.elapsed() > timeout {
                return Err(Error::Command {
                    what: format!(
                        "VM {}: waiting {timeout:?} for {marker:?} on its console",
                        self.name
                    ),
                    detail: self.console_tail(40),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// QEMU's resident memory (KiB), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.qemu.as_ref()?.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }
}

impl Drop for Vm {
    /// Powers the VM off hard (its disk is a throw-away overlay) and removes its tap device.
    ///
    /// Its disks go too (`BOOTSMAN_LAB_KEEP=1` keeps them); `console.log` stays with the run.
    fn drop(&mut self) {
        drop(self.qemu.take());
        let _ = Command::new("ip").args(["link", "del", &self.tap]).output();
        if std::env::var_os("BOOTSMAN_LAB_KEEP").is_none() {
            let _ = std::fs::remove_file(self.dir.join("root.qcow2"));
            let _ = std::fs::remove_file(self.dir.join("seed.img"));
        }
    }
}

/// Size of the files directly in `dir`, in MiB, rounded up.
fn dir_size_mib(dir: &Path) -> u64 {
    let bytes: u64 = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0);
    bytes.div_ceil(1 << 20)
}
