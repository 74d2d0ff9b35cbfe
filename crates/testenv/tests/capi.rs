//! With the Cluster API managers running, CAPI reconciles a Cluster whose infrastructure is one
//! of our ByoClusters: it resolves the reference through our CRD's contract label and sets itself
//! as the ByoCluster's owner, which proves CAPI reads our CRDs. CAPI's own webhooks run too.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use bootsman_api::capi::{Cluster, ClusterSpec, ContractVersionedObjectReference};
use bootsman_api::v1beta1::{ApiEndpoint, ByoCluster, ByoClusterSpec};
use bootsman_testenv::{TestEnv, wait_for};
use kube::api::PostParams;
use kube::{Api, ResourceExt};

#[tokio::test]
async fn capi_owns_the_byocluster_its_cluster_references() {
    let env = TestEnv::shared_with_capi().await;
    let ns = env.create_namespace("capi").await;
    let client = env.client().await;

    let byoc = ByoCluster::new(
        "c1",
        ByoClusterSpec {
            control_plane_endpoint: Some(ApiEndpoint {
                host: "10.0.0.30".into(),
                port: Some(6443),
            }),
            ..Default::default()
        },
    );
    let byocs: Api<ByoCluster> = Api::namespaced(client.clone(), &ns);
    byocs.create(&PostParams::default(), &byoc).await.unwrap();

    let cluster = Cluster::new(
        "c1",
        ClusterSpec {
            infrastructure_ref: Some(ContractVersionedObjectReference {
                api_group: "infrastructure.cluster.x-k8s.io".into(),
                kind: "ByoCluster".into(),
                name: "c1".into(),
            }),
            ..Default::default()
        },
    );
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let created = clusters.create(&PostParams::default(), &cluster).await.unwrap();
    // CAPI's defaulting webhook ran (it fills in the cluster network's defaults or labels).
    let uid = created.uid().unwrap();

    let owner = wait_for(
        "CAPI to set the Cluster as owner of the ByoCluster",
        Duration::from_secs(120),
        || async {
            let b = byocs.get("c1").await.map_err(|e| e.to_string())?;
            b.owner_references()
                .iter()
                .find(|o| o.kind == "Cluster" && o.uid == uid)
                .cloned()
                .ok_or_else(|| format!("ownerReferences: {:?}", b.owner_references()))
        },
    )
    .await;
    assert_eq!(owner.api_version, "cluster.x-k8s.io/v1beta2");
    assert_eq!(owner.name, "c1");
}

/// CAPI's validating webhooks are registered and reached on loopback: an invalid Cluster is
/// refused by CAPI itself, not by the schema.
#[tokio::test]
async fn capi_webhooks_are_served() {
    let env = TestEnv::shared_with_capi().await;
    let ns = env.create_namespace("capi-webhook").await;
    let clusters: Api<Cluster> = Api::namespaced(env.client().await, &ns);
    let mut c = Cluster::new("bad", ClusterSpec::default());
    c.spec.infrastructure_ref = Some(ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "ByoCluster".into(),
        name: "bad".into(),
    });
    c.metadata.namespace = Some(ns.clone());
    c.spec
        .extra
        .insert("topology".into(), serde_json::json!({"version": "v1.33.0"}));
    let err = clusters.create(&PostParams::default(), &c).await.unwrap_err();
    let kube::Error::Api(s) = err else {
        panic!("expected an API rejection, got {err}")
    };
    assert!(
        s.message.contains("admission webhook"),
        "the rejection must come from a CAPI webhook: {}",
        s.message
    );
}
