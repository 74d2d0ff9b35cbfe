//! `bench-bind`: how long the provider takes to bind N hosts to N machines, against how long the
//! same API server takes for N plain writes.
//!
//! ```text
//! cargo build --release -p bootsman-provider
//! cargo run --release -p bootsman-bench --bin bench-bind -- --hosts 500
//! ```
//!
//! What it does, in order:
//!
//! 1. starts a control plane of its own with [`bootsman_testenv::TestEnv::start`] (etcd,
//!    kube-apiserver, kube-controller-manager on loopback);
//! 2. **floor**: creates N ConfigMaps (16 at a time, untimed), then times N *sequential* merge
//!    patches of them from one admin client: one round trip and one etcd write each, as a host
//!    claim is. That is the least the server needs for N bindings done one after another;
//! 3. creates N registered hosts (ByoHost plus a fresh heartbeat Lease named after it), one CAPI
//!    Cluster with `status.initialization.infrastructureProvisioned = true`, and N Machines with
//!    their bootstrap data Secrets (labelled `cluster.x-k8s.io/cluster-name`, as the kubeadm
//!    bootstrap provider labels them) and the ByoMachines they own (no selector), 16 at a time,
//!    all before the provider starts;
//! 4. runs the `bootsman-provider` binary next to this one as a separate process
//!    (`--namespace NS --leader-elect=false`), with an identity of its own (user
//!    `bootsman-bench-provider`, bound to `cluster-admin`, classified by a FlowSchema of its own
//!    into the `exempt` priority level, so it is never throttled, just as an admin client is not),
//!    and times from spawning it until a list (every `--poll-ms`, default 100 ms, after the last
//!    one returned) sees `spec.providerID` on every ByoMachine: **bound**. On a saturated server
//!    one list can take many seconds, so `bound` is late by up to one list (`polls` and
//!    `poll_seconds` in the JSON say how long they took); a failed list is retried;
//! 5. **requests per binding**: `apiserver_request_total` has no user label, so the API server's
//!    `/metrics` is scraped before the provider starts and after it has exited, the sum over all
//!    series is taken, and the bench's own requests in that window (its polls and its first scrape)
//!    and the idle background (kube-controller-manager and the server itself, measured for a few
//!    seconds before the provider starts, scaled to the window) are subtracted; the rest is divided
//!    by N. As a cross-check, `apiserver_flowcontrol_dispatched_requests_total` of the provider's
//!    own FlowSchema counts the provider's requests alone (`flowschema_requests_per_binding`);
//! 6. the provider's peak RSS: `VmHWM` of `/proc/<pid>/status`, read after the last binding and
//!    before the provider is stopped;
//! 7. prints a summary and writes `<out>/bind-<N>.json` (keys `n`, `seconds`, `floor_seconds`,
//!    `ratio`, `requests_per_binding`, `provider_rss_mib`, and more) and the provider's log
//!    `<out>/bind-<N>-provider.log` (and the control plane's logs in `<out>/bind-<N>-logs/`);
//!    then stops the provider (SIGTERM) and the control plane.
//!    When not every machine is bound within `--timeout` (default 900 s), or the provider stalls
//!    (no binding and no ByoMachine reconcile started for `--stall-secs`, default 120 s, as read
//!    from its own `/metrics`), the JSON says `"completed": false` with `seconds` and `ratio`
//!    null, and the bench exits non-zero.
//!
//! "Bound" is `spec.providerID`, which the provider sets after the claim and the bootstrap
//! hand-over (per-host Secret, Role, RoleBinding, `ByoHost.spec.bootstrapSecret`); no agent runs,
//! so no machine goes on to `provisioned`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bootsman_api::capi::{
    Bootstrap, Cluster, ClusterSpec, ContractVersionedObjectReference, Machine, MachineSpec,
};
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoHostSpec, ByoMachine, ByoMachineSpec};
use bootsman_bench::{exempt_identity, parse_sample, peak_rss_mib, scrape};
use bootsman_testenv::{Options, TestEnv};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Setup requests in flight at once.
const PARALLEL: usize = 16;
/// The provider's identity (client-certificate CN) and the name of its FlowSchema.
const PROVIDER_USER: &str = "bootsman-bench-provider";
/// How long the idle background of the API server is measured.
const BACKGROUND: Duration = Duration::from_secs(5);

/// Binds N hosts to N machines with the provider and compares the time with N plain writes.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Number of hosts, and of machines.
    #[arg(long, default_value_t = 100)]
    hosts: usize,
    /// Folder of the JSON result and the provider's log.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Interval between the lists that look for bound machines, in milliseconds.
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    /// Give up waiting for the bindings after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Give up earlier when for this many seconds no machine was bound and the provider started
    /// no ByoMachine reconcile: it has stalled.
    #[arg(long, default_value_t = 120)]
    stall_secs: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.hosts;
    if n == 0 {
        bail!("--hosts must be at least 1");
    }
    let provider_bin = std::env::current_exe()?.with_file_name("bootsman-provider");
    if !provider_bin.is_file() {
        bail!(
            "{} is missing: build it next to this binary first (cargo build --release -p bootsman-provider)",
            provider_bin.display()
        );
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;

    eprintln!("bench-bind: starting a control plane");
    let env = TestEnv::start(Options::default())
        .await
        .context("start the control plane")?;
    // Ctrl-C or SIGTERM drop the bench (and with it the provider process, `kill_on_drop`), then
    // the control plane below.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        r = bench(&env, &args, &provider_bin) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    // Keep the control plane's logs: they go with its folder.
    let logs = args.out.join(format!("bind-{n}-logs"));
    if let Err(e) = copy_logs(&env.log_dir(), &logs) {
        eprintln!(
            "bench-bind: cannot keep the control plane's logs in {}: {e}",
            logs.display()
        );
    }
    drop(env); // stops kube-controller-manager, kube-apiserver and etcd
    let report = result?;
    println!("{}", summary(&report));
    let path = args.out.join(format!("bind-{n}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("write {}", path.display()))?;
    println!("wrote {}", path.display());
    if report.get("completed") != Some(&json!(true)) {
        bail!(
            "not every machine was bound within --timeout; see {}",
            path.display()
        );
    }
    Ok(())
}

async fn bench(env: &TestEnv, args: &Args, provider_bin: &Path) -> Result<serde_json::Value> {
    let n = args.hosts;
    let admin = env.client().await;
    let version = admin.apiserver_version().await?.git_version;

    // 2. The floor.
    let floor_ns = env.create_namespace("floor").await;
    let floor = floor(&admin, &floor_ns, n).await?;
    eprintln!("bench-bind: floor: {n} sequential ConfigMap merge patches in {floor:.3}s");

    // 3. Setup, before the provider starts.
    let ns = env.create_namespace("bench").await;
    let setup_started = Instant::now();
    exempt_identity(&admin, PROVIDER_USER).await?;
    create_hosts(&admin, &ns, n).await?;
    create_cluster(&admin, &ns, "c1").await?;
    create_machines(&admin, &ns, "c1", n).await?;
    let setup_secs = setup_started.elapsed().as_secs_f64();
    eprintln!("bench-bind: {n} hosts and {n} machines created in {setup_secs:.1}s");

    // The idle background: what the server counts with nobody but kube-controller-manager (and
    // this scrape) talking to it.
    let idle_before = scrape(&admin).await?;
    let idle_started = Instant::now();
    tokio::time::sleep(BACKGROUND).await;
    let before = scrape(&admin).await?;
    let idle_secs = idle_started.elapsed().as_secs_f64();
    let background_rate = ((before.total - idle_before.total - 1.0) / idle_secs).max(0.0);

    // 4. The provider, as a process of its own.
    let kubeconfig = env.kubeconfig_for(PROVIDER_USER, &[])?;
    let metrics_port = bootsman_testenv::free_port()?;
    let log_path = args.out.join(format!("bind-{n}-provider.log"));
    let window_started = Instant::now();
    let mut child =
        bootsman_bench::spawn_controller(provider_bin, &ns, metrics_port, &kubeconfig, &log_path)?;
    let pid = child.id().context("the provider has no pid")?;

    let bms: Api<ByoMachine> = Api::namespaced(admin.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut polls = 0u64;
    let mut poll_secs = 0.0;
    let mut last_report = Instant::now();
    let mut progress = Vec::new();
    let mut bound = 0;
    let mut poll_errors: Vec<String> = Vec::new();
    // (bound, reconciles started) and since when they have not changed.
    let mut last_change = (0, 0.0, Instant::now());
    let mut stalled = false;
    let seconds = loop {
        if let Some(status) = child.try_wait()? {
            bail!("the provider exited early ({status}); see {}", log_path.display());
        }
        let t = Instant::now();
        let list = bms.list(&ListParams::default()).await;
        polls += 1;
        poll_secs += t.elapsed().as_secs_f64();
        match list {
            Ok(list) => bound = list.items.iter().filter(|m| m.spec.provider_id.is_some()).count(),
            Err(e) => {
                // An overloaded server may time the list out or drop the connection; look again.
                poll_errors.push(format!("{:.0}s: {e}", window_started.elapsed().as_secs_f64()));
                eprintln!(
                    "bench-bind: a poll failed after {:.1}s: {e}",
                    t.elapsed().as_secs_f64()
                );
            }
        }
        let elapsed = window_started.elapsed().as_secs_f64();
        if bound == n {
            break Some(elapsed);
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            // The provider's own counters tell a stall (no reconciles) from slow progress.
            let m = provider_metrics(metrics_port).await.unwrap_or_default();
            let get = |k: &str| m.get(k).cloned().unwrap_or(json!(0));
            let reconciles = get("bootsman_reconcile_total{controller=byomachine}");
            let r = reconciles.as_f64().unwrap_or(0.0);
            if (bound, r) != (last_change.0, last_change.1) {
                last_change = (bound, r, Instant::now());
            } else if last_change.2.elapsed() >= Duration::from_secs(args.stall_secs) {
                eprintln!(
                    "bench-bind: stalled: {bound}/{n} bound and no ByoMachine reconcile started for {}s; \
                     giving up (see {})",
                    args.stall_secs,
                    log_path.display()
                );
                stalled = true;
                break None;
            }
            eprintln!(
                "bench-bind: {elapsed:.0}s: {bound}/{n} bound; byomachine reconciles started: {reconciles}"
            );
            progress.push(json!({
                "t": elapsed.round(),
                "bound": bound,
                "byomachine_reconciles": reconciles,
                "claims": get("bootsman_provider_claims_total"),
            }));
            last_report = Instant::now();
        }
        if Instant::now() > deadline {
            eprintln!(
                "bench-bind: only {bound} of {n} machines bound after {}s; giving up (see {})",
                args.timeout,
                log_path.display()
            );
            break None;
        }
        tokio::time::sleep(Duration::from_millis(args.poll_ms)).await;
    };
    if let Some(s) = seconds {
        eprintln!("bench-bind: all {n} bound after {s:.2}s");
    }

    // 6. Peak RSS and the provider's own counters, then stop it.
    let rss_mib = peak_rss_mib(pid)?;
    let provider_metrics = provider_metrics(metrics_port).await.unwrap_or_default();
    let _ = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await;
    let stopped_on_sigterm = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .is_ok();
    if !stopped_on_sigterm {
        eprintln!("bench-bind: the provider did not stop on SIGTERM within 15s; killing it");
        child.kill().await?;
    }
    let window_secs = window_started.elapsed().as_secs_f64();

    // 5. Requests: everything the server counted in the window, less ours and the background.
    let after = scrape(&admin).await?;
    let delta = after.total - before.total;
    let own = polls as f64 + 1.0; // the polls, and the scrape `before` (a scrape counts once done)
    let background = background_rate * window_secs;
    let requests_per_binding = (delta - own - background) / n as f64;
    let per_flow_schema: serde_json::Map<String, serde_json::Value> = after
        .by_flow_schema
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v - before.by_flow_schema.get(k).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, d)| *d > 0.0)
        .map(|(k, d)| (k, json!(d)))
        .collect();
    let flowschema_requests = per_flow_schema.get(PROVIDER_USER).and_then(|v| v.as_f64());
    let mut by_request: BTreeMap<String, f64> = BTreeMap::new();
    for (k, v) in &after.by_request {
        let d = v - before.by_request.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            by_request.insert(k.clone(), d);
        }
    }
    if let Some(v) = by_request.get_mut("LIST byomachines 200") {
        *v -= polls as f64; // our polls
    }
    by_request.retain(|_, v| *v > 0.0);
    let mut top: Vec<(String, f64)> = by_request.into_iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: serde_json::Map<String, serde_json::Value> =
        top.into_iter().take(30).map(|(k, v)| (k, json!(v))).collect();

    Ok(json!({
        "n": n,
        "seconds": seconds.map(round3),
        "floor_seconds": round3(floor),
        "ratio": seconds.map(|s| round3(s / floor)),
        "requests_per_binding": round3(requests_per_binding),
        "provider_rss_mib": round3(rss_mib),
        "completed": seconds.is_some(),
        "stalled": stalled,
        "bound": bound,
        "kubernetes_version": version,
        "cpus": std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0),
        "floor_method": format!(
            "{n} sequential JSON merge patches (data.k) of {n} pre-created ConfigMaps from one admin \
             client; wall time from the first request to the last response"
        ),
        "seconds_method": format!(
            "wall time from spawning the provider process until a list of ByoMachines (every \
             {} ms after the previous one returned) shows spec.providerID on all {n}",
            args.poll_ms
        ),
        "requests_method": "sum of apiserver_request_total over all series, scraped before the \
             provider started and after it exited, minus the bench's polls and first scrape, minus \
             the idle background rate (measured for 5 s before the provider started) times the \
             window; divided by n. Cross-check: flowschema_requests_per_binding counts \
             apiserver_flowcontrol_dispatched_requests_total of the provider's own FlowSchema",
        "requests_in_window": delta,
        "bench_requests_in_window": own,
        "background_requests_per_second": round3(background_rate),
        "window_seconds": round3(window_secs),
        "flowschema_requests_per_binding": flowschema_requests.map(|r| round3(r / n as f64)),
        "dispatched_by_flow_schema": per_flow_schema,
        "requests_by_verb_resource_code": top,
        "polls": polls,
        "poll_errors": poll_errors,
        "poll_seconds": round3(poll_secs),
        "setup_seconds": round3(setup_secs),
        "progress": progress,
        "provider_metrics": provider_metrics,
        "provider_stopped_on_sigterm": stopped_on_sigterm,
        "provider_log": log_path.display().to_string(),
    }))
}

fn copy_logs(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn summary(r: &serde_json::Value) -> String {
    let f = |k: &str| r.get(k).cloned().unwrap_or(serde_json::Value::Null);
    format!(
        "bench-bind on Kubernetes {}: n = {} ({} bound)\n  \
         bound:    {} s (provider start until every ByoMachine has spec.providerID)\n  \
         floor:    {} s ({} sequential ConfigMap merge patches, one client)\n  \
         ratio:    {}\n  \
         requests: {} per binding (apiserver_request_total, less bench and background; \
         provider FlowSchema alone: {})\n  \
         RSS:      {} MiB peak (VmHWM of the provider)",
        f("kubernetes_version"),
        f("n"),
        f("bound"),
        f("seconds"),
        f("floor_seconds"),
        f("n"),
        f("ratio"),
        f("requests_per_binding"),
        f("flowschema_requests_per_binding"),
        f("provider_rss_mib"),
    )
}

/// Creates `n` ConfigMaps (concurrently, untimed), then times `n` sequential merge patches.
async fn floor(client: &kube::Client, ns: &str, n: usize) -> Result<f64> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm = ConfigMap {
                    metadata: meta(&format!("cm{i:05}"), ns),
                    data: Some(BTreeMap::from([("k".to_string(), "0".to_string())])),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await
        .context("create the floor's ConfigMaps")?;
    let started = Instant::now();
    for i in 0..n {
        let patch = json!({"data": {"k": "1"}});
        api.patch(
            &format!("cm{i:05}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .context("patch a floor ConfigMap")?;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn meta(name: &str, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

/// N ByoHosts, each with a heartbeat Lease renewed now and valid for an hour.
async fn create_hosts(client: &kube::Client, ns: &str, n: usize) -> Result<()> {
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let (hosts, leases) = (hosts.clone(), leases.clone());
            async move {
                let name = format!("h{i:05}");
                let mut h = ByoHost::new(&name, ByoHostSpec::default());
                h.metadata.namespace = Some(ns.into());
                hosts
                    .create(&PostParams::default(), &h)
                    .await
                    .with_context(|| format!("create ByoHost {name}"))?;
                let lease = Lease {
                    metadata: meta(&name, ns),
                    spec: Some(LeaseSpec {
                        holder_identity: Some(name.clone()),
                        lease_duration_seconds: Some(3600),
                        renew_time: Some(MicroTime(Timestamp::now())),
                        ..Default::default()
                    }),
                };
                leases
                    .create(&PostParams::default(), &lease)
                    .await
                    .with_context(|| format!("create Lease {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// A CAPI Cluster whose infrastructure is provisioned.
async fn create_cluster(client: &kube::Client, ns: &str, name: &str) -> Result<()> {
    let mut c = Cluster::new(name, ClusterSpec::default());
    c.metadata.namespace = Some(ns.into());
    c.spec.infrastructure_ref = Some(ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "ByoCluster".into(),
        name: name.into(),
    });
    let api: Api<Cluster> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &c)
        .await
        .context("create the Cluster")?;
    let status = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("mark the Cluster's infrastructure provisioned")?;
    Ok(())
}

/// N Machines, each with its bootstrap data Secret and the ByoMachine it owns, as CAPI creates
/// them.
async fn create_machines(client: &kube::Client, ns: &str, cluster: &str, n: usize) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let machines: Api<Machine> = Api::namespaced(client.clone(), ns);
    let bms: Api<ByoMachine> = Api::namespaced(client.clone(), ns);
    let cluster_label = BTreeMap::from([(labels::CLUSTER_NAME.to_string(), cluster.to_string())]);
    futures::stream::iter(0..n)
        .map(|i| {
            let (secrets, machines, bms) = (secrets.clone(), machines.clone(), bms.clone());
            let cluster_label = cluster_label.clone();
            async move {
                let name = format!("m{i:05}");
                let data_secret = format!("{name}-bootstrap-data");
                let data = format!("#cloud-config\nruncmd:\n- echo {name}\n");
                let mut secret_meta = meta(&data_secret, ns);
                // As CAPI's bootstrap providers label the data Secrets they write.
                secret_meta.labels = Some(cluster_label.clone());
                let secret = Secret {
                    metadata: secret_meta,
                    data: Some(BTreeMap::from([
                        ("value".to_string(), ByteString(data.into_bytes())),
                        ("format".to_string(), ByteString(b"cloud-config".to_vec())),
                    ])),
                    ..Default::default()
                };
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .with_context(|| format!("create Secret {data_secret}"))?;
                let mut m = Machine::new(
                    &name,
                    MachineSpec {
                        cluster_name: cluster.into(),
                        bootstrap: Bootstrap {
                            data_secret_name: Some(data_secret),
                            config_ref: None,
                        },
                        infrastructure_ref: ContractVersionedObjectReference {
                            api_group: "infrastructure.cluster.x-k8s.io".into(),
                            kind: "ByoMachine".into(),
                            name: name.clone(),
                        },
                        ..Default::default()
                    },
                );
                m.metadata.namespace = Some(ns.into());
                m.metadata.labels = Some(cluster_label.clone());
                let m = machines
                    .create(&PostParams::default(), &m)
                    .await
                    .with_context(|| format!("create Machine {name}"))?;
                let mut bm = ByoMachine::new(&name, ByoMachineSpec::default());
                bm.metadata.namespace = Some(ns.into());
                bm.metadata.labels = Some(cluster_label);
                bm.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: Machine::api_version(&()).into(),
                    kind: "Machine".into(),
                    name: name.clone(),
                    uid: m.uid().context("a created Machine has a uid")?,
                    controller: Some(true),
                    ..Default::default()
                }]);
                bms.create(&PostParams::default(), &bm)
                    .await
                    .with_context(|| format!("create ByoMachine {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The provider's own counters (claims, conflicts, reconciles and their errors), from its
/// `/metrics`.
async fn provider_metrics(port: u16) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut body)).await??;
    let mut out = serde_json::Map::new();
    for line in body.lines() {
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        let wanted = matches!(
            name,
            "bootsman_provider_claims_total"
                | "bootsman_provider_claim_conflicts_total"
                | "bootsman_reconcile_total"
                | "bootsman_reconcile_errors_total"
                | "bootsman_reconcile_duration_seconds_sum"
                | "bootsman_provider_time_to_claim_seconds_sum"
                | "bootsman_provider_time_to_claim_seconds_count"
        );
        if wanted {
            let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            l.sort();
            let key = if l.is_empty() {
                name.to_string()
            } else {
                format!("{name}{{{}}}", l.join(","))
            };
            out.insert(key, json!(value));
        }
    }
    Ok(out)
}
