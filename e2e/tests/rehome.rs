//! A pivot's rehome step on two real control planes: a real `byoh-agent` serving a host of the
//! source is moved by `bootsmanctl hosts rehome` to the target, where its ByoHost was copied
//! as a move copies it. The agent enrols there with the replacement token the command issued
//! (through the target's real approver), reports `Rehomed=True` on the source, and from then on
//! registers and heartbeats only on the target, in the same process. The rehome Secret is the
//! host's alone: another host cannot read it, and a host cannot ask for a rehome itself. A
//! rehome asked for without its Secret is refused with the reason, and the agent stays.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

mod common;

use std::time::Duration;

use bootsman_api::condition::types;
use bootsman_api::identity;
use bootsman_api::v1beta1::{ByoHost, ByoHostSpec, rehome_secret_name};
use bootsman_testenv::TestEnv;
use bootsmanctl::cli::{Cli, run};
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

async fn renewed(leases: &Api<Lease>, host: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    leases.get_opt(host).await.ok()??.spec?.renew_time.map(|t| t.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rehomed_agent_enrols_with_the_target_and_leaves_the_source_in_one_step() {
    let site = common::Site::new("rehome").await;
    let pool = common::Pool {
        env: site.env,
        ns: site.ns.clone(),
        admin: site.admin.clone(),
    };
    pool.with_host_policy().await;
    let mut host = pool.host("node-r");
    host.start(&[]);
    let source_host = common::wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;

    // The target: its own control plane with the host roles, the pool, the provider's approver,
    // and the ByoHost copied there as a move copies it (spec and labels, no status).
    let target = TestEnv::start(bootsman_testenv::Options::default())
        .await
        .unwrap_or_else(|e| panic!("the target control plane: {e}"));
    target
        .apply_kustomization(&bootsman_testenv::repo_root().join("config/rbac"))
        .unwrap();
    let to = target.client().await;
    Api::<Namespace>::all(to.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": site.ns}})).unwrap(),
        )
        .await
        .unwrap();
    let approver = common::start_approver(&target).await;
    let target_hosts: Api<ByoHost> = Api::namespaced(to.clone(), &site.ns);
    let mut copy = ByoHost::new("node-r", ByoHostSpec::default());
    copy.metadata.labels = source_host.metadata.labels.clone();
    target_hosts.create(&PostParams::default(), &copy).await.unwrap();

    // A rehome asked for without its Secret is refused with the reason, and the agent stays.
    pool.hosts()
        .patch(
            "node-r",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rehome": {"server": target.api_url(),
                "requestedAt": "2026-01-01T00:00:00Z"}}})),
        )
        .await
        .unwrap();
    let refused = common::wait_condition(&pool.hosts(), &host, types::REHOMED, "False").await;
    let msg = common::message(&refused, types::REHOMED);
    assert!(
        msg.contains(&rehome_secret_name("node-r")) && msg.contains("does not exist"),
        "{msg}"
    );
    assert!(host.is_running(), "the agent exited:\n{}", host.log());

    let pid = host.pid();
    let source_leases: Api<Lease> = Api::namespaced(site.admin.clone(), &site.ns);
    let kubeconfig = site.env.kubeconfig().to_str().unwrap().to_string();
    let to_kubeconfig = target.kubeconfig().to_str().unwrap().to_string();
    let args = [
        "bootsmanctl",
        "--kubeconfig",
        &kubeconfig,
        "hosts",
        "rehome",
        "node-r",
        "-n",
        &site.ns,
        "--to",
        &to_kubeconfig,
        "--wait",
        "90s",
    ];
    let mut out = Vec::new();
    run(Cli::try_parse_from(args).unwrap(), &mut out)
        .await
        .unwrap_or_else(|e| panic!("rehome: {e:#}\nagent log:\n{}", host.log()));
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("node-r: rehomed; its Lease on the target was renewed"),
        "{out}"
    );

    // One step, one process: the agent was not restarted.
    assert!(host.is_running(), "the agent exited:\n{}", host.log());
    assert_eq!(host.pid(), pid);
    common::eventually("the agent goes on with the new cluster", || async {
        host.log()
            .contains("continuing with the new management cluster (rehomed)")
            .then_some(())
    })
    .await;
    let src = pool.hosts().get("node-r").await.unwrap();
    let msg = common::message(&src, types::REHOMED);
    assert!(
        msg.contains(target.api_url()),
        "Rehomed=True names the target: {msg}"
    );

    // A second run leaves the moved host alone: no unspent token for it on the target.
    let unspent = || async {
        Api::<Secret>::namespaced(to.clone(), "kube-system")
            .list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| {
                let a = s.metadata.annotations.clone().unwrap_or_default();
                a.get(identity::TOKEN_HOST).map(String::as_str) == Some("node-r")
                    && !a.contains_key(identity::TOKEN_SPENT_BY)
            })
            .count()
    };
    assert_eq!(unspent().await, 0, "the first token was spent");
    let mut again = Vec::new();
    run(Cli::try_parse_from(args).unwrap(), &mut again)
        .await
        .expect("a second rehome");
    let again = String::from_utf8(again).unwrap();
    assert!(
        again.contains("node-r: rehomed to") && again.contains("already"),
        "{again}"
    );
    assert_eq!(unspent().await, 0, "a token was issued again");

    // On the target the agent registers (its own writes, through the pool access the target's
    // approver granted) and heartbeats; on the source its Lease is no longer renewed.
    let on_target = common::wait_condition(&target_hosts, &host, types::REGISTERED, "True").await;
    assert!(on_target.status.unwrap().agent_version.is_some());
    let target_leases: Api<Lease> = Api::namespaced(to.clone(), &site.ns);
    let last_source = renewed(&source_leases, "node-r").await;
    let first_target = renewed(&target_leases, "node-r")
        .await
        .expect("a Lease on the target");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        renewed(&source_leases, "node-r").await,
        last_source,
        "still heartbeating on the source"
    );
    assert!(
        renewed(&target_leases, "node-r").await.unwrap() > first_target,
        "no heartbeat on the target"
    );

    // The Secret was for node-r alone; and a host may not ask for a rehome itself.
    let other = site.env.client_for("byoh:host:node-x", &["byoh:hosts"]).await;
    let err = Api::<Secret>::namespaced(other, &site.ns)
        .get(&rehome_secret_name("node-r"))
        .await
        .expect_err("another host read the rehome Secret");
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err}");
    let itself = site.env.client_for("byoh:host:node-r", &["byoh:hosts"]).await;
    let err = Api::<ByoHost>::namespaced(itself, &site.ns)
        .patch(
            "node-r",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rehome": {"server": "https://203.0.113.9:6443",
                "requestedAt": "2026-01-01T00:00:00Z"}}})),
        )
        .await
        .expect_err("a host changed its own rehome request");
    assert!(
        err.to_string().contains("spec.rehome is an admin's request"),
        "{err}"
    );

    assert_eq!(host.terminate().code(), Some(0));
    approver.stop().await;
    site.stop().await;
}
