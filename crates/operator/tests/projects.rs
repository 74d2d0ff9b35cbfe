//! Projects against the real control plane, with `config/projects` applied and the project
//! controller running: each member's rights are tried with that member's own certificate
//! identity, and what a member of another project, a viewer or a mere member may not do is
//! refused by the real API server (RBAC's 403, or the admission policy's).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use bootsman_api::labels;
use bootsman_api::v1alpha1::{BootsmanCluster, Project};
use bootsman_api::v1beta1::ByoHost;
use bootsman_fixtures::site::Running;
use bootsman_testenv::{TestEnv, repo_root, wait_for};
use common::sample;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn code(r: &Result<impl Sized, kube::Error>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(_) => Some(0),
    }
}

fn message(r: Result<impl Sized, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) => s.message.clone(),
        Err(e) => e.to_string(),
        Ok(_) => "allowed".into(),
    }
}

/// Waits until `api.call(...)` is allowed (RBAC learns new bindings from an informer, and the
/// aggregated roles are filled by a controller).
macro_rules! until_allowed {
    ($what:expr, $api:expr => $($call:tt)*) => {{
        let api = $api;
        wait_for($what, WAIT, || {
            let api = api.clone();
            async move { api.$($call)*.await.map(|_| ()).map_err(|e| e.to_string()) }
        })
        .await
    }};
}

async fn apply_project(admin: &kube::Client, body: serde_json::Value) {
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    Api::<Project>::all(admin.clone())
        .patch(
            &name,
            &PatchParams::apply("platform-admin").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
}

async fn ready(admin: &kube::Client, name: &str) -> Project {
    let api = Api::<Project>::all(admin.clone());
    wait_for(&format!("Project {name} reconciled"), WAIT, || async {
        let p = api.get(name).await.map_err(|e| e.to_string())?;
        let s = p.status.clone().unwrap_or_default();
        if s.observed_generation == p.metadata.generation && !s.conditions.is_empty() {
            Ok(p)
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await
}

fn condition<'a>(
    p: &'a Project,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

/// The shared control plane with `config/projects` applied, an admin client, and the project
/// controller running.
async fn with_projects() -> (&'static TestEnv, kube::Client, Running) {
    let env = TestEnv::shared().await;
    env.apply_kustomization(&repo_root().join("config/projects"))
        .expect("config/projects applies");
    let admin = env.client().await;
    let controller = Running::start(env, |client, stop| async move {
        bootsman_operator::project::run(client, stop).await;
    })
    .await;
    (env, admin, controller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_get_their_role_in_their_project_and_nothing_in_another() {
    let (env, admin, controller) = with_projects().await;

    // Unique names: the shared control plane serves other tests too.
    let tag = env.create_namespace("proj").await;
    let (a_ns, b_ns) = (format!("{tag}-a"), format!("{tag}-b"));
    let (a_pool, b_pool) = (
        env.create_namespace("pool-a").await,
        env.create_namespace("pool-b").await,
    );
    let (alpha, beta) = (format!("{tag}-alpha"), format!("{tag}-beta"));
    let user = |n: &str| format!("{tag}-{n}");
    apply_project(
        &admin,
        json!({
            "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
            "metadata": {"name": alpha},
            "spec": {
                "displayName": "Team Alpha",
                "namespaces": [a_ns],
                "hostPools": [a_pool],
                "members": [
                    {"kind": "User", "name": user("alice"), "role": "owner"},
                    {"kind": "User", "name": user("bob"), "role": "member"},
                    {"kind": "User", "name": user("carol"), "role": "viewer"},
                ],
                "quotas": {"clusters": 1, "controlPlaneHosts": 3, "resourceQuota": {"hard": {"configmaps": "50"}}},
            },
        }),
    )
    .await;
    apply_project(
        &admin,
        json!({
            "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
            "metadata": {"name": beta},
            "spec": {
                "namespaces": [b_ns],
                "hostPools": [b_pool],
                "members": [{"kind": "User", "name": user("dave"), "role": "owner"}],
            },
        }),
    )
    .await;
    let p = ready(&admin, &alpha).await;
    assert_eq!(condition(&p, "Ready").status, "True", "{:?}", p.status);
    ready(&admin, &beta).await;

    // The namespaces exist, labelled; the quota is in place.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let a = namespaces.get(&a_ns).await.unwrap();
    assert_eq!(a.labels().get(labels::PROJECT), Some(&alpha));
    let quota = Api::<ResourceQuota>::namespaced(admin.clone(), &a_ns)
        .get("bootsman-project")
        .await
        .unwrap();
    assert!(quota.spec.unwrap().hard.unwrap().contains_key("configmaps"));

    // Each project has a cluster and a kubeconfig Secret; each pool a host.
    for ns in [&a_ns, &b_ns] {
        Api::<BootsmanCluster>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &sample(ns))
            .await
            .unwrap();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "demo-kubeconfig"}, "stringData": {"value": "a kubeconfig"},
        }))
        .unwrap();
        Api::<Secret>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    for pool in [&a_pool, &b_pool] {
        Api::<ByoHost>::namespaced(admin.clone(), pool)
            .create(
                &PostParams::default(),
                &ByoHost::new("host-0", Default::default()),
            )
            .await
            .unwrap();
    }

    let alice = env.client_for(&user("alice"), &[]).await;
    let bob = env.client_for(&user("bob"), &[]).await;
    let carol = env.client_for(&user("carol"), &[]).await;
    let dave = env.client_for(&user("dave"), &[]).await;
    let clusters = |c: &kube::Client, ns: &str| Api::<BootsmanCluster>::namespaced(c.clone(), ns);
    let secrets = |c: &kube::Client, ns: &str| Api::<Secret>::namespaced(c.clone(), ns);
    let hosts = |c: &kube::Client, ns: &str| Api::<ByoHost>::namespaced(c.clone(), ns);
    let projects = |c: &kube::Client| Api::<Project>::all(c.clone());

    // What each role may do, once RBAC has learned the bindings.
    until_allowed!("alice lists her clusters", clusters(&alice, &a_ns) => list(&ListParams::default()));
    until_allowed!("alice reads her kubeconfig", secrets(&alice, &a_ns) => get("demo-kubeconfig"));
    until_allowed!("alice reads her pool's hosts", hosts(&alice, &a_pool) => list(&ListParams::default()));
    let alpha_name: &str = &alpha;
    until_allowed!("alice reads her project", projects(&alice) => get(alpha_name));
    until_allowed!("bob changes a cluster", clusters(&bob, &a_ns) => patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"team": "alpha"}}})),
    ));
    until_allowed!("bob reads the kubeconfig", secrets(&bob, &a_ns) => get("demo-kubeconfig"));
    until_allowed!("carol lists the clusters", clusters(&carol, &a_ns) => list(&ListParams::default()));
    until_allowed!("dave lists his clusters", clusters(&dave, &b_ns) => list(&ListParams::default()));

    // Nothing of another project: its clusters, its kubeconfigs, its pool's hosts, the project.
    for (who, c) in [("alice", &alice), ("bob", &bob), ("carol", &carol)] {
        assert_eq!(
            code(&clusters(c, &b_ns).list(&ListParams::default()).await),
            Some(403),
            "{who}"
        );
        assert_eq!(code(&clusters(c, &b_ns).get("demo").await), Some(403), "{who}");
        assert_eq!(
            code(&secrets(c, &b_ns).get("demo-kubeconfig").await),
            Some(403),
            "{who}"
        );
        assert_eq!(
            code(&hosts(c, &b_pool).list(&ListParams::default()).await),
            Some(403),
            "{who}"
        );
        assert_eq!(code(&projects(c).get(&beta).await), Some(403), "{who}");
        assert_eq!(
            code(&projects(c).list(&ListParams::default()).await),
            Some(403),
            "{who}"
        );
    }
    assert_eq!(
        code(&clusters(&dave, &a_ns).list(&ListParams::default()).await),
        Some(403)
    );
    assert_eq!(
        code(&secrets(&dave, &a_ns).get("demo-kubeconfig").await),
        Some(403)
    );
    assert_eq!(code(&hosts(&dave, &a_pool).get("host-0").await), Some(403));
    // A viewer reads, and nothing more: no Secrets, no changes.
    assert_eq!(
        code(&secrets(&carol, &a_ns).get("demo-kubeconfig").await),
        Some(403)
    );
    assert_eq!(
        code(&clusters(&carol, &a_ns).delete("demo", &Default::default()).await),
        Some(403)
    );
    // No one in a project writes hosts, or RBAC of the namespace.
    let host_patch = Patch::Merge(json!({"metadata": {"labels": {"role": "mine"}}}));
    assert_eq!(
        code(
            &hosts(&alice, &a_pool)
                .patch("host-0", &PatchParams::default(), &host_patch)
                .await
        ),
        Some(403)
    );
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "escalate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": user("alice"), "apiGroup": "rbac.authorization.k8s.io"}],
    }))
    .unwrap();
    assert_eq!(
        code(
            &Api::<RoleBinding>::namespaced(alice.clone(), &a_ns)
                .create(&PostParams::default(), &rb)
                .await
        ),
        Some(403)
    );

    // An owner edits members; a member does not.
    let add_erin = json!({"spec": {"members": [
        {"kind": "User", "name": user("alice"), "role": "owner"},
        {"kind": "User", "name": user("bob"), "role": "member"},
        {"kind": "User", "name": user("carol"), "role": "viewer"},
        {"kind": "User", "name": user("erin"), "role": "viewer"},
    ]}});
    assert_eq!(
        code(
            &projects(&bob)
                .patch(&alpha, &PatchParams::default(), &Patch::Merge(&add_erin))
                .await
        ),
        Some(403)
    );
    projects(&alice)
        .patch(&alpha, &PatchParams::default(), &Patch::Merge(&add_erin))
        .await
        .unwrap();
    let erin = env.client_for(&user("erin"), &[]).await;
    until_allowed!("erin, added by the owner, lists the clusters", clusters(&erin, &a_ns) => list(&ListParams::default()));

    // An owner cannot widen the project: namespaces, pools and quotas are the admins'. (The
    // policy applies once the API server has loaded it: wait, with dry runs, for that.)
    let probe = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the admin-fields policy to be in force", WAIT, || async {
        let widen = json!({"spec": {"hostPools": [a_pool, b_pool]}});
        match projects(&alice)
            .patch(&alpha, &probe, &Patch::Merge(&widen))
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("rule: project-admin-fields") => Ok(()),
            other => Err(format!("{:?}", other.map(|_| "allowed"))),
        }
    })
    .await;
    for (field, patch) in [
        (
            "spec.namespaces",
            json!({"spec": {"namespaces": [a_ns, format!("{tag}-c")]}}),
        ),
        ("spec.namespaces", json!({"spec": {"namespaces": [a_ns, b_ns]}})),
        ("spec.hostPools", json!({"spec": {"hostPools": [a_pool, b_pool]}})),
        ("spec.quotas", json!({"spec": {"quotas": {"clusters": 100}}})),
    ] {
        let r = projects(&alice)
            .patch(&alpha, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        assert!(
            matches!(&r, Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422),
            "{field}: {r:?}"
        );
        let m = message(r);
        assert!(
            m.contains(field) && m.contains("rule: project-admin-fields"),
            "{m}"
        );
    }
    // The cluster's own namespaces belong to no project, whoever asks.
    for c in [&alice, &admin] {
        let r = projects(c)
            .patch(
                &alpha,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"namespaces": [a_ns, "kube-system"]}})),
            )
            .await;
        let m = message(r);
        assert!(m.contains("rule: project-namespace-reserved"), "{m}");
    }
    // A second project cannot take the first one's namespace.
    let gamma = format!("{tag}-gamma");
    apply_project(&admin, json!({
        "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
        "metadata": {"name": gamma},
        "spec": {"namespaces": [a_ns], "members": [{"kind": "User", "name": user("mallory"), "role": "owner"}]},
    }))
    .await;
    let g = ready(&admin, &gamma).await;
    let c = condition(&g, "Ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NamespaceTaken"),
        "{c:?}"
    );
    assert!(
        c.message.contains(&a_ns) && c.message.contains(&alpha),
        "{}",
        c.message
    );
    assert_eq!(
        namespaces.get(&a_ns).await.unwrap().labels().get(labels::PROJECT),
        Some(&alpha)
    );
    let mallory = env.client_for(&user("mallory"), &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        code(&clusters(&mallory, &a_ns).list(&ListParams::default()).await),
        Some(403)
    );

    // Usage follows the clusters.
    let used = wait_for("alpha's usage counts its cluster", WAIT, || async {
        let p = projects(&admin).get(&alpha).await.map_err(|e| e.to_string())?;
        let s = p.status.clone().unwrap_or_default();
        if s.usage.clusters == 1 {
            Ok(s.usage)
        } else {
            Err(format!("{:?}", s.usage))
        }
    })
    .await;
    assert_eq!((used.control_plane_hosts, used.worker_hosts), (3, 3), "{used:?}");
    // Admission keeps the project within its quotas, naming the quota.
    let mut second = sample(&a_ns);
    second.metadata.name = Some("demo-2".into());
    // The policy reads the Project from the API server's own cache: wait (with dry runs, which
    // store nothing) until that has the usage too.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the quota policy to see alpha's usage", WAIT, || async {
        match clusters(&bob, &a_ns).create(&dry, &second).await {
            Err(kube::Error::Api(s)) if s.message.contains("rule: project-quota-clusters") => Ok(()),
            other => Err(format!("{:?}", other.map(|_| "allowed"))),
        }
    })
    .await;
    let m = message(
        clusters(&bob, &a_ns)
            .create(&PostParams::default(), &second)
            .await,
    );
    assert!(
        m.contains("quotas.clusters") && m.contains("rule: project-quota-clusters"),
        "{m}"
    );
    let grow = Patch::Merge(json!({"spec": {"controlPlane": {"replicas": 5}}}));
    let m = message(
        clusters(&bob, &a_ns)
            .patch("demo", &PatchParams::default(), &grow)
            .await,
    );
    assert!(
        m.contains("quotas.controlPlaneHosts") && m.contains("rule: project-quota-control-plane-hosts"),
        "{m}"
    );
    // A namespace of no project is not limited.
    let free_ns = env.create_namespace("no-project").await;
    clusters(&admin, &free_ns)
        .create(&PostParams::default(), &sample(&free_ns))
        .await
        .unwrap();
    // Quotas lowered below usage: reported, and a change asking for nothing more still passes.
    apply_project(&admin, json!({
        "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
        "metadata": {"name": alpha},
        "spec": {
            "namespaces": [a_ns], "hostPools": [a_pool],
            "members": [
                {"kind": "User", "name": user("alice"), "role": "owner"},
                {"kind": "User", "name": user("bob"), "role": "member"},
                {"kind": "User", "name": user("carol"), "role": "viewer"},
                {"kind": "User", "name": user("erin"), "role": "viewer"},
            ],
            "quotas": {"clusters": 0, "controlPlaneHosts": 3, "resourceQuota": {"hard": {"configmaps": "50"}}},
        },
    }))
    .await;
    let over = wait_for("alpha over its lowered cluster quota", WAIT, || async {
        let p = projects(&admin).get(&alpha).await.map_err(|e| e.to_string())?;
        match p
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "QuotaExceeded"))
        {
            Some(c) if c.status == "True" => Ok(c.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(over.message.contains("quotas.clusters (1/0)"), "{}", over.message);
    clusters(&bob, &a_ns)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"note": "still"}}})),
        )
        .await
        .unwrap();

    // A member removed loses the project at once.
    projects(&admin)
        .patch(
            &alpha,
            &PatchParams::apply("platform-admin").force(),
            &Patch::Apply(&json!({
                "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
                "metadata": {"name": alpha},
                "spec": {
                    "namespaces": [a_ns], "hostPools": [a_pool],
                    "members": [{"kind": "User", "name": user("alice"), "role": "owner"}],
                },
            })),
        )
        .await
        .unwrap();
    wait_for("bob's access gone", WAIT, || async {
        match code(&clusters(&bob, &a_ns).list(&ListParams::default()).await) {
            Some(403) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        code(&secrets(&bob, &a_ns).get("demo-kubeconfig").await),
        Some(403)
    );
    // Quotas gone from the spec: the ResourceQuota goes too.
    wait_for("the ResourceQuota removed", WAIT, || async {
        match Api::<ResourceQuota>::namespaced(admin.clone(), &a_ns)
            .get_opt("bootsman-project")
            .await
        {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    controller.stop().await;
}

/// A BootsmanCluster whose host selectors name `pools` (control plane by `matchLabels`, workers
/// by an `In` expression).
fn naming_pools(ns: &str, name: &str, control_plane: &str, workers: &[&str]) -> BootsmanCluster {
    let mut c = sample(ns);
    c.metadata.name = Some(name.into());
    c.spec.control_plane.host_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"bootsman.io/pool": control_plane}})).unwrap());
    c.spec.workers[0].host_selector = Some(
        serde_json::from_value(json!({"matchExpressions": [
            {"key": "bootsman.io/pool", "operator": "In", "values": workers},
            {"key": "role", "operator": "NotIn", "values": ["spare"]},
        ]}))
        .unwrap(),
    );
    c
}

/// Admission keeps a project's clusters on its own host pools: a host selector naming another
/// pool (by `bootsman.io/pool`) is refused, naming the pool and the rule, for the project's own
/// member; the project's pools and namespace are allowed; a namespace of no project is not
/// limited; and a write naming no new pool passes even after the project lost that pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_cluster_may_name_only_the_projects_pools() {
    let (env, admin, controller) = with_projects().await;
    let tag = env.create_namespace("pools").await;
    let ns = format!("{tag}-team");
    let (own_pool, foreign_pool) = (format!("{tag}-rack-a"), format!("{tag}-rack-b"));
    let project = format!("{tag}-p");
    let member = format!("{tag}-bob");
    let body = |pools: Vec<String>| {
        json!({
            "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
            "metadata": {"name": project},
            "spec": {
                "namespaces": [ns], "hostPools": pools,
                "members": [{"kind": "User", "name": member, "role": "member"}],
            },
        })
    };
    apply_project(&admin, body(vec![own_pool.clone()])).await;
    // The pool has no namespace yet: reported, and fixed as soon as the namespace appears.
    let p = ready(&admin, &project).await;
    let c = condition(&p, "Ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "HostPoolMissing"),
        "{c:?}"
    );
    assert!(c.message.contains(&own_pool), "{}", c.message);
    let pool_ns: Namespace = serde_json::from_value(json!({"metadata": {"name": own_pool}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &pool_ns)
        .await
        .unwrap();
    wait_for(
        "the project Ready once its pool's namespace exists",
        WAIT,
        || async {
            let p = Api::<Project>::all(admin.clone())
                .get(&project)
                .await
                .map_err(|e| e.to_string())?;
            let c = condition(&p, "Ready").clone();
            if c.status == "True" {
                Ok(())
            } else {
                Err(format!("{c:?}"))
            }
        },
    )
    .await;
    // A binding the project made, deleted by someone, is set back at once (not at the resync).
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), &ns);
    bindings
        .delete("bootsman:project:member", &Default::default())
        .await
        .unwrap();
    wait_for("the members' RoleBinding set back", WAIT, || async {
        match bindings.get_opt("bootsman:project:member").await {
            Ok(Some(b)) if b.metadata.deletion_timestamp.is_none() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let bob = env.client_for(&member, &[]).await;
    let clusters = |c: &kube::Client| Api::<BootsmanCluster>::namespaced(c.clone(), &ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };

    // The foreign pool, by matchLabels on the control plane: refused, naming it.
    let bad = naming_pools(&ns, "cp-foreign", &foreign_pool, &[&own_pool]);
    let m = wait_for("the pool policy to refuse a foreign pool", WAIT, || async {
        match clusters(&bob).create(&dry, &bad).await {
            Err(kube::Error::Api(s)) if s.message.contains("rule: project-host-pools") => Ok(s.message),
            other => Err(format!("{:?}", other.map(|_| "allowed"))),
        }
    })
    .await;
    assert!(
        m.contains(&format!("may not use host pool(s) {foreign_pool} ")) && m.contains(&project),
        "{m}"
    );
    // ... and by an In expression of a worker pool, among allowed ones.
    let bad = naming_pools(&ns, "w-foreign", &own_pool, &[&own_pool, &foreign_pool]);
    let m = message(clusters(&bob).create(&PostParams::default(), &bad).await);
    assert!(
        m.contains(&format!("may not use host pool(s) {foreign_pool} "))
            && !m.contains(&format!("pool(s) {own_pool}")),
        "{m}"
    );
    // The project's pool and its own namespace are allowed.
    let good = naming_pools(&ns, "good", &own_pool, &[&own_pool, &ns]);
    clusters(&bob)
        .create(&PostParams::default(), &good)
        .await
        .unwrap();
    // A namespace of no project is not limited by any project.
    let free_ns = env.create_namespace("pools-free").await;
    Api::<BootsmanCluster>::namespaced(admin.clone(), &free_ns)
        .create(
            &PostParams::default(),
            &naming_pools(&free_ns, "any", &foreign_pool, &[&foreign_pool]),
        )
        .await
        .unwrap();

    // The pool withdrawn: the existing cluster's writes that name no new pool still pass...
    apply_project(&admin, body(vec![])).await;
    wait_for("the pool policy to see the pool withdrawn", WAIT, || async {
        let probe = naming_pools(&ns, "probe", &own_pool, &[&ns]);
        match clusters(&admin).create(&dry, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("rule: project-host-pools") => Ok(()),
            other => Err(format!("{:?}", other.map(|_| "allowed"))),
        }
    })
    .await;
    let label = Patch::Merge(json!({"metadata": {"labels": {"note": "kept"}}}));
    clusters(&bob)
        .patch("good", &PatchParams::default(), &label)
        .await
        .unwrap();
    // ... but naming it anew is refused, even for an admin.
    let widen = Patch::Merge(json!({"spec": {"workers": [{"name": "default", "replicas": 3,
        "hostSelector": {"matchLabels": {"bootsman.io/pool": foreign_pool}}}]}}));
    let m = message(
        clusters(&admin)
            .patch("good", &PatchParams::default(), &widen)
            .await,
    );
    assert!(
        m.contains("rule: project-host-pools") && m.contains(&foreign_pool),
        "{m}"
    );
    controller.stop().await;
}
