//! With the Cluster API managers and their webhooks running (`TestEnv::shared_with_capi`): the
//! operator renders the sample and every CAPI object it applies (Cluster, KubeadmControlPlane,
//! KubeadmConfigTemplate, MachineDeployment) and every ByoCluster/ByoMachineTemplate passes
//! CAPI's defaulting and validating webhooks and is stored. The HelmChartProxy API (CAAPH) is not
//! installed in this environment, so the addons are reported, not applied.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_operator::controller::{Context, MANAGER, run};
use bootsman_operator::{OperatorSettings, render};
use bootsman_runtime::metrics::Metrics;
use bootsman_testenv::TestEnv;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};

#[tokio::test]
async fn every_rendered_capi_object_passes_the_capi_webhooks() {
    let env = TestEnv::shared_with_capi().await;
    let client = env.client().await;
    let ns = env.create_namespace("op-webhooks").await;
    let ctx = Arc::new(Context::new(
        client.clone(),
        OperatorSettings::default(),
        Arc::new(Metrics::new().unwrap()),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(run(
        ctx,
        Some(ns.clone()),
        bootsman_runtime::lifecycle::Readiness::detached(),
        async {
            let _ = stopped.await;
        },
    ));

    bootsman_fixtures::clusters::apply_sample(&client, &ns).await;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), &ns);
    let bc = api.get("demo").await.unwrap();

    for obj in render(&bc, &OperatorSettings::default()) {
        let kind = obj["kind"].as_str().unwrap().to_string();
        if kind == "HelmChartProxy" {
            continue;
        }
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let (group, version) = obj["apiVersion"].as_str().unwrap().split_once('/').unwrap();
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, &kind),
            &format!("{}s", kind.to_lowercase()),
        );
        let objs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        let what = format!("{kind} {name} stored by {MANAGER}");
        let stored = bootsman_testenv::wait_for(&what, Duration::from_secs(90), || {
            let objs = objs.clone();
            let name = name.clone();
            async move {
                match objs.get_opt(&name).await {
                    Ok(Some(o)) => Ok(o),
                    Ok(None) => Err("not created yet".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await;
        assert!(
            stored
                .managed_fields()
                .iter()
                .any(|m| m.manager.as_deref() == Some(MANAGER)),
            "{what}"
        );
    }

    // The replica counts and version went through the webhooks unchanged.
    let kcp: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"),
            "kubeadmcontrolplanes",
        ),
    );
    let kcp = kcp.get("demo-control-plane").await.unwrap();
    assert_eq!(kcp.data["spec"]["replicas"], 3);
    assert_eq!(kcp.data["spec"]["version"], "v1.33.4");
    assert_eq!(
        kcp.data["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxSurge"],
        0
    );

    let _ = stop.send(());
    operator.await.unwrap();
}
