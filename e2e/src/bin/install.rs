//! `bootsman-e2e-install`: `bootsmanctl install` on lab hosts, as a platform team runs it, and
//! interrupted the hard way (`hack/e2e.sh` runs it after `bootsman-e2e`).
//!
//! 1. **bootstrap**: the lab network and registry, HAProxy at the infrastructure cluster's
//!    endpoint (the site's load balancer), and a Site whose bootstrap side is the lab gateway;
//!    `bootsmanctl install -f site.yaml` starts `lab-control-plane` and prints a command per host.
//! 2. **enrol**: three lab hosts install `byoh-agent` from the project's `.deb` with the
//!    bootstrap kubeconfig `install` wrote for each; `install` labels them as the Site says.
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
//! 6. **stop**: SIGTERM stops `install` cleanly; nothing listens at the bootstrap address.
//!
//! It writes `target/e2e/install.json`: the seconds of each phase. Exit code 0 only when every
//! phase passed.

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
/// The bootstrap API server's port on the lab gateway.
const BOOTSTRAP_PORT: u16 = 6443;

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
        .enumerate()
        .map(|(i, name)| {
            json!({
                "name": name,
                "address": net::host_address(u8::try_from(i + 1).unwrap_or(1)).to_string(),
                "labels": {"bootsman.io/infrastructure": "true"},
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
    for (i, name) in HOSTS.iter().enumerate() {
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
        "3 lab hosts installed byoh-agent from the .deb with the printed tokens; labelled".into(),
    );

    let t = Instant::now();
    install
        .wait_for("control plane 1/3 ready", Duration::from_secs(900))
        .await?;
    install
        .child
        .kill()
        .map_err(bootsman_lab::error::io("kill -9", &install.log))?;
    let _ = install.child.wait();
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect((net::GATEWAY, BOOTSTRAP_PORT)).is_ok() {
        if Instant::now() > deadline {
            return Err(fail(
                "the bootstrap API server outlived a kill -9 of install".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
        .wait_for("the next step (the pivot", Duration::from_secs(900))
        .await?;
    let detail = check_controllers(&infra).await?;
    phase("controllers", t, detail);

    let t = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &install.child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Ok(Some(s)) = install.child.try_wait() {
            break s;
        }
        if Instant::now() > deadline {
            return Err(fail("install did not stop within 60s of SIGTERM".into()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !status.success() || std::net::TcpStream::connect((net::GATEWAY, BOOTSTRAP_PORT)).is_ok() {
        return Err(fail(format!(
            "install exited with {status} on SIGTERM, or its API server still answers"
        )));
    }
    phase(
        "stop",
        t,
        "SIGTERM: install exited 0 and stopped everything it started".into(),
    );
    drop(hosts);
    drop(lb);
    Ok(())
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
