//! `bootsmanctl diagnose` on a cluster whose bootstrap failed for real: the real provider binds
//! a real `byoh-agent` host to a Machine whose bootstrap command fails, and the bundle's
//! summary names the host and the failing command with the agent's output, while no secret
//! value (a Secret of the namespace, the bootstrap token in the command line and its output)
//! appears in any file of the bundle.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

mod common;

use std::path::Path;

use bootsman_api::condition::types;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsmanctl::cli::{Cli, run};
use clap::Parser;
use common::Controllers as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

/// A value that must never reach the bundle.
const SECRET_VALUE: &str = "diagnose-secret-value-7f3a91";
/// A bootstrap token in the failing command (and so in the agent's account of it).
const TOKEN: &str = "q8x2pz.k3j9v0w7m1n5b6c4";

fn files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bundle_of_a_failed_bootstrap_names_host_and_command_and_holds_no_secret() {
    let mut s = common::Site::new("diagnose").await;
    s.start_provider(s.config()).await;
    let pool = common::Pool {
        env: s.env,
        ns: s.ns.clone(),
        admin: s.admin.clone(),
    };
    let mut host = pool.host("node-d");
    host.start(&[]);
    common::eventually("node-d to register and be Available", || async {
        let h = pool.hosts().get_opt("node-d").await.ok().flatten()?;
        (h.status?.phase? == bootsman_api::v1beta1::HostPhase::Available).then_some(())
    })
    .await;
    pool.label("node-d", "role", "worker").await;

    let mut bc = common::sample(&s.ns);
    bc.metadata.name = Some("c1".into());
    Api::<BootsmanCluster>::namespaced(s.admin.clone(), &s.ns)
        .create(&PostParams::default(), &bc)
        .await
        .unwrap();
    let mut secret = Secret {
        metadata: common::meta("c1-credentials", &s.ns),
        ..Default::default()
    };
    secret.data = Some(
        [(
            "password".to_string(),
            ByteString(SECRET_VALUE.as_bytes().to_vec()),
        )]
        .into(),
    );
    Api::<Secret>::namespaced(s.admin.clone(), &s.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    s.cluster("c1", false).await;
    let data = format!(
        "#cloud-config\nruncmd:\n- echo joining with --token {TOKEN} >/dev/null; echo join refused >&2; exit 3\n"
    );
    common::create_machine_with_data(&s.admin, &s.ns, "c1", "m1", Some(common::role("worker")), &data).await;
    let h = common::wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "False").await;
    let msg = common::message(&h, types::BOOTSTRAP_SUCCEEDED);
    assert!(
        msg.contains(TOKEN),
        "the agent reports the command as it ran: {msg}"
    );

    let dir = std::env::temp_dir().join(format!("bootsman-diagnose-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bundle = dir.join("bundle.tar.gz");
    let kubeconfig = s.env.kubeconfig().to_str().unwrap().to_string();
    let args = [
        "bootsmanctl",
        "--kubeconfig",
        &kubeconfig,
        "diagnose",
        "c1",
        "-n",
        &s.ns,
        "-o",
        bundle.to_str().unwrap(),
        "--controllers-namespace",
        &s.ns,
    ];
    let mut out = Vec::new();
    run(Cli::try_parse_from(args).unwrap(), &mut out)
        .await
        .expect("diagnose");
    assert_eq!(
        String::from_utf8(out).unwrap().trim(),
        bundle.display().to_string()
    );
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let untar = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&bundle)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(untar.success());

    let all = files(&unpacked);
    let get = |suffix: &str| {
        all.iter()
            .find(|(p, _)| p.ends_with(suffix))
            .unwrap_or_else(|| {
                panic!(
                    "{suffix} not in the bundle: {:?}",
                    all.iter().map(|f| &f.0).collect::<Vec<_>>()
                )
            })
            .1
            .clone()
    };
    let summary = get("/SUMMARY.txt");
    let failed = format!("host {}/node-d: BootstrapSucceeded=False BootstrapFailed", s.ns);
    assert!(summary.contains(&failed), "{summary}");
    assert!(
        summary.contains("exit 3") && summary.contains("join refused"),
        "the command and its output: {summary}"
    );
    assert!(get("/status.txt").contains("ByoHost/node-d"));
    assert!(get(&format!("/hosts/{}/node-d/byohost.yaml", s.ns)).contains("BootstrapFailed"));
    assert!(get(&format!("/hosts/{}/node-d/heartbeat.txt", s.ns)).contains("renewed at"));
    assert!(get("/objects/Machine/m1.yaml").contains("clusterName: c1"));
    assert!(get("/secrets.txt").contains("c1-credentials"));
    assert!(get("/README.txt").contains("no Pods"));
    for (path, text) in &all {
        assert!(!text.contains(TOKEN), "the bootstrap token is in {path}:\n{text}");
        assert!(
            !text.contains(SECRET_VALUE),
            "a Secret's value is in {path}:\n{text}"
        );
        assert!(!text.contains("managedFields"), "{path} keeps managedFields");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(host.terminate().code(), Some(0));
    s.stop().await;
}
