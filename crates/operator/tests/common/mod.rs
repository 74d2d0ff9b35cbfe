//! What the operator's integration tests share: the operator running in the test's runtime, and
//! (from [`bootsman_fixtures::clusters`]) the sample BootsmanCluster and the HelmChartProxy CRD
//! stand-in.

#![allow(dead_code, unused_imports, clippy::unwrap_used)] // shared by several test binaries

use std::sync::Arc;

use bootsman_api::pools::SharedPool;
pub use bootsman_fixtures::clusters::{install_helm_chart_proxy_crd, sample};
use bootsman_fixtures::site::Running;
use bootsman_operator::OperatorSettings;
use bootsman_operator::controller::{Context, run};
use bootsman_testenv::TestEnv;

/// The operator, watching one namespace, on the calling test's runtime.
pub struct Operator(Running);

impl Operator {
    pub async fn start(env: &TestEnv, ns: &str) -> Self {
        Self::start_with_pools(env, ns, Vec::new()).await
    }

    /// The same, counting the hosts of `pools` (the operator's `--pool` flags).
    pub async fn start_with_pools(env: &TestEnv, ns: &str, pools: Vec<SharedPool>) -> Self {
        let ns = ns.to_string();
        Self(
            Running::start(env, |client, stop| async move {
                let metrics = Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
                let ctx = Context::new(client, OperatorSettings::default(), metrics).with_shared_pools(pools);
                let ready = bootsman_runtime::lifecycle::Readiness::detached();
                run(Arc::new(ctx), Some(ns), ready, stop).await;
            })
            .await,
        )
    }

    pub async fn stop(self) {
        self.0.stop().await;
    }
}
