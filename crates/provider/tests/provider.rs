//! The provider against the real control plane: hosts claimed race-free and only when healthy,
//! bootstrap data readable by its host alone, waiting machines woken by arriving hosts, release
//! and quarantine, pause.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bootsman_api::v1beta1::{ByoMachine, Quarantine};
use bootsman_testenv::wait_for;
use common::{ProviderSite as _, Site, WAIT, condition, role};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

async fn bound_host(site: &Site, machine: &str) -> String {
    wait_for(
        &format!("ByoMachine {machine} to get a providerID"),
        WAIT,
        || async {
            let bm = site.byomachines().get(machine).await.map_err(|e| e.to_string())?;
            bm.spec
                .provider_id
                .clone()
                .ok_or_else(|| format!("status: {:?}", bm.status))
        },
    )
    .await
    .rsplit('/')
    .next()
    .unwrap()
    .to_string()
}

async fn provisioned(site: &Site, machine: &str) -> ByoMachine {
    wait_for(
        &format!("ByoMachine {machine} to be provisioned"),
        WAIT,
        || async {
            let bm = site.byomachines().get(machine).await.map_err(|e| e.to_string())?;
            let p = bm
                .status
                .as_ref()
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.provisioned);
            if p == Some(true) {
                Ok(bm)
            } else {
                Err(format!("{:?}", bm.status))
            }
        },
    )
    .await
}

#[tokio::test]
async fn three_machines_five_hosts() {
    let mut site = Site::new("bind").await;
    site.start_provider(site.config()).await;
    let mut hosts = Vec::new();
    for i in 0..5 {
        hosts.push(site.host(&format!("host-{i}"), &[("role", "worker")], true).await);
    }
    site.cluster("c1", false).await;
    for i in 0..3 {
        site.machine("c1", &format!("m{i}"), Some(role("worker"))).await;
    }
    let mut bound = BTreeSet::new();
    for i in 0..3 {
        let host = bound_host(&site, &format!("m{i}")).await;
        let bm = site.byomachines().get(&format!("m{i}")).await.unwrap();
        assert_eq!(
            bm.spec.provider_id.as_deref(),
            Some(format!("byoh://{}/{host}", site.ns).as_str())
        );
        bound.insert(host);
    }
    assert_eq!(bound.len(), 3, "three distinct hosts: {bound:?}");

    // Each bound host reads its own bootstrap data and nobody else's.
    let by_name = |n: &str| hosts.iter().find(|h| h.name == n).unwrap();
    let names: Vec<&String> = bound.iter().collect();
    for name in &names {
        let host = by_name(name);
        let secret_name = wait_for("the host to be pointed at its bootstrap Secret", WAIT, || async {
            host.get()
                .await
                .spec
                .bootstrap_secret
                .map(|s| s.name)
                .ok_or_else(|| "not yet".to_string())
        })
        .await;
        let own = Api::<Secret>::namespaced(host.client.clone(), &site.ns)
            .get(&secret_name)
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&own.data.unwrap()["value"].0).contains("#cloud-config"));
    }
    let (a, b) = (by_name(names[0]), by_name(names[1]));
    let b_secret = b.get().await.spec.bootstrap_secret.unwrap().name;
    let denied = Api::<Secret>::namespaced(a.client.clone(), &site.ns)
        .get(&b_secret)
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(s)) if s.code == 403),
        "another host's bootstrap Secret must be 403"
    );
    let unbound = hosts.iter().find(|h| !bound.contains(&h.name)).unwrap();
    let denied = Api::<Secret>::namespaced(unbound.client.clone(), &site.ns)
        .list(&Default::default())
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(s)) if s.code == 403),
        "listing Secrets must be 403"
    );

    // Not provisioned until the host reports success; then provisioned with its addresses.
    let bm = site.byomachines().get("m0").await.unwrap();
    assert_ne!(
        bm.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned),
        Some(true)
    );
    for i in 0..3 {
        let name = bound_host(&site, &format!("m{i}")).await;
        by_name(&name).report("BootstrapSucceeded", true, "Done").await;
        let bm = provisioned(&site, &format!("m{i}")).await;
        assert_eq!(
            condition(&bm, "Ready"),
            Some(("True".into(), "Provisioned".into()))
        );
        assert!(
            bm.status
                .unwrap()
                .addresses
                .iter()
                .any(|a| a.address == "127.0.0.1")
        );
    }
    site.stop().await;
}

#[tokio::test]
async fn control_plane_machines_take_only_control_plane_hosts() {
    let mut site = Site::new("select").await;
    site.start_provider(site.config()).await;
    for i in 0..3 {
        site.host(&format!("worker-{i}"), &[("role", "worker")], true)
            .await;
    }
    for i in 0..2 {
        site.host(&format!("cp-{i}"), &[("role", "control-plane")], true)
            .await;
    }
    site.cluster("c1", false).await;
    for i in 0..2 {
        site.machine("c1", &format!("cp{i}"), Some(role("control-plane")))
            .await;
    }
    let a = bound_host(&site, "cp0").await;
    let b = bound_host(&site, "cp1").await;
    site.machine("c1", "cp2", Some(role("control-plane"))).await;
    assert!(a.starts_with("cp-") && b.starts_with("cp-") && a != b, "{a} {b}");
    // The third control-plane machine finds no free control-plane host and never takes a worker.
    wait_for("cp2 to wait for a host", WAIT, || async {
        let bm = site.byomachines().get("cp2").await.map_err(|e| e.to_string())?;
        match condition(&bm, "HostAssigned") {
            Some((s, r)) if s == "False" && r == "WaitingForHost" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        site.byomachines()
            .get("cp2")
            .await
            .unwrap()
            .spec
            .provider_id
            .is_none()
    );
    site.stop().await;
}

#[tokio::test]
async fn a_waiting_machine_is_woken_by_an_arriving_host() {
    let mut site = Site::new("wake").await;
    site.start_provider(site.config()).await;
    site.cluster("c1", false).await;
    site.machine("c1", "m0", None).await;
    wait_for("m0 to report that no host matches", WAIT, || async {
        let bm = site.byomachines().get("m0").await.map_err(|e| e.to_string())?;
        match condition(&bm, "HostAssigned") {
            Some((s, r)) if s == "False" && r == "NoMatchingHost" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    site.host("first", &[], true).await;
    bound_host(&site, "m0").await;
    site.machine("c1", "m1", None).await;
    wait_for("m1 to wait for a host", WAIT, || async {
        let bm = site.byomachines().get("m1").await.map_err(|e| e.to_string())?;
        match condition(&bm, "HostAssigned") {
            Some((s, r)) if s == "False" && r == "WaitingForHost" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let registered = Instant::now();
    site.host("late", &[], true).await;
    let host = bound_host(&site, "m1").await;
    let took = registered.elapsed();
    assert_eq!(host, "late");
    assert!(
        took < Duration::from_secs(2),
        "a host that registers must be claimed within 2 s, took {took:?}"
    );
    site.stop().await;
}

#[tokio::test]
async fn offline_maintenance_and_quarantined_hosts_are_never_chosen() {
    let mut site = Site::new("health").await;
    site.start_provider(site.config()).await;
    site.host("offline", &[], false).await;
    site.host("maint", &[], true).await;
    site.host("quarantined", &[], true).await;
    let hosts = site.byohosts();
    hosts
        .patch(
            "maint",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"maintenance": true}})),
        )
        .await
        .unwrap();
    let q = Quarantine {
        reason: "test".into(),
        since: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    hosts
        .patch(
            "quarantined",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"quarantine": q}})),
        )
        .await
        .unwrap();
    site.cluster("c1", false).await;
    for i in 0..3 {
        site.machine("c1", &format!("m{i}"), None).await;
    }
    wait_for("every machine to wait for a host", WAIT, || async {
        for i in 0..3 {
            let bm = site
                .byomachines()
                .get(&format!("m{i}"))
                .await
                .map_err(|e| e.to_string())?;
            match condition(&bm, "HostAssigned") {
                Some((s, r)) if s == "False" && r == "WaitingForHost" => {}
                other => return Err(format!("m{i}: {other:?}")),
            }
        }
        Ok(())
    })
    .await;
    // The provider reports the offline host's state from its Lease.
    wait_for("the offline host's phase", WAIT, || async {
        let h = hosts.get("offline").await.map_err(|e| e.to_string())?;
        match h.status.and_then(|s| s.phase) {
            Some(bootsman_api::v1beta1::HostPhase::Offline) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for name in ["offline", "maint", "quarantined"] {
        assert!(
            hosts.get(name).await.unwrap().spec.machine_ref.is_none(),
            "{name} must not be claimed"
        );
    }
    site.host("healthy", &[], true).await;
    let mut taken = 0;
    for i in 0..3 {
        if site
            .byomachines()
            .get(&format!("m{i}"))
            .await
            .unwrap()
            .spec
            .provider_id
            .is_some()
        {
            taken += 1;
        }
    }
    let host = wait_for("one machine to take the healthy host", WAIT, || async {
        let h = hosts.get("healthy").await.map_err(|e| e.to_string())?;
        h.spec.machine_ref.ok_or_else(|| "not claimed".to_string())
    })
    .await;
    assert!(host.name.starts_with('m'));
    assert_eq!(taken, 0);
    site.stop().await;
}

#[tokio::test]
async fn release_returns_the_host_clean_or_quarantines_it() {
    let mut site = Site::new("release").await;
    let mut config = site.config();
    config.release_timeout = Duration::from_secs(3);
    site.start_provider(config).await;
    let good = site.host("good", &[("role", "a")], true).await;
    let silent = site.host("silent", &[("role", "b")], true).await;
    site.cluster("c1", false).await;
    site.machine("c1", "ma", Some(role("a"))).await;
    site.machine("c1", "mb", Some(role("b"))).await;
    assert_eq!(bound_host(&site, "ma").await, "good");
    assert_eq!(bound_host(&site, "mb").await, "silent");
    good.report("BootstrapSucceeded", true, "Done").await;
    provisioned(&site, "ma").await;
    wait_for("silent's bootstrap Secret", WAIT, || async {
        silent
            .get()
            .await
            .spec
            .bootstrap_secret
            .ok_or_else(|| "none".to_string())
    })
    .await;

    site.byomachines()
        .delete("ma", &DeleteParams::default())
        .await
        .unwrap();
    site.byomachines()
        .delete("mb", &DeleteParams::default())
        .await
        .unwrap();
    // The good host is asked to reset, does so, and reports it.
    wait_for("the good host's release request", WAIT, || async {
        good.get().await.spec.release.ok_or_else(|| "none".to_string())
    })
    .await;
    let still = site.byomachines().get_opt("ma").await.unwrap();
    assert!(
        still.is_some(),
        "the finalizer holds until the host is clean; host: {:?}",
        site.byohosts().get("good").await.unwrap()
    );
    good.report("CleanupSucceeded", true, "Reset").await;
    wait_for("ma to be gone", WAIT, || async {
        match site
            .byomachines()
            .get_opt("ma")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    let h = site.byohosts().get("good").await.unwrap();
    assert!(h.spec.machine_ref.is_none() && h.spec.bootstrap_secret.is_none() && h.spec.release.is_none());
    assert!(h.spec.quarantine.is_none());
    let secrets: Api<Secret> = Api::namespaced(site.admin.clone(), &site.ns);
    let roles: Api<Role> = Api::namespaced(site.admin.clone(), &site.ns);
    assert!(secrets.get_opt("good-bootstrap").await.unwrap().is_none());
    assert!(roles.get_opt("good-bootstrap-reader").await.unwrap().is_none());

    // The silent host never answers: quarantined after the timeout, and the deletion completes.
    wait_for("mb to be gone", WAIT, || async {
        match site
            .byomachines()
            .get_opt("mb")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    let h = site.byohosts().get("silent").await.unwrap();
    assert!(h.spec.quarantine.is_some(), "the silent host must be quarantined");
    assert!(h.spec.machine_ref.is_none());
    assert!(secrets.get_opt("silent-bootstrap").await.unwrap().is_none());

    // The released host serves the next machine; the quarantined one does not.
    site.machine("c1", "mc", None).await;
    assert_eq!(bound_host(&site, "mc").await, "good");
    site.stop().await;
}

#[tokio::test]
async fn a_paused_cluster_gets_no_claims() {
    let mut site = Site::new("pause").await;
    site.start_provider(site.config()).await;
    site.host("h", &[], true).await;
    site.cluster("c1", true).await;
    site.machine("c1", "m0", None).await;
    let bm = wait_for("the Paused condition", WAIT, || async {
        let bm = site.byomachines().get("m0").await.map_err(|e| e.to_string())?;
        match condition(&bm, "Paused") {
            Some((s, _)) if s == "True" => Ok(bm),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(site.byohosts().get("h").await.unwrap().spec.machine_ref.is_none());
    assert!(bm.spec.provider_id.is_none());
    // Unpausing lets the claim happen.
    Api::<bootsman_api::capi::Cluster>::namespaced(site.admin.clone(), &site.ns)
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    assert_eq!(bound_host(&site, "m0").await, "h");
    let _ = bm.name_any();
    site.stop().await;
}

/// Where `<cluster>-kubeconfig` exists, the workload Node named after the host gets the
/// machine's providerID (the workload cluster here is the test control plane itself).
#[tokio::test]
async fn the_workload_node_gets_the_provider_id() {
    use k8s_openapi::api::core::v1::Node;
    let mut site = Site::new("node").await;
    site.start_provider(site.config()).await;
    let host = site.host("node-host", &[], true).await;
    site.cluster("c1", false).await;
    let kubeconfig = std::fs::read(site.env.kubeconfig()).unwrap();
    let secret = Secret {
        metadata: common::meta("c1-kubeconfig", &site.ns),
        data: Some([("value".to_string(), k8s_openapi::ByteString(kubeconfig))].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(site.admin.clone(), &site.ns)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let node_name = format!("node-host-{}", site.ns);
    // The host reports its kernel host name; the Node carries it.
    let nodes: Api<Node> = Api::all(site.admin.clone());
    let node = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(node_name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes.create(&Default::default(), &node).await.unwrap();
    host.inventory(&node_name).await;
    site.machine("c1", "m0", None).await;
    bound_host(&site, "m0").await;
    host.report("BootstrapSucceeded", true, "Done").await;
    provisioned(&site, "m0").await;
    let want = format!("byoh://{}/node-host", site.ns);
    wait_for("the workload Node's providerID", WAIT, || async {
        let n = nodes.get(&node_name).await.map_err(|e| e.to_string())?;
        match n.spec.and_then(|s| s.provider_id) {
            Some(id) if id == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    nodes.delete(&node_name, &DeleteParams::default()).await.unwrap();
    site.stop().await;
}

/// Machines draw from their own namespace and from shared pools that allow their namespace,
/// never from pools that do not.
#[tokio::test]
async fn shared_pools_serve_only_the_namespaces_they_allow() {
    let mut pool = Site::new("pool").await;
    let team = Site::new("team").await;
    let other = Site::new("other").await;
    let filter = pool.ns.clone();
    let config = bootsman_provider::Config {
        namespace: None,
        watch_filter: Some(filter.clone()),
        shared_pools: vec![
            bootsman_provider::SharedPool::parse(&format!("{}={}", pool.ns, team.ns)).unwrap(),
        ],
        ..bootsman_provider::Config::default()
    };
    pool.start_provider(config).await;
    pool.host("shared-1", &[], true).await;
    for site in [&team, &other] {
        site.cluster("c1", false).await;
        site.machine("c1", "m0", None).await;
        let patch = serde_json::json!({"metadata": {"labels": {"cluster.x-k8s.io/watch-filter": filter}}});
        site.byomachines()
            .patch("m0", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let id = wait_for("the team's machine to take the shared host", WAIT, || async {
        let bm = team.byomachines().get("m0").await.map_err(|e| e.to_string())?;
        bm.spec.provider_id.ok_or_else(|| format!("{:?}", bm.status))
    })
    .await;
    assert_eq!(id, format!("byoh://{}/shared-1", pool.ns));
    wait_for("the other namespace's machine to find no host", WAIT, || async {
        let bm = other.byomachines().get("m0").await.map_err(|e| e.to_string())?;
        match condition(&bm, "HostAssigned") {
            Some((s, r)) if s == "False" && r == "NoMatchingHost" => Ok(()),
            o => Err(format!("{o:?}")),
        }
    })
    .await;
    pool.stop().await;
}

/// In a namespace a Project holds, machines draw only from the Project's host pools (and their
/// own namespace): never from a shared pool the `--pool` flags open to every namespace, not even
/// when a selector names that pool with `bootsman.io/pool`. The pool label picks among the
/// project's pools, and widening the project's pools wakes the waiting machine.
#[tokio::test]
async fn a_project_draws_only_from_its_own_pools() {
    use bootsman_api::v1alpha1::Project;
    let mut open = Site::new("open").await;
    let rack = Site::new("rack").await;
    let team = Site::new("team").await;
    let filter = open.ns.clone();
    let config = bootsman_provider::Config {
        namespace: None,
        watch_filter: Some(filter.clone()),
        shared_pools: vec![bootsman_provider::SharedPool::parse(&format!("{}=*", open.ns)).unwrap()],
        projects: true,
        ..bootsman_provider::Config::default()
    };
    // The project holds the team's namespace (as the project controller reports it) and may use
    // the rack's hosts.
    let name = format!("{}-p", team.ns);
    let projects: Api<Project> = Api::all(team.admin.clone());
    let body = |pools: Vec<String>| {
        serde_json::json!({
            "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
            "metadata": {"name": name},
            "spec": {"namespaces": [team.ns], "hostPools": pools},
        })
    };
    let apply = PatchParams::apply("test").force();
    projects
        .patch(&name, &apply, &Patch::Apply(body(vec![rack.ns.clone()])))
        .await
        .unwrap();
    projects
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"namespaces": [team.ns]}})),
        )
        .await
        .unwrap();
    open.start_provider(config).await;
    open.host("open-1", &[], true).await;
    rack.host("rack-1", &[], true).await;
    team.cluster("c1", false).await;
    let watched = serde_json::json!({"metadata": {"labels": {"cluster.x-k8s.io/watch-filter": filter}}});
    let pool_selector = |pool: &str| {
        serde_json::from_value(serde_json::json!({"matchLabels": {"bootsman.io/pool": pool}})).unwrap()
    };
    // Naming the open pool reaches nothing.
    team.machine("c1", "m-open", Some(pool_selector(&open.ns))).await;
    // No selector: the project's pool, not the open one.
    team.machine("c1", "m-any", None).await;
    for m in ["m-open", "m-any"] {
        team.byomachines()
            .patch(m, &PatchParams::default(), &Patch::Merge(&watched))
            .await
            .unwrap();
    }
    let id = wait_for("the project's machine to take the rack's host", WAIT, || async {
        let bm = team.byomachines().get("m-any").await.map_err(|e| e.to_string())?;
        bm.spec.provider_id.ok_or_else(|| format!("{:?}", bm.status))
    })
    .await;
    assert_eq!(id, format!("byoh://{}/rack-1", rack.ns));
    wait_for(
        "the machine naming the open pool to find no host",
        WAIT,
        || async {
            let bm = team
                .byomachines()
                .get("m-open")
                .await
                .map_err(|e| e.to_string())?;
            match condition(&bm, "HostAssigned") {
                Some((s, r)) if s == "False" && r == "NoMatchingHost" => Ok(()),
                o => Err(format!("{o:?}")),
            }
        },
    )
    .await;
    let open_host = Api::<bootsman_api::v1beta1::ByoHost>::namespaced(open.admin.clone(), &open.ns)
        .get("open-1")
        .await
        .unwrap();
    assert!(open_host.spec.machine_ref.is_none(), "{:?}", open_host.spec);
    // The admin gives the project the open pool: the waiting machine takes its host.
    projects
        .patch(
            &name,
            &apply,
            &Patch::Apply(body(vec![rack.ns.clone(), open.ns.clone()])),
        )
        .await
        .unwrap();
    let id = wait_for("the machine to take the open pool's host", WAIT, || async {
        let bm = team
            .byomachines()
            .get("m-open")
            .await
            .map_err(|e| e.to_string())?;
        bm.spec.provider_id.ok_or_else(|| format!("{:?}", bm.status))
    })
    .await;
    assert_eq!(id, format!("byoh://{}/open-1", open.ns));
    projects.delete(&name, &DeleteParams::default()).await.unwrap();
    open.stop().await;
}

/// Removes every finalizer of `name` (as an admin, or `clusterctl move`, does) and deletes it.
async fn force_delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    wait_for(&format!("{name} to be gone"), WAIT, || async {
        match api.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
}

/// A machine that went without releasing its host (its finalizer removed by hand) leaves the host
/// claimed: after the grace period the host is asked to reset, and once it reports clean it is
/// back in the pool. A host whose machine still holds it is left alone.
#[tokio::test]
async fn a_host_whose_machine_is_gone_is_released_after_the_grace_period() {
    let mut site = Site::new("orphan").await;
    let mut config = site.config();
    config.orphan_grace = Duration::from_secs(3);
    site.start_provider(config).await;
    let kept = site.host("kept", &[("role", "a")], true).await;
    let orphan = site.host("orphan", &[("role", "b")], true).await;
    site.cluster("c1", false).await;
    site.machine("c1", "ma", Some(role("a"))).await;
    let mb = site.machine("c1", "mb", Some(role("b"))).await;
    assert_eq!(bound_host(&site, "ma").await, "kept");
    assert_eq!(bound_host(&site, "mb").await, "orphan");

    let gone_at = Instant::now();
    force_delete(&site.byomachines(), "mb").await;
    let release = wait_for("the orphaned host's release request", WAIT, || async {
        orphan.get().await.spec.release.ok_or_else(|| "none".to_string())
    })
    .await;
    assert!(
        gone_at.elapsed() >= Duration::from_secs(3),
        "released before the grace period ended"
    );
    assert_eq!(
        release.machine_uid,
        mb.uid().unwrap(),
        "the release names the binding"
    );
    orphan.report("CleanupSucceeded", true, "Reset").await;
    wait_for("the orphaned host back in the pool", WAIT, || async {
        let h = orphan.get().await;
        if h.spec.machine_ref.is_none() && h.spec.release.is_none() && h.spec.quarantine.is_none() {
            Ok(())
        } else {
            Err(format!("{:?}", h.spec))
        }
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(site.admin.clone(), &site.ns);
    assert!(secrets.get_opt("orphan-bootstrap").await.unwrap().is_none());

    let h = kept.get().await;
    assert!(h.spec.release.is_none(), "a held host was released: {:?}", h.spec);
    assert_eq!(h.spec.machine_ref.map(|r| r.name).as_deref(), Some("ma"));
    site.stop().await;
}

/// What `clusterctl move` does to a bound machine, in one control plane: the Cluster paused, the
/// Machine, ByoMachine and ByoHost deleted without their finalizers and created again from their
/// stored form (new uids, no status), the Cluster unpaused. The machine keeps its host, no second
/// host is claimed, and nothing is released, neither during the move nor after.
#[tokio::test]
async fn a_moved_machine_keeps_its_host_and_claims_no_other() {
    use bootsman_api::capi::{Cluster, Machine};
    use bootsman_api::v1beta1::ByoHost;
    let mut site = Site::new("moved").await;
    let mut config = site.config();
    config.orphan_grace = Duration::from_secs(2);
    site.start_provider(config).await;
    let a = site.host("a", &[], true).await;
    let b = site.host("b", &[], true).await;
    site.cluster("c1", false).await;
    site.machine("c1", "m0", None).await;
    let bound = bound_host(&site, "m0").await;
    let (held, free) = if bound == "a" { (&a, &b) } else { (&b, &a) };
    held.report("BootstrapSucceeded", true, "Done").await;
    let before = provisioned(&site, "m0").await;
    let binding = held.get().await.spec.machine_ref.unwrap();

    let clusters: Api<Cluster> = Api::namespaced(site.admin.clone(), &site.ns);
    let machines: Api<Machine> = Api::namespaced(site.admin.clone(), &site.ns);
    let pause = |p: bool| serde_json::json!({"spec": {"paused": p}});
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(pause(true)))
        .await
        .unwrap();
    // Copy, delete, create again: owners first, with the owner references rebuilt.
    let machine = machines.get("m0").await.unwrap();
    let bm = site.byomachines().get("m0").await.unwrap();
    let host = site.byohosts().get(&held.name).await.unwrap();
    force_delete(&site.byomachines(), "m0").await;
    force_delete(&machines, "m0").await;
    force_delete(&site.byohosts(), &held.name).await;
    let fresh = |meta: &mut kube::api::ObjectMeta| {
        meta.uid = None;
        meta.resource_version = None;
        meta.creation_timestamp = None;
        meta.managed_fields = None;
        meta.generation = None;
    };
    let mut h = ByoHost {
        metadata: host.metadata.clone(),
        spec: host.spec.clone(),
        status: None,
    };
    fresh(&mut h.metadata);
    site.byohosts().create(&PostParams::default(), &h).await.unwrap();
    let mut m = machine.clone();
    fresh(&mut m.metadata);
    m.status = None;
    let m = machines.create(&PostParams::default(), &m).await.unwrap();
    let mut moved = bm.clone();
    fresh(&mut moved.metadata);
    moved.status = None;
    moved.metadata.owner_references.as_mut().unwrap()[0].uid = m.uid().unwrap();
    let moved = site
        .byomachines()
        .create(&PostParams::default(), &moved)
        .await
        .unwrap();
    assert_ne!(moved.uid(), bm.uid());
    // Paused, and its machine gone for longer than the grace period: still not released.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        held.get().await.spec.release.is_none(),
        "released during the move"
    );
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(pause(false)))
        .await
        .unwrap();
    // The agent reports its bootstrap again from its journal (the status did not move).
    held.report("BootstrapSucceeded", true, "Done").await;

    let after = provisioned(&site, "m0").await;
    assert_eq!(after.spec.provider_id, before.spec.provider_id);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let h = held.get().await;
    assert_eq!(h.spec.machine_ref.as_ref(), Some(&binding), "the binding changed");
    assert!(h.spec.release.is_none(), "the moved machine's host was released");
    let f = free.get().await;
    assert!(
        f.spec.machine_ref.is_none(),
        "a second host was claimed: {:?}",
        f.spec
    );
    site.stop().await;
}

/// The fault of a provider killed between the two writes of a claim: ByoMachines carry the
/// intent a dead provider left (host annotation, attempt, binding id, block-move, finalizer), and
/// no host was claimed for them. A fresh provider finishes the claim on the intended host, not on
/// the host the machine's own choice would start from; a machine whose intended host was taken
/// meanwhile gets another, and the taken host stays with the machine that holds it.
#[tokio::test]
async fn a_provider_killed_between_intent_and_claim_claims_no_second_host() {
    use bootsman_api::v1beta1::{ByoHost, MachineRef};
    use bootsman_provider::byo_machine::{FINALIZER, claim};
    use bootsman_provider::pool::{self, Choice, Wanted};
    use kube::api::ListParams;

    // Two groups of hosts, so that m1 and m2 never compete: an intent reserves a host against a
    // second claim by its own machine, not against other machines.
    let mut site = Site::new("intent").await;
    for i in 0..3 {
        site.host(&format!("host-{i}"), &[("role", "worker")], true).await;
    }
    for i in 3..5 {
        site.host(&format!("host-{i}"), &[("role", "spare")], true).await;
    }
    site.cluster("c1", false).await;
    let m0 = site.machine("c1", "m0", Some(role("spare"))).await;
    let m1 = site.machine("c1", "m1", Some(role("worker"))).await;
    let m2 = site.machine("c1", "m2", Some(role("spare"))).await;
    let hosts = Api::<ByoHost>::namespaced(site.admin.clone(), &site.ns);

    // m0 holds host-3 (claimed before the crash).
    let taken = "host-3";
    hosts
        .patch(
            taken,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"machineRef": MachineRef {
                namespace: site.ns.clone(),
                name: "m0".into(),
                uid: m0.uid().unwrap(),
            }}})),
        )
        .await
        .unwrap();

    // m1's intent names a free host other than the one its own choice starts from.
    let all = hosts.list(&ListParams::default()).await.unwrap().items;
    let refs: Vec<&ByoHost> = all.iter().collect();
    let pools = vec![site.ns.clone()];
    let uid1 = m1.uid().unwrap();
    let selector = role("worker");
    let wanted = Wanted {
        machine_uid: &uid1,
        pools: &pools,
        selector: Some(&selector),
        failure_domain: None,
    };
    let Choice::Candidates(candidates) = pool::choose(&refs, &wanted, |_| true) else {
        panic!("the free hosts are candidates");
    };
    let natural = candidates[0].name_any();
    let intended = candidates[1].name_any();
    assert_ne!(natural, intended);

    // The intents a provider killed after its first write leaves behind.
    for (bm, host) in [(&m1, intended.as_str()), (&m2, taken)] {
        let patch = serde_json::json!({"metadata": {
            "annotations": {
                claim::HOST_ANNOTATION: format!("{}/{host}", site.ns),
                claim::ATTEMPT_ANNOTATION: "0123456789abcdef",
                claim::BINDING_ANNOTATION: bm.uid(),
                bootsman_api::labels::CLUSTERCTL_BLOCK_MOVE: "claiming a host",
            },
            "finalizers": [FINALIZER],
        }});
        site.byomachines()
            .patch(&bm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    site.start_provider(site.config()).await;
    assert_eq!(
        bound_host(&site, "m1").await,
        intended,
        "m1 claimed another host than its intent"
    );
    let m2_host = bound_host(&site, "m2").await;
    assert_eq!(
        m2_host, "host-4",
        "m2's intended host is m0's: it gets the other spare"
    );
    assert_eq!(bound_host(&site, "m0").await, taken);

    // Every host is bound at most once, and each bound host names the machine holding it.
    let all = hosts.list(&ListParams::default()).await.unwrap().items;
    let bound: Vec<(String, String)> = all
        .iter()
        .filter_map(|h| Some((h.name_any(), h.spec.machine_ref.as_ref()?.name.clone())))
        .collect();
    assert_eq!(bound.len(), 3, "three hosts bound, one each: {bound:?}");
    for (host, machine) in [(taken, "m0"), (intended.as_str(), "m1"), (m2_host.as_str(), "m2")] {
        assert!(
            bound.contains(&(host.to_string(), machine.to_string())),
            "{host} is not bound to {machine}: {bound:?}"
        );
    }
}
