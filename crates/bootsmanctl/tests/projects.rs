//! `bootsmanctl projects` against the real control plane: the list as a platform admin sees it,
//! a clear refusal for someone who may not list Projects, and one project's usage, as a member
//! with only the rights a project gives its members, as a table and as JSON.

use bootsman_api::v1alpha1::{BootsmanCluster, Project};
use bootsman_testenv::TestEnv;
use bootsmanctl::cli::{Cli, run};
use clap::Parser;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn projects(kubeconfig: &std::path::Path, extra: &[&str]) -> anyhow::Result<String> {
    let kubeconfig = kubeconfig.to_str().expect("utf-8 path").to_string();
    let mut args = vec!["bootsmanctl", "--kubeconfig", &kubeconfig, "projects"];
    args.extend_from_slice(extra);
    let mut out = Vec::new();
    run(Cli::try_parse_from(args).expect("arguments"), &mut out).await?;
    Ok(String::from_utf8(out).expect("utf-8"))
}

fn cluster(ns: &str, name: &str, control_plane: i32, workers: i32) -> BootsmanCluster {
    let mut bc = bootsman_fixtures::clusters::sample(ns);
    bc.metadata.name = Some(name.into());
    bc.spec.control_plane.replicas = control_plane;
    bc.spec.workers[0].replicas = workers;
    bc
}

#[tokio::test]
async fn lists_projects_and_shows_a_projects_usage_to_its_member() {
    let env = TestEnv::shared().await;
    let admin = env.client().await;
    let ns = env.create_namespace("team").await;
    let name = format!("{ns}-p");
    let body = json!({
        "apiVersion": "bootsman.io/v1alpha1", "kind": "Project",
        "metadata": {"name": name},
        "spec": {
            "displayName": "Team",
            "namespaces": [ns],
            "hostPools": ["rack-a"],
            "members": [{"kind": "User", "name": format!("{ns}-member"), "role": "member"}],
            "quotas": {"clusters": 3, "controlPlaneHosts": 5, "workerHosts": 6},
        },
    });
    let api: Api<Project> = Api::all(admin.clone());
    api.patch(&name, &PatchParams::apply("test").force(), &Patch::Apply(&body))
        .await
        .unwrap();
    // The status as the operator writes it.
    let status = json!({
        "apiVersion": "bootsman.io/v1alpha1", "kind": "Project", "metadata": {"name": name},
        "status": {
            "namespaces": [ns],
            "usage": {"clusters": 2, "controlPlaneHosts": 6, "workerHosts": 7},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                            "lastTransitionTime": "2026-12-07T10:00:00Z"}],
        },
    });
    api.patch_status(&name, &PatchParams::apply("test").force(), &Patch::Apply(&status))
        .await
        .unwrap();
    let bcs: Api<BootsmanCluster> = Api::namespaced(admin.clone(), &ns);
    for c in [cluster(&ns, "a", 3, 3), cluster(&ns, "b", 3, 4)] {
        bcs.create(&PostParams::default(), &c).await.unwrap();
    }

    // An admin lists every project.
    let table = projects(env.kubeconfig(), &["list"]).await.unwrap();
    let line = table
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} missing:\n{table}"));
    for cell in ["Team", ns.as_str(), "rack-a", "2/3", "True"] {
        assert!(line.contains(cell), "{cell} missing: {line}");
    }
    let rows: Value =
        serde_json::from_str(&projects(env.kubeconfig(), &["list", "-o", "json"]).await.unwrap()).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name.as_str())
        .unwrap();
    assert_eq!(row["members"], 1);
    assert_eq!(row["clusterQuota"], 3);

    // The member: `get` on its Project and reading the namespace's clusters, as a project
    // grants them (here written directly).
    let member = format!("{ns}-member");
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}:read")},
        "rules": [{"apiGroups": ["bootsman.io"], "resources": ["projects"], "resourceNames": [name], "verbs": ["get"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let subject = json!([{"kind": "User", "name": member, "apiGroup": "rbac.authorization.k8s.io"}]);
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}:read")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{name}:read")},
        "subjects": subject,
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    let read: Role = serde_json::from_value(json!({
        "metadata": {"name": "read-clusters"},
        "rules": [{"apiGroups": ["bootsman.io"], "resources": ["bootsmanclusters"], "verbs": ["get", "list"]}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &read)
        .await
        .unwrap();
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "read-clusters"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-clusters"},
        "subjects": subject,
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
    let member_config = env.kubeconfig_for(&member, &[]).unwrap();

    // Listing every project is refused with what to do instead.
    let err = projects(&member_config, &["list"]).await.unwrap_err().to_string();
    assert!(
        err.contains("platform admins") && err.contains("projects usage"),
        "{err}"
    );

    // Usage: what the clusters ask for now (not the status), against each quota.
    let usage = bootsman_testenv::wait_for(
        "the member's rights",
        std::time::Duration::from_secs(60),
        || async {
            projects(&member_config, &["usage", &name])
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let row = |q: &str| {
        usage
            .lines()
            .find(|l| l.starts_with(q))
            .unwrap_or_else(|| panic!("{q} missing:\n{usage}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("clusters"), "clusters 2 3 1");
    assert_eq!(row("controlPlaneHosts"), "controlPlaneHosts 6 5 -1 (over)");
    assert_eq!(row("workerHosts"), "workerHosts 7 6 -1 (over)");
    assert!(
        usage.contains(&format!("{ns}/a")) && usage.contains(&format!("{ns}/b")),
        "{usage}"
    );
    let json: Value = serde_json::from_str(
        &projects(&member_config, &["usage", &name, "-o", "json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(json["clusters"].as_array().unwrap().len(), 2);
    assert_eq!(json["quotas"][1]["used"], 6);

    // A project that does not exist is named.
    let err = projects(env.kubeconfig(), &["usage", "no-such-project"])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no Project named no-such-project"), "{err}");
}
