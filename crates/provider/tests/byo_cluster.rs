//! The ByoCluster controller: provisioned once the endpoint is known (port defaulted to 6443),
//! failure domains from the zones of the healthy hosts it may use, pause, and deletion waiting for the
//! cluster's ByoMachines.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use bootsman_api::capi::Cluster;
use bootsman_api::v1beta1::{ApiEndpoint, ByoCluster, ByoClusterSpec};
use bootsman_testenv::wait_for;
use common::{ProviderSite as _, Site, WAIT};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};

/// Cluster `name` and its ByoCluster (endpoint 10.0.0.40, no port), owned as CAPI would.
async fn byo_cluster(site: &Site, name: &str) -> Api<ByoCluster> {
    let cluster = site.cluster(name, false).await;
    let mut bc = ByoCluster::new(
        name,
        ByoClusterSpec {
            control_plane_endpoint: Some(ApiEndpoint {
                host: "10.0.0.40".into(),
                port: None,
            }),
            ..Default::default()
        },
    );
    bc.metadata.namespace = Some(site.ns.clone());
    // CAPI sets the Cluster as owner; the test plays CAPI's part here.
    bc.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Cluster::api_version(&()).into(),
        kind: "Cluster".into(),
        name: name.into(),
        uid: cluster.uid().unwrap(),
        ..Default::default()
    }]);
    let api: Api<ByoCluster> = Api::namespaced(site.admin.clone(), &site.ns);
    api.create(&PostParams::default(), &bc).await.unwrap();
    api
}

/// Waits until the ByoCluster's failure domains are `want`.
async fn zones(api: &Api<ByoCluster>, name: &str, want: &[&str]) {
    wait_for(&format!("failure domains {want:?}"), WAIT, || async {
        let bc = api.get(name).await.map_err(|e| e.to_string())?;
        let zones: Vec<String> = bc
            .status
            .map(|s| s.failure_domains.into_iter().map(|f| f.name).collect())
            .unwrap_or_default();
        if zones == want {
            Ok(())
        } else {
            Err(format!("{zones:?}"))
        }
    })
    .await;
}

/// A zone is a failure domain only while a healthy host is in it: an offline host's zone is not
/// offered to control-plane machines, and comes when the host comes back; a host put in
/// maintenance takes its zone away. Each change reaches the ByoCluster without any other event.
#[tokio::test]
async fn failure_domains_come_from_healthy_hosts_only() {
    let mut site = Site::new("byoc-zones").await;
    site.start_provider(site.config()).await;
    site.host("a", &[("topology.kubernetes.io/zone", "rack-1")], true)
        .await;
    let down = site
        .host("d", &[("topology.kubernetes.io/zone", "rack-3")], false)
        .await;
    let api = byo_cluster(&site, "c1").await;
    zones(&api, "c1", &["rack-1"]).await;

    down.heartbeat(3600).await;
    zones(&api, "c1", &["rack-1", "rack-3"]).await;

    site.byohosts()
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"maintenance": true}})),
        )
        .await
        .unwrap();
    zones(&api, "c1", &["rack-3"]).await;
    site.stop().await;
}

#[tokio::test]
async fn provisioned_with_default_port_and_zones_and_deletion_waits_for_machines() {
    let mut site = Site::new("byoc").await;
    site.start_provider(site.config()).await;
    site.host("a", &[("topology.kubernetes.io/zone", "rack-1")], true)
        .await;
    site.host("b", &[("topology.kubernetes.io/zone", "rack-2")], true)
        .await;
    site.host("c", &[("topology.kubernetes.io/zone", "rack-2")], true)
        .await;
    let api = byo_cluster(&site, "c1").await;
    let bc = wait_for("the ByoCluster to be provisioned", WAIT, || async {
        let bc = api.get("c1").await.map_err(|e| e.to_string())?;
        let p = bc
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned);
        if p == Some(true) && bc.status.as_ref().is_some_and(|s| s.failure_domains.len() == 2) {
            Ok(bc)
        } else {
            Err(format!("{:?}", bc.status))
        }
    })
    .await;
    assert_eq!(bc.spec.control_plane_endpoint.unwrap().port, Some(6443));
    let zones: Vec<String> = bc
        .status
        .unwrap()
        .failure_domains
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(zones, ["rack-1", "rack-2"]);

    // Deletion waits for the cluster's ByoMachines.
    site.machine("c1", "m0", None).await;
    wait_for("m0 to be bound", WAIT, || async {
        let bm = site.byomachines().get("m0").await.map_err(|e| e.to_string())?;
        bm.spec.provider_id.ok_or_else(|| "not yet".to_string())
    })
    .await;
    api.delete("c1", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        api.get_opt("c1").await.unwrap().is_some(),
        "the ByoCluster must wait for its ByoMachines"
    );
    // The machine goes (its host reports clean); then the ByoCluster goes.
    site.byomachines()
        .delete("m0", &DeleteParams::default())
        .await
        .unwrap();
    let host = wait_for("the host's release request", WAIT, || async {
        for name in ["a", "b", "c"] {
            let h = site.byohosts().get(name).await.map_err(|e| e.to_string())?;
            if h.spec.release.is_some() {
                return Ok(name.to_string());
            }
        }
        Err("none yet".into())
    })
    .await;
    let agent = common::Host {
        name: host,
        ns: site.ns.clone(),
        client: site.admin.clone(),
    };
    agent.report("CleanupSucceeded", true, "Reset").await;
    wait_for("the ByoCluster to be deleted", WAIT, || async {
        match api.get_opt("c1").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    site.stop().await;
}
