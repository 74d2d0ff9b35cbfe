//! The site the cross-component tests share: [`bootsman_fixtures`] (a pool namespace, hosts
//! played by the test or served by real `byoh-agent` processes, CAPI objects as CAPI writes
//! them, tokens and CSRs) with Bootsman's controllers run in-process: the provider on a
//! [`Site`], the operator on a namespace, the provider's CSR approver for enrolment.

#![allow(dead_code, unused_imports, clippy::unwrap_used)] // shared by several test binaries

use std::sync::Arc;

pub mod enrol;

pub use bootsman_fixtures::agent::{Host as Agent, Pool, message, wait_condition};
pub use bootsman_fixtures::capi::{
    condition, create_byo_cluster, create_cluster, create_machine, create_machine_with_data, role,
};
pub use bootsman_fixtures::clusters::{install_helm_chart_proxy_crd, sample};
pub use bootsman_fixtures::enroll::{apply_host_rbac, csr_pem, decision, issue_token, submit};
pub use bootsman_fixtures::site::{Host, Running, Site};
pub use bootsman_fixtures::{WAIT, eventually, grant, meta, read};
use bootsman_provider::Config;
use bootsman_testenv::TestEnv;

fn metrics() -> Arc<bootsman_runtime::metrics::Metrics> {
    Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap())
}

/// Bootsman's controllers on a [`Site`].
pub trait Controllers {
    /// Provider settings scoped to the site's namespace.
    fn config(&self) -> Config;
    /// Starts a provider instance with its own client; it runs until the site stops.
    fn start_provider(&mut self, config: Config) -> impl std::future::Future<Output = ()>;
    /// Starts the provider's CSR approver; it runs until the site stops.
    fn start_approver(&mut self) -> impl std::future::Future<Output = ()>;
}

impl Controllers for Site {
    fn config(&self) -> Config {
        Config::namespaced(&self.ns)
    }

    async fn start_provider(&mut self, config: Config) {
        self.spawn(|client, stop| async move {
            bootsman_provider::run(client, config, metrics(), stop)
                .await
                .unwrap();
        })
        .await;
    }

    async fn start_approver(&mut self) {
        self.spawn(|client, stop| async move {
            bootsman_provider::enrollment::run(client, metrics(), Default::default(), stop)
                .await
                .expect("CSR approver");
        })
        .await;
    }
}

/// The provider's CSR approver on its own, in `env`, until the test ends.
pub async fn start_approver(env: &TestEnv) -> Running {
    Running::start(env, |client, stop| async move {
        bootsman_provider::enrollment::run(client, metrics(), Default::default(), stop)
            .await
            .expect("CSR approver");
    })
    .await
}

/// The operator, watching namespace `ns` of `env`, until stopped.
pub async fn start_operator(env: &TestEnv, ns: &str) -> Running {
    let ns = ns.to_string();
    Running::start(env, |client, stop| async move {
        let settings = bootsman_operator::OperatorSettings::default();
        let ctx = bootsman_operator::controller::Context::new(client, settings, metrics());
        let ready = bootsman_runtime::lifecycle::Readiness::detached();
        bootsman_operator::controller::run(Arc::new(ctx), Some(ns), ready, stop).await;
    })
    .await
}
