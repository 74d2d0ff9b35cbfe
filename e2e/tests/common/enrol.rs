//! Host identity, as the enrolment tests use it: [`bootsman_fixtures::enroll`] (host RBAC, raw
//! CSRs, the approver's decisions), the provider's CSR approver in-process for the whole test,
//! and tokens issued as `bootsmanctl hosts token` issues them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use bootsman_fixtures::enroll::{
    apply_host_rbac, client_of, csr_pem, decision, host_user, register, submit, submit_for, temp_dir,
    wait_token_deleted,
};
use bootsman_testenv::TestEnv;

/// Runs the provider's CSR approver on this test's runtime until the test ends.
pub async fn start_approver(env: &TestEnv) {
    let metrics = Arc::new(bootsman_runtime::metrics::Metrics::new().expect("metrics"));
    let client = env.client().await;
    tokio::spawn(async move {
        if let Err(e) = bootsman_provider::enrollment::run(
            client,
            metrics,
            Default::default(),
            futures::future::pending(),
        )
        .await
        {
            panic!("CSR approver: {e:#}");
        }
    });
}

/// Issues a token for `pool` (and `host`) and writes its bootstrap kubeconfig to a file.
pub async fn bootstrap_kubeconfig(
    env: &TestEnv,
    pool: &str,
    host: Option<&str>,
) -> (bootsmanctl::token::Token, PathBuf) {
    issue(env, pool, host, false).await
}

/// Like [`bootstrap_kubeconfig`] for a token of `bootsmanctl hosts replace HOST`.
pub async fn replacement_kubeconfig(
    env: &TestEnv,
    pool: &str,
    host: &str,
) -> (bootsmanctl::token::Token, PathBuf) {
    issue(env, pool, Some(host), true).await
}

async fn issue(
    env: &TestEnv,
    pool: &str,
    host: Option<&str>,
    replace: bool,
) -> (bootsmanctl::token::Token, PathBuf) {
    let admin = env.client().await;
    let token = bootsmanctl::token::create(
        &admin,
        &bootsmanctl::token::Request {
            pool: pool.into(),
            host: host.map(Into::into),
            ttl: Duration::from_secs(600),
            replace,
        },
    )
    .await
    .expect("issue token");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(env.kubeconfig()).expect("admin kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("admin config");
    let yaml =
        bootsmanctl::token::bootstrap_kubeconfig(env.api_url(), &bootsmanctl::token::ca_pem(&config), &token);
    let path = temp_dir(env, "bootstrap").join("bootstrap-kubeconfig");
    std::fs::write(&path, yaml).expect("write bootstrap kubeconfig");
    (token, path)
}
