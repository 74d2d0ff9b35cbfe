//! One token enrols one host, even when several hosts race to use it and two approvers (two
//! provider replicas, say during a leader hand-over) decide at the same time.

mod common;

use bootsman_api::identity;
use bootsman_testenv::TestEnv;

#[tokio::test]
async fn one_token_enrols_one_host_even_with_two_approvers() {
    let env = TestEnv::shared().await;
    common::apply_host_rbac(env);
    let pool = env.create_namespace("race").await;
    let (token, kubeconfig) = common::issue_token(env, &pool, None).await;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("bootstrap kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("bootstrap config");
    let client = kube::Client::try_from(config).expect("client");

    // Every request is submitted before any approver runs, so they all compete for the token.
    let mut names = Vec::new();
    for i in 0..6 {
        let host = format!("racer-{i}");
        let pem = common::csr_pem(&identity::host_user(&host), &[identity::HOSTS_GROUP]);
        names.push(
            common::submit(
                &client,
                pem,
                "kubernetes.io/kube-apiserver-client",
                &["client auth"],
            )
            .await,
        );
    }
    let _first = common::start_approver(env).await;
    let _second = common::start_approver(env).await;

    let mut approved = Vec::new();
    let mut denied = Vec::new();
    for name in &names {
        match common::decision(env, name).await {
            Ok(()) => approved.push(name.clone()),
            Err(reason) => denied.push((name.clone(), reason)),
        }
    }
    assert_eq!(approved.len(), 1, "approved {approved:?}, denied {denied:?}");
    for (name, reason) in &denied {
        assert!(
            reason == "TokenSpent" || reason == "TokenNotFound",
            "CSR {name} denied for {reason}, not because the token was spent"
        );
    }
    // The winner registers (it holds its certificate), and the spent token is gone.
    let i = names
        .iter()
        .position(|n| *n == approved[0])
        .expect("approved CSR");
    let winner = bootsman_api::v1beta1::ByoHost::new(&format!("racer-{i}"), Default::default());
    kube::Api::namespaced(env.client().await, &pool)
        .create(&Default::default(), &winner)
        .await
        .expect("register the winner");
    bootsman_fixtures::enroll::wait_token_deleted(env, &token.secret_name()).await;
}
