//! The agent and the provider together: a real `byoh-agent` is claimed for a Machine, runs its
//! bootstrap data, and when the Machine goes away resets the server so the host is claimable
//! again — the whole protocol with neither side played by the test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

mod common;

use bootsman_api::condition::types;
use bootsman_api::v1beta1::HostPhase;
use common::Controllers as _;
use common::{Pool, eventually, read, wait_condition};
use kube::api::DeleteParams;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn machine_deleted_host_cleaned_and_claimable_again() {
    let mut site = common::Site::new("agent-e2e").await;
    let pool = Pool {
        env: site.env,
        ns: site.ns.clone(),
        admin: site.admin.clone(),
    };
    let events = vec![
        json!({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}),
        json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}),
    ];
    common::grant(
        &pool.admin,
        &pool.ns,
        "agent-events",
        events,
        json!({"kind": "Group", "name": "byoh:hosts"}),
    )
    .await;
    site.start_provider(site.config()).await;

    let mut host = pool.host("e2e-host");
    host.script(
        "/usr/local/bin/kubeadm",
        "mkdir -p \"$BYOH_ROOT/run\"; echo \"$@\" >> \"$BYOH_ROOT/run/kubeadm.log\"",
    );
    host.start(&["role=a"]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    pool.label("e2e-host", "role", "a").await;

    site.cluster("c1", false).await;
    site.machine("c1", "ma", Some(common::role("a"))).await;
    let h = wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "True").await;
    let mref = h.spec.machine_ref.clone().expect("claimed");
    assert_eq!(mref.name, "ma");
    let machine_uid = mref.uid.clone();
    let journal = std::fs::read_dir(&host.state).unwrap().count();
    assert!(journal > 0, "the state directory holds the journal");

    // Machine (infrastructure) deleted: the provider asks for a release, the agent resets.
    site.byomachines()
        .delete("ma", &DeleteParams::default())
        .await
        .unwrap();
    let h = wait_condition(&pool.hosts(), &host, types::CLEANUP_SUCCEEDED, "True").await;
    assert!(
        h.spec
            .release
            .as_ref()
            .is_none_or(|r| r.machine_uid == machine_uid),
        "release for another machine: {:?}",
        h.spec.release
    );
    assert!(read(&host.path("run/kubeadm.log")).contains("reset -f"));
    eventually("ma gone", || async {
        site.byomachines()
            .get_opt("ma")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    eventually("the host unclaimed", || async {
        let h = pool.hosts().get("e2e-host").await.ok()?;
        (h.spec.machine_ref.is_none() && h.spec.release.is_none()).then_some(())
    })
    .await;

    // Claimable again: a new Machine gets the same host and its bootstrap runs afresh.
    site.machine("c1", "mb", Some(common::role("a"))).await;
    eventually("mb bootstrapped on the same host", || async {
        let h = pool.hosts().get("e2e-host").await.ok()?;
        let claimed = h.spec.machine_ref.as_ref().is_some_and(|m| m.name == "mb");
        let conds = h.status.map(|s| s.conditions).unwrap_or_default();
        let done = bootsman_runtime::conditions::get(&conds, types::BOOTSTRAP_SUCCEEDED)
            .is_some_and(|c| c.status == "True" && c.observed_generation == h.metadata.generation);
        (claimed && done).then_some(())
    })
    .await;

    // SIGKILL: once the Lease lapses the provider marks the host Offline; a restart brings it
    // back, still provisioned for mb, without running mb's bootstrap again.
    host.kill();
    let phase = |want: HostPhase| {
        let hosts = pool.hosts();
        async move {
            eventually(&format!("phase {want:?}"), || async {
                let h = hosts.get("e2e-host").await.ok()?;
                (h.status.and_then(|s| s.phase) == Some(want)).then_some(())
            })
            .await
        }
    };
    phase(HostPhase::Offline).await;
    host.start(&["role=a"]);
    phase(HostPhase::Provisioned).await;
    site.stop().await;
}
