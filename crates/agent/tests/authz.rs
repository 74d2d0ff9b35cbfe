//! What an enrolled host may do, checked by the real API server with `config/rbac/` applied: host
//! A (user `byoh:host:a`, group `byoh:hosts`) writes its own ByoHost, status and Lease, and nothing
//! of host B's; it never sets or changes the spec fields the provider and admins own; and it reads
//! no Secret at all, B's bootstrap Secret included (which B itself may read through the provider's
//! per-host Role). All of it only in the pool the host was enrolled into.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::collections::BTreeMap;
use std::time::Duration;

use bootsman_api::v1beta1::ByoHost;
use bootsman_testenv::{TestEnv, wait_for};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn apply_rbac(env: &TestEnv) {
    let dir = bootsman_testenv::repo_root().join("config/rbac");
    if let Err(e) = env.apply_kustomization(&dir) {
        panic!("{e}");
    }
}

fn meta(name: &str, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

fn host(name: &str, ns: &str) -> ByoHost {
    ByoHost::registered(name, ns)
}

fn lease(name: &str, ns: &str) -> Lease {
    Lease {
        metadata: meta(name, ns),
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    }
}

/// Asserts the API server refused the call: 403 from RBAC or a policy, or 422 from a policy.
#[track_caller]
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.is_forbidden() || s.is_invalid() => s.message,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[track_caller]
fn allowed<T>(what: &str, r: Result<T, kube::Error>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: expected it to be allowed, got {e}"))
}

/// What the CSR approver grants host `name` when it enrols into pool `ns`: ClusterRole
/// `bootsman:host` through a RoleBinding in that namespace only.
async fn enrolled_in(admin: &kube::Client, ns: &str, name: &str) {
    let user = format!("byoh:host:{name}");
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta(&user, ns),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: "bootsman:host".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "User".into(),
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    name: user.clone(),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
}

/// The provider's hand-over for host `name`: its bootstrap Secret, readable by it alone.
async fn bootstrap_secret_for(admin: &kube::Client, ns: &str, name: &str) {
    let secret = format!("{name}-bootstrap");
    Api::<Secret>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: meta(&secret, ns),
                data: Some(BTreeMap::from([(
                    "value".to_string(),
                    ByteString(b"#cloud-config\n".to_vec()),
                )])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let role = format!("{name}-bootstrap-reader");
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta(&role, ns),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["secrets".into()]),
                    resource_names: Some(vec![secret]),
                    verbs: vec!["get".into(), "watch".into(), "list".into()],
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta(&role, ns),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: role.clone(),
                },
                subjects: Some(vec![Subject {
                    kind: "User".into(),
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    name: format!("byoh:host:{name}"),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_host_writes_only_its_own_objects_and_reads_no_secret() {
    let env = TestEnv::shared().await;
    apply_rbac(env);
    let ns = env.create_namespace("authz").await;
    let admin = env.client().await;
    let a = env.client_for("byoh:host:a", &["byoh:hosts"]).await;
    let b = env.client_for("byoh:host:b", &["byoh:hosts"]).await;
    let a_hosts = Api::<ByoHost>::namespaced(a.clone(), &ns);
    let a_leases = Api::<Lease>::namespaced(a.clone(), &ns);
    let pp = PostParams::default();
    for h in ["a", "b", "c"] {
        enrolled_in(&admin, &ns, h).await;
    }

    // Policies take effect a moment after they are created: wait until A is refused B's name.
    wait_for(
        "the host policies to refuse host a creating ByoHost b",
        WAIT,
        || {
            let a_hosts = a_hosts.clone();
            let ns = ns.clone();
            async move {
                match a_hosts.create(&PostParams::default(), &host("b", &ns)).await {
                    // RBAC allows it (A is enrolled here), so a refusal is the policy's.
                    Err(kube::Error::Api(s)) if s.message.contains("may write only its own") => Ok(()),
                    Ok(h) => {
                        let _ = Api::<ByoHost>::namespaced(env.client().await, &ns)
                            .delete(&h.name_any(), &Default::default())
                            .await;
                        Err("host a could still create ByoHost b".to_string())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;

    // B's objects, as B's agent and the provider made them.
    allowed(
        "host b creates its ByoHost",
        Api::<ByoHost>::namespaced(b.clone(), &ns)
            .create(&pp, &host("b", &ns))
            .await,
    );
    allowed(
        "host b creates its Lease",
        Api::<Lease>::namespaced(b.clone(), &ns)
            .create(&pp, &lease("b", &ns))
            .await,
    );
    bootstrap_secret_for(&admin, &ns, "b").await;
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(
            &pp,
            &Secret {
                metadata: meta("cluster1-kubeconfig", &ns),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // Allowed: A's own ByoHost, its status and its Lease.
    allowed(
        "host a creates its ByoHost",
        a_hosts.create(&pp, &host("a", &ns)).await,
    );
    let status = json!({"status": {"agentVersion": "1.0.0", "hostInfo": {"hostname": "a"}}});
    let own = allowed(
        "host a writes its status",
        a_hosts
            .patch_status("a", &PatchParams::default(), &Patch::Merge(&status))
            .await,
    );
    assert_eq!(own.status.unwrap().agent_version.as_deref(), Some("1.0.0"));
    allowed(
        "host a labels its ByoHost under host.bootsman.io/",
        a_hosts
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"labels": {"host.bootsman.io/role": "worker"}}})),
            )
            .await,
    );
    allowed(
        "host a creates its Lease",
        a_leases.create(&pp, &lease("a", &ns)).await,
    );
    let renew = json!({"spec": {"renewTime": MicroTime(Timestamp::now())}});
    allowed(
        "host a renews its Lease",
        a_leases
            .patch("a", &PatchParams::default(), &Patch::Merge(&renew))
            .await,
    );

    // Refused: A's own name in a pool it was not enrolled into.
    let elsewhere = env.create_namespace("authz-other").await;
    refused(
        "host a creates its ByoHost in another pool",
        Api::<ByoHost>::namespaced(a.clone(), &elsewhere)
            .create(&pp, &host("a", &elsewhere))
            .await,
    );
    refused(
        "host a lists the ByoHosts of another pool",
        Api::<ByoHost>::namespaced(a.clone(), &elsewhere)
            .list(&ListParams::default())
            .await,
    );

    // Refused: anything of B's, and names that merely contain A's (BYOH matched substrings).
    for name in ["b", "a1", "xa", "a.b"] {
        refused(
            &format!("host a creates ByoHost {name}"),
            a_hosts.create(&pp, &host(name, &ns)).await,
        );
        refused(
            &format!("host a creates Lease {name}"),
            a_leases.create(&pp, &lease(name, &ns)).await,
        );
    }
    let label = json!({"metadata": {"labels": {"role": "control-plane"}}});
    refused(
        "host a patches ByoHost b",
        a_hosts
            .patch("b", &PatchParams::default(), &Patch::Merge(&label))
            .await,
    );
    let mut b_host = Api::<ByoHost>::namespaced(admin.clone(), &ns)
        .get("b")
        .await
        .unwrap();
    b_host.labels_mut().insert("role".into(), "control-plane".into());
    refused(
        "host a replaces ByoHost b",
        a_hosts.replace("b", &pp, &b_host).await,
    );
    refused(
        "host a writes the status of ByoHost b",
        a_hosts
            .patch_status("b", &PatchParams::default(), &Patch::Merge(&status))
            .await,
    );
    refused(
        "host a renews Lease b",
        a_leases
            .patch("b", &PatchParams::default(), &Patch::Merge(&renew))
            .await,
    );
    refused(
        "host a deletes ByoHost b",
        a_hosts.delete("b", &Default::default()).await,
    );
    refused(
        "host a deletes Lease b",
        a_leases.delete("b", &Default::default()).await,
    );

    // Refused: the spec fields the provider and admins own, on A's own ByoHost.
    let claims = [
        (
            "spec.machineRef",
            json!({"spec": {"machineRef": {"namespace": ns, "name": "m1", "uid": "u1"}}}),
        ),
        (
            "spec.bootstrapSecret",
            json!({"spec": {"bootstrapSecret": {"name": "cluster1-kubeconfig"}}}),
        ),
        ("spec.maintenance", json!({"spec": {"maintenance": true}})),
    ];
    for (field, patch) in &claims {
        refused(
            &format!("host a sets {field} of its ByoHost"),
            a_hosts
                .patch("a", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
    }
    // Nor may a host create its ByoHost with them set.
    let c_hosts = Api::<ByoHost>::namespaced(env.client_for("byoh:host:c", &["byoh:hosts"]).await, &ns);
    let mut in_maintenance = host("c", &ns);
    in_maintenance.spec.maintenance = Some(true);
    refused(
        "host c creates its ByoHost in maintenance",
        c_hosts.create(&pp, &in_maintenance).await,
    );
    let mut claimed = host("c", &ns);
    claimed.spec.machine_ref = Some(bootsman_api::v1beta1::MachineRef {
        namespace: ns.clone(),
        name: "m1".into(),
        uid: "u1".into(),
    });
    refused(
        "host c creates its ByoHost claimed",
        c_hosts.create(&pp, &claimed).await,
    );
    allowed(
        "host c creates its ByoHost",
        c_hosts.create(&pp, &host("c", &ns)).await,
    );
    // A change the provider makes stays out of A's reach afterwards too.
    Api::<ByoHost>::namespaced(admin.clone(), &ns)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"machineRef": {"namespace": ns, "name": "m1", "uid": "u1"}}})),
        )
        .await
        .unwrap();
    refused(
        "host a clears its own spec.machineRef",
        a_hosts
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"machineRef": null}})),
            )
            .await,
    );
    let unchanged = Api::<ByoHost>::namespaced(admin.clone(), &ns)
        .get("a")
        .await
        .unwrap();
    assert_eq!(unchanged.spec.machine_ref.unwrap().name, "m1");
    assert_eq!(unchanged.spec.maintenance, None);
    assert_eq!(unchanged.spec.bootstrap_secret, None);

    // Secrets: none for A, B's own bootstrap Secret for B only.
    let a_secrets = Api::<Secret>::namespaced(a.clone(), &ns);
    refused(
        "host a reads b's bootstrap Secret",
        a_secrets.get("b-bootstrap").await,
    );
    refused(
        "host a reads another Secret",
        a_secrets.get("cluster1-kubeconfig").await,
    );
    refused(
        "host a lists Secrets",
        a_secrets.list(&ListParams::default()).await,
    );
    refused(
        "host a lists Secrets of every namespace",
        Api::<Secret>::all(a.clone()).list(&ListParams::default()).await,
    );
    refused(
        "host a reads a bootstrap token",
        Api::<Secret>::namespaced(a.clone(), "kube-system")
            .list(&ListParams::default())
            .await,
    );
    let b_secrets = Api::<Secret>::namespaced(b.clone(), &ns);
    allowed(
        "host b reads its bootstrap Secret",
        b_secrets.get("b-bootstrap").await,
    );
    refused(
        "host b reads another Secret",
        b_secrets.get("cluster1-kubeconfig").await,
    );
}

/// A host that adds a finalizer to its own ByoHost (or Lease) could keep it, and the pool access
/// that goes with it, after an admin removes it; one that sets an owner could have the garbage
/// collector take it. Both are refused; the provider's finalizer on a host's ByoHost stays when
/// the host writes its labels.
#[tokio::test]
async fn a_host_may_not_hold_its_objects_with_finalizers_or_owners() {
    let env = TestEnv::shared().await;
    apply_rbac(env);
    let ns = env.create_namespace("authz-fin").await;
    let admin = env.client().await;
    enrolled_in(&admin, &ns, "f").await;
    let f = env.client_for("byoh:host:f", &["byoh:hosts"]).await;
    let hosts = Api::<ByoHost>::namespaced(f.clone(), &ns);
    let mut with_finalizer = host("f", &ns);
    with_finalizer.metadata.finalizers = Some(vec!["evil.example/hold".into()]);
    wait_for("the finalizer rule to refuse host f", WAIT, || {
        let hosts = hosts.clone();
        let h = with_finalizer.clone();
        let admin_hosts = Api::<ByoHost>::namespaced(admin.clone(), &ns);
        async move {
            match hosts.create(&PostParams::default(), &h).await {
                Err(kube::Error::Api(s)) if s.message.contains("metadata.finalizers") => Ok(()),
                Ok(_) => {
                    // Created before the policy took effect: take it away and try again.
                    let clear = json!({"metadata": {"finalizers": null}});
                    let _ = admin_hosts
                        .patch("f", &PatchParams::default(), &Patch::Merge(clear))
                        .await;
                    let _ = admin_hosts.delete("f", &Default::default()).await;
                    Err("host f could still create a ByoHost with a finalizer".to_string())
                }
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    allowed(
        "host f registers",
        hosts.create(&PostParams::default(), &host("f", &ns)).await,
    );
    let msg = refused(
        "host f adds a finalizer to its ByoHost",
        hosts
            .patch(
                "f",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["evil.example/hold"]}})),
            )
            .await,
    );
    assert!(msg.contains("metadata.finalizers"), "{msg}");
    let msg = refused(
        "host f gives its ByoHost an owner",
        hosts
            .patch(
                "f",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"ownerReferences": [{
                    "apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": "00000000-0000-0000-0000-000000000001"
                }]}})),
            )
            .await,
    );
    assert!(msg.contains("metadata.ownerReferences"), "{msg}");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("f".into()),
            namespace: Some(ns.clone()),
            finalizers: Some(vec!["evil.example/hold".into()]),
            ..Default::default()
        },
        ..Default::default()
    };
    refused(
        "host f creates its Lease with a finalizer",
        Api::<Lease>::namespaced(f.clone(), &ns)
            .create(&PostParams::default(), &lease)
            .await,
    );

    // The provider's finalizer stays when the host writes its labels.
    Api::<ByoHost>::namespaced(admin.clone(), &ns)
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["infrastructure.cluster.x-k8s.io/test"]}})),
        )
        .await
        .unwrap();
    allowed(
        "host f writes its labels",
        hosts
            .patch(
                "f",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"host.bootsman.io/zone": "a"}}})),
            )
            .await,
    );
    Api::<ByoHost>::namespaced(admin, &ns)
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

/// Labels place machines: host selectors match them, the zone label makes failure domains, and
/// the provider marks a claimed host with its cluster's name. A host that could write them could
/// put itself in the control plane of any cluster, or in a zone of its choice. A host sets only
/// labels under `host.bootsman.io/`; it may not add, change or remove any other, on create,
/// by merge patch, by replace or by server-side apply, while an admin still may.
#[tokio::test]
async fn a_host_may_set_only_its_own_labels() {
    let env = TestEnv::shared().await;
    apply_rbac(env);
    let ns = env.create_namespace("authz-labels").await;
    let admin = env.client().await;
    enrolled_in(&admin, &ns, "l").await;
    let l = env.client_for("byoh:host:l", &["byoh:hosts"]).await;
    let hosts = Api::<ByoHost>::namespaced(l.clone(), &ns);
    let admin_hosts = Api::<ByoHost>::namespaced(admin.clone(), &ns);
    let mut placed = host("l", &ns);
    placed.labels_mut().insert("role".into(), "control-plane".into());
    wait_for("the label rule to refuse host l", WAIT, || {
        let hosts = hosts.clone();
        let h = placed.clone();
        let admin_hosts = admin_hosts.clone();
        async move {
            match hosts.create(&PostParams::default(), &h).await {
                Err(kube::Error::Api(s)) if s.message.contains("host.bootsman.io/") => Ok(()),
                Ok(_) => {
                    // Created before the policy took effect: take it away and try again.
                    let _ = admin_hosts.delete("l", &Default::default()).await;
                    Err("host l could still create a ByoHost with label role".to_string())
                }
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    let mut own = host("l", &ns);
    own.labels_mut()
        .insert("host.bootsman.io/rack".into(), "r12".into());
    allowed(
        "host l registers with a label of its own",
        hosts.create(&PostParams::default(), &own).await,
    );
    // The admin places the host; the provider marks it claimed.
    admin_hosts
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "role": "worker",
                "topology.kubernetes.io/zone": "zone-a",
                "cluster.x-k8s.io/cluster-name": "c1",
            }}})),
        )
        .await
        .unwrap();

    let merge = |labels: serde_json::Value| Patch::Merge(json!({"metadata": {"labels": labels}}));
    for (what, labels, named) in [
        (
            "promotes itself to the control plane",
            json!({"role": "control-plane"}),
            "role",
        ),
        (
            "moves to another zone",
            json!({"topology.kubernetes.io/zone": "zone-b"}),
            "topology.kubernetes.io/zone",
        ),
        (
            "leaves its zone",
            json!({"topology.kubernetes.io/zone": null}),
            "topology.kubernetes.io/zone",
        ),
        (
            "drops the claim mark",
            json!({"cluster.x-k8s.io/cluster-name": null}),
            "cluster.x-k8s.io/cluster-name",
        ),
        (
            "adds a label of another prefix",
            json!({"node-role.kubernetes.io/control-plane": ""}),
            "node-role.kubernetes.io/control-plane",
        ),
    ] {
        let msg = refused(
            &format!("host l {what}"),
            hosts.patch("l", &PatchParams::default(), &merge(labels)).await,
        );
        assert!(
            msg.contains("host.bootsman.io/") && msg.contains(named),
            "{what}: {msg}"
        );
    }
    let mut replaced = admin_hosts.get("l").await.unwrap();
    replaced
        .labels_mut()
        .insert("role".into(), "control-plane".into());
    refused(
        "host l replaces its ByoHost with another role",
        hosts.replace("l", &PostParams::default(), &replaced).await,
    );
    let applied = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoHost",
        "metadata": {"name": "l", "labels": {"role": "control-plane"}},
    });
    refused(
        "host l applies another role",
        hosts
            .patch(
                "l",
                &PatchParams::apply("byoh-agent/labels").force(),
                &Patch::Apply(&applied),
            )
            .await,
    );

    // Its own labels it may change and remove; the admin's and the provider's stay as they were.
    allowed(
        "host l changes its own label",
        hosts
            .patch(
                "l",
                &PatchParams::default(),
                &merge(json!({"host.bootsman.io/rack": "r13"})),
            )
            .await,
    );
    let own_apply = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoHost",
        "metadata": {"name": "l", "labels": {"host.bootsman.io/gpu": "a100"}},
    });
    allowed(
        "host l applies its own labels",
        hosts
            .patch(
                "l",
                &PatchParams::apply("byoh-agent/labels"),
                &Patch::Apply(&own_apply),
            )
            .await,
    );
    let labels = admin_hosts.get("l").await.unwrap().labels().clone();
    assert_eq!(
        labels.get("role").map(String::as_str),
        Some("worker"),
        "{labels:?}"
    );
    assert_eq!(
        labels.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("zone-a")
    );
    assert_eq!(
        labels.get("cluster.x-k8s.io/cluster-name").map(String::as_str),
        Some("c1")
    );
    assert_eq!(
        labels.get("host.bootsman.io/gpu").map(String::as_str),
        Some("a100")
    );

    // An admin still moves it.
    admin_hosts
        .patch(
            "l",
            &PatchParams::default(),
            &merge(json!({"topology.kubernetes.io/zone": "zone-b", "role": null})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_admin_still_manages_hosts() {
    let env = TestEnv::shared().await;
    apply_rbac(env);
    let ns = env.create_namespace("authz-admin").await;
    let admin = Api::<ByoHost>::namespaced(env.client().await, &ns);
    let mut h = host("web1", &ns);
    h.spec.maintenance = Some(true);
    admin.create(&PostParams::default(), &h).await.unwrap();
    admin
        .patch(
            "web1",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"maintenance": null}, "metadata": {"labels": {"role": "worker"}}}),
            ),
        )
        .await
        .unwrap();
}
