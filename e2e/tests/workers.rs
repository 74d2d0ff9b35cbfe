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
//!
//! Such a provisioned cluster is then moved with the real `clusterctl move` to a second control
//! plane, where every machine keeps its host and no other host is claimed or reset.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bootsman_api::capi::Machine;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use bootsman_testenv::{TestEnv, Workload, free_port, wait_for};
use common::Controllers as _;
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

/// A child cluster built by the whole chain (see the module docs): the first control-plane Machine
/// and the three worker Machines `Running` on hosts the provider bound, each with its Node in the
/// stand-in control plane.
struct Chain {
    site: common::Site,
    op: common::Running,
    hosts: BTreeMap<String, common::Host>,
    cluster: String,
    workload: Workload,
    /// Worker Machine → (phase, bound host).
    workers: BTreeMap<String, (String, Option<String>)>,
}

impl Chain {
    async fn build(env: &'static TestEnv, prefix: &str) -> Chain {
        common::install_helm_chart_proxy_crd(env).await;
        let mut site = common::Site::new_in(env, prefix).await;
        let ns = site.ns.clone();
        let admin = site.admin.clone();
        site.start_provider(site.config()).await;
        let op = common::start_operator(env, &ns).await;

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

        // KCP creates the first control-plane Machine; the provider binds it to a control-plane
        // host, which runs `kubeadm init` (the test plays the agent and reports it done).
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

        // Cluster API gives the MachineDeployment's Machines their join data; the provider binds
        // each to a worker host; each worker reports its bootstrap and gets a Node.
        let reported = std::sync::Mutex::new(BTreeSet::from([first.name_any()]));
        let workers = wait_for("3 worker Machines Running on distinct worker hosts", WAIT, || {
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
        Chain {
            site,
            op,
            hosts,
            cluster,
            workload,
            workers,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_machine_deployment_binds_distinct_worker_hosts() {
    let env = TestEnv::shared_with_capi().await;
    let chain = Chain::build(env, "workers").await;
    let bound = &chain.workers;
    let admin = chain.site.admin.clone();
    let byohosts: Api<ByoHost> = Api::namespaced(admin.clone(), &chain.site.ns);
    let byomachines: Api<ByoMachine> = Api::namespaced(admin.clone(), &chain.site.ns);

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

    chain.op.stop().await;
    drop(chain.workload);
}

/// Runs `clusterctl move` of namespace `ns` from `from` to `to` (the real clusterctl, built by
/// `hack/testbin`), retrying while clusterctl says the cluster is still provisioning (its own
/// precondition: every Machine has its Node). Returns clusterctl's output.
async fn clusterctl_move(from: &TestEnv, to: &TestEnv, ns: &str) -> String {
    let home = to.dir().join("clusterctl-home");
    std::fs::create_dir_all(&home).unwrap();
    let started = std::time::Instant::now();
    loop {
        let mut cmd = std::process::Command::new(from.testbin().bin("clusterctl"));
        cmd.args(["move", "--namespace", ns, "-v", "3", "--kubeconfig"])
            .arg(from.kubeconfig())
            .arg("--to-kubeconfig")
            .arg(to.kubeconfig())
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", &home);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            return text;
        }
        let provisioning = text.contains("cannot start the move operation while");
        assert!(
            provisioning && started.elapsed() < WAIT,
            "clusterctl move failed:\n{text}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The provider, in-process, against another control plane, until the returned sender is used
/// or dropped.
fn start_provider(
    client: kube::Client,
    ns: &str,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let config = bootsman_provider::Config {
        namespace: Some(ns.into()),
        ..bootsman_provider::Config::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let metrics = std::sync::Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
        bootsman_provider::run(client, config, metrics, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (tx, task)
}

/// Reasons of the Events in `ns` that ask a host to reset.
async fn release_events(client: &kube::Client, ns: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .filter(|r| r == "ReleaseRequested" || r == "OrphanReleaseRequested")
        .collect()
}

/// The real `clusterctl move` of a provisioned BootsmanCluster to a second control plane (with
/// the Cluster API managers, the provider and the operator running there, and the hosts' Leases
/// renewed there as re-homed agents would): clusterctl waits for the operator to let go, moves
/// the BootsmanCluster with everything it owns and the hosts; in the target every machine holds
/// the host it held (same binding), no other host is claimed, no host is asked to reset on either
/// side, the machines provision again once the agents report from their journals, and the
/// operator resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_keeps_every_binding() {
    use bootsman_api::labels::PAUSED_WITH_CLUSTER;
    let env = TestEnv::shared_with_capi().await;
    let chain = Chain::build(env, "move").await;
    let ns = chain.site.ns.clone();
    let admin = chain.site.admin.clone();
    let bindings = |hosts: Vec<ByoHost>| -> BTreeMap<String, bootsman_api::v1beta1::MachineRef> {
        hosts
            .into_iter()
            .filter_map(|h| Some((h.name_any(), h.spec.machine_ref?)))
            .collect()
    };
    let source_hosts: Api<ByoHost> = Api::namespaced(admin.clone(), &ns);
    let before = bindings(source_hosts.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(
        before.len(),
        4,
        "one control-plane and three worker hosts bound: {before:?}"
    );

    // The target: Cluster API, the provider and the operator; the agents' Leases renewed there.
    let target = TestEnv::start(bootsman_testenv::Options {
        capi: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("the target control plane: {e}"));
    common::install_helm_chart_proxy_crd(&target).await;
    let to = target.client().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(to.clone());
    let body = serde_json::json!({"metadata": {"name": ns}});
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(body).unwrap())
        .await
        .unwrap();
    let re_homed: BTreeMap<String, common::Host> = chain
        .hosts
        .keys()
        .map(|name| {
            let h = common::Host {
                name: name.clone(),
                ns: ns.clone(),
                client: to.clone(),
            };
            (name.clone(), h)
        })
        .collect();
    for h in re_homed.values() {
        h.heartbeat(3600).await;
    }
    let (provider_stop, provider) = start_provider(target.client().await, &ns);
    let target_op = common::start_operator(&target, &ns).await;

    let out = clusterctl_move(env, &target, &ns).await;
    eprintln!("clusterctl move:\n{out}");
    assert!(
        out.contains("BootsmanCluster"),
        "the BootsmanCluster is moved:\n{out}"
    );

    // The source keeps nothing of the cluster.
    assert!(
        source_hosts
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let source_bcs: Api<BootsmanCluster> = Api::namespaced(admin.clone(), &ns);
    assert!(source_bcs.get_opt(&chain.cluster).await.unwrap().is_none());

    // The target holds the same bindings: every moved machine finds its host again.
    let byohosts: Api<ByoHost> = Api::namespaced(to.clone(), &ns);
    let byomachines: Api<ByoMachine> = Api::namespaced(to.clone(), &ns);
    let holders = wait_for("every moved ByoMachine to hold its host", WAIT, || {
        let byomachines = byomachines.clone();
        async move {
            let list = byomachines
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let held: BTreeMap<String, String> = list
                .items
                .iter()
                .filter_map(|bm| {
                    let host = bm.status.as_ref()?.host_ref.as_ref()?.name.clone();
                    Some((host, bm.name_any()))
                })
                .collect();
            if list.items.len() == 4 && held.len() == 4 {
                Ok(held)
            } else {
                Err(format!("{} ByoMachines, held: {held:?}", list.items.len()))
            }
        }
    })
    .await;
    for (host, binding) in &before {
        assert_eq!(holders.get(host), Some(&binding.name), "host {host}: {holders:?}");
    }
    // The agents report from their journals; the machines provision again, nothing is claimed
    // besides, and nobody was asked to reset.
    for host in before.keys() {
        re_homed[host].report("BootstrapSucceeded", true, "Done").await;
    }
    wait_for("every moved ByoMachine provisioned", WAIT, || {
        let byomachines = byomachines.clone();
        async move {
            let list = byomachines
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let provisioned = list
                .items
                .iter()
                .filter(|bm| {
                    bm.status
                        .as_ref()
                        .and_then(|s| s.initialization.as_ref())
                        .and_then(|i| i.provisioned)
                        == Some(true)
                })
                .count();
            (provisioned == 4)
                .then_some(())
                .ok_or_else(|| format!("{provisioned}/4 provisioned"))
        }
    })
    .await;
    let target_bcs: Api<BootsmanCluster> = Api::namespaced(to.clone(), &ns);
    wait_for("the operator to resume in the target", WAIT, || {
        let target_bcs = target_bcs.clone();
        let name = chain.cluster.clone();
        async move {
            let bc = target_bcs.get(&name).await.map_err(|e| e.to_string())?;
            let paused = bc
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Paused"))
                .map(|c| c.status.clone());
            if paused.as_deref() == Some("False") && !bc.annotations().contains_key(PAUSED_WITH_CLUSTER) {
                Ok(())
            } else {
                Err(format!("Paused={paused:?}, annotations {:?}", bc.annotations()))
            }
        }
    })
    .await;
    let after_hosts = byohosts.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(after_hosts.len(), 7, "every host moved");
    assert!(
        after_hosts.iter().all(|h| h.spec.release.is_none()),
        "a host was asked to reset"
    );
    assert_eq!(bindings(after_hosts), before, "the bindings changed");
    assert_eq!(release_events(&to, &ns).await, Vec::<String>::new());
    assert_eq!(release_events(&admin, &ns).await, Vec::<String>::new());

    let _ = provider_stop.send(());
    let _ = provider.await;
    target_op.stop().await;
    chain.op.stop().await;
    drop(target);
    drop(chain.workload);
}
