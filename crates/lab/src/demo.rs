//! The demo on lab hosts (`hack/demo.sh`, `bootsman-lab demo`): a site of six hosts (three
//! labelled `role=control-plane`, three `role=worker`) whose provider and operator run as Pods of
//! the chart on an infrastructure node, the sample BootsmanCluster with the lab's changes
//! (printed), and the progress until the child cluster has six Ready Nodes; then its
//! `kubectl get nodes -o wide` and how to look around.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::{Error, Result, io};
use crate::site::{Controllers, Progress, Site, SitePlan, lab_cluster};

/// How the demo runs.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// Leave the site running until Ctrl-C.
    pub keep: bool,
    /// Longest wait for the six Ready Nodes.
    pub timeout: Duration,
}

/// Runs the demo; `Ok` once the child cluster had 3 + 3 Ready Nodes.
pub async fn run(opts: DemoOptions) -> Result<()> {
    let p = Progress::new();
    say("a site on lab hosts: network, registry, infrastructure control plane and node, chart, 6 hosts");
    let site = Site::up(SitePlan::new(3, 3).with_controllers(Controllers::Pods), &p).await?;

    let (bc, changes) = lab_cluster(&site.lab.labbin().kubernetes_version)?;
    say("kubectl apply -f config/samples/bootsmancluster.yaml, with the lab's changes:");
    for c in &changes {
        println!("      {c}");
    }
    let file = site.lab.dir().join("bootsmancluster.json");
    std::fs::write(&file, bc.to_string()).map_err(io("write", &file))?;
    site.kubectl(None, &["apply", "-f", &file.display().to_string()])?;
    let name = bc["metadata"]["name"].as_str().unwrap_or("demo").to_string();
    let ns = bc["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();

    say(&format!("progress (up to {}s)", opts.timeout.as_secs()));
    let reached = watch(&site, &ns, &name, &p, opts.timeout).await;
    if reached.is_ok() {
        // The Nodes are there; Cluster API marks the last machine ready a little later.
        let bmcs: Api<DynamicObject> =
            Api::namespaced_with(site.client().await, &ns, &bootsman_cluster_resource());
        let ready = crate::site::until("the BootsmanCluster Ready", Duration::from_secs(120), || async {
            Ok(match bmcs.get(&name).await {
                Ok(b) if condition_true(&b.data, "Ready") => Ok(()),
                Ok(b) => Err(b.data["status"]["phase"].to_string()),
                Err(e) => Err(e.to_string()),
            })
        })
        .await;
        match ready {
            Ok(()) => p.say("BootsmanCluster demo Ready"),
            Err(e) => p.say(&format!("{e}")),
        }
    }

    say("where it got");
    for args in [
        vec![
            "-n",
            ns.as_str(),
            "get",
            "bootsmanclusters,clusters,kubeadmcontrolplanes,machinedeployments,machines",
        ],
        vec![
            "-n",
            ns.as_str(),
            "get",
            "byohosts",
            "-L",
            "role,host.bootsman.io/role",
        ],
    ] {
        if let Ok(out) = site.kubectl(None, &args) {
            print_indented(&out);
        }
    }
    if let Ok(out) = site.kubectl(
        None,
        &[
            "-n",
            &ns,
            "get",
            "bootsmancluster",
            &name,
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{\"\\n\"}{end}",
        ],
    ) {
        println!("    BootsmanCluster conditions:");
        print_indented(&out);
    }
    let child = site.child_kubeconfig(&ns, &name).await.ok();
    if let Some(kc) = &child {
        say(&format!(
            "the child cluster: kubectl --kubeconfig {} get nodes -o wide",
            kc.display()
        ));
        if let Ok(out) = site.kubectl(Some(kc), &["get", "nodes", "-o", "wide"]) {
            print_indented(&out);
        }
        if let Ok(out) = site.kubectl(Some(kc), &["get", "pods", "-A", "-o", "wide"]) {
            print_indented(&out);
        }
    }
    explore(&site, child.as_deref());

    if opts.keep {
        say("running until Ctrl-C");
        let _ = tokio::signal::ctrl_c().await;
    }
    reached
}

/// Prints the progress until the cluster has 3 control-plane and 3 worker Nodes Ready.
async fn watch(site: &Site, ns: &str, name: &str, p: &Progress, timeout: Duration) -> Result<()> {
    let machines: Api<DynamicObject> = Api::namespaced_with(site.client().await, ns, &machine_resource());
    let mut last = String::new();
    let deadline = std::time::Instant::now() + timeout;
    loop {
        site.check_controllers()?;
        let ms = machines
            .list(&ListParams::default())
            .await
            .map_err(crate::error::kube("list Machines"))?;
        let running = ms
            .items
            .iter()
            .filter(|m| m.data["status"]["phase"] == "Running")
            .count();
        let hs = site.byohosts().await?;
        let claimed = hs
            .iter()
            .filter(|h| !h.data["spec"]["machineRef"].is_null())
            .count();
        let bootstrapped = hs
            .iter()
            .filter(|h| condition_true(&h.data, "BootstrapSucceeded"))
            .count();
        let (cp, workers) = match site.child_kubeconfig(ns, name).await {
            Ok(kc) => ready_nodes(&kc).await.unwrap_or((0, 0)),
            Err(_) => (0, 0),
        };
        let line = format!(
            "Machines {} (Running {running}), hosts claimed {claimed}/{}, bootstrapped {bootstrapped}, \
             Nodes Ready: {cp} control-plane + {workers} workers",
            ms.items.len(),
            hs.len()
        );
        if line != last {
            p.say(&line);
            last = line;
        }
        if cp >= 3 && workers >= 3 {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("3 control-plane and 3 worker Nodes Ready (last seen: {last})"),
                secs: timeout.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// The BootsmanCluster resource.
pub fn bootsman_cluster_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "bootsman.io",
        "v1alpha1",
        "BootsmanCluster",
    ))
}

/// The Cluster API Machine resource.
pub fn machine_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "Machine",
    ))
}

/// Whether an object's `status.conditions` hold `type=True`.
pub fn condition_true(obj: &serde_json::Value, type_: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

/// A client of a child cluster from its kubeconfig.
pub async fn child_client(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Command {
        what: format!("read {}", kubeconfig.display()),
        detail: e.to_string(),
    })?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Command {
            what: format!("use {}", kubeconfig.display()),
            detail: e.to_string(),
        })?;
    kube::Client::try_from(cfg).map_err(crate::error::kube("child cluster client"))
}

/// Ready Nodes of a child cluster: (control-plane, workers).
pub async fn ready_nodes(kubeconfig: &Path) -> Result<(usize, usize)> {
    let nodes = Api::<Node>::all(child_client(kubeconfig).await?)
        .list(&ListParams::default())
        .await
        .map_err(crate::error::kube("list Nodes of the child cluster"))?;
    let mut out = (0, 0);
    for n in nodes.items.iter().filter(|n| node_ready(n)) {
        if n.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("node-role.kubernetes.io/control-plane"))
        {
            out.0 += 1;
        } else {
            out.1 += 1;
        }
    }
    Ok(out)
}

/// Whether a Node reports `Ready=True`.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn say(msg: &str) {
    println!("\n\x1b[1m==> {msg}\x1b[0m");
}

fn print_indented(text: &str) {
    for l in text.lines() {
        println!("      {l}");
    }
}

fn explore(site: &Site, child: Option<&Path>) {
    let kubectl = site.env.testbin().bin("kubectl");
    let first = site.hosts.first();
    println!(
        "\nExplore (while it runs; the lab lives in its own network namespace, so enter it first):
  nsenter --net=/proc/{pid}/ns/net -- bash
  export KUBECONFIG={kc} PATH={bin}:$PATH
  kubectl get bootsmanclusters,machines,byohosts -A
  kubectl --kubeconfig {child} get nodes -o wide          # the child cluster
  nsenter -t {init} -a -- crictl ps                       # containers of {host}
  nsenter -t {init} -a -- systemctl status kubelet byoh-agent
  less {logs}/hosts/{host}/logs/byoh-agent.log           # a host's journal (also kubelet.log, containerd.log)
  less {logs}/bootsman-provider.log",
        pid = std::process::id(),
        kc = site.env.kubeconfig().display(),
        bin = kubectl
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        child = child
            .map(|c| c.display().to_string())
            .unwrap_or_else(|| "<none yet>".into()),
        init = first.map(|h| h.init_pid()).unwrap_or(0),
        host = first.map(|h| h.name().to_string()).unwrap_or_default(),
        logs = site.log_dir().display(),
    );
}
