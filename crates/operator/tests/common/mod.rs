//! What the operator's integration tests share: the HelmChartProxy CRD stand-in, the operator
//! running in the test's runtime, and the sample BootsmanCluster.
//!
//! CAAPH's CRDs cannot be fetched here (the Go module proxy refuses
//! `sigs.k8s.io/cluster-api-addon-provider-helm`), so the tests install a HelmChartProxy CRD
//! generated from our Rust type (schema-less, `x-kubernetes-preserve-unknown-fields`). It checks
//! that the objects are stored, not CAAPH's field validation.

#![allow(dead_code, clippy::unwrap_used)] // shared by several test binaries; test code

use std::sync::Arc;
use std::time::Duration;

use bootsman_api::capi::HelmChartProxy;
use bootsman_api::pools::SharedPool;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_operator::OperatorSettings;
use bootsman_operator::controller::{Context, run};
use bootsman_testenv::{TestEnv, wait_for};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, CustomResourceExt};
use serde_json::json;

/// Installs the HelmChartProxy CRD stand-in (once per control plane; a second call finds it).
pub async fn install_helm_chart_proxy_crd(env: &TestEnv) {
    let crds: Api<CustomResourceDefinition> = Api::all(env.client().await);
    let mut crd = HelmChartProxy::crd();
    crd.spec.versions[0].subresources = Some(serde_json::from_value(json!({"status": {}})).unwrap());
    crd.spec.versions[0].schema = Some(
        serde_json::from_value(json!({"openAPIV3Schema": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        }}))
        .unwrap(),
    );
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("installing HelmChartProxy CRD: {e}"),
    }
    let api: Api<HelmChartProxy> = Api::all(env.client().await);
    wait_for("HelmChartProxy API served", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await;
}

/// The operator, watching one namespace, on the calling test's runtime.
pub struct Operator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    pub async fn start(env: &TestEnv, ns: &str) -> Self {
        Self::start_with_pools(env, ns, Vec::new()).await
    }

    /// The same, counting the hosts of `pools` (the operator's `--pool` flags).
    pub async fn start_with_pools(env: &TestEnv, ns: &str, pools: Vec<SharedPool>) -> Self {
        let metrics = Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
        let ctx = Arc::new(
            Context::new(env.client().await, OperatorSettings::default(), metrics).with_shared_pools(pools),
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(
            ctx,
            Some(ns.into()),
            bootsman_runtime::lifecycle::Readiness::detached(),
            async move {
                let _ = rx.await;
            },
        ));
        Self { stop: Some(tx), task }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.task.await;
    }
}

/// config/samples/bootsmancluster.yaml, in namespace `ns`.
pub fn sample(ns: &str) -> BootsmanCluster {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/samples/bootsmancluster.yaml"
    ))
    .unwrap();
    let mut bc: BootsmanCluster = serde_saphyr::from_str(&text).unwrap();
    bc.metadata.namespace = Some(ns.into());
    bc
}
