//! A Bootsman site on lab hosts, as the demo and the end-to-end test use it:
//!
//! 1. the lab network and registry ([`crate::net`], [`crate::registry`]);
//! 2. the infrastructure cluster's control plane from `bootsman-testenv` (etcd, kube-apiserver,
//!    kube-controller-manager, the Cluster API core, kubeadm bootstrap and kubeadm
//!    control-plane managers), serving on the lab gateway as well so hosts reach it;
//! 3. `charts/bootsman` installed with Helm; `bootsman-provider` and `bootsman-operator` either
//!    run **as Pods** from their images in the lab registry, on an infrastructure node
//!    ([`crate::infra`]), or as processes with the chart's ServiceAccount tokens
//!    ([`Controllers`]);
//! 4. lab hosts, each enrolled as the README says (a one-time token from `bootsmanctl hosts
//!    token`, `dpkg -i` of the agent's `.deb`, its flags file, `systemctl enable --now
//!    byoh-agent`);
//! 5. HAProxy at the child cluster's endpoint with the control-plane hosts as backends.
//!
//! Everything stops in reverse order when the site is dropped.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use bootsman_testenv::process::Component;
use bootsman_testenv::{Options, TestEnv};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::error::{Error, Result, io};
use crate::infra::InfraNode;
use crate::lb::LoadBalancer;
use crate::registry::Registry;
use crate::{Lab, LabHost, net, run};

/// Role label of a host, as the sample BootsmanCluster selects them: an admin's label, set on
/// each ByoHost once it has registered (a host's own `--label role=...` is only
/// `host.bootsman.io/role`, which no selector of the lab uses).
pub const ROLE_LABEL: &str = "role";
/// The pool namespace the lab's hosts enrol into.
pub const POOL: &str = "default";

/// How the site runs Bootsman's controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controllers {
    /// As Pods of the chart's Deployments, from images built from the workspace and pushed to
    /// the lab registry, on an infrastructure node.
    Pods,
    /// As processes in the lab namespace with tokens of the chart's ServiceAccounts (the same
    /// rights; no node needed).
    Processes,
}

/// The hosts of a site: name and role (`control-plane` or `worker`).
#[derive(Clone, Debug)]
pub struct SitePlan {
    /// `(name, role)` of each host, in boot order.
    pub hosts: Vec<(String, String)>,
    /// How the controllers run.
    pub controllers: Controllers,
}

impl SitePlan {
    /// `host-1`… with the first `control_plane` labelled `role=control-plane`, the rest workers.
    pub fn new(control_plane: usize, workers: usize) -> Self {
        let hosts = (1..=control_plane + workers)
            .map(|i| {
                let role = if i <= control_plane {
                    "control-plane"
                } else {
                    "worker"
                };
                (format!("host-{i}"), role.to_string())
            })
            .collect();
        Self {
            hosts,
            controllers: Controllers::Processes,
        }
    }

    /// The same plan with the controllers run as `c`.
    pub fn with_controllers(mut self, c: Controllers) -> Self {
        self.controllers = c;
        self
    }
}

/// Progress lines with the seconds since the start.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    start: Instant,
}

impl Progress {
    /// Starts counting now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
    /// Prints `[  12s] msg`.
    pub fn say(&self, msg: &str) {
        println!("    [{:4}s] {msg}", self.start.elapsed().as_secs());
    }
    /// Seconds since the start.
    pub fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// A running site. Fields drop in order: hosts, load balancer, controllers, control plane,
/// registry, lab.
#[derive(Debug)]
pub struct Site {
    /// The lab hosts, by name.
    pub hosts: Vec<LabHost>,
    /// HAProxy at the child cluster endpoint (once the hosts are known).
    pub lb: Option<LoadBalancer>,
    /// The infrastructure node running the controllers' Pods ([`Controllers::Pods`]).
    pub infra: Option<InfraNode>,
    controllers: Vec<Component>,
    /// The infrastructure cluster's control plane.
    pub env: TestEnv,
    /// The lab registry.
    pub registry: Registry,
    /// The lab run.
    pub lab: Lab,
    plan: SitePlan,
}

impl Site {
    /// Brings the site up (see the module header). Hosts are enrolled and heartbeating when it
    /// returns.
    pub async fn up(plan: SitePlan, p: &Progress) -> Result<Site> {
        let lab = Lab::create()?;
        p.say(&format!(
            "lab run {} (folder {})",
            lab.run_id(),
            lab.dir().display()
        ));
        let registry = Registry::start(&lab)?;
        p.say(&format!(
            "lab registry at {} (the site's mirror)",
            net::registry()
        ));
        let env = TestEnv::start(Options {
            capi: true,
            advertise_address: Some(IpAddr::V4(net::GATEWAY)),
            ..Options::default()
        })
        .await?;
        p.say(&format!(
            "infrastructure control plane at {} with the Cluster API managers",
            env.advertised_url()
        ));

        let mut helm_args: Vec<String> = Vec::new();
        let mut infra = None;
        if plan.controllers == Controllers::Pods {
            let n = u8::try_from(plan.hosts.len() + 1)
                .map_err(|_| Error::Unsupported("at most 98 lab hosts".into()))?;
            infra = Some(InfraNode::join(&lab, &env, n, "infra-1").await?);
            p.say("infrastructure node infra-1 Ready (kubelet, kube-proxy; kube-scheduler)");
            let tag = image_tag(
                &lab.exe_dir().join("bootsman-provider"),
                &lab.exe_dir().join("bootsman-operator"),
            )?;
            for bin in ["bootsman-provider", "bootsman-operator"] {
                let r = registry.push_program(
                    &lab,
                    &format!("bootsman-io/{bin}:{tag}"),
                    &lab.exe_dir().join(bin),
                    Some(65532),
                )?;
                p.say(&format!("image {r}"));
            }
            helm_args.extend(
                [
                    format!("image.registry={}/bootsman-io", net::registry()),
                    format!("image.tag={tag}"),
                    "provider.replicas=1".into(),
                    "operator.replicas=1".into(),
                    "provider.releaseTimeout=3m".into(),
                ]
                .into_iter()
                .flat_map(|v| ["--set".to_string(), v]),
            );
        }
        let helm = env.testbin().bin("helm");
        run(
            Command::new(&helm)
                .args(["install", "bootsman"])
                .arg(bootsman_testenv::repo_root().join("charts/bootsman"))
                .args([
                    "--namespace",
                    "bootsman-system",
                    "--create-namespace",
                    "--skip-crds",
                ])
                .args(&helm_args)
                .env("KUBECONFIG", env.kubeconfig())
                .env("HELM_CACHE_HOME", lab.dir().join("helm"))
                .env("HELM_CONFIG_HOME", lab.dir().join("helm"))
                .env("HELM_DATA_HOME", lab.dir().join("helm")),
            "helm install bootsman charts/bootsman",
        )?;
        p.say("helm install bootsman charts/bootsman");

        let mut controllers = Vec::new();
        if plan.controllers == Controllers::Pods {
            for d in ["bootsman-provider", "bootsman-operator"] {
                let rollout = run(
                    env.kubectl().args([
                        "-n",
                        "bootsman-system",
                        "rollout",
                        "status",
                        &format!("deployment/{d}"),
                        "--timeout=180s",
                    ]),
                    &format!("kubectl rollout status deployment/{d}"),
                );
                if let Err(e) = rollout {
                    return Err(explain_rollout(&env, &lab, d, e));
                }
            }
            p.say("bootsman-provider and bootsman-operator running as Pods of the chart on infra-1");
        } else {
            for (bin, port, extra) in [
                ("bootsman-provider", 18080, vec!["--release-timeout", "3m"]),
                ("bootsman-operator", 18081, vec![]),
            ] {
                let program = lab.exe_dir().join(bin);
                if !program.exists() {
                    return Err(Error::Unsupported(format!(
                        "{} is not built: cargo build --bins",
                        program.display()
                    )));
                }
                let kubeconfig = service_account_kubeconfig(&env, &lab, bin)?;
                let mut args = vec!["--metrics-bind-address".to_string(), format!("127.0.0.1:{port}")];
                args.extend(extra.iter().map(|s| (*s).to_string()));
                controllers.push(Component::spawn(
                    bin,
                    &program,
                    &args,
                    &[
                        ("KUBECONFIG", &kubeconfig.display().to_string()),
                        ("POD_NAMESPACE", "bootsman-system"),
                        ("RUST_LOG", "info,kube=warn"),
                    ],
                    lab.dir().join(format!("{bin}.log")),
                )?);
            }
            p.say("bootsman-provider and bootsman-operator running as processes with the chart's ServiceAccount tokens");
        }

        let mut site = Site {
            hosts: Vec::new(),
            lb: None,
            infra,
            controllers,
            env,
            registry,
            lab,
            plan: plan.clone(),
        };
        for i in 0..plan.hosts.len() {
            site.boot_host(i).await?;
        }
        // HAProxy with the control-plane hosts as backends, as a site's load balancer has them.
        let backends: Vec<(String, Ipv4Addr)> = site
            .hosts
            .iter()
            .zip(&plan.hosts)
            .filter(|(_, (_, role))| role == "control-plane")
            .map(|(h, _)| (h.name().to_string(), h.address()))
            .collect();
        site.lb = Some(LoadBalancer::start(&site.lab, net::endpoint(0), 6443, &backends)?);
        p.say(&format!(
            "{} hosts booted and enrolling; HAProxy at {}:6443 in front of {}",
            site.hosts.len(),
            net::endpoint(0),
            backends
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if let Err(e) = site
            .wait_hosts_available(plan.hosts.len(), Duration::from_secs(180))
            .await
        {
            return Err(Error::Command {
                what: "host enrolment".into(),
                detail: format!("{e}\n{}", site.enrolment_report().await),
            });
        }
        p.say(&format!("{} ByoHosts Available in pool {POOL}", plan.hosts.len()));
        Ok(site)
    }

    /// Boots host `i` of the plan (again, after a kill: its disks keep what they held) and
    /// enrols it when it has not enrolled before.
    pub async fn boot_host(&mut self, i: usize) -> Result<()> {
        let (name, role) = self.plan.hosts[i].clone();
        let n = u8::try_from(i + 1).map_err(|_| Error::Unsupported("at most 99 lab hosts".into()))?;
        if let Some(old) = self.hosts.get_mut(i) {
            old.power_off();
        }
        let host = LabHost::boot(&self.lab, n, &name)?;
        if host
            .sh("test -f /var/lib/byoh-agent/kubeconfig && echo yes || echo no")?
            .trim()
            == "no"
        {
            let token = self.host_token(&name)?;
            host.install_agent(
                &agent_package()?,
                &token,
                &format!(
                    "--namespace {POOL} --name {name} --label {ROLE_LABEL}={role} \
                     --bootstrap-kubeconfig /etc/byoh-agent/bootstrap-kubeconfig --heartbeat-interval 5s"
                ),
            )?;
        }
        if i < self.hosts.len() {
            self.hosts[i] = host;
        } else {
            self.hosts.push(host);
        }
        Ok(())
    }

    /// The bootstrap kubeconfig of a token for host `name` in the pool (`bootsmanctl hosts
    /// token --name NAME`), with the API server's lab address.
    pub fn host_token(&self, name: &str) -> Result<String> {
        run(
            Command::new(self.lab.exe_dir().join("bootsmanctl"))
                .args([
                    "hosts",
                    "token",
                    "--namespace",
                    POOL,
                    "--name",
                    name,
                    "--ttl",
                    "30m",
                ])
                .arg("--server")
                .arg(self.env.advertised_url())
                .env("KUBECONFIG", self.env.kubeconfig()),
            &format!("bootsmanctl hosts token --name {name}"),
        )
    }

    /// `bootsmanctl ARGS` with the infrastructure cluster's admin kubeconfig; its output.
    pub fn bootsmanctl(&self, args: &[&str]) -> Result<String> {
        run(
            Command::new(self.lab.exe_dir().join("bootsmanctl"))
                .args(args)
                .env("KUBECONFIG", self.env.kubeconfig()),
            &format!("bootsmanctl {}", args.join(" ")),
        )
    }

    /// Host by name.
    pub fn host(&self, name: &str) -> Option<&LabHost> {
        self.hosts.iter().find(|h| h.name() == name)
    }

    /// Index of a host in the plan.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.plan.hosts.iter().position(|(n, _)| n == name)
    }

    /// An admin client of the infrastructure cluster.
    pub async fn client(&self) -> kube::Client {
        self.env.client().await
    }

    /// Fails with the log tail of the first controller that stopped.
    pub fn check_controllers(&self) -> Result<()> {
        for c in &self.controllers {
            c.check_running()?;
        }
        if let Some(i) = &self.infra {
            i.check_running()?;
        }
        self.lb.as_ref().map_or(Ok(()), LoadBalancer::check_running)
    }

    /// Where the controllers and the lab services log.
    pub fn log_dir(&self) -> &Path {
        self.lab.dir()
    }

    /// The ByoHosts of the lab's pool.
    pub async fn byohosts(&self) -> Result<Vec<DynamicObject>> {
        Ok(
            Api::<DynamicObject>::namespaced_with(self.client().await, POOL, &byohost_resource())
                .list(&ListParams::default())
                .await
                .map_err(crate::error::kube("list ByoHosts"))?
                .items,
        )
    }

    /// Labels each registered ByoHost of the plan that lacks it with its role, as the site's
    /// admin does (`kubectl label byohost host-1 role=control-plane`): placement labels are the
    /// admin's, and the host policy refuses them from the host.
    async fn label_roles(&self, hosts: &[DynamicObject]) -> Result<()> {
        let api = Api::<DynamicObject>::namespaced_with(self.client().await, POOL, &byohost_resource());
        for h in hosts {
            let name = h.metadata.name.clone().unwrap_or_default();
            let Some((_, role)) = self.plan.hosts.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            let has = h.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL));
            if has != Some(role) {
                let patch = json!({"metadata": {"labels": {ROLE_LABEL: role}}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(crate::error::kube("label a ByoHost with its role"))?;
            }
        }
        Ok(())
    }

    /// Waits until `n` ByoHosts of the pool are `Available`, labelling each with its role as it
    /// registers.
    pub async fn wait_hosts_available(&self, n: usize, timeout: Duration) -> Result<()> {
        until(&format!("{n} ByoHosts Available"), timeout, || async {
            self.check_controllers()?;
            let hosts = self.byohosts().await?;
            self.label_roles(&hosts).await?;
            let phases: Vec<String> = hosts
                .iter()
                .map(|h| {
                    format!(
                        "{}={}",
                        h.metadata.name.clone().unwrap_or_default(),
                        h.data["status"]["phase"].as_str().unwrap_or("-")
                    )
                })
                .collect();
            let available = hosts
                .iter()
                .filter(|h| h.data["status"]["phase"] == "Available")
                .count();
            Ok(if available >= n {
                Ok(())
            } else {
                Err(phases.join(" "))
            })
        })
        .await
    }

    /// For each host of the plan that is not `Available`: its phase, the certificate requests
    /// it made and the end of its agent's log, which together say where enrolment stopped.
    pub async fn enrolment_report(&self) -> String {
        let phases: std::collections::BTreeMap<String, String> = self
            .byohosts()
            .await
            .unwrap_or_default()
            .iter()
            .map(|h| {
                (
                    h.metadata.name.clone().unwrap_or_default(),
                    h.data["status"]["phase"].as_str().unwrap_or("-").to_string(),
                )
            })
            .collect();
        let csrs = self
            .kubectl(None, &["get", "certificatesigningrequests", "-o", "wide"])
            .unwrap_or_else(|e| e.to_string());
        let mut out = String::new();
        for (name, _) in &self.plan.hosts {
            match phases.get(name).map(String::as_str) {
                Some("Available") => continue,
                Some(phase) => out.push_str(&format!("--- {name}: ByoHost phase {phase}\n")),
                None => out.push_str(&format!("--- {name}: no ByoHost\n")),
            }
            let mine: Vec<&str> = csrs
                .lines()
                .filter(|l| l.starts_with(&format!("byoh-host-{name}-")))
                .collect();
            out.push_str(&format!(
                "certificate requests: {}\n",
                if mine.is_empty() {
                    "none".to_string()
                } else {
                    mine.join("\n")
                }
            ));
            if let Some(h) = self.host(name) {
                let log = h.log_dir().join("byoh-agent.log");
                out.push_str(&format!(
                    "{} (last 12 lines):\n{}\n",
                    log.display(),
                    bootsman_testenv::tail(&log, 12)
                ));
            }
        }
        out
    }

    /// Writes the admin kubeconfig of child cluster `name` (from the `<name>-kubeconfig` Secret
    /// Cluster API keeps) into the run folder and returns its path.
    pub async fn child_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let secret = Api::<Secret>::namespaced(self.client().await, namespace)
            .get(&format!("{name}-kubeconfig"))
            .await
            .map_err(crate::error::kube(format!(
                "read Secret {namespace}/{name}-kubeconfig"
            )))?;
        let value = secret
            .data
            .and_then(|d| d.get("value").cloned())
            .ok_or_else(|| Error::Unsupported(format!("Secret {name}-kubeconfig has no value")))?;
        let path = self.lab.dir().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, value.0).map_err(io("write", &path))?;
        Ok(path)
    }

    /// `kubectl ARGS` against the infrastructure cluster, or a child cluster with `kubeconfig`.
    pub fn kubectl(&self, kubeconfig: Option<&Path>, args: &[&str]) -> Result<String> {
        run(
            Command::new(self.env.testbin().bin("kubectl"))
                .args(args)
                .env("KUBECONFIG", kubeconfig.unwrap_or(self.env.kubeconfig())),
            &format!("kubectl {}", args.join(" ")),
        )
    }
}

/// A tag naming the controllers' build: the first 12 hex digits of the SHA-256 of both binaries.
fn image_tag(provider: &Path, operator: &Path) -> Result<String> {
    let out = run(
        Command::new("sha256sum").arg(provider).arg(operator),
        "sha256sum of the controllers",
    )?;
    let sums: String = out.split_whitespace().step_by(2).collect();
    let joined = run(
        Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {sums} | sha256sum")),
        "sha256sum",
    )?;
    Ok(format!("lab-{}", &joined[..12.min(joined.len())]))
}

/// The ByoHost resource for dynamic access.
pub fn byohost_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "ByoHost",
    ))
}

/// The newest `byoh-agent` `.deb` built by `hack/package`.
pub fn agent_package() -> Result<PathBuf> {
    let dir = bootsman_testenv::repo_root().join("target/package");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    debs.retain(|p| p.extension().is_some_and(|e| e == "deb"));
    debs.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    debs.pop().ok_or_else(|| {
        Error::Unsupported(format!(
            "no byoh-agent .deb in {}: run hack/package",
            dir.display()
        ))
    })
}

/// A kubeconfig with a token of ServiceAccount `bootsman-system/<sa>`: the controller gets
/// exactly the chart's RBAC, as in a Pod.
fn service_account_kubeconfig(env: &TestEnv, lab: &Lab, sa: &str) -> Result<PathBuf> {
    let token = run(
        env.kubectl().args([
            "-n",
            "bootsman-system",
            "create",
            "token",
            sa,
            "--duration",
            "24h",
        ]),
        &format!("kubectl create token {sa}"),
    )?;
    let ca = std::fs::read_to_string(&env.pki().files().server_ca.cert)
        .map_err(io("read", &env.pki().files().server_ca.cert))?;
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "infra", "cluster": {
            "server": env.api_url(),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca.as_bytes()),
        }}],
        "users": [{"name": sa, "user": {"token": token.trim()}}],
        "contexts": [{"name": sa, "context": {"cluster": "infra", "user": sa}}],
        "current-context": sa,
    });
    let path = lab.dir().join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, kc.to_string()).map_err(io("write", &path))?;
    Ok(path)
}

/// Free disk a lab host's kubelet insists on before it reports disk pressure. Lab hosts share the
/// machine's disk with everything else on it, so the kubelet's percentage thresholds (10 % and
/// 15 % of the whole disk) would taint every node on a machine whose disk is merely well used.
pub const DISK_RESERVE: &str = "2Gi";

/// The sample BootsmanCluster (`config/samples/bootsmancluster.yaml`) with what a lab site
/// differs in: the version of the lab's kubelet and kubeadm, the lab registry as image
/// repository, HAProxy as the endpoint's external load balancer, kube-router as the CNI (the
/// Cluster API add-on provider for Helm, which installs Cilium, Longhorn and ingress-nginx, is
/// not obtainable here), this machine's cgroup v1, and disk thresholds of [`DISK_RESERVE`].
/// Returns the object and a line per change.
pub fn lab_cluster(version: &str) -> Result<(Value, Vec<String>)> {
    let path = bootsman_testenv::repo_root().join("config/samples/bootsmancluster.yaml");
    let text = std::fs::read_to_string(&path).map_err(io("read", &path))?;
    let mut bc: Value = serde_saphyr::from_str(&text).map_err(|e| Error::Command {
        what: format!("parse {}", path.display()),
        detail: e.to_string(),
    })?;
    let spec = &mut bc["spec"];
    let mut changes = Vec::new();
    let mut set = |ptr: &str, v: Value, why: &str| {
        changes.push(format!("{ptr} = {v}  ({why})"));
        let (parent, key) = ptr.rsplit_once('/').unwrap_or(("", ptr));
        let mut cur = &mut *spec;
        for part in parent.split('/').filter(|s| !s.is_empty()) {
            cur = &mut cur[part];
        }
        cur[key] = v;
    };
    set(
        "kubernetesVersion",
        json!(version),
        "the version of the lab's kubelet and kubeadm",
    );
    set(
        "imageRepository",
        json!(net::registry()),
        "the lab registry, the site's mirror",
    );
    set(
        "controlPlane/endpoint/host",
        json!(net::endpoint(0).to_string()),
        "HAProxy's address on the lab network",
    );
    set(
        "controlPlane/endpoint/loadBalancer",
        json!("external"),
        "HAProxy, since kube-vip is not obtainable here",
    );
    set(
        "network/cni",
        json!("kube-router"),
        "Cilium needs the Helm add-on provider, not obtainable here",
    );
    set(
        "network/kubeProxy",
        json!({"conntrackMaxPerCore": 0}),
        "lab hosts may not raise nf_conntrack_max",
    );
    set(
        "storage/longhorn/enabled",
        json!(false),
        "a Helm chart: needs the add-on provider",
    );
    set(
        "ingress/nginx/enabled",
        json!(false),
        "a Helm chart: needs the add-on provider",
    );
    set("nodes/allowCgroupV1", json!(true), "this machine runs cgroup v1");
    set(
        "nodes/kubelet",
        json!({
            "evictionHard": {"nodefs.available": DISK_RESERVE, "imagefs.available": DISK_RESERVE},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 95,
        }),
        "lab hosts share this machine's disk: how full it is says nothing about them",
    );
    Ok((bc, changes))
}

/// Polls `check` every 2 s until it returns `Ok(Ok(v))`; `Ok(Err(seen))` keeps waiting and is
/// reported on timeout; `Err` stops at once.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<std::result::Result<T, String>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match check().await? {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("{what} (last seen: {seen})"),
                secs: timeout.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A Deployment that did not roll out: what its Pods, their Events and their logs say, written to
/// `<lab>/<deployment>-rollout.txt` and summed up in the error, so a failed run explains itself.
fn explain_rollout(env: &TestEnv, lab: &Lab, deployment: &str, cause: Error) -> Error {
    let selector = format!("app.kubernetes.io/name={deployment}");
    let mut report = String::new();
    for (what, args) in [
        ("pods", vec!["get", "pods", "-o", "wide", "-l", &selector]),
        ("describe", vec!["describe", "pods", "-l", &selector]),
        (
            "logs",
            vec![
                "logs",
                "-l",
                &selector,
                "--all-containers",
                "--tail=80",
                "--prefix",
            ],
        ),
        (
            "previous logs",
            vec![
                "logs",
                "-l",
                &selector,
                "--all-containers",
                "--tail=40",
                "--previous",
            ],
        ),
        ("lease", vec!["get", "leases", "-o", "wide"]),
    ] {
        let out = env.kubectl().args(["-n", "bootsman-system"]).args(&args).output();
        report.push_str(&format!("--- {what}\n"));
        match out {
            Ok(o) => {
                report.push_str(&String::from_utf8_lossy(&o.stdout));
                report.push_str(&String::from_utf8_lossy(&o.stderr));
            }
            Err(e) => report.push_str(&format!("kubectl: {e}\n")),
        }
    }
    let file = lab.dir().join(format!("{deployment}-rollout.txt"));
    let _ = std::fs::write(&file, &report);
    eprintln!(
        "{deployment} did not roll out; what its Pods say ({}):\n{report}",
        file.display()
    );
    cause
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_lab_cluster_is_the_sample_with_named_changes() {
        let (bc, changes) = lab_cluster("v1.36.3").unwrap();
        assert_eq!(bc["spec"]["controlPlane"]["replicas"], 3);
        assert_eq!(bc["spec"]["controlPlane"]["endpoint"]["loadBalancer"], "external");
        assert_eq!(bc["spec"]["network"]["cni"], "kube-router");
        assert_eq!(bc["spec"]["imageRepository"], "172.31.77.1:5000");
        assert_eq!(changes.len(), 10);
        let typed: bootsman_api::v1alpha1::BootsmanCluster = serde_json::from_value(bc).unwrap();
        assert!(typed.spec.nodes.allow_cgroup_v1);
        assert_eq!(
            typed.spec.nodes.kubelet.eviction_hard["nodefs.available"],
            DISK_RESERVE
        );
    }
}
