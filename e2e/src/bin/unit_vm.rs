//! `bootsman-unit-vm`: the host agent's package and systemd unit under a real systemd
//! (`hack/unit-vm.sh`).
//!
//! Lab hosts run the agent's unit through the lab's own small service manager, which honours
//! `ExecStart` and the environment but none of the unit's hardening. This program boots an
//! emulated Debian 12 VM (`bootsman_lab::vm`, systemd as PID 1) on the lab network of a site
//! with no lab hosts (the infrastructure control plane, Cluster API, and the provider with its
//! CSR approver), and there:
//!
//! 1. **install**: `dpkg -i` of the project's `.deb`, the bootstrap kubeconfig of a token
//!    pinned to the VM's name, the flags file, `systemctl enable` and start of `byoh-agent`;
//!    the agent enrols, registers and heartbeats: the ByoHost is `Available`;
//! 2. **bootstrap**: a Cluster API Machine claims the host, and its cloud-config, run by the
//!    agent under its unit (`UMask=0077`, `ProtectClock`, `RestrictRealtime`, ...), does what a
//!    kubeadm bootstrap needs of the system and checks each: commands run with umask 022 (a
//!    key file stays readable by other users, as apt's `_apt` needs), a `permissions: '4755'`
//!    file keeps its setuid bit, `/root/.kube` is writable, network namespaces, sysctls and
//!    kernel modules can be used, and a unit the bootstrap writes is started through systemd.
//!    The ByoHost's `BootstrapSucceeded` is `True`, and its message carries the commands'
//!    output: the unit's settings as systemd reports them;
//! 3. **release**: the Machine is deleted; the agent resets the host under its unit, and the
//!    host is `Available` again with `CleanupSucceeded`.
//!
//! It writes `target/e2e/unit-vm.json` (seconds of each step, QEMU's peak resident memory).
//! Exit code 0 only when every step passed; on a failure it prints the end of the VM's console
//! (where the VM's journal goes).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use bootsman_lab::site::{POOL, Progress, Site, SitePlan, byohost_resource, until};
use bootsman_lab::vm::{Vm, VmImage};
use bootsman_lab::{Error, Result, ns};
use kube::Api;
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// The VM's host name (and ByoHost).
const NAME: &str = "vm-1";
/// Its number on the lab network (its address is `net::host_address(VM_NUMBER)`).
const VM_NUMBER: u8 = 50;
/// Boot, enrolment and registration of an emulated VM on a loaded 2-core machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(420);
/// A step inside the (slow, emulated) VM.
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

/// What the bootstrap checks inside the VM, as a kubeadm bootstrap would need it; each check
/// names what failed.
const BOOTSTRAP: &str = r#"#cloud-config
write_files:
- path: /usr/local/bin/bootsman-probe
  permissions: '4755'
  content: |
    #!/bin/sh
    echo probe
- path: /etc/systemd/system/bootsman-probe.service
  content: |
    [Unit]
    Description=A unit a bootstrap starts, as kubeadm starts the kubelet
    [Service]
    Type=oneshot
    RemainAfterExit=yes
    ExecStart=/bin/true
runcmd:
- 'test "$(umask)" = 0022 || { echo "umask: commands run with $(umask), not 0022"; exit 1; }'
- 'mkdir -p /etc/apt/keyrings && echo key > /etc/apt/keyrings/bootsman-probe.asc && setpriv --reuid=65534 --regid=65534 --clear-groups cat /etc/apt/keyrings/bootsman-probe.asc >/dev/null || { echo "umask: a key file the bootstrap wrote is unreadable by other users"; exit 1; }'
- 'test "$(stat -c %a /usr/local/bin/bootsman-probe)" = 4755 || { echo "setuid: permissions 4755 became $(stat -c %a /usr/local/bin/bootsman-probe)"; exit 1; }'
- 'mkdir -p /root/.kube && echo probe > /root/.kube/config || { echo "home: /root/.kube is not writable"; exit 1; }'
- 'ip netns add bootsman-probe && ip netns del bootsman-probe || { echo "namespaces: ip netns add failed"; exit 1; }'
- 'sysctl -q -w net.ipv4.ip_forward=1 || { echo "sysctl: net.ipv4.ip_forward cannot be set"; exit 1; }'
- 'modprobe br_netfilter || { echo "modules: modprobe br_netfilter failed"; exit 1; }'
- 'systemctl daemon-reload && systemctl start bootsman-probe.service && systemctl is-active --quiet bootsman-probe.service || { echo "systemd: a unit written by the bootstrap did not start"; exit 1; }'
- 'agent=$(systemctl show -p MainPID --value byoh-agent); echo "bootstrap checks passed under systemd $(systemctl --version | head -n1 | cut -d" " -f2); the agent (pid $agent) runs with $(grep Umask /proc/$agent/status | tr -d "\t"), its commands with umask $(umask); unit byoh-agent: $(systemctl show byoh-agent -p UMask -p ProtectHome -p RestrictSUIDSGID -p ProtectClock | tr "\n" " ")"'
"#;

fn main() -> ExitCode {
    let Some(rt) = ns::enter("bootsman-unit-vm") else {
        return ExitCode::FAILURE;
    };
    match rt.block_on(run()) {
        Ok(()) => {
            println!("bootsman-unit-vm: every step passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bootsman-unit-vm: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Seconds of each step and QEMU's memory, for `unit-vm.json`.
#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    boot_to_available_seconds: f64,
    bootstrap_seconds: f64,
    release_seconds: f64,
    qemu_peak_rss_mib: u64,
    bootstrap_message: String,
    ok: bool,
}

async fn run() -> Result<()> {
    let p = Progress::new();
    let image = VmImage::locate()?;
    p.say(&format!("VM image {}", image.dir.display()));
    let site = Site::up(SitePlan::new(0, 0), &p).await?;
    let mut summary = Summary::default();
    let result = steps(&site, &image, &p, &mut summary).await;
    summary.ok = result.is_ok();
    write_summary(&summary);
    result
}

fn write_summary(summary: &Summary) {
    let root = bootsman_testenv::repo_root();
    let dir = root.canonicalize().unwrap_or(root).join("target/e2e");
    let path = dir.join("unit-vm.json");
    let text = serde_json::to_string_pretty(summary).unwrap_or_default();
    if std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, &text))
        .is_ok()
    {
        println!("    wrote {}:\n{text}", path.display());
    }
}

async fn steps(site: &Site, image: &VmImage, p: &Progress, summary: &mut Summary) -> Result<()> {
    let lab = &site.lab;
    let token = site.host_token(NAME)?;
    let kubeconfig = lab.dir().join("bootstrap-kubeconfig");
    std::fs::write(&kubeconfig, token).map_err(|e| Error::Command {
        what: format!("write {}", kubeconfig.display()),
        detail: e.to_string(),
    })?;
    let deb = bootsman_lab::site::agent_package()?;
    let deb_name = deb
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let script = format!(
        "dpkg -i /seed/{deb_name}
install -m 0600 /seed/bootstrap-kubeconfig /etc/byoh-agent/bootstrap-kubeconfig
sed -i 's|^BYOH_AGENT_ARGS=.*|BYOH_AGENT_ARGS=\"--namespace {POOL} --name {NAME} \
--bootstrap-kubeconfig /etc/byoh-agent/bootstrap-kubeconfig --heartbeat-interval 5s\"|' \
/etc/byoh-agent/byoh-agent.env
systemctl enable byoh-agent
# Not waited for: the unit is ordered after network-online.target, which waits for this one.
systemctl start --no-block byoh-agent
echo 'seed: byoh-agent installed, enabled and started'"
    );
    let files: [&Path; 2] = [&deb, &kubeconfig];
    let vm = Vm::boot(lab, image, VM_NUMBER, NAME, &files, &script)?;
    p.say(&format!(
        "VM {NAME} booting at {} (QEMU, TCG; console {})",
        vm.address(),
        vm.dir().join("console.log").display()
    ));
    let peak = std::sync::atomic::AtomicU64::new(0);
    let sample = || {
        let rss = vm.rss_kib().unwrap_or(0) / 1024;
        peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
    };

    // 1. install: systemd boots, the seed installs the package, the unit enrols the host.
    let step = p.secs();
    let r = async {
        vm.wait_console("seed: byoh-agent installed", BOOT_TIMEOUT)
            .await?;
        p.say("systemd booted; dpkg installed byoh-agent; its unit is enabled and started");
        wait_host(site, "Available", BOOT_TIMEOUT, &|_| Ok(()), &sample).await
    }
    .await;
    summary.boot_to_available_seconds = p.secs() - step;
    fail_with_console(r, &vm)?;
    p.say(&format!(
        "ByoHost {NAME} Available: enrolled and heartbeating through its unit ({:.0}s from boot)",
        summary.boot_to_available_seconds
    ));

    // 2. bootstrap: a Machine claims the host; its checks run under the unit.
    let step = p.secs();
    site.kubectl(
        None,
        &["apply", "-f", &write_machine(lab.dir())?.display().to_string()],
    )?;
    let r = wait_host(site, "Provisioned", STEP_TIMEOUT, &bootstrap_failed, &sample).await;
    summary.bootstrap_seconds = p.secs() - step;
    let host = fail_with_console(r, &vm)?;
    summary.bootstrap_message = condition(&host, "BootstrapSucceeded")
        .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    // The agent really runs under the unit's UMask=0077, and its commands with 022.
    let wanted = [
        "bootstrap checks passed",
        "runs with Umask:0077",
        "commands with umask 0022",
        "UMask=0077",
    ];
    if !wanted.iter().all(|w| summary.bootstrap_message.contains(w)) {
        return Err(Error::Command {
            what: "the bootstrap's checks".into(),
            detail: format!("BootstrapSucceeded says: {}", summary.bootstrap_message),
        });
    }
    p.say(&format!(
        "bootstrap under the unit succeeded in {:.0}s: {}",
        summary.bootstrap_seconds,
        summary.bootstrap_message.replace('\n', " | ")
    ));

    // 3. release: the Machine goes; the agent resets the host under its unit.
    let step = p.secs();
    site.kubectl(None, &["-n", POOL, "delete", "machine", NAME, "--wait=false"])?;
    let r = wait_host(
        site,
        "Available",
        STEP_TIMEOUT,
        &|h| match condition(h, "CleanupSucceeded") {
            Some(c) if c["status"] == "True" => Ok(()),
            _ => Err("no CleanupSucceeded yet".into()),
        },
        &sample,
    )
    .await;
    summary.release_seconds = p.secs() - step;
    fail_with_console(r, &vm)?;
    p.say(&format!(
        "Machine deleted: the host reset under its unit and is Available again ({:.0}s)",
        summary.release_seconds
    ));
    sample();
    summary.qemu_peak_rss_mib = peak.load(std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// On an error, adds the end of the VM's console (its journal) to it.
fn fail_with_console<T>(r: Result<T>, vm: &Vm) -> Result<T> {
    r.map_err(|e| Error::Command {
        what: e.to_string(),
        detail: format!("VM console (last 60 lines):\n{}", vm.console_tail(60)),
    })
}

/// A condition of a ByoHost by type.
fn condition<'a>(h: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    h.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// A failed bootstrap stops the wait at once, with the output tail the agent reported.
fn bootstrap_failed(h: &DynamicObject) -> std::result::Result<(), String> {
    match condition(h, "BootstrapSucceeded") {
        Some(c) if c["status"] == "False" && c["reason"] != "WaitingForBootstrap" => Err(format!(
            "FAILED {}: {}",
            c["reason"].as_str().unwrap_or_default(),
            c["message"].as_str().unwrap_or_default()
        )),
        _ => Ok(()),
    }
}

/// Waits until the VM's ByoHost is in `phase` and `check` passes; a `check` error starting
/// with `FAILED` ends the wait at once.
async fn wait_host(
    site: &Site,
    phase: &str,
    timeout: Duration,
    check: &dyn Fn(&DynamicObject) -> std::result::Result<(), String>,
    sample: &dyn Fn(),
) -> Result<DynamicObject> {
    let api = Api::<DynamicObject>::namespaced_with(site.client().await, POOL, &byohost_resource());
    until(&format!("ByoHost {NAME} {phase}"), timeout, || async {
        sample();
        site.check_controllers()?;
        let Some(h) = api.get_opt(NAME).await.map_err(|e| Error::Command {
            what: format!("read ByoHost {NAME}"),
            detail: e.to_string(),
        })?
        else {
            return Ok(Err("no ByoHost yet".into()));
        };
        if let Err(why) = check(&h) {
            if why.starts_with("FAILED") {
                return Err(Error::Command {
                    what: format!("ByoHost {NAME}"),
                    detail: why,
                });
            }
            return Ok(Err(why));
        }
        let seen = h.data["status"]["phase"].as_str().unwrap_or("-").to_string();
        Ok(if seen == phase {
            Ok(h)
        } else {
            Err(format!("phase {seen}"))
        })
    })
    .await
}

/// A Cluster of its own for the VM's Machine: the Cluster and ByoCluster, the bootstrap data
/// Secret, and a worker Machine with its ByoMachine, as Cluster API has them. Returns the file.
fn write_machine(dir: &Path) -> Result<PathBuf> {
    let endpoint = bootsman_lab::net::endpoint(9).to_string();
    let ns = POOL;
    let objects = [
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": {
                "controlPlaneEndpoint": {"host": endpoint, "port": 6443},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "ByoCluster", "name": NAME}}}),
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoCluster",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": {"controlPlaneEndpoint": {"host": endpoint, "port": 6443}}}),
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{NAME}-bootstrap"), "namespace": ns},
            "stringData": {"value": BOOTSTRAP, "format": "cloud-config"}}),
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": NAME, "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": NAME}},
            "spec": {
                "clusterName": NAME,
                "bootstrap": {"dataSecretName": format!("{NAME}-bootstrap")},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "ByoMachine", "name": NAME}}}),
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoMachine",
            "metadata": {"name": NAME, "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": NAME}},
            "spec": {}}),
    ];
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let path = dir.join("vm-machine.json");
    std::fs::write(&path, list.to_string()).map_err(|e| Error::Command {
        what: format!("write {}", path.display()),
        detail: e.to_string(),
    })?;
    Ok(path)
}
