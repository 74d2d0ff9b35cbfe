//! `bootsman-e2e`: the end-to-end test on real nodes (`hack/e2e.sh`).
//!
//! A site on nine lab hosts (five labelled `role=control-plane`, four `role=worker`; see
//! `bootsman_lab::site`), then, each measured by reading the child cluster or the
//! infrastructure cluster, never by trusting a status that says so:
//!
//! 1. **cluster**: the sample BootsmanCluster (with the lab's changes) becomes 3 control-plane
//!    and 3 worker Nodes `Ready`, each with a `containerd://` runtime; etcd has 3 started
//!    members (asked on a control-plane host); CoreDNS runs. The child's `kubectl get nodes -o
//!    json` is written to `target/e2e/nodes.json`.
//! 2. **workload**: a Deployment of 3 replicas spread over the three workers answers through
//!    its Service, by name, from another pod.
//! 3. **isolation**: two projects' namespaces (`iso-a`, `iso-b`), each with a web pod and a
//!    client pod, and a hostNetwork pod standing in for the ingress DaemonSet. Before
//!    isolation a client reaches the other project's web pod (so a refusal later is the
//!    policy's, not a broken network); then `spec.network.isolation` lists both projects with
//!    the lab network as `hostNetworks`, the operator's ClusterResourceSet puts kube-router's
//!    NetworkPolicies in place, and: each client still reaches its own project's pod, no longer
//!    the other's, a pod of a namespace in no project reaches neither, and the hostNetwork pod
//!    reaches both.
//! 4. **scale-control-plane**: control plane 3 → 5, five control-plane Nodes and five started
//!    etcd members; then 5 → 3: three members again, and the two released hosts ran `kubeadm
//!    reset` and are `Available`.
//! 5. **scale-workers**: workers 3 → 4, a fourth worker Node is `Ready`. (The control plane goes
//!    back to 3 first: this machine's limit of 128 inotify instances per user, which no lab may
//!    raise, holds about nine nodes at once; see `summary.json`'s `peak_inotify_instances`.)
//! 6. **kill-worker**: one worker host loses all its processes and namespaces at once: its Node
//!    goes `NotReady`, its ByoHost `Offline`, and for as long as it is offline the provider hands
//!    it to no other machine (its claim stays, no other ByoMachine names it). Booted again, it
//!    rejoins as the same Node.
//! 7. **delete**: the BootsmanCluster is deleted; every host ran a real `kubeadm reset`, has no
//!    container or pod sandbox left, and is `Available` again.
//!
//! It writes `target/e2e/summary.json`: seconds and Ready Nodes after each phase, the peak
//! resident memory of the whole lab (every process below this one: control planes, hosts,
//! containers) and how it was measured. Exit code 0 only when every phase passed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bootsman_lab::demo::{child_client, condition_true, node_ready, ready_nodes};
use bootsman_lab::site::{
    DISK_RESERVE, POOL, Progress, Site, SitePlan, byohost_resource, lab_cluster, until,
};
use bootsman_lab::{Error, Result, ns};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

/// The phases after the site is up, in order.
const PHASES: [&str; 7] = [
    "cluster",
    "workload",
    "isolation",
    "scale-control-plane",
    "scale-workers",
    "kill-worker",
    "delete",
];

/// One phase's outcome, as written to `summary.json`.
#[derive(Debug, Clone, serde::Serialize)]
struct PhaseResult {
    name: String,
    seconds: f64,
    ok: bool,
    /// Ready Nodes of the child cluster when the phase ended.
    control_plane_nodes_ready: usize,
    worker_nodes_ready: usize,
    detail: String,
}

fn main() -> ExitCode {
    let Some(rt) = ns::enter("bootsman-e2e") else {
        return ExitCode::FAILURE;
    };
    rt.block_on(run())
}

async fn run() -> ExitCode {
    let out = bootsman_testenv::repo_root().join("target/e2e");
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("bootsman-e2e: create {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let out = out.canonicalize().unwrap_or(out);
    let peak = Arc::new(Peaks::default());
    let sampler = tokio::spawn(sample(peak.clone()));
    let started = Instant::now();
    let p = Progress::new();
    let mut results = Vec::new();

    heading("site: lab network, registry, infrastructure control plane, chart, controllers, 9 hosts");
    let t = Instant::now();
    let site = match Site::up(SitePlan::new(5, 4), &p).await {
        Ok(s) => s,
        Err(e) => {
            results.push(result("site", t, Err(e.to_string()), (0, 0)));
            write_summary(&out, &results, &peak, started);
            eprintln!("\nbootsman-e2e: FAILED in phase site: {e}");
            return ExitCode::FAILURE;
        }
    };
    results.push(result(
        "site",
        t,
        Ok("9 hosts enrolled and Available".into()),
        (0, 0),
    ));
    let mut e2e = E2e {
        site,
        out: out.clone(),
        p,
        ns: String::new(),
        name: String::new(),
        child: PathBuf::new(),
    };

    let mut failed = None;
    for name in PHASES {
        heading(name);
        let t = Instant::now();
        let outcome = match name {
            "cluster" => e2e.cluster().await,
            "workload" => e2e.workload().await,
            "isolation" => e2e.isolation().await,
            "scale-workers" => e2e.scale_workers().await,
            "scale-control-plane" => e2e.scale_control_plane().await,
            "kill-worker" => e2e.kill_worker().await,
            _ => e2e.delete().await,
        }
        .map_err(|e| e.to_string());
        let nodes = if e2e.child.as_os_str().is_empty() {
            (0, 0)
        } else {
            ready_nodes(&e2e.child).await.unwrap_or((0, 0))
        };
        match &outcome {
            Ok(d) => e2e.p.say(&format!(
                "PASSED {name} in {:.0}s: {d}",
                t.elapsed().as_secs_f64()
            )),
            Err(e) => eprintln!("\nFAILED {name} after {:.0}s: {e}", t.elapsed().as_secs_f64()),
        }
        let ok = outcome.is_ok();
        results.push(result(name, t, outcome, nodes));
        write_summary(&out, &results, &peak, started);
        if !ok {
            failed = Some(name);
            diagnose(&e2e).await;
            break;
        }
    }
    sampler.abort();
    write_summary(&out, &results, &peak, started);
    println!(
        "\nsummary: {} (peak lab RSS {} MiB, {:.0}s in all)",
        out.join("summary.json").display(),
        peak.rss_kib.load(Ordering::Relaxed) / 1024,
        started.elapsed().as_secs_f64()
    );
    match failed {
        None => {
            println!("all phases passed");
            ExitCode::SUCCESS
        }
        Some(f) => {
            eprintln!(
                "bootsman-e2e: FAILED in phase {f}; logs under {}",
                e2e.site.log_dir().display()
            );
            ExitCode::FAILURE
        }
    }
}

fn heading(s: &str) {
    println!("\n\x1b[1m==> {s}\x1b[0m");
}

fn result(
    name: &str,
    t: Instant,
    outcome: std::result::Result<String, String>,
    nodes: (usize, usize),
) -> PhaseResult {
    let ok = outcome.is_ok();
    PhaseResult {
        name: name.into(),
        seconds: (t.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        ok,
        control_plane_nodes_ready: nodes.0,
        worker_nodes_ready: nodes.1,
        detail: outcome.unwrap_or_else(|e| e),
    }
}

fn write_summary(out: &Path, results: &[PhaseResult], peak: &Peaks, started: Instant) {
    let summary = json!({
        "phases": results,
        "total_seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "passed": results.iter().all(|r| r.ok) && results.len() == PHASES.len() + 1,
        "peak_rss_mib": peak.rss_kib.load(Ordering::Relaxed) / 1024,
        "peak_inotify_instances": peak.inotify.load(Ordering::Relaxed),
        "inotify_instances_limit": std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
            .ok().and_then(|v| v.trim().parse::<u64>().ok()),
        "peak_rss_how": "largest sum, sampled every 2 s, of VmRSS of every process descending from bootsman-e2e: \
                         the infrastructure control plane, Cluster API, provider, operator, registry, HAProxy, \
                         and every lab host with its containerd, kubelet, agent and containers (shared pages \
                         are counted once per process)",
        "machine_cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    let _ = std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap_or_default(),
    );
}

/// The largest figures seen over the lab's processes.
#[derive(Debug, Default)]
struct Peaks {
    /// Sum of VmRSS (KiB) of this process and its descendants.
    rss_kib: AtomicU64,
    /// inotify instances they hold (the machine allows 128 per user).
    inotify: AtomicU64,
}

/// Samples every 2 s: the sum of VmRSS and the inotify instances of this process and its
/// descendants.
async fn sample(peak: Arc<Peaks>) {
    let me = std::process::id();
    loop {
        let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
        let mut rss: BTreeMap<u32, u64> = BTreeMap::new();
        if let Ok(d) = std::fs::read_dir("/proc") {
            for e in d.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                    continue;
                };
                for l in status.lines() {
                    if let Some(v) = l.strip_prefix("PPid:") {
                        parent.insert(pid, v.trim().parse().unwrap_or(0));
                    } else if let Some(v) = l.strip_prefix("VmRSS:") {
                        rss.insert(pid, v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0));
                    }
                }
            }
        }
        let mine = |pid: u32| {
            let mut p = pid;
            for _ in 0..64 {
                if p == me {
                    return true;
                }
                match parent.get(&p) {
                    Some(&pp) if pp != 0 => p = pp,
                    _ => return false,
                }
            }
            false
        };
        let mut total = 0;
        let mut inotify = 0;
        for (pid, kb) in &rss {
            if !mine(*pid) {
                continue;
            }
            total += kb;
            if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                inotify += fds
                    .flatten()
                    .filter(|f| {
                        std::fs::read_link(f.path())
                            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:inotify")
                    })
                    .count() as u64;
            }
        }
        peak.rss_kib.fetch_max(total, Ordering::Relaxed);
        peak.inotify.fetch_max(inotify, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

struct E2e {
    site: Site,
    out: PathBuf,
    p: Progress,
    ns: String,
    name: String,
    child: PathBuf,
}

impl E2e {
    fn bmc_api(&self, client: kube::Client) -> Api<DynamicObject> {
        let ar = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "bootsman.io",
            "v1alpha1",
            "BootsmanCluster",
        ));
        Api::namespaced_with(client, &self.ns, &ar)
    }

    /// Waits until the child cluster has at least `cp` control-plane and `w` worker Nodes Ready.
    async fn wait_nodes(&mut self, cp: usize, w: usize, timeout: Duration) -> Result<()> {
        let last = std::cell::RefCell::new(String::new());
        let child = until(
            &format!("{cp} control-plane + {w} worker Nodes Ready"),
            timeout,
            || async {
                self.site.check_controllers()?;
                let Ok(kc) = self.site.child_kubeconfig(&self.ns, &self.name).await else {
                    return Ok(Err("no kubeconfig Secret yet".into()));
                };
                let (c, wk) = ready_nodes(&kc).await.unwrap_or((0, 0));
                let line = format!("Nodes Ready: {c} control-plane + {wk} workers");
                if *last.borrow() != line {
                    self.p.say(&line);
                    *last.borrow_mut() = line.clone();
                }
                Ok(if c >= cp && wk >= w { Ok(kc) } else { Err(line) })
            },
        )
        .await?;
        self.child = child;
        Ok(())
    }

    async fn child(&self) -> Result<kube::Client> {
        child_client(&self.child).await
    }

    async fn cluster(&mut self) -> Result<String> {
        let (bc, changes) = lab_cluster(&self.site.lab.labbin().kubernetes_version)?;
        for c in &changes {
            println!("      {c}");
        }
        self.ns = bc["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        self.name = bc["metadata"]["name"].as_str().unwrap_or("demo").to_string();
        let file = self.site.lab.dir().join("bootsmancluster.json");
        std::fs::write(&file, bc.to_string()).map_err(bootsman_lab::error::io("write", &file))?;
        self.site
            .kubectl(None, &["apply", "-f", &file.display().to_string()])?;
        self.wait_nodes(3, 3, Duration::from_secs(900)).await?;

        let nodes = Api::<Node>::all(self.child().await?)
            .list(&ListParams::default())
            .await
            .map_err(bootsman_lab::error::kube("list Nodes"))?;
        for n in &nodes.items {
            let rt = n
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.container_runtime_version.clone())
                .unwrap_or_default();
            if !rt.starts_with("containerd://") {
                return Err(fail(format!(
                    "Node {} runs {rt:?}, not containerd",
                    n.metadata.name.clone().unwrap_or_default()
                )));
            }
        }
        self.check_kubelet_settings(&nodes.items)?;
        let json = self
            .site
            .kubectl(Some(&self.child), &["get", "nodes", "-o", "json"])?;
        let path = self.out.join("nodes.json");
        std::fs::write(&path, json).map_err(bootsman_lab::error::io("write", &path))?;

        let members = self.wait_etcd_members(3).await?;
        let tree = self.check_status_tree(3, 3)?;
        let dns = self
            .wait_pods_running("kube-system", "k8s-app=kube-dns", 1, Duration::from_secs(180))
            .await?;
        Ok(format!(
            "3 + 3 Nodes Ready on containerd ({}), no disk pressure, kubelets on the cluster's thresholds (nodefs/imagefs {DISK_RESERVE}), etcd members {members:?}, CoreDNS Running on {dns:?}; {tree}; nodes.json written",
            nodes
                .items
                .first()
                .and_then(|n| n
                    .status
                    .as_ref()?
                    .node_info
                    .as_ref()
                    .map(|i| i.container_runtime_version.clone()))
                .unwrap_or_default()
        ))
    }

    /// `bootsmanctl status` shows the cluster as it stands: under the control plane `cp`
    /// Machines and under the MachineDeployments `workers`, each through its ByoMachine down to
    /// a ByoHost whose agent is healthy with a heartbeat under a minute old. Prints the table.
    fn check_status_tree(&self, cp: usize, workers: usize) -> Result<String> {
        let table = self.site.bootsmanctl(&["status", "-n", &self.ns, &self.name])?;
        for l in table.lines() {
            println!("      {l}");
        }
        let out = self
            .site
            .bootsmanctl(&["status", "-n", &self.ns, &self.name, "-o", "json"])?;
        let trees: Value = serde_json::from_str(&out)
            .map_err(|e| fail(format!("bootsmanctl status -o json: {e}: {out}")))?;
        fn hosts<'a>(n: &'a Value, under: &str, found: &mut Vec<(String, &'a Value)>) {
            let kind = n["kind"].as_str().unwrap_or_default();
            let under = match kind {
                "KubeadmControlPlane" | "MachineDeployment" => kind,
                _ => under,
            };
            if kind == "ByoHost" {
                found.push((under.to_string(), n));
            }
            for c in n["children"].as_array().into_iter().flatten() {
                hosts(c, under, found);
            }
        }
        let mut found = Vec::new();
        for t in trees.as_array().into_iter().flatten() {
            hosts(t, "", &mut found);
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        for (_, h) in &found {
            let name = h["name"].as_str().unwrap_or_default();
            let beat = h["heartbeat"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| now.duration_since(t).as_secs());
            if h["summary"]["type"] != "AgentHealthy"
                || h["summary"]["status"] != "True"
                || beat.is_none_or(|b| b >= 60)
            {
                return Err(fail(format!(
                    "bootsmanctl status shows ByoHost {name} with {} and heartbeat {:?}s ago, not a healthy agent",
                    h["summary"], beat
                )));
            }
        }
        let count = |k: &str| found.iter().filter(|(u, _)| u == k).count();
        if count("KubeadmControlPlane") != cp || count("MachineDeployment") != workers {
            return Err(fail(format!(
                "bootsmanctl status shows {} hosts under the control plane and {} under MachineDeployments, not {cp} and {workers}:\n{table}",
                count("KubeadmControlPlane"),
                count("MachineDeployment")
            )));
        }
        Ok(format!(
            "bootsmanctl status shows {cp} + {workers} hosts below their Machines, each agent healthy with a heartbeat under a minute old"
        ))
    }

    /// `spec.nodes.kubelet` reached every kubelet: its running configuration (the kubelet's
    /// `/configz`, through the child's API server) holds the lab's disk thresholds, and no Node
    /// reports disk pressure.
    fn check_kubelet_settings(&self, nodes: &[Node]) -> Result<()> {
        for n in nodes {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            if let Some(c) = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "DiskPressure"))
                && c.status != "False"
            {
                return Err(fail(format!(
                    "Node {name} reports DiskPressure={}: {}",
                    c.status,
                    c.message.as_deref().unwrap_or_default()
                )));
            }
            let raw = self.site.kubectl(
                Some(&self.child),
                &["get", "--raw", &format!("/api/v1/nodes/{name}/proxy/configz")],
            )?;
            let config: Value =
                serde_json::from_str(&raw).map_err(|e| fail(format!("configz of {name} {raw:?}: {e}")))?;
            let config = &config["kubeletconfig"];
            let eviction = &config["evictionHard"];
            if eviction["nodefs.available"] != DISK_RESERVE
                || eviction["imagefs.available"] != DISK_RESERVE
                || eviction["memory.available"] != "100Mi"
                || config["imageGCHighThresholdPercent"] != 100
            {
                return Err(fail(format!(
                    "the kubelet of {name} runs with evictionHard {eviction} and \
                     imageGCHighThresholdPercent {}, not the cluster's spec.nodes.kubelet",
                    config["imageGCHighThresholdPercent"]
                )));
            }
        }
        Ok(())
    }

    /// Names of the started etcd members, asked of etcd on a control-plane host through its
    /// JSON gateway with the host's etcd client certificate.
    async fn etcd_members(&self) -> Result<Vec<String>> {
        let nodes = Api::<Node>::all(self.child().await?)
            .list(&ListParams::default().labels("node-role.kubernetes.io/control-plane"))
            .await
            .map_err(bootsman_lab::error::kube("list control-plane Nodes"))?;
        let host = nodes
            .items
            .iter()
            .filter(|n| node_ready(n))
            .find_map(|n| self.site.host(n.metadata.name.as_deref()?))
            .ok_or_else(|| fail("no Ready control-plane Node runs on a lab host".into()))?;
        let out = host.sh(
            "curl -sS --max-time 10 --cacert /etc/kubernetes/pki/etcd/ca.crt \
             --cert /etc/kubernetes/pki/etcd/healthcheck-client.crt --key /etc/kubernetes/pki/etcd/healthcheck-client.key \
             -X POST -d '{}' https://127.0.0.1:2379/v3/cluster/member/list",
        )?;
        let v: Value =
            serde_json::from_str(&out).map_err(|e| fail(format!("etcd member list {out:?}: {e}")))?;
        Ok(v["members"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .filter(|m| {
                        m["name"].as_str().is_some_and(|n| !n.is_empty())
                            && m["clientURLs"].as_array().is_some_and(|c| !c.is_empty())
                    })
                    .filter_map(|m| m["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn wait_pods_running(
        &self,
        ns: &str,
        selector: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let api: Api<Pod> = Api::namespaced(self.child().await?, ns);
        until(
            &format!("{n} pods {selector} Running in {ns}"),
            timeout,
            || async {
                let pods = api
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(bootsman_lab::error::kube("list pods"))?;
                let ready: Vec<String> = pods
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().is_some_and(|s| {
                            s.phase.as_deref() == Some("Running")
                                && s.conditions
                                    .iter()
                                    .flatten()
                                    .any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                    })
                    .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                    .collect();
                Ok(if ready.len() >= n {
                    Ok(ready)
                } else {
                    let why: Vec<String> = pods.items.iter().filter_map(pod_not_ready).collect();
                    Err(format!(
                        "{} of {} Running and Ready; {}",
                        ready.len(),
                        pods.items.len(),
                        why.join("; ")
                    ))
                })
            },
        )
        .await
    }

    async fn workload(&mut self) -> Result<String> {
        let busybox = format!(
            "{}/{}",
            bootsman_lab::net::registry(),
            self.site.lab.labbin().busybox_image
        );
        let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "e2e"}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "e2e"},
             "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
               "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                 "nodeSelector": {"bootsman.io/role": "worker"},
                 "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                   "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                 "containers": [{"name": "web", "image": busybox,
                   "command": ["sh", "-c", "echo hello from $(hostname) > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
                   "ports": [{"containerPort": 8080}],
                   "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2}}]}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "e2e"},
             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": "e2e", "labels": {"app": "client"}},
             "spec": {"containers": [{"name": "client", "image": busybox, "command": ["sleep", "3600"]}]}},
        ]});
        let file = self.site.lab.dir().join("workload.json");
        std::fs::write(&file, manifest.to_string()).map_err(bootsman_lab::error::io("write", &file))?;
        self.site
            .kubectl(Some(&self.child), &["apply", "-f", &file.display().to_string()])?;
        let nodes = self
            .wait_pods_running("e2e", "app=web", 3, Duration::from_secs(300))
            .await?;
        let mut distinct = nodes.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != 3 {
            return Err(fail(format!("the 3 replicas run on {nodes:?}, not on 3 workers")));
        }
        let workers: Vec<String> = Api::<Node>::all(self.child().await?)
            .list(&ListParams::default().labels("bootsman.io/role=worker"))
            .await
            .map_err(bootsman_lab::error::kube("list worker Nodes"))?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        if let Some(n) = distinct.iter().find(|n| !workers.contains(n)) {
            return Err(fail(format!("a replica runs on {n}, not a worker ({workers:?})")));
        }
        let client_node = self
            .wait_pods_running("e2e", "app=client", 1, Duration::from_secs(120))
            .await?;
        let child = self.child.clone();
        let answer = until(
            "an answer from the web Service, by name, in the client pod",
            Duration::from_secs(120),
            || async {
                match self.site.kubectl(
                    Some(&child),
                    &[
                        "-n",
                        "e2e",
                        "exec",
                        "client",
                        "--",
                        "timeout",
                        "5",
                        "wget",
                        "-qO-",
                        "http://web.e2e.svc.cluster.local",
                    ],
                ) {
                    Ok(out) if out.contains("hello from web-") => Ok(Ok(out.trim().to_string())),
                    Ok(out) => Ok(Err(format!("answer {out:?}"))),
                    Err(e) => Ok(Err(e.to_string())),
                }
            },
        )
        .await?;
        Ok(format!(
            "3 replicas on workers {distinct:?}; the client pod on {} got {answer:?} through http://web.e2e.svc.cluster.local",
            client_node.join(",")
        ))
    }

    /// Whether pod `pod` of namespace `ns` in the child cluster gets an answer from
    /// `http://ip:8080` within 3 s.
    fn reaches(&self, ns: &str, pod: &str, ip: &str) -> bool {
        let url = format!("http://{ip}:8080");
        self.site
            .kubectl(
                Some(&self.child),
                &["-n", ns, "exec", pod, "--", "timeout", "3", "wget", "-qO-", &url],
            )
            .is_ok_and(|out| out.contains("hello from"))
    }

    /// The IP of pod `pod` in `ns` of the child cluster.
    async fn pod_ip(&self, ns: &str, pod: &str) -> Result<String> {
        let p = Api::<Pod>::namespaced(self.child().await?, ns)
            .get(pod)
            .await
            .map_err(bootsman_lab::error::kube("read a pod"))?;
        p.status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| fail(format!("pod {ns}/{pod} has no IP")))
    }

    async fn isolation(&mut self) -> Result<String> {
        let busybox = format!(
            "{}/{}",
            bootsman_lab::net::registry(),
            self.site.lab.labbin().busybox_image
        );
        let web = |ns: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}},
             "spec": {"nodeSelector": {"bootsman.io/role": "worker"}, "containers": [{"name": "web", "image": busybox,
               "command": ["sh", "-c", "echo hello from $(hostname) > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
               "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2}}]}})
        };
        let client = |ns: &str, host_network: bool| {
            json!({"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": if host_network { "edge" } else { "client" }, "namespace": ns, "labels": {"app": "client"}},
             "spec": {"hostNetwork": host_network, "nodeSelector": {"bootsman.io/role": "worker"},
               "containers": [{"name": "client", "image": busybox, "command": ["sleep", "3600"]}]}})
        };
        let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "iso-a"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "iso-b"}},
            web("iso-a"), client("iso-a", false), web("iso-b"), client("iso-b", false),
            client("e2e", true),
        ]});
        let file = self.site.lab.dir().join("isolation.json");
        std::fs::write(&file, manifest.to_string()).map_err(bootsman_lab::error::io("write", &file))?;
        self.site
            .kubectl(Some(&self.child), &["apply", "-f", &file.display().to_string()])?;
        for ns in ["iso-a", "iso-b"] {
            self.wait_pods_running(ns, "app=web", 1, Duration::from_secs(180))
                .await?;
            self.wait_pods_running(ns, "app=client", 1, Duration::from_secs(180))
                .await?;
        }
        self.wait_pods_running("e2e", "app=client", 2, Duration::from_secs(180))
            .await?;
        let (a_ip, b_ip) = (
            self.pod_ip("iso-a", "web").await?,
            self.pod_ip("iso-b", "web").await?,
        );
        // Without isolation the projects reach each other: a refusal later is the policy's.
        until(
            "iso-a's client to reach iso-b's web pod before isolation",
            Duration::from_secs(60),
            || async {
                Ok(if self.reaches("iso-a", "client", &b_ip) {
                    Ok(())
                } else {
                    Err("no answer".to_string())
                })
            },
        )
        .await?;

        let lab_net = {
            let o = bootsman_lab::net::GATEWAY.octets();
            format!("{}.{}.{}.0/{}", o[0], o[1], o[2], bootsman_lab::net::PREFIX)
        };
        self.patch_bmc(json!({"spec": {"network": {"isolation": {
            "projects": [{"name": "a", "namespaces": ["iso-a"]}, {"name": "b", "namespaces": ["iso-b"]}],
            "hostNetworks": [lab_net],
        }}}}))
        .await?;
        let child = self.child().await?;
        let policies = until(
            "the isolation NetworkPolicies in the child cluster",
            Duration::from_secs(240),
            || async {
                let mut found = Vec::new();
                for ns in ["iso-a", "iso-b"] {
                    let np: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
                        Api::namespaced(child.clone(), ns);
                    if np
                        .get_opt("bootsman-project-isolation")
                        .await
                        .ok()
                        .flatten()
                        .is_some()
                    {
                        found.push(ns);
                    }
                }
                Ok(if found.len() == 2 {
                    Ok(found)
                } else {
                    Err(format!("in {found:?}"))
                })
            },
        )
        .await?;
        // kube-router applies a policy within its sync period.
        until(
            "the other project's pods to stop answering",
            Duration::from_secs(120),
            || async {
                let a_to_b = self.reaches("iso-a", "client", &b_ip);
                let b_to_a = self.reaches("iso-b", "client", &a_ip);
                Ok(if !a_to_b && !b_to_a {
                    Ok(())
                } else {
                    Err(format!(
                        "iso-a -> iso-b answered: {a_to_b}, iso-b -> iso-a answered: {b_to_a}"
                    ))
                })
            },
        )
        .await?;
        let mut wrong = Vec::new();
        for (ns, pod, ip, want, what) in [
            ("iso-a", "client", &a_ip, true, "iso-a -> its own web pod"),
            ("iso-b", "client", &b_ip, true, "iso-b -> its own web pod"),
            ("e2e", "edge", &a_ip, true, "the hostNetwork pod -> iso-a"),
            ("e2e", "edge", &b_ip, true, "the hostNetwork pod -> iso-b"),
            ("e2e", "client", &a_ip, false, "a pod of no project -> iso-a"),
            ("iso-a", "client", &b_ip, false, "iso-a -> iso-b"),
        ] {
            // An answer is tried for up to three times; a refusal once is enough.
            let tries = if want { 3 } else { 1 };
            let got = (0..tries).any(|_| self.reaches(ns, pod, ip));
            if got != want {
                wrong.push(format!("{what}: answered {got}, expected {want}"));
            }
        }
        if !wrong.is_empty() {
            return Err(fail(format!("isolation: {}", wrong.join("; "))));
        }
        Ok(format!(
            "NetworkPolicies in {policies:?} (hostNetworks {lab_net}); each project reaches its own web pod and not the other's, a pod of no project reaches neither, the hostNetwork pod reaches both"
        ))
    }

    async fn patch_bmc(&self, patch: Value) -> Result<()> {
        self.bmc_api(self.site.client().await)
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(bootsman_lab::error::kube("patch the BootsmanCluster"))?;
        Ok(())
    }

    async fn scale_workers(&mut self) -> Result<String> {
        let (bc, _) = lab_cluster(&self.site.lab.labbin().kubernetes_version)?;
        let mut workers = bc["spec"]["workers"].clone();
        workers[0]["replicas"] = json!(4);
        self.patch_bmc(json!({"spec": {"workers": workers}})).await?;
        self.wait_nodes(3, 4, Duration::from_secs(600)).await?;
        Ok("workers 3 -> 4: four worker Nodes Ready".into())
    }

    async fn scale_control_plane(&mut self) -> Result<String> {
        self.patch_bmc(json!({"spec": {"controlPlane": {"replicas": 5}}}))
            .await?;
        self.wait_nodes(5, 3, Duration::from_secs(900)).await?;
        let five = self.wait_etcd_members(5).await?;
        let before = self.control_plane_nodes().await?;

        self.p.say("control plane 5 -> 3");
        self.patch_bmc(json!({"spec": {"controlPlane": {"replicas": 3}}}))
            .await?;
        let after = until("3 control-plane Nodes", Duration::from_secs(900), || async {
            // While members leave, a request may meet an API server that is going away.
            Ok(match self.control_plane_nodes().await {
                Ok(now) if now.len() == 3 => Ok(now),
                Ok(now) => Err(format!("{now:?}")),
                Err(e) => Err(e.to_string()),
            })
        })
        .await?;
        let three = self.wait_etcd_members(3).await?;
        let released: Vec<String> = before.into_iter().filter(|n| !after.contains(n)).collect();
        let admin = self.site.client().await;
        let hosts: Api<DynamicObject> = Api::namespaced_with(admin, POOL, &byohost_resource());
        let released_msg = until(
            "the released control-plane hosts reset and Available",
            Duration::from_secs(600),
            || async {
                let mut waiting = Vec::new();
                for name in &released {
                    let h = hosts
                        .get(name)
                        .await
                        .map_err(bootsman_lab::error::kube("get a ByoHost"))?;
                    if h.data["status"]["phase"] != "Available" || !h.data["spec"]["machineRef"].is_null() {
                        waiting.push(format!("{name}={}", h.data["status"]["phase"]));
                    } else if !cleanup_message(&h).contains("kubeadm reset") {
                        return Err(fail(format!(
                            "{name}: CleanupSucceeded says {:?}",
                            cleanup_message(&h)
                        )));
                    }
                }
                Ok(if waiting.is_empty() {
                    Ok(())
                } else {
                    Err(waiting.join(" "))
                })
            },
        )
        .await;
        released_msg?;
        Ok(format!(
            "3 -> 5: five control-plane Nodes Ready, etcd members {five:?}; 5 -> 3: etcd members {three:?}, \
             {released:?} ran kubeadm reset and are Available"
        ))
    }

    /// Names of the control-plane Nodes of the child cluster.
    async fn control_plane_nodes(&self) -> Result<Vec<String>> {
        Ok(Api::<Node>::all(self.child().await?)
            .list(&ListParams::default().labels("node-role.kubernetes.io/control-plane"))
            .await
            .map_err(bootsman_lab::error::kube("list control-plane Nodes"))?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect())
    }

    async fn wait_etcd_members(&self, n: usize) -> Result<Vec<String>> {
        until(
            &format!("{n} started etcd members"),
            Duration::from_secs(300),
            || async {
                Ok(match self.etcd_members().await {
                    Ok(m) if m.len() == n => Ok(m),
                    Ok(m) => Err(format!("{m:?}")),
                    Err(e) => Err(e.to_string()),
                })
            },
        )
        .await
    }

    async fn kill_worker(&mut self) -> Result<String> {
        let admin = self.site.client().await;
        let victim = self
            .site
            .byohosts()
            .await?
            .into_iter()
            .find(|h| {
                h.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("role"))
                    .map(String::as_str)
                    == Some("worker")
                    && !h.data["spec"]["machineRef"].is_null()
            })
            .ok_or_else(|| fail("no claimed worker host".into()))?;
        let name = victim.metadata.name.clone().unwrap_or_default();
        let claim = victim.data["spec"]["machineRef"].clone();
        let i = self
            .site
            .index_of(&name)
            .ok_or_else(|| fail(format!("{name} is not a lab host")))?;
        self.p.say(&format!(
            "killing every process of {name} (claimed by {})",
            claim["name"]
        ));
        self.site.hosts[i].kill();

        let nodes: Api<Node> = Api::all(self.child().await?);
        // Its own clients: the host is booted again (a mutable use of the site) in between.
        let hosts: Api<DynamicObject> = Api::namespaced_with(admin.clone(), POOL, &byohost_resource());
        let byo: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &self.ns, &byomachine_resource());
        let check_claim = || async {
            let all = hosts
                .list(&ListParams::default())
                .await
                .map_err(bootsman_lab::error::kube("list ByoHosts"))?
                .items;
            let me = all.iter().find(|h| h.metadata.name.as_deref() == Some(&name));
            let now = me
                .map(|h| h.data["spec"]["machineRef"].clone())
                .unwrap_or(Value::Null);
            if now != claim {
                return Err(fail(format!(
                    "{name}'s claim changed while offline: {claim} -> {now}"
                )));
            }
            for m in byo
                .list(&ListParams::default())
                .await
                .map_err(bootsman_lab::error::kube("list ByoMachines"))?
                .items
            {
                let host = m.data["status"]["hostRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if host == name && m.metadata.name.as_deref() != claim["name"].as_str() {
                    return Err(fail(format!(
                        "ByoMachine {:?} was handed offline host {name}",
                        m.metadata.name
                    )));
                }
            }
            Ok(me
                .and_then(|h| h.data["status"]["phase"].as_str().map(String::from))
                .unwrap_or_default())
        };
        let t = Instant::now();
        let (mut not_ready, mut offline) = (None, None);
        while not_ready.is_none() || offline.is_none() {
            if t.elapsed() > Duration::from_secs(240) {
                return Err(fail(format!(
                    "after 240 s: Node NotReady at {not_ready:?}, ByoHost Offline at {offline:?}"
                )));
            }
            let phase = check_claim().await?;
            if offline.is_none() && phase == "Offline" {
                offline = Some(t.elapsed().as_secs());
                self.p.say(&format!("ByoHost {name} Offline"));
            }
            let node = nodes.get(&name).await;
            if not_ready.is_none() && node.as_ref().is_ok_and(|n| !node_ready(n)) {
                not_ready = Some(t.elapsed().as_secs());
                self.p.say(&format!("Node {name} NotReady"));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        // Stay offline a while longer: the claim must not move.
        for _ in 0..10 {
            check_claim().await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        self.p.say(&format!("booting {name} again"));
        self.site.boot_host(i).await?;
        let back = until(
            &format!("Node {name} Ready again"),
            Duration::from_secs(300),
            || async {
                let phase = check_claim().await?;
                Ok(match nodes.get(&name).await {
                    Ok(node) if node_ready(&node) && phase != "Offline" => Ok(phase),
                    Ok(_) => Err(format!("ByoHost {phase}, Node not Ready")),
                    Err(e) => Err(format!("ByoHost {phase}, Node: {e}")),
                })
            },
        )
        .await?;
        Ok(format!(
            "{name}: Node NotReady after {}s, ByoHost Offline after {}s, its claim ({}) unchanged and no other \
             ByoMachine handed it while offline; booted again it is Ready and {back}",
            not_ready.unwrap_or(0),
            offline.unwrap_or(0),
            claim["name"].as_str().unwrap_or_default()
        ))
    }

    async fn delete(&mut self) -> Result<String> {
        let admin = self.site.client().await;
        self.bmc_api(admin.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
            .map_err(bootsman_lab::error::kube("delete the BootsmanCluster"))?;
        let bmcs = self.bmc_api(admin.clone());
        let name = self.name.clone();
        until(
            "the BootsmanCluster to be gone",
            Duration::from_secs(900),
            || async {
                self.site.check_controllers()?;
                Ok(
                    match bmcs
                        .get_opt(&name)
                        .await
                        .map_err(bootsman_lab::error::kube("get the BootsmanCluster"))?
                    {
                        None => Ok(()),
                        Some(b) => Err(format!("phase {}", b.data["status"]["phase"])),
                    },
                )
            },
        )
        .await?;
        let n = self.site.hosts.len();
        let all = until(
            &format!("{n} ByoHosts Available, unclaimed and clean"),
            Duration::from_secs(600),
            || async {
                let list = self.site.byohosts().await?;
                let waiting: Vec<String> = list
                    .iter()
                    .filter(|h| {
                        h.data["status"]["phase"] != "Available"
                            || !h.data["spec"]["machineRef"].is_null()
                            || (h.data["status"]["conditions"]
                                .as_array()
                                .is_some_and(|c| c.iter().any(|c| c["type"] == "CleanupSucceeded"))
                                && !condition_true(&h.data, "CleanupSucceeded"))
                    })
                    .map(|h| {
                        format!(
                            "{}={}",
                            h.metadata.name.clone().unwrap_or_default(),
                            h.data["status"]["phase"]
                        )
                    })
                    .collect();
                Ok(if waiting.is_empty() && list.len() == n {
                    Ok(list)
                } else {
                    Err(waiting.join(" "))
                })
            },
        )
        .await?;
        let mut reset = 0;
        for h in &all {
            let hname = h.metadata.name.clone().unwrap_or_default();
            let msg = cleanup_message(h);
            if !msg.contains("kubeadm reset") {
                return Err(fail(format!(
                    "{hname}: CleanupSucceeded says {msg:?}, not that kubeadm reset ran"
                )));
            }
            let host = self
                .site
                .host(&hname)
                .ok_or_else(|| fail(format!("{hname} is not a lab host")))?;
            let left = host
                .sh("crictl ps -a -q; crictl pods -q; ls -A /etc/kubernetes/manifests 2>/dev/null || true")?;
            if !left.trim().is_empty() {
                return Err(fail(format!(
                    "{hname} still has containers, sandboxes or static pods: {left}"
                )));
            }
            reset += 1;
        }
        self.child = PathBuf::new();
        Ok(format!(
            "the BootsmanCluster is gone; all {reset} hosts ran kubeadm reset, hold no container, pod sandbox or \
             static pod, and are Available"
        ))
    }
}

/// The message of a ByoHost's `CleanupSucceeded` condition.
fn cleanup_message(h: &DynamicObject) -> String {
    h.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "CleanupSucceeded"))
        .and_then(|c| c["message"].as_str().map(String::from))
        .unwrap_or_default()
}

fn byomachine_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "ByoMachine",
    ))
}

fn fail(what: String) -> Error {
    Error::Command {
        what: "check".into(),
        detail: what,
    }
}

/// Why a pod is not Running and Ready, in one line (None when it is): its node, phase, the
/// reason of a false condition and the waiting or terminated state of each container.
fn pod_not_ready(p: &Pod) -> Option<String> {
    let status = p.status.as_ref()?;
    let conditions = status.conditions.as_deref().unwrap_or_default();
    if status.phase.as_deref() == Some("Running")
        && conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    {
        return None;
    }
    let mut parts = vec![format!(
        "{} on {}: {}",
        p.metadata.name.as_deref().unwrap_or("?"),
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("no node"),
        status.phase.as_deref().unwrap_or("no phase")
    )];
    for c in conditions.iter().filter(|c| c.status != "True") {
        if let Some(m) = c.message.as_deref().or(c.reason.as_deref()) {
            parts.push(format!("{}={m}", c.type_));
        }
    }
    for cs in status.container_statuses.iter().flatten() {
        let state = cs.state.as_ref();
        if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            parts.push(format!(
                "{} waiting {} {}",
                cs.name,
                w.reason.as_deref().unwrap_or(""),
                w.message.as_deref().unwrap_or("")
            ));
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            parts.push(format!(
                "{} exited {} {}",
                cs.name,
                t.exit_code,
                t.reason.as_deref().unwrap_or("")
            ));
        } else if !cs.ready {
            parts.push(format!(
                "{} running, not ready (restarts {})",
                cs.name, cs.restart_count
            ));
        }
    }
    Some(parts.join(", "))
}

/// After a failure: the state of the infrastructure and child clusters and the logs to read.
async fn diagnose(e2e: &E2e) {
    heading("diagnosis");
    // The cluster's tree while its BootsmanCluster exists; the objects by kind otherwise.
    let tree = (!e2e.name.is_empty())
        .then(|| {
            e2e.site
                .bootsmanctl(&["status", "-n", &e2e.ns, &e2e.name, "--all-conditions"])
                .ok()
        })
        .flatten();
    let by_kind = "bootsmanclusters,clusters,kubeadmcontrolplanes,machinedeployments,machines,byomachines";
    if let Some(out) = tree.or_else(|| e2e.site.kubectl(None, &["get", by_kind, "-A"]).ok()) {
        println!("{out}");
    }
    if let Ok(out) = e2e.site.kubectl(None, &["get", "byohosts", "-A", "-L", "role"]) {
        println!("{out}");
    }
    if !e2e.child.as_os_str().is_empty() {
        for args in [
            vec!["get", "nodes", "-o", "wide"],
            vec!["get", "pods", "-A", "-o", "wide"],
        ] {
            if let Ok(out) = e2e.site.kubectl(Some(&e2e.child), &args) {
                println!("{out}");
            }
        }
    }
    println!(
        "logs: {} (controllers, registry, HAProxy; hosts/<host>/logs/ for each host's units)",
        e2e.site.log_dir().display()
    );
    for h in &e2e.site.hosts {
        let log = h.log_dir().join("byoh-agent.log");
        println!("--- {} ---\n{}", log.display(), bootsman_testenv::tail(&log, 8));
    }
    // Last, where a shortened report still shows it: what went wrong inside the child cluster.
    if !e2e.child.as_os_str().is_empty() {
        let args = [
            "get",
            "events",
            "-A",
            "--field-selector",
            "type=Warning",
            "--sort-by",
            ".lastTimestamp",
        ];
        if let Ok(out) = e2e.site.kubectl(Some(&e2e.child), &args) {
            let lines: Vec<&str> = out.lines().collect();
            println!("--- Warning events in the child cluster (last 15) ---");
            for l in &lines[lines.len().saturating_sub(15)..] {
                println!("{l}");
            }
        }
    }
}
