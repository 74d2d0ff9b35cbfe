//! A host's rights: the RoleBinding `byoh:host:<name>` in its pool's namespace.
//!
//! Enrollment writes it ([`grant_pool_access`]) before approving; the host-health controller hands
//! it to the host's ByoHost as owner so the garbage collector takes it with the host; renewal
//! needs it, owned by a live ByoHost ([`check_renewal`]); bindings nobody took over are swept
//! ([`sweep_orphan_bindings`]).

use std::time::Duration;

use bootsman_api::identity;
use bootsman_api::v1beta1::ByoHost;
use bootsman_runtime::api_errors;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::{Denial, FIELD_MANAGER, HOST_CLUSTER_ROLE, delete_exactly, deny};
use crate::error::{Result, kube as kerr};

/// Name of the RoleBinding that gives host `host` its rights in its pool: `byoh:host:<host>`.
pub fn pool_binding_name(host: &str) -> String {
    identity::host_user(host)
}

/// Whether host `host` may renew its certificate: it still has the pool access enrollment gave
/// it, and that access is held by a live host. That is a binding as [`grant_pool_access`] writes
/// it (in any namespace) whose namespace has the host's ByoHost, not being deleted, as the
/// binding's owner. A removed host (binding gone with its ByoHost), a host being deleted (a
/// ByoHost held by a finalizer keeps its binding until it is gone) and a binding no ByoHost has
/// taken over yet are all denied, with the reason: a host cannot keep itself a certificate past
/// its removal.
pub async fn check_renewal(client: &kube::Client, host: &str) -> Result<Result<(), Denial>> {
    let name = pool_binding_name(host);
    let bindings = Api::<RoleBinding>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(kerr(format!("list RoleBindings {name}")))?;
    let mut why = None;
    for b in bindings.items.iter().filter(|b| is_pool_binding(b, host)) {
        let ns = b.namespace().unwrap_or_default();
        let byohost = Api::<ByoHost>::namespaced(client.clone(), &ns)
            .get_opt(host)
            .await
            .map_err(kerr(format!("read ByoHost {ns}/{host}")))?;
        let owned = b.owner_references().iter().any(is_host_owner);
        let d = match byohost {
            None if !owned => deny(
                "HostNotAdopted",
                format!(
                    "host {host:?} has not registered its ByoHost in pool {ns:?} yet: a host renews once its ByoHost owns the pool RoleBinding {ns}/{name}; retry later"
                ),
            ),
            None => deny(
                "HostRemoved",
                format!(
                    "host {host:?} has no ByoHost in its pool {ns:?} any more; enrol it again with `bootsmanctl hosts token`"
                ),
            ),
            Some(h) if h.metadata.deletion_timestamp.is_some() => deny(
                "HostDeleting",
                format!(
                    "ByoHost {ns}/{host} is being deleted: a host being removed gets no new certificate; enrol it again with `bootsmanctl hosts token` once it is gone"
                ),
            ),
            Some(h)
                if !b
                    .owner_references()
                    .iter()
                    .any(|o| is_host_owner(o) && Some(&o.uid) == h.metadata.uid.as_ref()) =>
            {
                deny(
                    "HostNotAdopted",
                    format!(
                        "the pool RoleBinding {ns}/{name} is not owned by ByoHost {ns}/{host}: the provider hands it over once the host has registered; retry later"
                    ),
                )
            }
            Some(_) => return Ok(Ok(())),
        };
        why.get_or_insert(d);
    }
    Ok(Err(why.unwrap_or_else(|| {
        deny(
            "HostRemoved",
            format!(
                "host {host:?} has no pool access any more (no RoleBinding {name} in any namespace: its ByoHost was deleted); enrol it again with `bootsmanctl hosts token`"
            ),
        )
    })))
}

/// Whether `binding` is exactly what [`grant_pool_access`] writes for host `host`: named
/// `byoh:host:<host>`, binding ClusterRole [`HOST_CLUSTER_ROLE`] to user `byoh:host:<host>` and
/// to no one else. Only such a binding is handed to the host's ByoHost as its owner.
pub fn is_pool_binding(binding: &RoleBinding, host: &str) -> bool {
    let user = identity::host_user(host);
    let role = &binding.role_ref;
    let subject_is_host = match binding.subjects.as_deref() {
        Some([s]) => {
            s.kind == "User"
                && s.name == user
                && s.api_group.as_deref() == Some("rbac.authorization.k8s.io")
                && s.namespace.as_deref().unwrap_or_default().is_empty()
        }
        _ => false,
    };
    binding.metadata.name.as_deref() == Some(pool_binding_name(host).as_str())
        && role.api_group == "rbac.authorization.k8s.io"
        && role.kind == "ClusterRole"
        && role.name == HOST_CLUSTER_ROLE
        && subject_is_host
}

/// Whether `owner` names a ByoHost (any version of its API group).
pub fn is_host_owner(owner: &OwnerReference) -> bool {
    let group = ByoHost::group(&());
    owner.kind == ByoHost::kind(&()) && owner.api_version.split('/').next() == Some(group.as_ref())
}

/// Whether `binding` belongs to a ByoHost that is gone: it names ByoHost owners, and none of them
/// is `live_host` (the uid of the host's current ByoHost, if it has one that is not being
/// deleted). The garbage collector deletes such a binding, so it must not carry a re-enrolled
/// host's rights.
pub fn owned_by_a_gone_host(binding: &RoleBinding, live_host: Option<&str>) -> bool {
    let owners: Vec<_> = binding
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| is_host_owner(o))
        .collect();
    !owners.is_empty() && !owners.iter().any(|o| Some(o.uid.as_str()) == live_host)
}

/// Grants host `host` the ClusterRole [`HOST_CLUSTER_ROLE`] in namespace `pool`, and only there:
/// a RoleBinding for user `byoh:host:<host>`, written with server-side apply (idempotent). The
/// pool comes from the token the API server authenticated, so a host cannot pick it.
///
/// The apply leaves `metadata.ownerReferences` alone (the provider writes the host's ByoHost there
/// with a field manager of its own), so a repeated grant keeps the binding owned. A binding whose
/// ByoHost owner is gone (or going) is deleted first and written afresh: the garbage collector
/// deletes by uid, so it cannot take the new one.
pub async fn grant_pool_access(client: &kube::Client, pool: &str, host: &str) -> Result<(), kube::Error> {
    let name = pool_binding_name(host);
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), pool);
    if let Some(old) = bindings.get_opt(&name).await?
        && old.metadata.owner_references.iter().flatten().any(is_host_owner)
    {
        // A ByoHost being deleted is as good as gone: the binding would go with it.
        let live = Api::<ByoHost>::namespaced(client.clone(), pool)
            .get_opt(host)
            .await?
            .filter(|h| h.metadata.deletion_timestamp.is_none())
            .and_then(|h| h.uid());
        if owned_by_a_gone_host(&old, live.as_deref()) {
            delete_exactly(&bindings, &name, old.uid()).await?;
            tracing::info!(%pool, %host, "replaced the pool RoleBinding of a deleted ByoHost");
        }
    }
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": name,
            "namespace": pool,
            "labels": {"app.kubernetes.io/part-of": "bootsman"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": HOST_CLUSTER_ROLE,
        },
        "subjects": [{
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "User",
            "name": identity::host_user(host),
        }],
    });
    bindings
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await
        .map(|_| ())
}

/// How long a pool RoleBinding may wait for a ByoHost to take it over before
/// [`sweep_orphan_bindings`] removes it. An agent registers within seconds of its enrollment.
pub const ORPHAN_BINDING_GRACE: Duration = Duration::from_secs(15 * 60);

/// Deletes the pool RoleBindings that no ByoHost took over and whose host has no ByoHost: hosts
/// enrolled that never registered, or whose ByoHost was deleted before the provider handed it the
/// binding, so that the garbage collector would never take it. Only bindings as
/// [`grant_pool_access`] writes them (labelled `app.kubernetes.io/part-of: bootsman`), older than
/// `grace`, owned by no ByoHost, with no ByoHost of their host in their namespace; each deleted
/// by uid, so a binding granted again meanwhile stays. In `namespace` only, or in every one.
/// Returns `namespace/name` of each deleted.
pub async fn sweep_orphan_bindings(
    client: &kube::Client,
    namespace: Option<&str>,
    grace: Duration,
    now: Timestamp,
) -> Result<Vec<String>> {
    let api = match namespace {
        Some(ns) => Api::<RoleBinding>::namespaced(client.clone(), ns),
        None => Api::<RoleBinding>::all(client.clone()),
    };
    let all = api
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=bootsman"))
        .await
        .map_err(kerr("list pool RoleBindings"))?;
    let mut swept = Vec::new();
    for b in &all.items {
        let name = b.name_any();
        let Some(host) = name.strip_prefix(identity::HOST_USER_PREFIX) else {
            continue;
        };
        let old_enough = b.metadata.creation_timestamp.as_ref().is_some_and(|t| {
            now.as_second() - t.0.as_second() >= i64::try_from(grace.as_secs()).unwrap_or(i64::MAX)
        });
        if !is_pool_binding(b, host) || !old_enough || b.owner_references().iter().any(is_host_owner) {
            continue;
        }
        let ns = b.namespace().unwrap_or_default();
        let registered = Api::<ByoHost>::namespaced(client.clone(), &ns)
            .get_opt(host)
            .await
            .map_err(kerr(format!("read ByoHost {ns}/{host}")))?
            .is_some();
        if registered {
            continue;
        }
        let api = Api::<RoleBinding>::namespaced(client.clone(), &ns);
        match delete_exactly(&api, &name, b.uid()).await {
            Ok(()) => {
                tracing::info!(namespace = %ns, %host, "removed the pool RoleBinding of a host that has no ByoHost");
                swept.push(format!("{ns}/{name}"));
            }
            // Granted again since the list: a new uid, not this binding any more.
            Err(kube::Error::Api(s)) if api_errors::conflict(&s) => {}
            Err(e) => return Err(kerr(format!("delete RoleBinding {ns}/{name}"))(e)),
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {

    use kube::api::ObjectMeta;

    use super::*;

    fn binding(host: &str) -> RoleBinding {
        RoleBinding {
            metadata: ObjectMeta {
                name: Some(pool_binding_name(host)),
                ..Default::default()
            },
            role_ref: k8s_openapi::api::rbac::v1::RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: HOST_CLUSTER_ROLE.into(),
            },
            subjects: Some(vec![k8s_openapi::api::rbac::v1::Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "User".into(),
                name: identity::host_user(host),
                namespace: None,
            }]),
        }
    }

    #[test]
    fn pool_bindings() {
        assert!(is_pool_binding(&binding("h1"), "h1"));
        assert!(!is_pool_binding(&binding("h1"), "h2"), "another host's binding");
        let mut b = binding("h1");
        let mut alice = b.subjects.as_ref().expect("subjects")[0].clone();
        alice.name = "alice".into();
        b.subjects.as_mut().expect("subjects").push(alice);
        assert!(!is_pool_binding(&b, "h1"), "a second subject");
        let mut b = binding("h1");
        b.subjects.as_mut().expect("subjects")[0].kind = "Group".into();
        assert!(!is_pool_binding(&b, "h1"), "a group of that name");
        let mut b = binding("h1");
        b.subjects = None;
        assert!(!is_pool_binding(&b, "h1"), "no subject");
        let mut b = binding("h1");
        b.role_ref.name = "admin".into();
        assert!(!is_pool_binding(&b, "h1"), "another role");
        let mut b = binding("h1");
        b.role_ref.kind = "Role".into();
        assert!(!is_pool_binding(&b, "h1"), "a Role of that name");
        let mut b = binding("h1");
        b.metadata.name = Some("other".into());
        assert!(!is_pool_binding(&b, "h1"), "another name");
    }

    #[test]
    fn bindings_of_gone_hosts() {
        let owner = |kind: &str, api_version: &str, uid: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "h1".into(),
            uid: uid.into(),
            ..Default::default()
        };
        let host = |uid: &str| owner("ByoHost", "infrastructure.cluster.x-k8s.io/v1beta1", uid);
        let mut b = binding("h1");
        assert!(
            !owned_by_a_gone_host(&b, None),
            "never owned: fresh from the approver"
        );
        b.metadata.owner_references = Some(vec![host("u1")]);
        assert!(!owned_by_a_gone_host(&b, Some("u1")), "owned by the live host");
        assert!(
            owned_by_a_gone_host(&b, Some("u2")),
            "the host was deleted and registered again"
        );
        assert!(owned_by_a_gone_host(&b, None), "the host was deleted");
        b.metadata.owner_references = Some(vec![host("u1"), host("u2")]);
        assert!(!owned_by_a_gone_host(&b, Some("u2")), "one owner is live");
        b.metadata.owner_references = Some(vec![owner("ConfigMap", "v1", "u3")]);
        assert!(!owned_by_a_gone_host(&b, None), "not owned by a host");
        b.metadata.owner_references = Some(vec![owner("ByoHost", "example.com/v1", "u3")]);
        assert!(!owned_by_a_gone_host(&b, None), "a ByoHost of another API group");
    }
}
