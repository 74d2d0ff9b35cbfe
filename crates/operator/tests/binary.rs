//! The `bootsman-operator` binary against the real control plane: it takes the leader Lease,
//! reconciles a BootsmanCluster of its namespace, serves its reconcile metrics, and exits 0 on
//! SIGTERM.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::{Command, Stdio};
use std::time::Duration;

use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_testenv::{TestEnv, free_port, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

#[tokio::test]
async fn the_binary_leads_reconciles_serves_metrics_and_stops_on_sigterm() {
    let env = TestEnv::shared().await;
    let client = env.client().await;
    let ns = env.create_namespace("op-bin").await;
    let port = free_port().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bootsman-operator"))
        .args(["--namespace", &ns, "--leader-elect-namespace", &ns])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", env.kubeconfig())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the operator holds its Lease",
        Duration::from_secs(60),
        || async {
            let l = leases
                .get_opt("bootsman-operator")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no Lease yet")?;
            l.spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty())
                .ok_or_else(|| "no holder yet".to_string())
        },
    )
    .await;

    bootsman_fixtures::clusters::apply_sample(&client, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the BootsmanCluster has a status",
        Duration::from_secs(60),
        || async {
            let bc = api.get("demo").await.map_err(|e| e.to_string())?;
            bc.status
                .and_then(|s| s.observed_generation)
                .ok_or_else(|| "no status yet".to_string())
        },
    )
    .await;

    let body = wait_for("reconcile metrics", Duration::from_secs(30), || async {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{port}/metrics")])
            .output()
            .map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&out.stdout).to_string();
        if body.contains("bootsman_reconcile_total") {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await;
    assert!(body.contains("bootsmancluster"), "{body}");

    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = wait_for("the operator exits", Duration::from_secs(30), || {
        let r = child
            .try_wait()
            .map_err(|e| e.to_string())
            .and_then(|s| s.ok_or("running".to_string()));
        async move { r }
    })
    .await;
    assert!(status.success(), "exit status {status}");
}
