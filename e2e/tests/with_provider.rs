//! The real `byoh-agent` with the real provider (`bootsman_provider::run` in-process) on the real
//! control plane: a host registers and is Available, a Machine claims it and its bootstrap data
//! runs, deleting the Machine resets the host and returns it to the pool, a killed agent makes the
//! host Offline once its Lease expires, a restarted one brings it back, and the host serves the
//! next Machine. Faults: a certificate renewal mid-bootstrap neither kills nor repeats the
//! command; a ByoHost an admin deletes while its agent runs stays deleted until a new token
//! enrols the host; a host whose quarantine an admin lifts is reset before its next bootstrap.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

mod common;

use std::time::Duration;

use bootsman_api::condition::types;
use bootsman_api::v1beta1::HostPhase;
use bootsman_testenv::wait_for;
use common::Controllers as _;
use kube::api::DeleteParams;

async fn phase(s: &common::Site, host: &str, want: HostPhase) {
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

async fn gone(s: &common::Site, machine: &str) {
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

/// A site with the provider running (releases time out after `release_timeout`), and its pool
/// for real agents.
async fn site_with_provider(prefix: &str, release_timeout: Duration) -> (common::Site, common::Pool) {
    let mut s = common::Site::new(prefix).await;
    let mut config = s.config();
    config.release_timeout = release_timeout;
    s.start_provider(config).await;
    let pool = common::Pool {
        env: s.env,
        ns: s.ns.clone(),
        admin: s.admin.clone(),
    };
    (s, pool)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_serves_a_machine_is_released_clean_goes_offline_and_comes_back() {
    let (s, pool) = site_with_provider("agent-e2e", Duration::from_secs(120)).await;
    let mut host = pool.host("node-p");
    host.start(&["role=worker"]);
    phase(&s, "node-p", HostPhase::Available).await;
    pool.label("node-p", "role", "worker").await;

    // A Machine claims the host; its bootstrap data (`runcmd: echo m1`) runs on it.
    s.cluster("c1", false).await;
    s.machine("c1", "m1", Some(common::role("worker"))).await;
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
    s.machine("c1", "m2", Some(common::role("worker"))).await;
    phase(&s, "node-p", HostPhase::Provisioned).await;
    let h = s.byohosts().get("node-p").await.unwrap();
    assert_eq!(h.spec.machine_ref.as_ref().map(|m| m.name.as_str()), Some("m2"));
    assert_eq!(host.terminate().code(), Some(0), "SIGTERM drains and exits 0");
    s.stop().await;
}

/// The fault of a certificate renewal while a bootstrap command runs. The control plane signs
/// 1-minute host certificates, so the agent, enrolled with a real bootstrap token through the
/// provider's approver, renews about 48 s after enrolment, in the middle of a command that runs
/// on until the test lets it end. The command is neither killed nor run again, the bootstrap
/// succeeds once, and the agent goes on with the renewed certificate.
#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_mid_bootstrap_neither_kills_nor_repeats_the_command() {
    use bootsman_api::identity;
    use bootsman_testenv::{Options, TestEnv};
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use kube::Api;
    use kube::api::ListParams;

    let env: &'static TestEnv = Box::leak(Box::new(
        TestEnv::start(Options {
            signing_duration: Some(Duration::from_secs(60)),
            ..Options::default()
        })
        .await
        .expect("start the control plane"),
    ));
    env.apply_kustomization(&bootsman_testenv::repo_root().join("config/rbac"))
        .expect("apply config/rbac");
    let (s, mut host) = enrolling_site(env, "agent-renew", "node-r", "renew1").await;
    host.command_timeout = "5m".into();
    std::fs::create_dir_all(host.path("run")).unwrap();
    host.start(&[]);
    phase(&s, "node-r", HostPhase::Available).await;
    let pid = host.pid();

    s.cluster("c1", false).await;
    let data = "#cloud-config\nruncmd:\n  - \"echo x >> run/started.txt; while [ ! -e run/go ]; do sleep 0.2; done; echo x >> run/done.txt\"\n  - echo x >> run/after.txt\n";
    common::create_machine_with_data(&s.admin, &s.ns, "c1", "m1", None, data).await;
    let started = host.path("run/started.txt");
    common::eventually("the command starts", || async { started.exists().then_some(()) }).await;

    // The renewal comes while the command runs (the certificate lasts 60 s from enrolment).
    wait_for(
        "the host certificate to be renewed",
        Duration::from_secs(120),
        || async {
            if host.log().contains("host certificate renewed") {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await;
    assert!(
        !host.path("run/done.txt").exists(),
        "the command ended before the renewal: the test proves nothing"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    std::fs::write(host.path("run/go"), "").unwrap();

    phase(&s, "node-r", HostPhase::Provisioned).await;
    let h = s.byohosts().get("node-r").await.unwrap();
    assert_eq!(
        common::read(&started),
        "x\n",
        "the command ran twice: {}",
        common::message(&h, types::BOOTSTRAP_SUCCEEDED)
    );
    assert_eq!(common::read(&host.path("run/done.txt")), "x\n");
    assert_eq!(common::read(&host.path("run/after.txt")), "x\n");
    assert_eq!(host.pid(), pid, "the agent was restarted");
    common::eventually("the agent goes on with the renewed certificate", || async {
        host.log()
            .contains("continuing with the renewed host certificate")
            .then_some(())
    })
    .await;

    // The renewal went through the host's own identity, and its heartbeat goes on after it.
    let csrs = Api::<CertificateSigningRequest>::all(s.admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let renewals = csrs
        .items
        .iter()
        .filter(|c| c.spec.username.as_deref() == Some(identity::host_user("node-r").as_str()))
        .count();
    assert!(renewals >= 1, "no CSR by the host itself");
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(s.admin.clone(), &s.ns);
    let renewed_at = |l: k8s_openapi::api::coordination::v1::Lease| l.spec.and_then(|s| s.renew_time);
    let before = renewed_at(leases.get("node-r").await.unwrap());
    common::eventually("the heartbeat goes on", || async {
        let now = renewed_at(leases.get("node-r").await.ok()?);
        (now != before).then_some(())
    })
    .await;
    assert_eq!(host.terminate().code(), Some(0), "SIGTERM drains and exits 0");
    s.stop().await;
}

/// A token pinned to `host` in the site's pool, as the bootstrap kubeconfig an operator hands
/// the server.
async fn pinned_bootstrap(s: &common::Site, id: &str, host: &str, replace: bool) -> std::path::PathBuf {
    let token = bootsman_api::identity::BootstrapToken {
        id: id.into(),
        secret: "0123456789abcdef".into(),
        expiration: k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(600),
        pool: s.ns.clone(),
        host: Some(host.into()),
        replace,
    };
    bootsman_fixtures::enroll::token_kubeconfig(s.env, &token).await
}

/// A site with the provider and its approver, and a host that has no identity yet, only the
/// bootstrap kubeconfig of a token (`token_id`) pinned to it.
async fn enrolling_site(
    env: &'static bootsman_testenv::TestEnv,
    prefix: &str,
    host: &str,
    token_id: &str,
) -> (common::Site, common::Agent) {
    let mut s = common::Site::new_in(env, prefix).await;
    s.start_provider(s.config()).await;
    s.start_approver().await;
    let pool = common::Pool {
        env,
        ns: s.ns.clone(),
        admin: s.admin.clone(),
    };
    let mut agent = pool.host(host);
    std::fs::remove_file(&agent.kubeconfig).unwrap();
    agent.bootstrap_kubeconfig = Some(pinned_bootstrap(&s, token_id, host, false).await);
    (s, agent)
}

/// Waits for the agent to exit on its own and returns its status.
async fn exits(host: &mut common::Agent) -> std::process::ExitStatus {
    for _ in 0..600 {
        if let Some(status) = host.exited() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the agent did not exit within 60 s; log:\n{}", host.log());
}

/// The fault of an admin deleting a ByoHost while its agent runs. The host leaves the pool: the
/// agent does not register it again (neither at once, racing the garbage collector for its pool
/// binding, nor when restarted as its unit restarts it, with its still-valid certificate and the
/// spent token), and exits naming the way back. A replacement token for the host brings it back.
#[tokio::test(flavor = "multi_thread")]
async fn a_byohost_deleted_while_its_agent_runs_stays_gone_until_a_replacement_token() {
    let env = bootsman_testenv::TestEnv::shared().await;
    env.apply_kustomization(&bootsman_testenv::repo_root().join("config/rbac"))
        .expect("apply config/rbac");
    let (s, mut host) = enrolling_site(env, "agent-removed", "node-d", "remov1").await;
    host.start(&[]);
    phase(&s, "node-d", HostPhase::Available).await;
    let uid = s.byohosts().get("node-d").await.unwrap().metadata.uid.unwrap();

    s.byohosts()
        .delete("node-d", &DeleteParams::default())
        .await
        .unwrap();
    let status = exits(&mut host).await;
    assert!(!status.success(), "{status}: {}", host.log());
    assert!(
        host.log().contains("bootsmanctl hosts replace node-d"),
        "the way back is named: {}",
        host.log()
    );
    // Restarted as its unit restarts it: the same identity, the spent token, no ByoHost.
    host.start(&[]);
    let status = exits(&mut host).await;
    assert!(!status.success(), "{status}: {}", host.log());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        s.byohosts().get_opt("node-d").await.unwrap().is_none(),
        "the removed host registered again: {}",
        host.log()
    );

    // A replacement token (its unexpired certificate still holds the name) brings it back, as a
    // new ByoHost.
    host.bootstrap_kubeconfig = Some(pinned_bootstrap(&s, "remov2", "node-d", true).await);
    host.start(&[]);
    phase(&s, "node-d", HostPhase::Available).await;
    let again = s.byohosts().get("node-d").await.unwrap().metadata.uid.unwrap();
    assert_ne!(again, uid);
    assert_eq!(host.terminate().code(), Some(0), "SIGTERM drains and exits 0");
    s.stop().await;
}

/// The fault of a quarantine an admin lifts. A host whose agent is down while its machine is
/// deleted cannot reset: after the release timeout it is quarantined, still holding that
/// machine's files. Its agent comes back, the admin lifts the quarantine (no release is asked
/// for), and the next machine that claims the host finds it reset first: the first machine's
/// file gone, the file it appended to cut back, and only then its own bootstrap.
#[tokio::test(flavor = "multi_thread")]
async fn a_lifted_quarantine_resets_the_host_before_its_next_bootstrap() {
    use kube::api::{Patch, PatchParams};

    let (s, pool) = site_with_provider("agent-quarantine", Duration::from_secs(5)).await;
    let mut host = pool.host("node-q");
    std::fs::create_dir_all(host.path("etc")).unwrap();
    std::fs::write(host.path("etc/site.conf"), "before\n").unwrap();
    host.start(&[]);
    phase(&s, "node-q", HostPhase::Available).await;
    s.cluster("c1", false).await;
    let data = |m: &str| {
        format!(
            "#cloud-config\nwrite_files:\n  - path: /etc/{m}.conf\n    content: \"{m}\\n\"\n  \
             - path: /etc/site.conf\n    content: \"{m}\\n\"\n    append: true\nruncmd:\n  - echo {m}\n"
        )
    };
    common::create_machine_with_data(&s.admin, &s.ns, "c1", "m1", None, &data("m1")).await;
    phase(&s, "node-q", HostPhase::Provisioned).await;
    assert_eq!(common::read(&host.path("etc/site.conf")), "before\nm1\n");

    // The agent is down while m1 is deleted: no reset, quarantine after the release timeout.
    host.kill();
    s.byomachines()
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    gone(&s, "m1").await;
    let h = s.byohosts().get("node-q").await.unwrap();
    assert!(h.spec.quarantine.is_some(), "{:?}", h.spec);
    assert!(host.path("etc/m1.conf").exists(), "nothing reset the host yet");

    host.start(&[]);
    phase(&s, "node-q", HostPhase::Quarantined).await;
    s.byohosts()
        .patch(
            "node-q",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"quarantine": null}})),
        )
        .await
        .unwrap();
    phase(&s, "node-q", HostPhase::Available).await;

    common::create_machine_with_data(&s.admin, &s.ns, "c1", "m2", None, &data("m2")).await;
    phase(&s, "node-q", HostPhase::Provisioned).await;
    let h = s.byohosts().get("node-q").await.unwrap();
    assert_eq!(h.spec.machine_ref.as_ref().map(|m| m.name.as_str()), Some("m2"));
    assert!(
        !host.path("etc/m1.conf").exists(),
        "m1's file outlived the lifted quarantine"
    );
    assert_eq!(common::read(&host.path("etc/m2.conf")), "m2\n");
    assert_eq!(
        common::read(&host.path("etc/site.conf")),
        "before\nm2\n",
        "m1's append must be cut back before m2's"
    );
    assert_eq!(host.terminate().code(), Some(0), "SIGTERM drains and exits 0");
    s.stop().await;
}
