//! `testenv up [--capi]`: the test control plane, standalone, until Ctrl-C.
//!
//! Prints the `KUBECONFIG` to use with `kubectl`; everything stops cleanly on Ctrl-C or SIGTERM.

use std::process::ExitCode;

use bootsman_testenv::{Options, TestEnv};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: testenv up [--capi]\n\n  up      start etcd, kube-apiserver and kube-controller-manager on loopback\n  --capi  also run the Cluster API core, kubeadm bootstrap and kubeadm control-plane managers";
    if args.first().map(String::as_str) != Some("up") || args.iter().skip(1).any(|a| a != "--capi") {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    let options = Options {
        capi: args.iter().any(|a| a == "--capi"),
    };
    let env = match TestEnv::start(options).await {
        Ok(env) => env,
        Err(e) => {
            eprintln!("testenv: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("control plane ready at {}", env.api_url());
    println!("  export KUBECONFIG={}", env.kubeconfig().display());
    println!("  kubectl: {}", env.testbin().bin("kubectl").display());
    println!("  logs:    {}", env.log_dir().display());
    println!("Ctrl-C stops everything.");
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("testenv: cannot watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    println!("stopping");
    drop(env);
    ExitCode::SUCCESS
}
