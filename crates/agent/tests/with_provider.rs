//! The real `byoh-agent` with the real provider (`bootsman_provider::run` in-process) on the real
//! control plane: a host registers and is Available, a Machine claims it and its bootstrap data
//! runs, deleting the Machine resets the host and returns it to the pool, a killed agent makes the
//! host Offline once its Lease expires, a restarted one brings it back, and the host serves the
//! next Machine.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

#[path = "../../provider/tests/common/mod.rs"]
mod site;

mod common;

use std::time::Duration;

use bootsman_api::condition::types;
use bootsman_api::v1beta1::HostPhase;
use bootsman_testenv::wait_for;
use kube::api::DeleteParams;

async fn phase(s: &site::Site, host: &str, want: HostPhase) {
    wait_for(&format!("host {host} to be {want:?}"), common::WAIT, || async {
        let h = s.byohosts().get(host).await.map_err(|e| e.to_string())?;
        let p = h.status.as_ref().and_then(|st| st.phase);
        if p == Some(want) {
            Ok(())
        } else {
            Err(format!("phase {p:?}, spec {:?}", h.spec))
        }
    })
    .await
}

async fn gone(s: &site::Site, machine: &str) {
    wait_for(
        &format!("ByoMachine {machine} to be gone"),
        common::WAIT,
        || async {
            match s
                .byomachines()
                .get_opt(machine)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(bm) => Err(format!("still there: {:?}", bm.status)),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_serves_a_machine_is_released_clean_goes_offline_and_comes_back() {
    let mut s = site::Site::new("agent-e2e").await;
    let mut config = s.config();
    config.release_timeout = Duration::from_secs(120);
    s.start_provider(config).await;
    let pool = common::Pool {
        env: s.env,
        ns: s.ns.clone(),
        admin: s.admin.clone(),
    };
    let mut host = pool.host("node-p");
    host.start(&["role=worker"]);
    phase(&s, "node-p", HostPhase::Available).await;
    pool.label("node-p", "role", "worker").await;

    // A Machine claims the host; its bootstrap data (`runcmd: echo m1`) runs on it.
    s.cluster("c1", false).await;
    s.machine("c1", "m1", Some(site::role("worker"))).await;
    phase(&s, "node-p", HostPhase::Provisioned).await;
    let h = s.byohosts().get("node-p").await.unwrap();
    assert_eq!(h.spec.machine_ref.as_ref().map(|m| m.name.as_str()), Some("m1"));
    let msg = common::message(&h, types::BOOTSTRAP_SUCCEEDED);
    assert!(msg.contains("m1"), "the output tail of `echo m1`: {msg}");

    // Deleting the Machine resets the host; the provider returns it to the pool, not quarantined.
    s.byomachines()
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    gone(&s, "m1").await;
    let h = s.byohosts().get("node-p").await.unwrap();
    assert!(
        h.spec.quarantine.is_none(),
        "released clean, not quarantined: {:?}",
        h.spec
    );
    assert!(h.spec.machine_ref.is_none() && h.spec.release.is_none());
    phase(&s, "node-p", HostPhase::Available).await;

    // SIGKILL: the Lease (4 x 1 s) expires and the host goes Offline; a restart brings it back.
    host.kill();
    phase(&s, "node-p", HostPhase::Offline).await;
    host.start(&["role=worker"]);
    phase(&s, "node-p", HostPhase::Available).await;

    // The released host is claimable again and serves the next Machine.
    s.machine("c1", "m2", Some(site::role("worker"))).await;
    phase(&s, "node-p", HostPhase::Provisioned).await;
    let h = s.byohosts().get("node-p").await.unwrap();
    assert_eq!(h.spec.machine_ref.as_ref().map(|m| m.name.as_str()), Some("m2"));
    assert_eq!(host.terminate().code(), Some(0), "SIGTERM drains and exits 0");
    s.stop().await;
}
