//! The whole chain on the real control plane with the Cluster API core, kubeadm bootstrap and
//! kubeadm control-plane managers running, the provider and the operator in-process, and hosts
//! played by the test with their own identities: the sample BootsmanCluster renders a
//! KubeadmControlPlane whose first Machine the provider binds to a control-plane host; once that
//! host reports `kubeadm init` done, the cluster's stand-in control plane
//! (`bootsman_testenv::Workload`, real etcd and kube-apiserver with the cluster CA) answers at the
//! endpoint, Cluster API sees the control plane initialized and gives the rendered
//! MachineDeployment's Machines their `kubeadm join` data, and the provider binds them to three
//! distinct worker hosts. With a Node registered per bootstrapped host (the kubelet's part), the
//! Machines reach `Running`.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
#[path = "../../provider/tests/common/mod.rs"]
mod site;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bootsman_api::capi::Machine;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use bootsman_testenv::{TestEnv, Workload, free_port, wait_for};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};

const WAIT: Duration = Duration::from_secs(120);

/// The bootstrap data the provider copied for a host (`spec.bootstrapSecret`), as text.
async fn bootstrap_data(admin: &kube::Client, host: &ByoHost) -> String {
    let secret = host
        .spec
        .bootstrap_secret
        .as_ref()
        .expect("a claimed host names its bootstrap Secret");
    let ns = secret
        .namespace
        .clone()
        .unwrap_or_else(|| host.namespace().unwrap());
    let s = Api::<Secret>::namespaced(admin.clone(), &ns)
        .get(&secret.name)
        .await
        .unwrap();
    let value = &s.data.unwrap()["value"];
    String::from_utf8_lossy(&value.0).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_machine_deployment_binds_distinct_worker_hosts() {
    let env = TestEnv::shared_with_capi().await;
    common::install_helm_chart_proxy_crd(env).await;
    let mut site = site::Site::new_in(env, "workers").await;
    let ns = site.ns.clone();
    let admin = site.admin.clone();
    site.start_provider(site.config()).await;
    let op = common::Operator::start(env, &ns).await;

    let mut hosts = BTreeMap::new();
    for (name, role) in [
        ("cp-0", "control-plane"),
        ("cp-1", "control-plane"),
        ("cp-2", "control-plane"),
        ("w-0", "worker"),
        ("w-1", "worker"),
        ("w-2", "worker"),
        ("w-3", "worker"),
    ] {
        hosts.insert(name.to_string(), site.host(name, &[("role", role)], true).await);
    }

    // The endpoint is a loopback address where the stand-in control plane will listen.
    let mut bc: BootsmanCluster = common::sample(&ns);
    bc.spec.control_plane.endpoint.host = "127.0.0.11".into();
    bc.spec.control_plane.endpoint.port = i32::from(free_port().unwrap());
    let cluster = bc.name_any();
    Api::<BootsmanCluster>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &bc)
        .await
        .unwrap();

    let byohosts: Api<ByoHost> = Api::namespaced(admin.clone(), &ns);
    let byomachines: Api<ByoMachine> = Api::namespaced(admin.clone(), &ns);
    let machines: Api<Machine> = Api::namespaced(admin.clone(), &ns);

    // KCP creates the first control-plane Machine; the provider binds it to a control-plane host,
    // which runs `kubeadm init` (the test plays the agent and reports it done).
    let first = wait_for("a control-plane host claimed", WAIT, || {
        let byohosts = byohosts.clone();
        async move {
            let list = byohosts
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|h| h.spec.machine_ref.is_some() && h.spec.bootstrap_secret.is_some())
                .ok_or_else(|| "no host claimed yet".to_string())
        }
    })
    .await;
    assert!(
        first.name_any().starts_with("cp-"),
        "the first claimed host is a control-plane host: {}",
        first.name_any()
    );
    let init = bootstrap_data(&admin, &first).await;
    assert!(
        init.contains("kubeadm init"),
        "the first host gets kubeadm init data:\n{init}"
    );
    hosts[&first.name_any()]
        .report("BootstrapSucceeded", true, "Done")
        .await;

    // What `kubeadm init` would bring up on that host.
    let dir = env.dir().join(format!("workload-{ns}"));
    let workload = Workload::start(&admin, env.testbin(), &dir, &ns, &cluster)
        .await
        .unwrap_or_else(|e| panic!("stand-in control plane: {e}"));

    // Cluster API gives the MachineDeployment's Machines their join data; the provider binds each
    // to a worker host; each worker reports its bootstrap and gets a Node.
    let reported = std::sync::Mutex::new(BTreeSet::from([first.name_any()]));
    let bound = wait_for("3 worker Machines Running on distinct worker hosts", WAIT, || {
        let (byohosts, byomachines, machines) = (byohosts.clone(), byomachines.clone(), machines.clone());
        let (admin, hosts, workload) = (admin.clone(), &hosts, &workload);
        let reported = &reported;
        async move {
            workload.check_running().map_err(|e| e.to_string())?;
            let list = byohosts
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            for h in &list.items {
                let done = reported.lock().unwrap().contains(&h.name_any());
                if h.spec.bootstrap_secret.is_some() && !done {
                    let data = bootstrap_data(&admin, h).await;
                    assert!(
                        data.contains("kubeadm join"),
                        "{} gets kubeadm join data:\n{data}",
                        h.name_any()
                    );
                    hosts[&h.name_any()]
                        .report("BootstrapSucceeded", true, "Done")
                        .await;
                    reported.lock().unwrap().insert(h.name_any());
                }
            }
            workload.sync_nodes(&admin).await.map_err(|e| e.to_string())?;
            let mut workers = BTreeMap::new();
            for m in machines
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
            {
                let labels = m.labels();
                if !labels.contains_key("cluster.x-k8s.io/deployment-name") {
                    continue;
                }
                let phase = m
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let infra = m.spec.infrastructure_ref.name.clone();
                let host = byomachines
                    .get_opt(&infra)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|bm| bm.status.and_then(|s| s.host_ref).map(|r| r.name));
                workers.insert(m.name_any(), (phase, host));
            }
            let running = workers
                .values()
                .filter(|(phase, host)| phase == "Running" && host.is_some())
                .count();
            if workers.len() == 3 && running == 3 {
                Ok(workers)
            } else {
                Err(format!("{workers:?}"))
            }
        }
    })
    .await;

    let worker_hosts: BTreeSet<String> = bound.values().filter_map(|(_, h)| h.clone()).collect();
    assert_eq!(worker_hosts.len(), 3, "three distinct hosts: {bound:?}");
    assert!(
        worker_hosts.iter().all(|h| h.starts_with("w-")),
        "worker Machines are bound to worker hosts only: {bound:?}"
    );
    // Each host is bound to one machine, and that machine names it back.
    for h in &worker_hosts {
        let host = byohosts.get(h).await.unwrap();
        let bm = host.spec.machine_ref.as_ref().unwrap().name.clone();
        let owner = byomachines.get(&bm).await.unwrap();
        assert_eq!(
            owner.status.and_then(|s| s.host_ref).map(|r| r.name).as_deref(),
            Some(h.as_str())
        );
    }

    op.stop().await;
    drop(workload);
}
