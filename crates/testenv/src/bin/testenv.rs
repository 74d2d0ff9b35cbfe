//! The test control plane and the stand-in child control plane, standalone.
//!
//! - `testenv up [--capi]`: etcd, kube-apiserver and kube-controller-manager (and with `--capi`
//!   the Cluster API managers) on loopback until Ctrl-C. Prints the `KUBECONFIG` to use.
//! - `testenv workload --namespace NS --cluster NAME --dir DIR`: with `KUBECONFIG` pointing at the
//!   management cluster, waits until the first control-plane host of CAPI Cluster `NS/NAME`
//!   reports its bootstrap (`kubeadm init`) done, then runs the cluster's stand-in control plane
//!   at its endpoint (see `bootsman_testenv::workload`) and registers a Node for each host that
//!   has bootstrapped, until Ctrl-C.
//!
//! Everything stops cleanly on Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bootsman_testenv::workload::bootstrapped_hosts;
use bootsman_testenv::{Options, TestEnv, Testbin, Workload};

const USAGE: &str = "usage: testenv up [--capi]
       testenv workload --namespace NS --cluster NAME --dir DIR

  up        start etcd, kube-apiserver and kube-controller-manager on loopback
  --capi    also run the Cluster API core, kubeadm bootstrap and kubeadm control-plane managers
  workload  once CAPI Cluster NS/NAME has a bootstrapped control-plane host, run its stand-in
            control plane (etcd, kube-apiserver, kubeadm-config, Nodes) at its endpoint;
            KUBECONFIG names the management cluster";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("up") if args.iter().skip(1).all(|a| a == "--capi") => {
            up(args.iter().any(|a| a == "--capi")).await
        }
        Some("workload") => match workload_args(&args[1..]) {
            Ok((ns, cluster, dir)) => workload(&ns, &cluster, dir).await,
            Err(e) => {
                eprintln!("testenv workload: {e}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testenv: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn up(capi: bool) -> Result<(), String> {
    let env = TestEnv::start(Options {
        capi,
        ..Options::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    println!("control plane ready at {}", env.api_url());
    println!("  export KUBECONFIG={}", env.kubeconfig().display());
    println!("  kubectl: {}", env.testbin().bin("kubectl").display());
    println!("  logs:    {}", env.log_dir().display());
    println!("Ctrl-C stops everything.");
    stopped().await?;
    println!("stopping");
    drop(env);
    Ok(())
}

fn workload_args(args: &[String]) -> Result<(String, String, PathBuf), String> {
    let (mut ns, mut cluster, mut dir) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--namespace" => ns = Some(value.clone()),
            "--cluster" => cluster = Some(value.clone()),
            "--dir" => dir = Some(PathBuf::from(value)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((
        ns.ok_or("--namespace is required")?,
        cluster.ok_or("--cluster is required")?,
        dir.ok_or("--dir is required")?,
    ))
}

async fn workload(ns: &str, cluster: &str, dir: PathBuf) -> Result<(), String> {
    let mgmt = kube::Client::try_default()
        .await
        .map_err(|e| format!("management cluster client (KUBECONFIG): {e}"))?;
    let testbin = Testbin::locate().map_err(|e| e.to_string())?;
    println!("waiting for a control-plane host of {ns}/{cluster} to run kubeadm init");
    let wait_init = async {
        loop {
            match bootstrapped_hosts(&mgmt, ns, cluster).await {
                Ok(hosts) => {
                    if let Some(h) = hosts.iter().find(|h| h.control_plane) {
                        return h.host.clone();
                    }
                }
                Err(e) => eprintln!("testenv workload: {e}"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    let first = tokio::select! {
        h = wait_init => h,
        r = stopped() => return r,
    };
    println!("{first} ran kubeadm init: starting the stand-in control plane of {ns}/{cluster}");
    let workload = Workload::start(&mgmt, &testbin, &dir, ns, cluster)
        .await
        .map_err(|e| e.to_string())?;
    println!("stand-in control plane ready at {}", workload.url());
    println!("  export KUBECONFIG={}", workload.kubeconfig().display());
    let sync = async {
        let mut known = std::collections::BTreeSet::new();
        loop {
            if let Err(e) = workload.check_running() {
                return e.to_string();
            }
            match workload.sync_nodes(&mgmt).await {
                Ok(nodes) => {
                    for n in nodes.difference(&known) {
                        println!("Node {n} registered");
                    }
                    known = nodes;
                }
                Err(e) => eprintln!("testenv workload: {e}"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    tokio::select! {
        e = sync => return Err(e),
        r = stopped() => r?,
    }
    println!("stopping");
    drop(workload);
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn stopped() -> Result<(), String> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
