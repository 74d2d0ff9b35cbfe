//! `bootsmanctl hosts list` against the real control plane: one row per host with its phase and
//! claim, for one pool or every pool.

use bootsman_api::v1beta1::{ByoHost, ByoHostSpec, MachineRef};
use bootsman_testenv::TestEnv;
use bootsmanctl::cli::{Cli, run};
use clap::Parser;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

async fn list(env: &TestEnv, extra: &[&str]) -> String {
    let kubeconfig = env.kubeconfig().to_str().expect("utf-8 path").to_string();
    let mut args = vec!["bootsmanctl", "--kubeconfig", &kubeconfig, "hosts", "list"];
    args.extend_from_slice(extra);
    let mut out = Vec::new();
    run(Cli::try_parse_from(args).expect("arguments"), &mut out)
        .await
        .expect("hosts list");
    String::from_utf8(out).expect("utf-8")
}

#[tokio::test]
async fn lists_the_hosts_of_a_pool_with_phase_and_claim() {
    let env = TestEnv::shared().await;
    let pool = env.create_namespace("list").await;
    let hosts = Api::<ByoHost>::namespaced(env.client().await, &pool);
    for name in ["web-2", "web-1"] {
        hosts
            .create(
                &PostParams::default(),
                &ByoHost::new(name, ByoHostSpec::default()),
            )
            .await
            .expect("create host");
    }
    hosts
        .patch_status(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Available"}})),
        )
        .await
        .expect("phase");
    let claim = MachineRef {
        namespace: pool.clone(),
        name: "md-0-abc".into(),
        uid: "u1".into(),
    };
    hosts
        .patch(
            "web-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"machineRef": claim}})),
        )
        .await
        .expect("claim");

    let out = list(env, &["--namespace", &pool]).await;
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "PHASE", "MACHINE", "AGE"], "{out}");
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[1][..3], ["web-1", "Available", "-"], "{out}");
    let claimed = format!("{pool}/md-0-abc");
    assert_eq!(lines[2][..3], ["web-2", "-", claimed.as_str()], "{out}");
    assert!(lines[1][3].ends_with('s') || lines[1][3].ends_with('m'), "{out}");

    // Every pool: a NAMESPACE column, and this pool's hosts among the rows.
    let all = list(env, &[]).await;
    assert!(all.starts_with("NAMESPACE"), "{all}");
    let ours = all.lines().filter(|l| l.starts_with(&format!("{pool} "))).count();
    assert_eq!(ours, 2, "{all}");

    // JSON for scripts: unset fields are null, the creation time is RFC 3339.
    let json: serde_json::Value =
        serde_json::from_str(&list(env, &["-n", &pool, "-o", "json"]).await).expect("json");
    assert_eq!(json[0]["name"], "web-1");
    assert_eq!(json[0]["phase"], "Available");
    assert!(json[0]["machine"].is_null());
    assert_eq!(json[1]["machine"], claimed.as_str());
    assert!(json[1]["phase"].is_null());
    assert!(
        json[0]["created"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{json}"
    );

    // An empty pool prints the header only.
    let empty = env.create_namespace("list-empty").await;
    assert_eq!(list(env, &["-n", &empty]).await.lines().count(), 1);
}
