//! With the Cluster API core manager running: a MachineDeployment of 3 replicas whose template
//! names a bootstrap data Secret and a ByoMachineTemplate gives 3 Machines that reach phase
//! `Provisioned` on 3 distinct hosts.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bootsman_api::capi::{
    Bootstrap, ContractVersionedObjectReference, Machine, MachineDeployment, MachineDeploymentSpec,
    MachineSpec, MachineTemplateSpec, TemplateMeta,
};
use bootsman_api::v1beta1::{
    ApiEndpoint, ByoCluster, ByoClusterSpec, ByoMachineSpec, ByoMachineTemplate, ByoMachineTemplateResource,
    ByoMachineTemplateSpec,
};
use bootsman_testenv::{TestEnv, wait_for};
use common::{ProviderSite as _, Site};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ListParams, PostParams};

#[tokio::test]
async fn a_machine_deployment_gets_three_provisioned_machines_on_distinct_hosts() {
    let env = TestEnv::shared_with_capi().await;
    let mut site = Site::new_in(env, "capi-md").await;
    site.start_provider(site.config()).await;
    let mut hosts = Vec::new();
    for i in 0..4 {
        hosts.push(site.host(&format!("w{i}"), &[("role", "worker")], true).await);
    }
    let ns = site.ns.clone();
    let admin = site.admin.clone();

    let mut bc = ByoCluster::new(
        "c1",
        ByoClusterSpec {
            control_plane_endpoint: Some(ApiEndpoint {
                host: "10.0.0.50".into(),
                port: Some(6443),
            }),
            ..Default::default()
        },
    );
    bc.metadata.namespace = Some(ns.clone());
    Api::<ByoCluster>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &bc)
        .await
        .unwrap();
    let mut cluster = bootsman_api::capi::Cluster::new("c1", Default::default());
    cluster.metadata.namespace = Some(ns.clone());
    cluster.spec.infrastructure_ref = Some(ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "ByoCluster".into(),
        name: "c1".into(),
    });
    Api::<bootsman_api::capi::Cluster>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();

    let mut tmpl = ByoMachineTemplate::new(
        "workers",
        ByoMachineTemplateSpec {
            template: ByoMachineTemplateResource {
                metadata: None,
                spec: ByoMachineSpec {
                    selector: Some(LabelSelector {
                        match_labels: Some([("role".to_string(), "worker".to_string())].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            },
        },
    );
    tmpl.metadata.namespace = Some(ns.clone());
    Api::<ByoMachineTemplate>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &tmpl)
        .await
        .unwrap();
    let secret = Secret {
        metadata: common::meta("workers-bootstrap", &ns),
        data: Some(BTreeMap::from([
            (
                "value".to_string(),
                ByteString(b"#cloud-config\nruncmd:\n- echo joined\n".to_vec()),
            ),
            ("format".to_string(), ByteString(b"cloud-config".to_vec())),
        ])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let labels = BTreeMap::from([("pool".to_string(), "workers".to_string())]);
    let mut md = MachineDeployment::new(
        "workers",
        MachineDeploymentSpec {
            cluster_name: "c1".into(),
            replicas: Some(3),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: MachineTemplateSpec {
                metadata: Some(TemplateMeta {
                    labels,
                    ..Default::default()
                }),
                spec: MachineSpec {
                    cluster_name: "c1".into(),
                    bootstrap: Bootstrap {
                        data_secret_name: Some("workers-bootstrap".into()),
                        config_ref: None,
                    },
                    infrastructure_ref: ContractVersionedObjectReference {
                        api_group: "infrastructure.cluster.x-k8s.io".into(),
                        kind: "ByoMachineTemplate".into(),
                        name: "workers".into(),
                    },
                    version: Some("v1.33.4".into()),
                    ..Default::default()
                },
            },
            ..Default::default()
        },
    );
    md.metadata.namespace = Some(ns.clone());
    Api::<MachineDeployment>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();

    // Hosts play their part: report bootstrap success once they are handed their data.
    let reporter = tokio::spawn(async move {
        loop {
            for h in &hosts {
                let host = h.get().await;
                let done = host.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "BootstrapSucceeded" && c.status == "True")
                });
                if host.spec.bootstrap_secret.is_some() && !done {
                    h.report("BootstrapSucceeded", true, "Done").await;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    let machines: Api<Machine> = Api::namespaced(admin.clone(), &ns);
    let provisioned = wait_for(
        "3 Machines in phase Provisioned",
        Duration::from_secs(180),
        || async {
            let list = machines
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let phases: Vec<(String, Option<String>, Option<String>)> = list
                .items
                .iter()
                .map(|m| {
                    (
                        m.metadata.name.clone().unwrap_or_default(),
                        m.status.as_ref().and_then(|s| s.phase.clone()),
                        m.spec.provider_id.clone(),
                    )
                })
                .collect();
            let done: Vec<_> = phases
                .iter()
                .filter(|(_, p, _)| p.as_deref() == Some("Provisioned"))
                .cloned()
                .collect();
            if done.len() == 3 && list.items.len() == 3 {
                Ok(done)
            } else {
                Err(format!("{phases:?}"))
            }
        },
    )
    .await;
    reporter.abort();
    let ids: BTreeSet<String> = provisioned.iter().filter_map(|(_, _, id)| id.clone()).collect();
    assert_eq!(ids.len(), 3, "three distinct hosts: {ids:?}");
    assert!(
        ids.iter().all(|id| id.starts_with(&format!("byoh://{ns}/w"))),
        "{ids:?}"
    );
    site.stop().await;
}
