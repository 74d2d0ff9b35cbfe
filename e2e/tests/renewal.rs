//! The agent's renewal loop against a control plane whose kube-controller-manager signs 1-minute
//! client certificates (backdated by 5 minutes, as it always does): the host renews once at 80 %
//! of what was left when its certificate arrived, with its own identity, and keeps working with
//! the renewed certificate. A loop that counted from the backdated `notBefore` would find the
//! certificate always due and renew without pause.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::enrol;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bootsman_api::identity;
use bootsman_testenv::{Options, TestEnv};
use byoh_agent::enroll;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::api::{ListParams, PostParams};

async fn whoami(config: kube::Config) -> String {
    let client = kube::Client::try_from(config).unwrap();
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("the certificate authenticates");
    review.status.unwrap().user_info.unwrap().username.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_renews_a_short_lived_certificate_once_per_lifetime() {
    let env = TestEnv::start(Options {
        signing_duration: Some(Duration::from_secs(60)),
        ..Options::default()
    })
    .await
    .expect("start the control plane");
    enrol::apply_host_rbac(&env);
    enrol::start_approver(&env).await;
    let pool = env.create_namespace("renew").await;
    let (_token, bootstrap) = enrol::bootstrap_kubeconfig(&env, &pool, Some("db-1")).await;
    let state_dir = enrol::temp_dir(&env, "state").join("byoh-agent");
    let opts = enroll::Options {
        kubeconfig: state_dir.join("kubeconfig"),
        state_dir,
        bootstrap_kubeconfig: Some(bootstrap),
        host_name: "db-1".into(),
        approval_timeout: Duration::from_secs(60),
        certificate_lifetime: enroll::DEFAULT_CERTIFICATE_LIFETIME,
    };
    let first = enroll::ensure_identity(&opts).await.expect("enrollment");
    assert_eq!(whoami(first.clone()).await, identity::host_user("db-1"));
    // Registered, with its pool RoleBinding taken over by its ByoHost: renewals are approved.
    let host = kube::Client::try_from(first).unwrap();
    enrol::register(&env, &host, &pool, "db-1").await;

    // 70 s of the loop: the certificate (valid for 60 s from its arrival) is due after 48 s; the
    // renewed one would be due about 48 s after that, outside the window.
    let renewed = Arc::new(AtomicUsize::new(0));
    let configs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (r, c) = (renewed.clone(), configs.clone());
    enroll::renew_loop(
        &opts,
        move |config| {
            r.fetch_add(1, Ordering::SeqCst);
            c.lock().unwrap().push(config);
        },
        tokio::time::sleep(Duration::from_secs(70)),
    )
    .await
    .expect("the renewal loop");
    let n = renewed.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&n),
        "renewed {n} times in 70 s with 1-minute certificates (expected once)"
    );
    let last = configs.lock().unwrap().pop().unwrap();
    assert_eq!(
        whoami(last).await,
        identity::host_user("db-1"),
        "the renewed certificate authenticates the host"
    );

    // Enrollment went through the token, every renewal through the host's own identity.
    let admin = env.client().await;
    let csrs = Api::<CertificateSigningRequest>::all(admin)
        .list(&ListParams::default())
        .await
        .unwrap();
    let by_host = csrs
        .items
        .iter()
        .filter(|c| c.spec.username.as_deref() == Some(identity::host_user("db-1").as_str()))
        .count();
    assert_eq!(
        by_host, n,
        "one CSR per renewal, each requested by the host itself"
    );
}
