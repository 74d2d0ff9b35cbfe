//! `bootsman-e2e-install`: `bootsmanctl install` on lab hosts, as a platform team runs it, and
//! interrupted the hard way (`hack/e2e.sh` runs it after `bootsman-e2e`).
//!
//! 1. **bootstrap**: the lab network and registry, HAProxy at the infrastructure cluster's
//!    endpoint (the site's load balancer), and a Site whose bootstrap side is the lab gateway;
//!    `bootsmanctl install -f site.yaml` starts `lab-control-plane` and prints a command per host.
//! 2. **enrol**: six lab hosts (three for the infrastructure cluster, three free) install
//!    `byoh-agent` from the project's `.deb` with the bootstrap kubeconfig `install` wrote for
//!    each; `install` labels them as the Site says.
//! 3. **kill**: while the infrastructure cluster is being built (once its first control-plane
//!    machine is ready), `install` gets SIGKILL: everything it started dies with it. Then a
//!    second `install` restarts the bootstrap side from the state folder (same CA: the agents
//!    reconnect) and continues.
//! 4. **infrastructure**: the infrastructure cluster `lab-infra` becomes `Ready`, checked through
//!    its own kubeconfig, not its status: three control-plane Nodes `Ready`, none tainted
//!    `NoSchedule` (Cluster API and Bootsman will run on them).
//! 5. **controllers**: Cluster API's managers and Bootsman's controllers run as Pods in
//!    `lab-infra` from images in the lab registry (pushed first, as a site mirrors them): every
//!    Deployment Available, and Cluster API's validating webhook answers through its Service.
//! 6. **pivot**: `install` pauses the bootstrap side, saves the pool's objects and moves them
//!    into `lab-infra`; once they are saved it gets SIGKILL again, and the next `install`
//!    continues without starting the bootstrap side's Bootsman controllers. Once it has verified
//!    the pivot it is killed a third time; a fourth `install` tears the bootstrap side down and
//!    exits 0. Checked from outside: nothing listens at the bootstrap address and its folder is
//!    gone; through `lab-infra`, the six ByoHosts are there with the bindings the bootstrap side
//!    had, each host's Lease renewed there, the Machines and Nodes of `lab-infra` the same as
//!    before (no host was reset or rebuilt). A fifth `install` says the site is installed,
//!    starts nothing here and refreshes the controllers (their webhook certificates issued anew).
//! 7. **child**: a BootsmanCluster `lab-apps` applied to the infrastructure cluster is built by
//!    its Pods from the three free hosts (re-homed by the pivot): three schedulable
//!    control-plane Nodes `Ready` through its own kubeconfig, each host bound exactly once.
//!
//! It writes `target/e2e/install.json`: the seconds of each phase, the objects moved and the
//! hosts re-homed. Exit code 0 only when every phase passed.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use bootsman_lab::lb::LoadBalancer;
use bootsman_lab::registry::Registry;
use bootsman_lab::site::{DISK_RESERVE, Progress, agent_package};
use bootsman_lab::{Error, Lab, LabHost, Result, net, ns};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

/// The Site's name.
const SITE: &str = "lab";
/// The pool the hosts enrol into.
const POOL: &str = "bootsman-hosts";
/// The infrastructure hosts.
const HOSTS: [&str; 3] = ["infra-1", "infra-2", "infra-3"];
/// The free hosts, for a child cluster once the site is installed.
const FREE: [&str; 3] = ["apps-1", "apps-2", "apps-3"];
/// The child cluster built from the free hosts.
const CHILD: &str = "lab-apps";
/// The bootstrap API server's port on the lab gateway.
const BOOTSTRAP_PORT: u16 = 6443;
/// What install prints when it starts the bootstrap side once the pivot has begun.
const CONTROLLERS_STAY_STOPPED: &str = "bootsman-provider and bootsman-operator stay stopped here";

/// Whether the bootstrap API server still accepts connections on the lab gateway.
fn bootstrap_answers() -> bool {
    std::net::TcpStream::connect((net::GATEWAY, BOOTSTRAP_PORT)).is_ok()
}

/// Waits up to 15 s for the bootstrap API server's port to close: a killed process that is still
/// writing to a busy disk keeps its listening socket until the kernel has finished it. `Err`
/// says what still listens there.
async fn bootstrap_gone(after: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while bootstrap_answers() {
        if Instant::now() > deadline {
            let listens = Command::new("ss")
                .args(["-ltnp", &format!("sport = :{BOOTSTRAP_PORT}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| format!("(ss: {e})"));
            return Err(fail(format!(
                "the bootstrap API server outlived {after} by 15 s; listening:\n{listens}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn main() -> ExitCode {
    let Some(rt) = ns::enter("bootsman-e2e-install") else {
        return ExitCode::FAILURE;
    };
    rt.block_on(async {
        let out = bootsman_testenv::repo_root().join("target/e2e");
        let _ = std::fs::create_dir_all(&out);
        let out = out.canonicalize().unwrap_or(out);
        let mut phases = Vec::new();
        let result = run(&mut phases).await;
        let summary = json!({
            "ok": result.is_ok(),
            "error": result.as_ref().err().map(ToString::to_string),
            "phases": phases,
        });
        let path = out.join("install.json");
        let _ = std::fs::write(&path, serde_json::to_vec_pretty(&summary).unwrap_or_default());
        println!("\nsummary: {}", path.display());
        match result {
            Ok(()) => {
                println!("bootsman-e2e-install: every phase passed");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("\nbootsman-e2e-install: FAILED: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// A running `bootsmanctl install`, killed when dropped.
struct Install {
    child: Child,
    log: PathBuf,
}

impl Install {
    fn start(lab: &Lab, site: &Path, log: PathBuf) -> Result<Install> {
        let bundle = bootsman_testenv::Testbin::locate()?.dir.clone();
        let chart = bootsman_testenv::repo_root().join("charts/bootsman");
        let chart = chart.canonicalize().unwrap_or(chart);
        let file = std::fs::File::create(&log).map_err(bootsman_lab::error::io("create", &log))?;
        let err = file.try_clone().map_err(bootsman_lab::error::io("open", &log))?;
        let child = Command::new(lab.exe_dir().join("bootsmanctl"))
            .arg("install")
            .arg("-f")
            .arg(site)
            .arg("--bundle")
            .arg(&bundle)
            .arg("--chart")
            .arg(chart)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(bootsman_lab::error::io("start bootsmanctl install", &log))?;
        Ok(Install { child, log })
    }

    /// Waits until the install's output holds `text`; fails with the output when it exits first
    /// or after `timeout`.
    async fn wait_for(&mut self, text: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = std::fs::read_to_string(&self.log).unwrap_or_default();
            if now.contains(text) {
                return Ok(now);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(fail(format!(
                    "bootsmanctl install exited ({status}) before printing {text:?}; its output:\n{now}"
                )));
            }
            if Instant::now() > deadline {
                return Err(fail(format!(
                    "no {text:?} from bootsmanctl install within {}s; its output:\n{}",
                    timeout.as_secs(),
                    tail(&now, 40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Install {
    /// Waits for the install to exit by itself within `timeout`.
    async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let now = std::fs::read_to_string(&self.log).unwrap_or_default();
                return Err(fail(format!(
                    "bootsmanctl install did not exit within {}s; its output:\n{}",
                    timeout.as_secs(),
                    tail(&now, 20)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fail(detail: String) -> Error {
    Error::Command {
        what: "bootsmanctl install".into(),
        detail,
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The Site of the lab: the bootstrap side on the lab gateway, the lab registry, three hosts
/// labelled for the infrastructure cluster, HAProxy at its endpoint, and what lab hosts need
/// (cgroup v1, no conntrack changes, absolute disk thresholds).
fn site_file(lab: &Lab) -> Result<PathBuf> {
    let hosts: Vec<_> = HOSTS
        .iter()
        .chain(FREE.iter())
        .enumerate()
        .map(|(i, name)| {
            let labels = if i < HOSTS.len() {
                json!({"bootsman.io/infrastructure": "true"})
            } else {
                json!({"bootsman.io/role": "apps"})
            };
            json!({
                "name": name,
                "address": net::host_address(u8::try_from(i + 1).unwrap_or(1)).to_string(),
                "labels": labels,
            })
        })
        .collect();
    let site = json!({
        "apiVersion": "bootsman.io/v1alpha1",
        "kind": "Site",
        "metadata": {"name": SITE},
        "spec": {
            "bootstrap": {
                "address": net::GATEWAY.to_string(),
                "port": BOOTSTRAP_PORT,
                "stateDir": lab.dir().join("site"),
            },
            "registry": net::registry(),
            "pool": POOL,
            "hosts": hosts,
            "infrastructure": {
                "kubernetesVersion": lab.labbin().kubernetes_version,
                "controlPlane": {
                    "replicas": 3,
                    "hostLabels": {"bootsman.io/infrastructure": "true"},
                    "endpoint": {"host": net::endpoint(0).to_string(), "port": 6443, "loadBalancer": "external"},
                },
                "network": {
                    "podCIDR": "10.244.0.0/16",
                    "serviceCIDR": "10.96.0.0/12",
                    "kubeProxy": {"conntrackMaxPerCore": 0},
                },
                "nodes": {
                    "allowCgroupV1": true,
                    "kubelet": {
                        "evictionHard": {"nodefs.available": DISK_RESERVE, "imagefs.available": DISK_RESERVE},
                        "imageGCHighThresholdPercent": 100,
                        "imageGCLowThresholdPercent": 95,
                    },
                },
            },
        },
    });
    let path = lab.dir().join("site.yaml");
    let text = serde_json::to_string_pretty(&site).unwrap_or_default();
    std::fs::write(&path, text).map_err(bootsman_lab::error::io("write", &path))?;
    Ok(path)
}

async fn run(phases: &mut Vec<serde_json::Value>) -> Result<()> {
    let p = Progress::new();
    let mut phase = |name: &str, t: Instant, detail: String| {
        p.say(&format!("{name}: {detail} ({:.0}s)", t.elapsed().as_secs_f64()));
        phases.push(json!({"name": name, "seconds": t.elapsed().as_secs_f64(), "detail": detail}));
    };

    let t = Instant::now();
    let lab = Lab::create()?;
    let registry = Registry::start(&lab)?;
    push_images(&lab, &registry)?;
    let backends: Vec<(String, Ipv4Addr)> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                (*n).to_string(),
                net::host_address(u8::try_from(i + 1).unwrap_or(1)),
            )
        })
        .collect();
    let lb = LoadBalancer::start(&lab, net::endpoint(0), 6443, &backends)?;
    let site = site_file(&lab)?;
    let state = lab.dir().join("site");
    let mut install = Install::start(&lab, &site, lab.dir().join("install-1.log"))?;
    install
        .wait_for("waiting for 3 infrastructure hosts", Duration::from_secs(300))
        .await?;
    phase(
        "bootstrap",
        t,
        format!(
            "lab-control-plane serving at {}:{BOOTSTRAP_PORT}; output in {}",
            net::GATEWAY,
            install.log.display()
        ),
    );

    let t = Instant::now();
    let deb = agent_package()?;
    let mut hosts = Vec::new();
    for (i, name) in HOSTS.iter().chain(FREE.iter()).enumerate() {
        let n = u8::try_from(i + 1).unwrap_or(1);
        let host = LabHost::boot(&lab, n, name)?;
        let kc_path = state.join(format!("enrol/{name}.kubeconfig"));
        let kubeconfig =
            std::fs::read_to_string(&kc_path).map_err(bootsman_lab::error::io("read", &kc_path))?;
        host.install_agent(
            &deb,
            &kubeconfig,
            &format!(
                "--namespace {POOL} --name {name} --bootstrap-kubeconfig /etc/byoh-agent/bootstrap-kubeconfig \
                 --heartbeat-interval 5s"
            ),
        )?;
        hosts.push(host);
    }
    install
        .wait_for(
            "3 of 3 infrastructure hosts enrolled and labelled",
            Duration::from_secs(300),
        )
        .await?;
    phase(
        "enrol",
        t,
        "6 lab hosts installed byoh-agent from the .deb with the printed tokens; the 3 infrastructure hosts \
         labelled"
            .into(),
    );

    let t = Instant::now();
    install
        .wait_for("control plane 1/3 ready", Duration::from_secs(900))
        .await?;
    kill(&mut install).await?;
    let mut install = Install::start(&lab, &site, lab.dir().join("install-2.log"))?;
    install
        .wait_for(
            "restarted from its saved state: lab-control-plane",
            Duration::from_secs(300),
        )
        .await?;
    phase(
        "kill",
        t,
        "install killed (SIGKILL) with 1 of 3 control-plane machines ready; nothing left listening; the next \
         install restarted the bootstrap side from its state folder"
            .into(),
    );

    let t = Instant::now();
    let out = install
        .wait_for("lab-infra Ready: Nodes", Duration::from_secs(1200))
        .await?;
    let kubeconfig = state.join("infrastructure.kubeconfig");
    let infra = client(&kubeconfig).await?;
    let nodes = Api::<Node>::all(infra.clone())
        .list(&ListParams::default())
        .await
        .map_err(bootsman_lab::error::kube(
            "list the infrastructure cluster's Nodes",
        ))?;
    let mut ready = Vec::new();
    for n in &nodes.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        let is_ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let no_schedule: Vec<String> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.effect == "NoSchedule")
            .map(|t| t.key)
            .collect();
        if !no_schedule.is_empty() {
            return Err(fail(format!(
                "Node {name} is tainted NoSchedule ({}): the infrastructure cluster's control plane must take workloads",
                no_schedule.join(", ")
            )));
        }
        if is_ready {
            ready.push(name);
        }
    }
    if ready.len() != 3 {
        return Err(fail(format!(
            "the infrastructure cluster has {} Ready Nodes ({}), not 3; install said:\n{}",
            ready.len(),
            ready.join(", "),
            tail(&out, 20)
        )));
    }
    phase(
        "infrastructure",
        t,
        format!(
            "lab-infra Ready; through its own kubeconfig: Nodes {} Ready, none tainted NoSchedule",
            ready.join(", ")
        ),
    );

    let t = Instant::now();
    install
        .wait_for("every Deployment Available", Duration::from_secs(900))
        .await?;
    let detail = check_controllers(&infra).await?;
    phase("controllers", t, detail);

    let t = Instant::now();
    let boot_kubeconfig = state.join("bootstrap/admin.kubeconfig");
    let source = client(&boot_kubeconfig).await?;
    let before = bindings(&source).await?;
    let infra_machines = machines(&source).await?;
    let infra_nodes = node_uids(&infra).await?;
    install.wait_for("saved to", Duration::from_secs(600)).await?;
    kill(&mut install).await?;
    let mut install = Install::start(&lab, &site, lab.dir().join("install-3.log"))?;
    install
        .wait_for(CONTROLLERS_STAY_STOPPED, Duration::from_secs(300))
        .await?;
    // Ctrl-C in the middle of the pivot: a clean stop, and the next install goes on.
    let _ = Command::new("kill")
        .args(["-TERM", &install.child.id().to_string()])
        .status();
    let status = install.wait_exit(Duration::from_secs(60)).await?;
    if !status.success() {
        return Err(fail(format!("install exited with {status} on SIGTERM")));
    }
    bootstrap_gone("install's exit on SIGTERM").await?;
    let mut install = Install::start(&lab, &site, lab.dir().join("install-3b.log"))?;
    install
        .wait_for(CONTROLLERS_STAY_STOPPED, Duration::from_secs(300))
        .await?;
    let verified = install
        .wait_for("objects moved, ", Duration::from_secs(900))
        .await?;
    kill(&mut install).await?;
    let line = verified
        .lines()
        .find(|l| l.contains("objects moved, "))
        .unwrap_or_default()
        .to_string();
    let mut install = Install::start(&lab, &site, lab.dir().join("install-4.log"))?;
    install.wait_for("is installed", Duration::from_secs(600)).await?;
    let status = install.wait_exit(Duration::from_secs(30)).await?;
    if !status.success() {
        return Err(fail(format!(
            "the install that finished the pivot exited with {status}"
        )));
    }
    if bootstrap_answers() || state.join("bootstrap").exists() {
        return Err(fail(
            "after the teardown the bootstrap API server still answers, or its folder is still there".into(),
        ));
    }
    let after = bindings(&infra).await?;
    if after != before {
        return Err(fail(format!(
            "the hosts' bindings changed in the pivot: before {before:?}, after {after:?}"
        )));
    }
    let rehomed = leases_renewed(&infra, &after).await?;
    if machines(&infra).await? != infra_machines || node_uids(&infra).await? != infra_nodes {
        return Err(fail(
            "lab-infra's Machines or Nodes changed in the pivot: a host was reset or rebuilt".into(),
        ));
    }
    let mut again = Install::start(&lab, &site, lab.dir().join("install-5.log"))?;
    again
        .wait_for("nothing else to do", Duration::from_secs(300))
        .await?;
    let status = again.wait_exit(Duration::from_secs(30)).await?;
    if !status.success() {
        return Err(fail(format!("install of an installed site exited with {status}")));
    }
    let (objects, moved_hosts) = numbers(&line);
    phase(
        "pivot",
        t,
        format!(
            "killed (SIGKILL) once the objects were saved, stopped (SIGTERM, exit 0) on the next start, killed \
             again once the pivot was verified; the next install tore the bootstrap side down and exited 0. {objects} objects moved, {moved_hosts} hosts re-homed \
             (Leases renewed on lab-infra: {rehomed}); bindings as before ({}); lab-infra's Machines and Nodes \
             unchanged; a further install starts nothing here and refreshes the controllers",
            after
                .iter()
                .map(|(h, m)| format!("{h}→{}", m.as_deref().unwrap_or("free")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );

    let t = Instant::now();
    let free: Vec<(String, Ipv4Addr)> = FREE
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                (*n).to_string(),
                net::host_address(u8::try_from(HOSTS.len() + i + 1).unwrap_or(1)),
            )
        })
        .collect();
    let child_lb = LoadBalancer::start(&lab, net::endpoint(1), 6443, &free)?;
    let detail = child_cluster(&lab, &infra).await?;
    phase("child", t, detail);
    if let Some(e) = phases.iter_mut().find(|e| e["name"] == "pivot") {
        e["objectsMoved"] = json!(objects);
        e["hostsRehomed"] = json!(moved_hosts);
    }
    drop(child_lb);
    drop(hosts);
    drop(lb);
    Ok(())
}

/// SIGKILL to `install`; fails when its bootstrap API server outlives it.
async fn kill(install: &mut Install) -> Result<()> {
    install
        .child
        .kill()
        .map_err(bootsman_lab::error::io("kill -9", &install.log))?;
    let _ = install.child.wait();
    bootstrap_gone("a kill -9 of install").await
}

/// The numbers of `verified: N objects moved, M hosts re-homed, …`.
fn numbers(line: &str) -> (u64, u64) {
    let after = line.split("verified:").nth(1).unwrap_or_default();
    let mut n = after
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .filter_map(|w| w.parse::<u64>().ok());
    (n.next().unwrap_or(0), n.next().unwrap_or(0))
}

/// Host → the ByoMachine it is bound to, in the pool.
async fn bindings(client: &kube::Client) -> Result<std::collections::BTreeMap<String, Option<String>>> {
    use bootsman_api::v1beta1::ByoHost;
    let list = Api::<ByoHost>::namespaced(client.clone(), POOL)
        .list(&ListParams::default())
        .await
        .map_err(bootsman_lab::error::kube("list the pool's ByoHosts"))?;
    Ok(list
        .items
        .into_iter()
        .map(|h| {
            let m = h.spec.machine_ref.map(|r| r.name);
            (h.metadata.name.unwrap_or_default(), m)
        })
        .collect())
}

/// Sorted names of the Machines in the pool.
async fn machines(client: &kube::Client) -> Result<Vec<String>> {
    let list = Api::<bootsman_api::capi::Machine>::namespaced(client.clone(), POOL)
        .list(&ListParams::default())
        .await
        .map_err(bootsman_lab::error::kube("list the pool's Machines"))?;
    let mut n: Vec<String> = list.items.into_iter().filter_map(|m| m.metadata.name).collect();
    n.sort();
    Ok(n)
}

/// Node name → uid (a Node that re-joined after a reset has a new uid).
async fn node_uids(client: &kube::Client) -> Result<std::collections::BTreeMap<String, String>> {
    let list = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(bootsman_lab::error::kube("list the Nodes"))?;
    Ok(list
        .items
        .into_iter()
        .map(|n| {
            (
                n.metadata.name.unwrap_or_default(),
                n.metadata.uid.unwrap_or_default(),
            )
        })
        .collect())
}

/// How many of `hosts` have a Lease renewed in the last minute in the pool of `client`; fails
/// naming those without.
async fn leases_renewed(
    client: &kube::Client,
    hosts: &std::collections::BTreeMap<String, Option<String>>,
) -> Result<usize> {
    use k8s_openapi::api::coordination::v1::Lease;
    let api: Api<Lease> = Api::namespaced(client.clone(), POOL);
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut stale = Vec::new();
    for h in hosts.keys() {
        let renewed = api
            .get_opt(h)
            .await
            .map_err(bootsman_lab::error::kube(format!("read the Lease of {h}")))?
            .and_then(|l| l.spec?.renew_time)
            .is_some_and(|t| now.duration_since(t.0).as_secs() < 60);
        if !renewed {
            stale.push(h.clone());
        }
    }
    if !stale.is_empty() {
        return Err(fail(format!(
            "no Lease renewed on lab-infra in the last minute for {}",
            stale.join(", ")
        )));
    }
    Ok(hosts.len())
}

/// Applies the BootsmanCluster [`CHILD`] to the infrastructure cluster, on the free hosts, and
/// waits until its three Nodes are `Ready` through its own kubeconfig.
async fn child_cluster(lab: &Lab, infra: &kube::Client) -> Result<String> {
    use bootsman_api::v1alpha1::BootsmanCluster;
    use kube::api::{Patch, PatchParams};
    let body = json!({
        "apiVersion": "bootsman.io/v1alpha1",
        "kind": "BootsmanCluster",
        "metadata": {"name": CHILD, "namespace": POOL},
        "spec": {
            "kubernetesVersion": lab.labbin().kubernetes_version,
            "imageRepository": net::registry(),
            "controlPlane": {
                "replicas": 3,
                "schedulable": true,
                "hostSelector": {"matchLabels": {"bootsman.io/role": "apps"}},
                "endpoint": {"host": net::endpoint(1).to_string(), "port": 6443, "loadBalancer": "external"},
            },
            "workers": [{"name": "default", "replicas": 0}],
            "network": {
                "cni": "kube-router",
                "podCIDR": "10.245.0.0/16",
                "serviceCIDR": "10.112.0.0/12",
                "kubeProxy": {"conntrackMaxPerCore": 0},
            },
            "storage": {"longhorn": {"enabled": false}},
            "ingress": {"nginx": {"enabled": false}},
            "nodes": {
                "allowCgroupV1": true,
                "kubelet": {
                    "evictionHard": {"nodefs.available": DISK_RESERVE, "imagefs.available": DISK_RESERVE},
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 95,
                },
            },
        },
    });
    let api: Api<BootsmanCluster> = Api::namespaced(infra.clone(), POOL);
    api.patch(
        CHILD,
        &PatchParams::apply("bootsman-e2e-install").force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(bootsman_lab::error::kube(format!(
        "apply BootsmanCluster {POOL}/{CHILD}"
    )))?;
    let deadline = Instant::now() + Duration::from_secs(1200);
    let secret = loop {
        let bc = api.get(CHILD).await.map_err(bootsman_lab::error::kube(format!(
            "read BootsmanCluster {POOL}/{CHILD}"
        )))?;
        let status = bc.status.unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready && let Some(s) = status.kubeconfig_secret.clone() {
            break s;
        }
        if Instant::now() > deadline {
            return Err(fail(format!(
                "{CHILD} not Ready within 1200s on the infrastructure cluster: {:?}",
                status.conditions
            )));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let data = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(infra.clone(), POOL)
        .get(&secret)
        .await
        .map_err(bootsman_lab::error::kube(format!("read Secret {POOL}/{secret}")))?
        .data
        .and_then(|mut d| d.remove("value"))
        .ok_or_else(|| fail(format!("Secret {POOL}/{secret} has no key value")))?;
    let path = lab.dir().join(format!("{CHILD}.kubeconfig"));
    std::fs::write(&path, &data.0).map_err(bootsman_lab::error::io("write", &path))?;
    let (control_plane, workers) = bootsman_lab::demo::ready_nodes(&path).await?;
    if control_plane != 3 || workers != 0 {
        return Err(fail(format!(
            "{CHILD} has {control_plane} control-plane and {workers} worker Nodes Ready through its own kubeconfig, \
             not 3 and 0"
        )));
    }
    let bound = bindings(infra).await?;
    let mut used: Vec<&str> = bound
        .iter()
        .filter(|(h, m)| FREE.contains(&h.as_str()) && m.is_some())
        .map(|(h, _)| h.as_str())
        .collect();
    used.sort_unstable();
    let machines: std::collections::BTreeSet<&str> = bound.values().filter_map(|m| m.as_deref()).collect();
    if used != FREE || machines.len() != bound.values().filter(|m| m.is_some()).count() {
        return Err(fail(format!(
            "{CHILD} should hold exactly the free hosts, each bound once; bindings: {bound:?}"
        )));
    }
    Ok(format!(
        "BootsmanCluster {CHILD} applied to lab-infra: built by its Pods from {}; 3 control-plane Nodes Ready \
         through its own kubeconfig; each host bound exactly once",
        FREE.join(", ")
    ))
}

/// The images the infrastructure cluster runs besides the Kubernetes ones the lab has: Cluster
/// API's three managers (from the bundle's programs) and Bootsman's two controllers (from this
/// workspace), under the names and tags `install` asks for.
fn push_images(lab: &Lab, registry: &Registry) -> Result<()> {
    let bundle = bootsman_testenv::Testbin::locate()?;
    let version = bundle.capi_version()?;
    for m in &bootsman_controlplane::capi::MANAGERS {
        registry.push_program(
            lab,
            &format!("{}:{version}", m.image),
            &bundle.bin(m.binary),
            Some(65532),
        )?;
    }
    let chart = bootsman_testenv::repo_root().join("charts/bootsman/Chart.yaml");
    let text = std::fs::read_to_string(&chart).map_err(bootsman_lab::error::io("read", &chart))?;
    let tag = text
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .ok_or_else(|| fail(format!("{} has no appVersion", chart.display())))?;
    for bin in ["bootsman-provider", "bootsman-operator"] {
        registry.push_program(
            lab,
            &format!("bootsman-io/{bin}:{tag}"),
            &lab.exe_dir().join(bin),
            Some(65532),
        )?;
    }
    Ok(())
}

/// Through the infrastructure cluster's own API: every Deployment of Cluster API and Bootsman is
/// Available, and Cluster API's webhooks answer through their Services (a server-side dry run of
/// an invalid Cluster is refused by name by its validating webhook).
async fn check_controllers(client: &kube::Client) -> Result<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    let mut available = Vec::new();
    for ns in [
        "capi-system",
        "capi-kubeadm-bootstrap-system",
        "capi-kubeadm-control-plane-system",
        "bootsman-system",
    ] {
        let list = Api::<Deployment>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(bootsman_lab::error::kube(format!("list the Deployments of {ns}")))?;
        if list.items.is_empty() {
            return Err(fail(format!("no Deployment in {ns}")));
        }
        for d in list.items {
            let name = d.metadata.name.clone().unwrap_or_default();
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let have = d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
            if have < want {
                return Err(fail(format!(
                    "{ns}/{name} has {have} of {want} replicas Available"
                )));
            }
            available.push(format!("{ns}/{name}"));
        }
    }
    let ar = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
    ));
    let cluster: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["10.250.0.0/16"]}}},
    }))
    .map_err(|e| fail(e.to_string()))?;
    // A Cluster without any reference is invalid: only Cluster API's validating webhook (called
    // through its Service, trusting the webhook CA) refuses it, with its own name in the answer.
    let answer = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), "default", &ar)
        .create(
            &kube::api::PostParams {
                dry_run: true,
                ..Default::default()
            },
            &cluster,
        )
        .await;
    match answer {
        Err(kube::Error::Api(s))
            if s.message
                .contains("admission webhook \"validation.cluster.cluster.x-k8s.io\"") => {}
        other => {
            return Err(fail(format!(
                "a Cluster without references should be refused by Cluster API's validating webhook; got {other:?}"
            )));
        }
    }
    Ok(format!(
        "through the infrastructure cluster's API: {} Available; Cluster API's validating webhook answers \
         through its Service",
        available.join(", ")
    ))
}

async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    bootsman_controlplane::client_from(kubeconfig)
        .await
        .map_err(|e| fail(format!("the infrastructure cluster's kubeconfig: {e}")))
}
