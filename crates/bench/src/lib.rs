//! # bootsman-bench
//!
//! Benchmark programs, each starting a real control plane of its own
//! ([`bootsman_testenv::TestEnv`]) and running the release build of a Bootsman controller
//! against it as a separate process. They print their numbers and write them as JSON under
//! `target/bench/`; nothing here asserts a time. Being a crate of their own, they keep the test
//! harness out of the controllers' builds.
//!
//! - `bench-bind` (`src/bin/bench_bind.rs`): N hosts bound to N machines by `bootsman-provider`,
//!   against the API server's floor for N sequential writes; requests per binding; the
//!   provider's peak RSS.
//! - `bench-operator` (`src/bin/bench_operator.rs`): N BootsmanClusters kept by
//!   `bootsman-operator`: its API requests per second per idle cluster, the time from a replica
//!   change to the patched MachineDeployment, its peak RSS.
//!
//! The helpers below are theirs: an exempt identity whose requests the API server counts apart,
//! the API server's request counters, a process's peak RSS.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::json;

/// `cluster-admin` for `user` (a controller run by a benchmark), and a FlowSchema named `user`
/// that puts its requests into the `exempt` priority level (as an admin's are), so it is never
/// throttled and `apiserver_flowcontrol_dispatched_requests_total` counts its requests alone.
pub async fn exempt_identity(client: &kube::Client, user: &str) -> Result<()> {
    let crb = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(user.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &crb)
        .await
        .context("create the provider's ClusterRoleBinding")?;
    let fs: FlowSchema = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": user},
        "spec": {
            "matchingPrecedence": 2,
            "priorityLevelConfiguration": {"name": "exempt"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": user}}],
                "resourceRules": [{
                    "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "namespaces": ["*"], "clusterScope": true,
                }],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    }))?;
    let api: Api<FlowSchema> = Api::all(client.clone());
    api.create(&PostParams::default(), &fs)
        .await
        .context("create the provider's FlowSchema")?;
    // The APF configuration controller marks a FlowSchema (`Dangling`) once it has digested it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fs = api.get(user).await?;
        let digested = fs
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_.as_deref() == Some("Dangling")));
        if digested {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the API server did not take up FlowSchema {user} within 30s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Counters of one scrape of the API server's `/metrics`.
pub struct Scrape {
    /// Sum of `apiserver_request_total` over every series.
    pub total: f64,
    /// `apiserver_request_total` by `VERB resource[/subresource] code`.
    pub by_request: HashMap<String, f64>,
    /// `apiserver_flowcontrol_dispatched_requests_total` by FlowSchema.
    pub by_flow_schema: HashMap<String, f64>,
}

pub async fn scrape(client: &kube::Client) -> Result<Scrape> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("scrape the API server's /metrics")?;
    let mut s = Scrape {
        total: 0.0,
        by_request: HashMap::new(),
        by_flow_schema: HashMap::new(),
    };
    for line in text.lines() {
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        match name {
            "apiserver_request_total" => {
                s.total += value;
                let l = |k: &str| labels.get(k).map(String::as_str).unwrap_or("");
                let resource = match (l("resource"), l("subresource")) {
                    ("", _) => "(non-resource)".to_string(),
                    (r, "") => r.to_string(),
                    (r, sub) => format!("{r}/{sub}"),
                };
                *s.by_request
                    .entry(format!("{} {resource} {}", l("verb"), l("code")))
                    .or_default() += value;
            }
            "apiserver_flowcontrol_dispatched_requests_total" => {
                if let Some(fs) = labels.get("flow_schema") {
                    *s.by_flow_schema.entry(fs.clone()).or_default() += value;
                }
            }
            _ => {}
        }
    }
    Ok(s)
}

/// One sample of the Prometheus text format: name, labels and value.
pub fn parse_sample(line: &str) -> Option<(&str, HashMap<String, String>, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, rest) = match series.find('{') {
        Some(i) => (&series[..i], &series[i + 1..]),
        None => (series, ""),
    };
    let mut labels = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim_start_matches([',', ' ']).to_string();
        if key.is_empty() || key.starts_with('}') {
            break;
        }
        if chars.next() != Some('"') {
            break;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(e) = chars.next() {
                        val.push(if e == 'n' { '\n' } else { e });
                    }
                }
                '"' => break,
                c => val.push(c),
            }
        }
        labels.insert(key, val);
    }
    Some((name, labels, value))
}

/// `VmHWM` (peak resident set) of a process, in MiB.
pub fn peak_rss_mib(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmHWM in {path}"))?;
    Ok(kib / 1024.0)
}

/// A controller binary run as a benchmark runs it: its own process, watching namespace `ns`,
/// leader election off, metrics on `127.0.0.1:<metrics_port>`, the identity of `kubeconfig`, its
/// output into `log`; killed when dropped.
pub fn spawn_controller(
    bin: &std::path::Path,
    ns: &str,
    metrics_port: u16,
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
) -> Result<tokio::process::Child> {
    let out = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    tokio::process::Command::new(bin)
        .args([
            "--namespace",
            ns,
            "--leader-elect=false",
            "--metrics-bind-address",
            &format!("127.0.0.1:{metrics_port}"),
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))
}
