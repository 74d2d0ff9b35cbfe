//! # bootsman-lab
//!
//! Real Kubernetes nodes on one machine, without Docker and without VMs: **lab hosts**. Each
//! host is a set of Linux namespaces (network, mount, UTS, IPC, PID) on a lab network in a
//! namespace the run creates, running what a server of a site runs: containerd and runc from
//! Debian's packages, a kubelet and kubeadm built from the Kubernetes Go modules at the control
//! plane's version, and `byoh-agent` installed from the project's own `.deb` and started by its
//! systemd unit. Images come from an OCI registry (distribution v3) on the lab network, as from
//! an air-gapped site's mirror; control-plane endpoints are served by HAProxy.
//!
//! - [`ns`]: the run's own network namespace (the run re-executes itself under `unshare --net`);
//! - [`net`]: the bridge, addresses and veth pairs;
//! - [`host`]: a host seen from the lab (installation, boot, exec, stop, kill);
//! - [`init`]: a host's first process (mounts, network, a small service manager);
//! - [`unit`], [`systemctl`]: unit files as systemd reads them, and the host's `systemctl`;
//! - [`registry`], [`lb`]: the lab registry and the load balancer at an endpoint;
//! - [`infra`]: a node of the infrastructure cluster itself, for the controllers' Pods;
//! - [`vm`]: emulated VMs with a real systemd, on the same network (the agent's unit as systemd runs it);
//! - [`site`]: a whole Bootsman site on lab hosts (the demo's and the end-to-end test's);
//! - [`demo`]: the demo (`hack/demo.sh`): the sample BootsmanCluster on six lab hosts;
//! - [`cleanup`]: cgroups and folders of runs that are gone (`bootsman-lab down`).
//!
//! Nothing on the machine outside the run changes: no sysctl (forwarding is enabled in the
//! lab's namespaces only, and the machine-wide sysctls the kubelet writes are files bound over
//! them in each host), no file outside the run's folder (each host sees the machine's `/etc`,
//! `/usr`, `/var`, `/opt` and `/root` through overlays whose upper layers are its own), no
//! mount or process after the run (see [`cleanup`]).

pub mod cleanup;
pub mod demo;
pub mod error;
pub mod host;
pub mod infra;
pub mod init;
pub mod lb;
pub mod net;
pub mod ns;
pub mod registry;
pub mod site;
pub mod systemctl;
pub mod unit;
pub mod vm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use error::{Error, Result};
pub use host::LabHost;

/// The lab's programs and images (from `hack/labbin`).
#[derive(Debug, Clone)]
pub struct Labbin {
    /// The cache entry.
    pub dir: PathBuf,
    /// kubelet, kubeadm, crictl, registry, crane, ...
    pub bin: PathBuf,
    /// Storage of the registry holding the lab's images.
    pub registry: PathBuf,
    /// Kubernetes version of kubelet and kubeadm (`v1.36.3`).
    pub kubernetes_version: String,
    /// `pause:<tag>` (without a registry).
    pub pause_image: String,
    /// `kube-router:<tag>` (without a registry).
    pub kube_router_image: String,
    /// `busybox:<tag>` (without a registry).
    pub busybox_image: String,
}

impl Labbin {
    /// Finds the complete cache entry of the current versions (`hack/labbin --print-dir`).
    pub fn locate() -> Result<Labbin> {
        let script = bootsman_testenv::repo_root().join("hack/labbin");
        let out = Command::new(&script)
            .arg("--print-dir")
            .output()
            .map_err(error::io("run", &script))?;
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if !out.status.success() {
            return Err(Error::Unsupported(format!(
                "the lab's programs and images are not built ({}): run hack/labbin",
                dir.display()
            )));
        }
        let env_path = dir.join("env");
        let text = std::fs::read_to_string(&env_path).map_err(error::io("read", &env_path))?;
        let env: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect();
        let get = |k: &str| {
            env.get(k).cloned().ok_or_else(|| {
                Error::Unsupported(format!("{} lacks {k}: run hack/labbin", env_path.display()))
            })
        };
        Ok(Labbin {
            bin: PathBuf::from(get("BOOTSMAN_LAB_BIN")?),
            registry: PathBuf::from(get("BOOTSMAN_LAB_REGISTRY")?),
            kubernetes_version: get("BOOTSMAN_LAB_K8S_VERSION")?,
            pause_image: get("BOOTSMAN_LAB_PAUSE_IMAGE")?,
            kube_router_image: get("BOOTSMAN_LAB_KUBE_ROUTER_IMAGE")?,
            busybox_image: get("BOOTSMAN_LAB_BUSYBOX_IMAGE")?,
            dir,
        })
    }

    /// A program of the lab cache.
    pub fn program(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

/// One lab run: its folder, the lab's programs, and `bootsman-lab` (which hosts run as their
/// init and `systemctl`).
#[derive(Debug)]
pub struct Lab {
    run_id: String,
    dir: PathBuf,
    labbin: Labbin,
    exe: PathBuf,
}

/// Where runs keep their folders: `$BOOTSMAN_LAB_DIR`, else `$TMPDIR/bootsman-lab`.
pub fn runs_root() -> PathBuf {
    std::env::var_os("BOOTSMAN_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("bootsman-lab"))
}

impl Lab {
    /// Starts a run inside the lab namespace ([`ns::reexec`] first): removes what crashed runs
    /// left ([`cleanup::down`]), creates the run's folder, and brings the lab network up.
    pub fn create() -> Result<Lab> {
        if !ns::inside() {
            return Err(Error::Unsupported(
                "a lab runs in its own network namespace: call ns::reexec() first".into(),
            ));
        }
        let labbin = Labbin::locate()?;
        for tool in ["unshare", "nsenter", "ip", "setpriv", "dpkg"] {
            if Command::new(tool).arg("--version").output().is_err() {
                return Err(Error::Unsupported(format!("{tool} is not installed")));
            }
        }
        let root = runs_root();
        let report = cleanup::down(&root);
        if !report.removed.is_empty() {
            eprintln!(
                "lab: removed what earlier runs left: {}",
                report.removed.join(", ")
            );
        }
        let run_id = format!("{}-{}", std::process::id(), short_suffix());
        let dir = root.join(&run_id);
        std::fs::create_dir_all(&dir).map_err(error::io("create", &dir))?;
        let owner = dir.join(cleanup::OWNER);
        let started = cleanup::start_time(std::process::id()).unwrap_or_default();
        std::fs::write(&owner, started).map_err(error::io("write", &owner))?;
        // Hosts run `bootsman-lab host-init` and `bootsman-lab systemctl`: the program beside
        // this one (a lab command is either bootsman-lab itself or built into the same folder).
        let me = std::env::current_exe().map_err(error::io("find", "this program"))?;
        let exe = me.with_file_name("bootsman-lab");
        if !exe.exists() {
            return Err(Error::Unsupported(format!(
                "{} is not built: cargo build -p bootsman-lab",
                exe.display()
            )));
        }
        net::up()?;
        Ok(Lab {
            run_id,
            dir,
            labbin,
            exe,
        })
    }

    /// The run's id (`<pid>-<suffix>`), also the name of its cgroup tree.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The run's folder (hosts, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The lab's programs and images.
    pub fn labbin(&self) -> &Labbin {
        &self.labbin
    }

    /// `bootsman-lab`.
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    /// The folder of `bootsman-lab` (and of the other programs of the workspace).
    pub fn exe_dir(&self) -> PathBuf {
        self.exe.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    /// `bootsman-lab`'s file name.
    pub fn exe_name(&self) -> String {
        self.exe
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Lab {
    /// The hosts are stopped by now: their cgroups go, and so do their disks (overlay layers,
    /// containerd's images and snapshots, about 300 MB a host); their logs stay in the run's
    /// folder until the next run or `bootsman-lab down` (`BOOTSMAN_LAB_KEEP=1` keeps the disks).
    fn drop(&mut self) {
        cleanup::remove_cgroup_tree(&format!("/bootsman-lab/{}", self.run_id));
        cleanup::remove_empty_cgroup_root();
        if std::env::var_os("BOOTSMAN_LAB_KEEP").is_none() {
            cleanup::remove_host_disks(&self.dir.join("hosts"));
        }
    }
}

/// Runs a command, returning its stdout; a failure carries its status and stderr.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(|e| Error::Command {
        what: what.into(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            what: what.into(),
            detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        })
    }
}

fn short_suffix() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{:06x}", t & 0xff_ffff)
}
