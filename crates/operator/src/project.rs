//! The Project controller: puts a [`Project`]'s namespaces, RoleBindings, host-pool access and
//! per-project ClusterRoles in place and reports its usage.
//!
//! For a Project `p`, as field manager [`MANAGER`], everything labelled `bootsman.io/project=p`:
//! - each namespace of `spec.namespaces`: created when missing, else adopted (the label added)
//!   unless another Project's label is on it (`Ready=False`, reason `NamespaceTaken`; nothing of
//!   `p` is bound there);
//! - in each namespace held: one RoleBinding `bootsman:project:<role>` per role with members,
//!   to the shipped ClusterRole of that role; and, with `spec.quotas.resourceQuota`, the
//!   ResourceQuota `bootsman-project`;
//! - in each host pool: the RoleBinding `bootsman:project:<p>:hosts` to
//!   `bootsman:project:host-reader`, for every member;
//! - cluster-wide: the ClusterRole `bootsman:project:<p>:read` (get `p`) bound to every member,
//!   and `bootsman:project:<p>:owner` (get, update and patch `p`) bound to its owners.
//!
//! Namespaced objects carry an owner reference to the Project, so deleting it removes every
//! binding; the namespaces stay (they hold clusters), still labelled, and a later Project may
//! adopt them. A binding, quota or namespace label the Project no longer asks for is removed. Status: `usage` (BootsmanClusters and the hosts their
//! specs ask for), `namespaces` held, conditions `Ready` and `QuotaExceeded`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bootsman_api::labels;
use bootsman_api::v1alpha1::{
    BootsmanCluster, MemberKind, Project, ProjectMember, ProjectRole, ProjectStatus, ProjectUsage,
};
use bootsman_runtime::conditions::{self, Status};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams,
};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

/// Field manager of every write of this controller.
pub const MANAGER: &str = "bootsman-operator/projects";
/// The ResourceQuota kept in each of a project's namespaces.
pub const QUOTA_NAME: &str = "bootsman-project";
/// How often a project is looked at again without a change. Changes wake it at once: of the
/// Project, of a BootsmanCluster in its namespaces (usage), of a namespace it lists (as
/// namespace or pool), and of the RBAC objects and quotas it made (set back).
const RESYNC: Duration = Duration::from_secs(10 * 60);

/// Why a project reconcile failed.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct Error {
    action: String,
    #[source]
    source: kube::Error,
}

fn kerr(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error { action, source }
}

/// The RBAC subject of a member.
fn subject(m: &ProjectMember) -> Value {
    match m.kind {
        MemberKind::User => json!({"kind": "User", "name": m.name, "apiGroup": "rbac.authorization.k8s.io"}),
        MemberKind::Group => {
            json!({"kind": "Group", "name": m.name, "apiGroup": "rbac.authorization.k8s.io"})
        }
        MemberKind::ServiceAccount => {
            json!({"kind": "ServiceAccount", "name": m.name, "namespace": m.namespace})
        }
    }
}

/// The subjects of `members` with `role` (every member with `None`), without repeats, in a
/// stable order.
fn subjects(members: &[ProjectMember], role: Option<ProjectRole>) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    members
        .iter()
        .filter(|m| role.is_none_or(|r| m.role == r))
        .filter(|m| seen.insert((m.kind, m.name.clone(), m.namespace.clone())))
        .map(subject)
        .collect()
}

/// The owner reference every namespaced object of the project carries.
fn owner(p: &Project) -> Value {
    json!([{
        "apiVersion": Project::api_version(&()),
        "kind": Project::kind(&()),
        "name": p.name_any(),
        "uid": p.uid().unwrap_or_default(),
        "blockOwnerDeletion": false,
    }])
}

/// Name of the cluster-wide role and binding giving `what` on project `name`.
pub fn project_role_name(name: &str, what: &str) -> String {
    format!("bootsman:project:{name}:{what}")
}

/// Name of the RoleBinding giving a project's members the hosts of one pool.
pub fn hosts_binding_name(name: &str) -> String {
    format!("bootsman:project:{name}:hosts")
}

/// Every object the project should have, as server-side apply bodies: (namespace or `None`,
/// kind, body). `held`: the namespaces the project holds.
pub fn desired(p: &Project, held: &[String], pools: &[String]) -> Vec<(Option<String>, &'static str, Value)> {
    let name = p.name_any();
    let project_labels = json!({labels::PROJECT: name, "app.kubernetes.io/part-of": "bootsman"});
    let mut out = Vec::new();
    for ns in held {
        for role in ProjectRole::ALL {
            let subs = subjects(&p.spec.members, Some(role));
            if subs.is_empty() {
                continue;
            }
            out.push((
                Some(ns.clone()),
                "RoleBinding",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": role.cluster_role(), "namespace": ns,
                                 "labels": project_labels, "ownerReferences": owner(p)},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": role.cluster_role()},
                    "subjects": subs,
                }),
            ));
        }
        if let Some(spec) = p.spec.quotas.as_ref().and_then(|q| q.resource_quota.as_ref()) {
            out.push((
                Some(ns.clone()),
                "ResourceQuota",
                json!({
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": QUOTA_NAME, "namespace": ns,
                                 "labels": project_labels, "ownerReferences": owner(p)},
                    "spec": spec,
                }),
            ));
        }
    }
    let everyone = subjects(&p.spec.members, None);
    if !everyone.is_empty() {
        for pool in pools {
            out.push((
                Some(pool.clone()),
                "RoleBinding",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": hosts_binding_name(&name), "namespace": pool,
                                 "labels": project_labels, "ownerReferences": owner(p)},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "bootsman:project:host-reader"},
                    "subjects": everyone,
                }),
            ));
        }
    }
    for (what, verbs, subs) in [
        ("read", json!(["get"]), everyone),
        (
            "owner",
            json!(["get", "update", "patch"]),
            subjects(&p.spec.members, Some(ProjectRole::Owner)),
        ),
    ] {
        let role = project_role_name(&name, what);
        out.push((
            None,
            "ClusterRole",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role, "labels": project_labels, "ownerReferences": owner(p)},
                "rules": [{"apiGroups": ["bootsman.io"], "resources": ["projects"],
                           "resourceNames": [name], "verbs": verbs}],
            }),
        ));
        if !subs.is_empty() {
            out.push((
                None,
                "ClusterRoleBinding",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": role, "labels": project_labels, "ownerReferences": owner(p)},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": subs,
                }),
            ));
        }
    }
    out
}

/// The quotas `usage` is above, as `name (used/limit)`.
pub fn exceeded(p: &Project, usage: &ProjectUsage) -> Vec<String> {
    let Some(q) = &p.spec.quotas else {
        return Vec::new();
    };
    [
        ("clusters", q.clusters, usage.clusters),
        (
            "controlPlaneHosts",
            q.control_plane_hosts,
            usage.control_plane_hosts,
        ),
        ("workerHosts", q.worker_hosts, usage.worker_hosts),
    ]
    .into_iter()
    .filter_map(|(what, limit, used)| {
        let limit = limit?;
        (used > limit).then(|| format!("quotas.{what} ({used}/{limit})"))
    })
    .collect()
}

/// Reconciles one Project.
pub async fn reconcile(p: Arc<Project>, client: Arc<kube::Client>) -> Result<Action, Error> {
    let client = client.as_ref().clone();
    let name = p.name_any();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let projects: Api<Project> = Api::all(client.clone());
    let mut held = Vec::new();
    let mut taken = Vec::new();
    for ns in &p.spec.namespaces {
        let current = namespaces
            .get_opt(ns)
            .await
            .map_err(kerr(format!("reading namespace {ns}")))?;
        let holder = current
            .as_ref()
            .and_then(|n| n.labels().get(labels::PROJECT).cloned());
        // A label naming a Project that no longer exists (deleted: its bindings went with it,
        // the namespace stayed) does not hold the namespace.
        let holder = match holder {
            Some(other) if other != name => projects
                .get_metadata_opt(&other)
                .await
                .map_err(kerr(format!("reading Project {other}")))?
                .map(|_| other),
            h => h,
        };
        match holder {
            Some(other) if other != name => {
                taken.push(format!("{ns} (project {other})"));
                continue;
            }
            Some(_) => {}
            None => {
                let body = json!({
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns, "labels": {labels::PROJECT: name}},
                });
                namespaces
                    .patch(ns, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
                    .await
                    .map_err(kerr(format!("labelling namespace {ns}")))?;
            }
        }
        held.push(ns.clone());
    }
    let keep: BTreeSet<String> = held.iter().cloned().collect();
    release_namespaces(&client, &name, &keep).await?;

    // A pool whose namespace does not exist yet (no host enrolled there) gets its members'
    // binding once it does; until then the project reports it.
    let mut pools = Vec::new();
    let mut missing_pools = Vec::new();
    for pool in &p.spec.host_pools {
        let found = namespaces
            .get_metadata_opt(pool)
            .await
            .map_err(kerr(format!("reading namespace {pool}")))?
            .is_some();
        if found {
            pools.push(pool.clone());
        } else {
            missing_pools.push(pool.clone());
        }
    }

    let desired = desired(&p, &held, &pools);
    let mut wanted = BTreeSet::new();
    for (ns, kind, body) in &desired {
        let obj_name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
        wanted.insert((ns.clone(), kind.to_string(), obj_name.clone()));
        let ar = match *kind {
            "RoleBinding" => ApiResource::erase::<RoleBinding>(&()),
            "ResourceQuota" => ApiResource::erase::<ResourceQuota>(&()),
            "ClusterRole" => ApiResource::erase::<ClusterRole>(&()),
            _ => ApiResource::erase::<ClusterRoleBinding>(&()),
        };
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            &obj_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map_err(kerr(format!(
            "applying {kind} {}/{obj_name}",
            ns.as_deref().unwrap_or("")
        )))?;
    }
    remove_unwanted(&client, &name, &wanted).await?;

    let mut clusters = Vec::new();
    for ns in &held {
        let list = Api::<BootsmanCluster>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(kerr(format!("listing BootsmanClusters in {ns}")))?;
        clusters.extend(list.items);
    }
    let usage = ProjectUsage::of(&clusters);
    let over = exceeded(&p, &usage);

    let mut status = p.status.clone().unwrap_or_default();
    let generation = p.metadata.generation;
    let now = conditions::now();
    let (ready, reason, message) = if !taken.is_empty() {
        (
            Status::False,
            "NamespaceTaken",
            format!("namespaces of another project, not bound: {}", taken.join(", ")),
        )
    } else if !missing_pools.is_empty() {
        (
            Status::False,
            "HostPoolMissing",
            format!(
                "host pools without a namespace yet (no host can serve from them): {}",
                missing_pools.join(", ")
            ),
        )
    } else {
        (Status::True, "Ready", String::new())
    };
    conditions::set(
        &mut status.conditions,
        "Ready",
        ready,
        reason,
        &message,
        generation,
        now.clone(),
    );
    let (q_status, q_reason, q_message) = if over.is_empty() {
        (Status::False, "WithinQuota", String::new())
    } else {
        (
            Status::True,
            "QuotaExceeded",
            format!("above {}", over.join(", ")),
        )
    };
    conditions::set(
        &mut status.conditions,
        "QuotaExceeded",
        q_status,
        q_reason,
        &q_message,
        generation,
        now,
    );
    status.usage = usage;
    status.namespaces = held;
    status.observed_generation = generation;
    write_status(&client, &p, status).await?;
    Ok(Action::requeue(RESYNC))
}

/// Removes the project label from namespaces it no longer asks for (those not in `keep`).
async fn release_namespaces(client: &kube::Client, name: &str, keep: &BTreeSet<String>) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{}={name}", labels::PROJECT));
    let labelled = namespaces
        .list_metadata(&lp)
        .await
        .map_err(kerr("listing the project's namespaces"))?;
    for ns in labelled.items {
        let ns_name = ns.name_any();
        if keep.contains(&ns_name) {
            continue;
        }
        let patch = json!({"metadata": {"labels": {labels::PROJECT: null}}});
        namespaces
            .patch(&ns_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr(format!("releasing namespace {ns_name}")))?;
    }
    Ok(())
}

/// Deletes the project's labelled RBAC objects and quotas that `wanted` does not hold.
async fn remove_unwanted(
    client: &kube::Client,
    name: &str,
    wanted: &BTreeSet<(Option<String>, String, String)>,
) -> Result<(), Error> {
    let selector = format!("{}={name}", labels::PROJECT);
    remove_unlisted::<RoleBinding>(client, &selector, wanted).await?;
    remove_unlisted::<ResourceQuota>(client, &selector, wanted).await?;
    remove_unlisted::<ClusterRoleBinding>(client, &selector, wanted).await
}

/// Deletes the objects of kind `K` matching `selector` that `wanted` does not hold.
async fn remove_unlisted<K>(
    client: &kube::Client,
    selector: &str,
    wanted: &BTreeSet<(Option<String>, String, String)>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    let listed = Api::<K>::all(client.clone())
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .map_err(kerr(format!("listing the project's {kind}s")))?;
    for o in listed.items {
        let (ns, n) = (o.namespace(), o.name_any());
        if wanted.contains(&(ns.clone(), kind.clone(), n.clone())) {
            continue;
        }
        let ar = ApiResource::erase::<K>(&());
        let api: Api<DynamicObject> = match &ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        ignore_gone(api.delete(&n, &DeleteParams::default()).await.map(|_| ()))
            .map_err(kerr(format!("deleting {kind} {}/{n}", ns.unwrap_or_default())))?;
    }
    Ok(())
}

fn ignore_gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(e) if bootsman_runtime::api_errors::is_not_found(&e) => Ok(()),
        other => other,
    }
}

async fn write_status(client: &kube::Client, p: &Project, status: ProjectStatus) -> Result<(), Error> {
    if p.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<Project> = Api::all(client.clone());
    let body = bootsman_runtime::ssa::body::<Project>(&p.name_any(), None, json!({"status": status}));
    bootsman_runtime::ssa::apply_status(&api, MANAGER, &p.name_any(), &body)
        .await
        .map_err(kerr(format!("writing status of Project {}", p.name_any())))?;
    Ok(())
}

/// Requeue on error.
pub fn error_policy(p: Arc<Project>, err: &Error, _client: Arc<kube::Client>) -> Action {
    tracing::warn!(project = %p.name_any(), error = %err, "project reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// The Project that made `o` (its owner reference), to set it back when someone changes or
/// deletes it. Projects are cluster-scoped, so the reference carries no namespace.
fn made_by<K: kube::Resource>(
    o: PartialObjectMeta<K>,
) -> Option<kube::runtime::reflector::ObjectRef<Project>> {
    o.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.kind == Project::kind(&()) && r.api_version == Project::api_version(&()))
        .map(|r| kube::runtime::reflector::ObjectRef::new(&r.name))
}

/// Changes of `K` (metadata only) that `config` selects, from every namespace.
fn metadata_changes<K>(
    client: &kube::Client,
    config: kube::runtime::watcher::Config,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<K>, kube::runtime::watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    use kube::runtime::WatchStreamExt;
    kube::runtime::watcher(Api::<PartialObjectMeta<K>>::all(client.clone()), config)
        .default_backoff()
        .touched_objects()
}

/// Runs the Project controller until `shutdown` resolves. Wakes a project on its own change, a
/// BootsmanCluster's in its namespaces, a namespace's it lists, and a change of what it made.
pub async fn run(
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::StreamExt;
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::{Controller, watcher};
    let projects: Api<Project> = Api::all(client.clone());
    let controller = Controller::new(projects, watcher::Config::default());
    let store = controller.store();
    // The namespace → project map comes from the projects' specs (the label follows them).
    let by_namespace = move |bc: BootsmanCluster| {
        let ns = bc.namespace().unwrap_or_default();
        store
            .state()
            .into_iter()
            .filter(|p| p.spec.namespaces.contains(&ns))
            .map(|p| ObjectRef::from_obj(&*p))
            .collect::<Vec<_>>()
    };
    let store = controller.store();
    // A namespace wakes the projects listing it (created, labelled, deleted).
    let listing = move |ns: PartialObjectMeta<Namespace>| {
        let name = ns.name_any();
        store
            .state()
            .into_iter()
            .filter(|p| p.spec.namespaces.contains(&name) || p.spec.host_pools.contains(&name))
            .map(|p| ObjectRef::from_obj(&*p))
            .collect::<Vec<_>>()
    };
    let made = || watcher::Config::default().labels(labels::PROJECT);
    controller
        .watches(
            Api::<BootsmanCluster>::all(client.clone()),
            watcher::Config::default(),
            by_namespace,
        )
        .watches_stream(
            metadata_changes::<Namespace>(&client, watcher::Config::default()),
            listing,
        )
        .watches_stream(metadata_changes::<RoleBinding>(&client, made()), made_by)
        .watches_stream(metadata_changes::<ResourceQuota>(&client, made()), made_by)
        .watches_stream(metadata_changes::<ClusterRole>(&client, made()), made_by)
        .watches_stream(metadata_changes::<ClusterRoleBinding>(&client, made()), made_by)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(client))
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootsman_api::v1alpha1::{ProjectQuotas, ProjectSpec};

    fn project(members: Vec<ProjectMember>, quotas: Option<ProjectQuotas>) -> Project {
        let mut p = Project::new(
            "alpha",
            ProjectSpec {
                display_name: None,
                members,
                namespaces: vec!["alpha".into()],
                host_pools: vec!["pool".into()],
                quotas,
            },
        );
        p.metadata.uid = Some("uid-1".into());
        p
    }

    fn member(kind: MemberKind, name: &str, role: ProjectRole) -> ProjectMember {
        ProjectMember {
            kind,
            name: name.into(),
            namespace: (kind == MemberKind::ServiceAccount).then(|| "ci".into()),
            role,
        }
    }

    #[test]
    fn each_role_with_members_gets_one_binding_and_everyone_reads_the_pool() {
        let p = project(
            vec![
                member(MemberKind::User, "alice", ProjectRole::Owner),
                member(MemberKind::Group, "devs", ProjectRole::Member),
                member(MemberKind::ServiceAccount, "deployer", ProjectRole::Member),
                member(MemberKind::User, "alice", ProjectRole::Owner),
            ],
            None,
        );
        let d = desired(&p, &["alpha".to_string()], &p.spec.host_pools);
        let names: Vec<(Option<String>, &str, String)> = d
            .iter()
            .map(|(ns, k, b)| {
                (
                    ns.clone(),
                    *k,
                    b["metadata"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let a = Some("alpha".to_string());
        assert!(names.contains(&(a.clone(), "RoleBinding", "bootsman:project:owner".into())));
        assert!(names.contains(&(a.clone(), "RoleBinding", "bootsman:project:member".into())));
        assert!(!names.contains(&(a, "RoleBinding", "bootsman:project:viewer".into())));
        let owners = &d
            .iter()
            .find(|(_, k, b)| *k == "RoleBinding" && b["metadata"]["name"] == "bootsman:project:owner")
            .unwrap()
            .2["subjects"];
        assert_eq!(owners.as_array().unwrap().len(), 1, "alice once: {owners}");
        let hosts = d.iter().find(|(ns, _, _)| ns.as_deref() == Some("pool")).unwrap();
        assert_eq!(hosts.2["subjects"].as_array().unwrap().len(), 3);
        assert_eq!(hosts.2["subjects"][2]["namespace"], "ci");
        let owner_role = d
            .iter()
            .find(|(_, k, b)| *k == "ClusterRole" && b["metadata"]["name"] == "bootsman:project:alpha:owner")
            .unwrap();
        assert_eq!(owner_role.2["rules"][0]["resourceNames"], json!(["alpha"]));
        // No namespace held (taken by another project): nothing bound there.
        assert!(
            desired(&p, &[], &p.spec.host_pools)
                .iter()
                .all(|(ns, _, _)| ns.as_deref() != Some("alpha"))
        );
    }

    #[test]
    fn usage_is_compared_with_each_quota() {
        let p = project(
            Vec::new(),
            Some(ProjectQuotas {
                clusters: Some(1),
                control_plane_hosts: Some(3),
                worker_hosts: None,
                resource_quota: None,
            }),
        );
        let u = ProjectUsage {
            clusters: 2,
            control_plane_hosts: 3,
            worker_hosts: 40,
        };
        assert_eq!(exceeded(&p, &u), ["quotas.clusters (2/1)"]);
    }
}
