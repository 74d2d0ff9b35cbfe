//! `bench-operator`: what N BootsmanClusters cost `bootsman-operator` once they are rendered and
//! nothing changes, and how fast it follows a replica change.
//!
//! ```text
//! cargo build --release -p bootsman-operator
//! cargo run --release -p bootsman-bench --bin bench-operator -- --clusters 200
//! ```
//!
//! What it does, in order:
//!
//! 1. starts a control plane of its own (etcd, kube-apiserver, kube-controller-manager on
//!    loopback; the Cluster API CRDs are installed, no Cluster API manager runs) and a stand-in
//!    CRD for `HelmChartProxy`;
//! 2. creates N BootsmanClusters from `config/samples/bootsmancluster.yaml` (names `c000`, ...)
//!    in one namespace;
//! 3. runs the `bootsman-operator` binary next to this one as a separate process
//!    (`--namespace NS --leader-elect=false`), with an identity of its own (user
//!    `bootsman-bench-operator`, bound to `cluster-admin`, its own FlowSchema in the `exempt`
//!    priority level), and times until every cluster's MachineDeployment `<name>-default` exists:
//!    **rendered**;
//! 4. **idle**: waits `--settle-secs` (default 10 s), then counts the operator's requests
//!    (`apiserver_flowcontrol_dispatched_requests_total` of its FlowSchema) over `--idle-secs`
//!    (default 60 s) in which nothing changes: requests per second, and per second per cluster;
//!    the same window's requests by verb and resource (all clients) say what they were;
//! 5. **replica change**: for `--changes` clusters (default 10), one after another, patches
//!    `spec.workers[0].replicas` from 3 to 4 (a replace of the object read just before) and times
//!    from the replace until that cluster's MachineDeployment has
//!    `spec.replicas: 4` (polled every 10 ms): median and maximum;
//! 6. the operator's peak RSS (`VmHWM`), then prints a summary and writes
//!    `<out>/operator-<N>.json` and the operator's log next to it.
//!
//! Nothing is asserted: the numbers are printed and written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bootsman_api::capi::MachineDeployment;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_bench::{exempt_identity, peak_rss_mib, scrape};
use bootsman_testenv::{Options, TestEnv};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// Setup requests in flight at once.
const PARALLEL: usize = 16;
/// The operator's identity (client-certificate CN) and the name of its FlowSchema.
const OPERATOR_USER: &str = "bootsman-bench-operator";

/// Measures the operator's cost at rest and its reaction to a replica change.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Number of BootsmanClusters.
    #[arg(long, default_value_t = 200)]
    clusters: usize,
    /// How long the idle requests are counted, in seconds.
    #[arg(long, default_value_t = 60)]
    idle_secs: u64,
    /// Pause between the last cluster rendered and the idle window, in seconds.
    #[arg(long, default_value_t = 10)]
    settle_secs: u64,
    /// How many replica changes are timed.
    #[arg(long, default_value_t = 10)]
    changes: usize,
    /// Give up waiting for the clusters to be rendered after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Folder of the JSON result and the operator's log.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.clusters == 0 {
        bail!("--clusters must be at least 1");
    }
    if args.changes > args.clusters {
        bail!("--changes must be at most --clusters ({})", args.clusters);
    }
    let operator_bin = std::env::current_exe()?.with_file_name("bootsman-operator");
    if !operator_bin.is_file() {
        bail!(
            "{} is missing: build it next to this binary first (cargo build --release -p bootsman-operator)",
            operator_bin.display()
        );
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    eprintln!("bench-operator: starting a control plane");
    let env = TestEnv::start(Options::default())
        .await
        .context("start the control plane")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        r = bench(&env, &args, &operator_bin) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    drop(env);
    let report = result?;
    println!("{}", summary(&report));
    let path = args.out.join(format!("operator-{}.json", args.clusters));
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

async fn bench(env: &TestEnv, args: &Args, operator_bin: &Path) -> Result<serde_json::Value> {
    let n = args.clusters;
    let admin = env.client().await;
    bootsman_fixtures::clusters::install_helm_chart_proxy_crd(env).await;
    exempt_identity(&admin, OPERATOR_USER).await?;
    let ns = env.create_namespace("bench-operator").await;

    // 2. The clusters, before the operator starts.
    let started = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("c{i:03}")).collect();
    let api: Api<BootsmanCluster> = Api::namespaced(admin.clone(), &ns);
    futures::stream::iter(names.clone())
        .map(|name| {
            let (api, ns) = (api.clone(), ns.clone());
            async move {
                let mut bc = bootsman_fixtures::clusters::sample(&ns);
                bc.metadata.name = Some(name.clone());
                api.create(&PostParams::default(), &bc)
                    .await
                    .with_context(|| format!("create BootsmanCluster {name}"))
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!(
        "bench-operator: {n} BootsmanClusters created in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // 3. The operator, as a process of its own.
    let kubeconfig = env.kubeconfig_for(OPERATOR_USER, &[])?;
    let metrics_port = bootsman_testenv::free_port()?;
    let log_path = args.out.join(format!("operator-{n}-operator.log"));
    let spawned = Instant::now();
    let mut child =
        bootsman_bench::spawn_controller(operator_bin, &ns, metrics_port, &kubeconfig, &log_path)?;
    let pid = child.id().context("the operator has no pid")?;
    let mds: Api<MachineDeployment> = Api::namespaced(admin.clone(), &ns);
    let deadline = spawned + Duration::from_secs(args.timeout);
    let rendered_secs = loop {
        if let Some(status) = child.try_wait()? {
            bail!("the operator exited early ({status}); see {}", log_path.display());
        }
        let rendered = mds
            .list(&Default::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        if rendered >= n {
            break spawned.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("only {rendered} of {n} clusters rendered within --timeout");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("bench-operator: {n} clusters rendered in {rendered_secs:.1}s; settling");

    // 4. At rest.
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    let before = scrape(&admin).await?;
    let idle_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let after = scrape(&admin).await?;
    let idle = idle_started.elapsed().as_secs_f64();
    let own = |s: &bootsman_bench::Scrape| s.by_flow_schema.get(OPERATOR_USER).copied().unwrap_or(0.0);
    let idle_requests = own(&after) - own(&before);
    let per_second = idle_requests / idle;
    let mut by_request: BTreeMap<String, f64> = BTreeMap::new();
    for (k, v) in &after.by_request {
        let d = v - before.by_request.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            by_request.insert(k.clone(), d);
        }
    }
    eprintln!("bench-operator: idle {idle_requests:.0} requests in {idle:.0}s; timing replica changes");

    // 5. Replica changes, one at a time.
    let mut latencies = Vec::new();
    for name in names.iter().take(args.changes) {
        let md_name = format!("{name}-default");
        let mut bc = api.get(name).await?;
        bc.spec.workers[0].replicas = 4;
        let t = Instant::now();
        api.replace(name, &PostParams::default(), &bc)
            .await
            .with_context(|| format!("scale BootsmanCluster {name}"))?;
        loop {
            let md = mds.get(&md_name).await?;
            if md.spec.replicas == Some(4) {
                latencies.push(t.elapsed().as_secs_f64());
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("MachineDeployment {md_name} was not scaled within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    latencies.sort_by(f64::total_cmp);
    let median = latencies.get(latencies.len() / 2).copied();
    let max = latencies.last().copied();
    let rss = peak_rss_mib(pid)?;
    child.start_kill()?;
    let _ = child.wait().await;

    Ok(json!({
        "clusters": n,
        "rendered_seconds": round3(rendered_secs),
        "idle_seconds": round3(idle),
        "idle_requests": idle_requests,
        "idle_requests_per_second": round3(per_second),
        "idle_requests_per_second_per_cluster": round3(per_second / n as f64),
        "idle_requests_by_verb_resource_code_all_clients": by_request,
        "replica_change_seconds_median": median.map(round3),
        "replica_change_seconds_max": max.map(round3),
        "replica_changes": latencies.len(),
        "operator_rss_mib": round3(rss),
        "kubernetes": admin.apiserver_version().await?.git_version,
    }))
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn summary(r: &serde_json::Value) -> String {
    format!(
        "bench-operator: {} clusters rendered in {} s; at rest {} requests/s ({} per cluster) \
         over {} s; replica change to MachineDeployment: median {} s, max {} s; operator peak RSS \
         {} MiB",
        r["clusters"],
        r["rendered_seconds"],
        r["idle_requests_per_second"],
        r["idle_requests_per_second_per_cluster"],
        r["idle_seconds"],
        r["replica_change_seconds_median"],
        r["replica_change_seconds_max"],
        r["operator_rss_mib"],
    )
}
