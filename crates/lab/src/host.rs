//! A lab host, seen from the lab: its folder, the files a server's installation would hold
//! (containerd's configuration with the lab registry as mirror, kubelet and kubeadm as their
//! packages install them, a `systemctl`), the process tree that is the host
//! (`unshare` → [`crate::init`]), its place on the lab network, and the ways in: running a
//! command inside (like ssh), reading its files, stopping it gracefully or killing it outright.

use std::net::Ipv4Addr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use bootsman_testenv::process::Component;

use crate::error::{Error, Result, io};
use crate::init::{HOST_DIR, HostSpec, READY, RUN_DIR};
use crate::{Lab, net};

/// Units a lab host runs (when enabled): others installed on the machine are never started.
pub const UNITS: [&str; 3] = ["containerd.service", "kubelet.service", "byoh-agent.service"];

/// kubelet.service as the Kubernetes packages install it.
const KUBELET_UNIT: &str = "[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
";

/// kubeadm's drop-in for kubelet.service, as its package installs it.
const KUBEADM_DROPIN: &str = r#"# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"#;

/// A running lab host.
#[derive(Debug)]
pub struct LabHost {
    spec: HostSpec,
    address: Ipv4Addr,
    /// The `unshare` process; its only child is the host's init.
    process: Component,
    /// The init's PID as the lab sees it.
    init_pid: u32,
    /// Lab-side end of the host's veth pair.
    veth: String,
    /// Its processes and cgroups are gone (see [`LabHost::power_off`]).
    off: bool,
}

impl LabHost {
    /// Prepares host number `n` (from 1) named `name`, boots it and plugs it into the lab
    /// network. Returns once its init reports ready (units enabled at boot are starting).
    pub fn boot(lab: &Lab, n: u8, name: &str) -> Result<LabHost> {
        let dir = lab.dir().join("hosts").join(name);
        let address = net::host_address(n);
        let spec = HostSpec {
            name: name.into(),
            dir: dir.clone(),
            address: format!("{address}/{}", net::PREFIX),
            gateway: net::GATEWAY.to_string(),
            units: UNITS.iter().map(|u| (*u).to_string()).collect(),
            cgroup_root: format!("/bootsman-lab/{}/{name}", lab.run_id()),
            exports: vec![
                (lab.labbin().bin.clone(), "bin".into()),
                (lab.exe_dir(), "lab".into()),
            ],
        };
        std::fs::create_dir_all(spec.log_dir()).map_err(io("create", spec.log_dir()))?;
        install(lab, &spec, n)?;
        let spec_path = dir.join("spec.json");
        let json = serde_json::to_vec_pretty(&spec).map_err(|e| Error::Command {
            what: "encode host spec".into(),
            detail: e.to_string(),
        })?;
        std::fs::write(&spec_path, json).map_err(io("write", &spec_path))?;

        let args: Vec<String> = [
            "--net",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .chain([
            lab.exe().display().to_string(),
            "host-init".into(),
            spec_path.display().to_string(),
        ])
        .collect();
        let process = Component::spawn(
            &format!("host {name}"),
            Path::new("unshare"),
            &args,
            &[],
            spec.log_dir().join("console.log"),
        )?;
        let pid = process.pid().ok_or_else(|| host_error(&spec, "exited at once"))?;
        let veth = format!("lab-{name}");
        let veth = veth.chars().take(15).collect::<String>();
        let init_pid = wait_for_init(&spec, &process, pid)?;
        net::plug(&veth, init_pid)?;
        let host = LabHost {
            spec,
            address,
            process,
            init_pid,
            veth,
            off: false,
        };
        host.wait_ready(Duration::from_secs(60))?;
        Ok(host)
    }

    fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.path(READY).exists() {
            if self.process.check_running().is_err() {
                return Err(host_error(&self.spec, "stopped while booting"));
            }
            if Instant::now() > deadline {
                return Err(host_error(
                    &self.spec,
                    &format!("not ready after {}s", timeout.as_secs()),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Host name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Address on the lab network.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The host's folder on the machine.
    pub fn dir(&self) -> &Path {
        &self.spec.dir
    }

    /// The host's journal folder (one log per unit, `init.log`, `console.log`).
    pub fn log_dir(&self) -> PathBuf {
        self.spec.log_dir()
    }

    /// PID of the host's init, as the lab sees it.
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }

    /// A path inside the host, reachable from the lab (through `/proc/<init>/root`).
    pub fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.init_pid)).join(inside.trim_start_matches('/'))
    }

    /// Whether the host's processes still run.
    pub fn is_running(&self) -> bool {
        self.process.check_running().is_ok()
    }

    /// `sh -c script` inside the host (its namespaces and file system), like a command over ssh.
    pub fn exec(&self, script: &str) -> Result<Output> {
        Command::new("nsenter")
            .args([
                "-t",
                &self.init_pid.to_string(),
                "-m",
                "-u",
                "-i",
                "-n",
                "-p",
                "-r",
                "-w",
                "--",
            ])
            .args(["/bin/sh", "-c", script])
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .output()
            .map_err(io("run nsenter into", format!("host {}", self.spec.name)))
    }

    /// Like [`Self::exec`], failing with the command's output when it exits non-zero.
    pub fn sh(&self, script: &str) -> Result<String> {
        let out = self.exec(script)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Command {
                what: format!("on {}: {}", self.spec.name, first_line(script)),
                detail: format!(
                    "{}\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            })
        }
    }

    /// Installs the agent from a package file and enrols the host, as the README's host
    /// enrollment says: `dpkg -i`, the bootstrap kubeconfig, the flags file, `systemctl enable
    /// --now byoh-agent`.
    pub fn install_agent(&self, deb: &Path, bootstrap_kubeconfig: &str, agent_args: &str) -> Result<()> {
        let inside = |f: &str| format!("{HOST_DIR}/{f}");
        std::fs::copy(deb, self.spec.dir.join("byoh-agent.deb")).map_err(io("copy", deb))?;
        let kc = self.spec.dir.join("bootstrap-kubeconfig");
        std::fs::write(&kc, bootstrap_kubeconfig).map_err(io("write", &kc))?;
        self.sh(&format!(
            "set -e
dpkg -i {deb} >/dev/null
install -m 0600 {kc} /etc/byoh-agent/bootstrap-kubeconfig
sed -i 's|^BYOH_AGENT_ARGS=.*|BYOH_AGENT_ARGS=\"{agent_args}\"|' /etc/byoh-agent/byoh-agent.env
systemctl enable --now byoh-agent",
            deb = inside("byoh-agent.deb"),
            kc = inside("bootstrap-kubeconfig"),
        ))?;
        Ok(())
    }

    /// Stops the host as a shutdown does: its units get SIGTERM, then its init exits.
    pub fn stop(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.init_pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(45);
        while self.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.process.stop();
    }

    /// Kills every process of the host at once, as pulling the power cord would.
    pub fn kill(&self) {
        self.process.stop();
    }

    /// Lab-side name of the host's network interface.
    pub fn veth(&self) -> &str {
        &self.veth
    }

    /// The cgroup the host's pods live under (relative to each hierarchy).
    pub fn cgroup_root(&self) -> &str {
        &self.spec.cgroup_root
    }
}

impl LabHost {
    /// Shuts the host down (gracefully when it still runs) and removes its cgroups, so it can be
    /// booted again from its folder ([`LabHost::boot`] with the same name).
    pub fn power_off(&mut self) {
        if self.off {
            return;
        }
        if self.is_running() {
            self.stop();
        }
        crate::cleanup::remove_cgroup_tree(&self.spec.cgroup_root);
        self.off = true;
    }
}

impl Drop for LabHost {
    fn drop(&mut self) {
        self.power_off();
    }
}

fn first_line(s: &str) -> String {
    let l = s
        .trim()
        .lines()
        .find(|l| !l.trim().is_empty() && l.trim() != "set -e")
        .unwrap_or_default();
    l.chars().take(100).collect()
}

fn host_error(spec: &HostSpec, problem: &str) -> Error {
    let mut tail = String::new();
    for f in ["console.log", "init.log"] {
        let p = spec.log_dir().join(f);
        if p.exists() {
            tail.push_str(&format!(
                "--- {} ---\n{}\n",
                p.display(),
                bootsman_testenv::tail(&p, 20)
            ));
        }
    }
    Error::Host {
        host: spec.name.clone(),
        problem: problem.into(),
        tail,
    }
}

/// The init is the only child of the `unshare` process.
fn wait_for_init(spec: &HostSpec, process: &Component, pid: u32) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(child) = bootsman_testenv::process::children_of(pid).first() {
            return Ok(*child);
        }
        if process.check_running().is_err() {
            return Err(host_error(spec, "unshare exited before starting the host's init"));
        }
        if Instant::now() > deadline {
            return Err(host_error(spec, "its init did not start within 20 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(io("create", p))?;
    }
    std::fs::write(path, text).map_err(io("write", path))
}

fn link(target: &str, at: &Path) -> Result<()> {
    if let Some(p) = at.parent() {
        std::fs::create_dir_all(p).map_err(io("create", p))?;
    }
    let _ = std::fs::remove_file(at);
    symlink(target, at).map_err(io("link", at))
}

/// What a server's installation holds before the agent arrives, written into the host's upper
/// layers: identity, name resolution, containerd with the lab registry as its mirror, kubelet
/// and kubeadm as their packages install them (with the cgroup v1 settings this machine needs
/// in `/etc/default/kubelet`), crictl's configuration and the lab's `systemctl`.
fn install(lab: &Lab, spec: &HostSpec, n: u8) -> Result<()> {
    let etc = spec.upper("etc");
    let usr = spec.upper("usr");
    let name = &spec.name;
    let address = spec.address.split('/').next().unwrap_or_default();
    write(&etc.join("hostname"), &format!("{name}\n"))?;
    write(
        &etc.join("hosts"),
        &format!("127.0.0.1 localhost\n::1 localhost ip6-localhost\n{address} {name}\n"),
    )?;
    write(
        &etc.join("resolv.conf"),
        &format!("nameserver {}\n", net::GATEWAY),
    )?;
    write(
        &etc.join("machine-id"),
        &format!("{}\n", machine_id(lab.run_id(), n)),
    )?;

    let registry = net::registry();
    write(
        &etc.join("containerd/config.toml"),
        &format!(
            r#"# containerd of a lab host: images come from the lab registry (the site's mirror).
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{registry}/{pause}"
  # Pod sandboxes cannot lower their OOM score in a lab host (no CAP_SYS_RESOURCE in the
  # bounding set of its namespaces); kind's rootless nodes set the same.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
"#,
            pause = lab.labbin().pause_image,
        ),
    )?;
    write(
        &etc.join(format!("containerd/certs.d/{registry}/hosts.toml")),
        &format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )?;
    write(
        &etc.join("crictl.yaml"),
        "runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 10\n",
    )?;
    // What a cgroup v1 machine without systemd needs; a site on cgroup v2 with systemd leaves
    // this file empty.
    write(
        &etc.join("default/kubelet"),
        &format!(
            "KUBELET_EXTRA_ARGS=\"--fail-cgroupv1=false --cgroup-driver=cgroupfs --fail-swap-on=false --cgroup-root={}\"\n",
            spec.cgroup_root
        ),
    )?;
    write(&usr.join("lib/systemd/system/kubelet.service"), KUBELET_UNIT)?;
    write(
        &usr.join("lib/systemd/system/kubelet.service.d/10-kubeadm.conf"),
        KUBEADM_DROPIN,
    )?;
    for prog in ["kubelet", "kubeadm", "crictl"] {
        link(&format!("{RUN_DIR}/bin/{prog}"), &usr.join("bin").join(prog))?;
    }
    write(
        &usr.join("bin/systemctl"),
        &format!(
            "#!/bin/sh\n# The lab host's systemctl: the host's init manages its units.\nexec {RUN_DIR}/lab/{} systemctl \"$@\"\n",
            lab.exe_name()
        ),
    )?;
    set_mode(&usr.join("bin/systemctl"), 0o755)?;
    // Enabled at boot, as the containerd and kubelet packages leave them.
    let wants = etc.join("systemd/system/multi-user.target.wants");
    link(
        "/usr/lib/systemd/system/containerd.service",
        &wants.join("containerd.service"),
    )?;
    link(
        "/usr/lib/systemd/system/kubelet.service",
        &wants.join("kubelet.service"),
    )?;
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io("chmod", path))
}

/// A machine-id of 32 hex digits, different per run and host.
fn machine_id(run: &str, n: u8) -> String {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in run.bytes().chain([n]) {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013B);
    }
    format!("{h:032x}")
}
