//! `bootsmanctl status` against the real control plane: the tree is read off the objects as
//! Cluster API and Bootsman write them (references, labels, conditions, the host's Lease),
//! for one cluster or every cluster of a namespace, as a table and as JSON.

use bootsman_api::v1beta1::{ByoHost, ByoHostSpec};
use bootsman_testenv::TestEnv;
use bootsmanctl::cli::{Cli, run};
use clap::Parser;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn status(env: &TestEnv, extra: &[&str]) -> anyhow::Result<String> {
    let kubeconfig = env.kubeconfig().to_str().expect("utf-8 path").to_string();
    let mut args = vec!["bootsmanctl", "--kubeconfig", &kubeconfig, "status"];
    args.extend_from_slice(extra);
    let mut out = Vec::new();
    run(Cli::try_parse_from(args).expect("arguments"), &mut out).await?;
    Ok(String::from_utf8(out).expect("utf-8"))
}

fn ar(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// Creates `body` (group/version/kind given) in `ns` and merges `status` into its status.
async fn create(client: &kube::Client, ns: &str, r: &ApiResource, body: Value, status: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, r);
    let mut body = body;
    body["apiVersion"] = r.api_version.clone().into();
    body["kind"] = r.kind.clone().into();
    body["metadata"]["namespace"] = ns.into();
    let obj: DynamicObject = serde_json::from_value(body).expect("object");
    let name = obj.metadata.name.clone().expect("name");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {} {name}: {e}", r.kind));
    if !status.is_null() {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap_or_else(|e| panic!("status of {} {name}: {e}", r.kind));
    }
}

fn cond(t: &str, s: &str, reason: &str) -> Value {
    json!({"type": t, "status": s, "reason": reason, "message": format!("{t} is {s}"),
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

#[tokio::test]
async fn shows_the_tree_of_a_cluster_from_bootsman_cluster_to_host_heartbeat() {
    let env = TestEnv::shared().await;
    let admin = env.client().await;
    let ns = env.create_namespace("status").await;
    let pool = env.create_namespace("status-pool").await;

    let bc = bootsman_fixtures::clusters::apply_sample(&admin, &ns).await;
    let name = bc.metadata.name.clone().expect("name");
    let bcs: Api<bootsman_api::v1alpha1::BootsmanCluster> = Api::namespaced(admin.clone(), &ns);
    bcs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Provisioning",
            "conditions": [cond("Ready", "False", "ControlPlaneNotReady")]}})),
    )
    .await
    .expect("BootsmanCluster status");

    let cp = format!("{name}-control-plane");
    let infra =
        |kind: &str, n: &str| json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": kind, "name": n});
    create(
        &admin,
        &ns,
        &ar("cluster.x-k8s.io", "v1beta2", "Cluster"),
        json!({"metadata": {"name": name}, "spec": {
            "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": cp},
            "infrastructureRef": infra("ByoCluster", &name)}}),
        json!({"conditions": [cond("Available", "False", "NotAvailable")]}),
    )
    .await;
    create(
        &admin,
        &ns,
        &ar("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"),
        json!({"metadata": {"name": cp}, "spec": {"replicas": 3, "version": "v1.36.3",
            "machineTemplate": {"spec": {"infrastructureRef": infra("ByoMachineTemplate", &cp)}}}}),
        json!({"readyReplicas": 1, "conditions": [cond("Available", "False", "ScalingUp")]}),
    )
    .await;
    let md = format!("{name}-default");
    create(
        &admin,
        &ns,
        &ar("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        json!({"metadata": {"name": md}, "spec": {"clusterName": name, "replicas": 3,
            "selector": {"matchLabels": {"pool": "default"}},
            "template": {"metadata": {"labels": {"pool": "default"}}, "spec": {"clusterName": name, "version": "v1.36.3",
                "bootstrap": {"dataSecretName": "none"}, "infrastructureRef": infra("ByoMachineTemplate", &md)}}}}),
        Value::Null,
    )
    .await;
    // One control-plane machine bound to a host with a fresh heartbeat, one worker waiting.
    for (m, labels, host) in [
        (
            format!("{cp}-a"),
            json!({"cluster.x-k8s.io/control-plane": ""}),
            Some("status-host-1"),
        ),
        (
            format!("{md}-b"),
            json!({"cluster.x-k8s.io/deployment-name": md}),
            None,
        ),
    ] {
        let mut l = labels;
        l["cluster.x-k8s.io/cluster-name"] = name.clone().into();
        create(
            &admin,
            &ns,
            &ar("cluster.x-k8s.io", "v1beta2", "Machine"),
            json!({"metadata": {"name": m, "labels": l}, "spec": {"clusterName": name,
                "bootstrap": {"dataSecretName": "none"}, "infrastructureRef": infra("ByoMachine", &m)}}),
            json!({"phase": if host.is_some() {"Running"} else {"Provisioning"},
                   "conditions": [cond("Ready", if host.is_some() {"True"} else {"False"}, "Bound")]}),
        )
        .await;
        create(
            &admin,
            &ns,
            &ar("infrastructure.cluster.x-k8s.io", "v1beta1", "ByoMachine"),
            json!({"metadata": {"name": m}, "spec": {}}),
            match host {
                Some(h) => json!({"hostRef": {"namespace": pool, "name": h},
                                  "conditions": [cond("Ready", "True", "HostBootstrapped")]}),
                None => json!({"conditions": [cond("Ready", "False", "WaitingForHost")]}),
            },
        )
        .await;
    }
    // A ByoMachine of another cluster in the same namespace, bound to another host: not shown.
    create(
        &admin,
        &ns,
        &ar("infrastructure.cluster.x-k8s.io", "v1beta1", "ByoMachine"),
        json!({"metadata": {"name": "other-cluster-m"}, "spec": {}}),
        json!({"hostRef": {"namespace": pool, "name": "status-host-9"}}),
    )
    .await;
    let hosts: Api<ByoHost> = Api::namespaced(admin.clone(), &pool);
    hosts
        .create(
            &PostParams::default(),
            &ByoHost::new("status-host-1", ByoHostSpec::default()),
        )
        .await
        .expect("host");
    hosts
        .patch_status(
            "status-host-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Provisioned", "agentVersion": "9.9.9",
                "conditions": [cond("AgentHealthy", "True", "LeaseRenewed")]}})),
        )
        .await
        .expect("host status");
    let mut lease = Lease {
        spec: Some(LeaseSpec {
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            lease_duration_seconds: Some(40),
            holder_identity: Some("status-host-1".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    lease.metadata.name = Some("status-host-1".into());
    Api::<Lease>::namespaced(admin.clone(), &pool)
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease");

    let out = status(env, &["-n", &ns, &name]).await.expect("status");
    // The first column: the tree drawing and `Kind/name`.
    let names: Vec<&str> = out
        .lines()
        .map(|row| match row.find('/') {
            Some(i) => &row[..i + row[i..].find(' ').unwrap_or(row.len() - i)],
            None => row.split_whitespace().next().unwrap_or_default(),
        })
        .collect();
    let expected = [
        "NAME".to_string(),
        format!("BootsmanCluster/{name}"),
        format!("└─Cluster/{name}"),
        format!("  ├─KubeadmControlPlane/{cp}"),
        format!("  │ └─Machine/{cp}-a"),
        format!("  │   └─ByoMachine/{cp}-a"),
        "  │     └─ByoHost/status-host-1".to_string(),
        format!("  └─MachineDeployment/{md}"),
        format!("    └─Machine/{md}-b"),
        format!("      └─ByoMachine/{md}-b"),
    ];
    assert_eq!(names, expected, "{out}");
    assert!(
        !out.contains("other-cluster-m") && !out.contains("status-host-9"),
        "{out}"
    );
    let row = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_default()
            .to_string()
    };
    let host = row("ByoHost/status-host-1");
    assert!(
        host.contains("True") && host.contains("LeaseRenewed") && host.contains("phase Provisioned"),
        "{host}"
    );
    assert!(
        host.contains("heartbeat ") && host.contains("s ago") && host.contains("agent 9.9.9"),
        "{host}"
    );
    assert!(
        row(&format!("KubeadmControlPlane/{cp}")).contains("1/3 ready"),
        "{out}"
    );
    assert!(row("ByoMachine/").contains("HostBootstrapped"), "{out}");
    assert!(
        row(&format!("ByoMachine/{md}-b")).contains("WaitingForHost"),
        "{out}"
    );
    assert!(
        row(&format!("ByoMachine/{md}-b")).contains("no host bound"),
        "{out}"
    );

    // Every condition on request; every cluster of the namespace without a name.
    let all = status(env, &["-n", &ns, "--all-conditions"])
        .await
        .expect("status");
    assert!(
        all.lines()
            .any(|l| l.contains("· Ready") && l.contains("ControlPlaneNotReady")),
        "{all}"
    );

    // JSON: the same tree, whole.
    let json: Value = serde_json::from_str(
        &status(env, &["-n", &ns, &name, "-o", "json"])
            .await
            .expect("json"),
    )
    .expect("JSON output");
    let h = &json[0]["children"][0]["children"][0]["children"][0]["children"][0]["children"][0];
    assert_eq!(h["kind"], "ByoHost", "{json:#}");
    assert_eq!(h["namespace"], pool.as_str());
    assert_eq!(h["summary"]["reason"], "LeaseRenewed");

    // A cluster that does not exist is named in the error.
    let err = status(env, &["-n", &ns, "nope"])
        .await
        .expect_err("no such cluster");
    assert!(
        format!("{err:#}").contains("no BootsmanCluster \"nope\""),
        "{err:#}"
    );
}

#[tokio::test]
async fn a_cluster_without_cluster_api_objects_yet_is_shown_alone() {
    let env = TestEnv::shared().await;
    let admin = env.client().await;
    let ns = env.create_namespace("status-new").await;
    let bc = bootsman_fixtures::clusters::apply_sample(&admin, &ns).await;
    let name = bc.metadata.name.expect("name");
    let out = status(env, &["-n", &ns]).await.expect("status");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains(&format!("BootsmanCluster/{name}")) && out.contains("no Cluster yet"),
        "{out}"
    );
    let bad = status(env, &["-n", "Not_A_Namespace"])
        .await
        .expect_err("bad namespace");
    assert!(format!("{bad:#}").starts_with("--namespace:"), "{bad:#}");
}
