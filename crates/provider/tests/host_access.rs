//! A host's rights in its pool last as long as its ByoHost: the RoleBinding the CSR approver grants
//! at enrollment is handed to the ByoHost by the provider, and the garbage collector takes it with
//! the ByoHost. Real control plane, config/rbac applied, hosts with their own identities.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use bootsman_api::v1beta1::{ByoHost, ByoHostSpec, HostPhase};
use bootsman_provider::enrollment::pool_access::{grant_pool_access, pool_binding_name};
use bootsman_provider::host_health::ACCESS_MANAGER;
use bootsman_testenv::{TestEnv, repo_root, wait_for};
use common::{Host, ProviderSite as _, Site, WAIT, meta};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// A pool of the shared control plane where a host has only what the approver grants it (the
/// site's group-wide test Role is removed), with the host roles and policies of config/rbac.
async fn pool(prefix: &str) -> Site {
    let env = TestEnv::shared().await;
    if let Err(e) = env.apply_kustomization(&repo_root().join("config/rbac")) {
        panic!("{e}");
    }
    let site = Site::new_in(env, prefix).await;
    Api::<RoleBinding>::namespaced(site.admin.clone(), &site.ns)
        .delete("test-hosts", &DeleteParams::default())
        .await
        .unwrap();
    site
}

/// A pool (see [`pool`]) where host `name` is enrolled: refused before, it holds the approver's
/// grant, in effect. Returns the site and the host's own client.
async fn enrolled(prefix: &str, name: &str) -> (Site, kube::Client) {
    let site = pool(prefix).await;
    let identity = site
        .env
        .client_for(&format!("byoh:host:{name}"), &["byoh:hosts"])
        .await;
    refused_by_rbac(
        "registering before enrollment",
        try_register(&identity, &site.ns, name).await,
    );
    grant_pool_access(&site.admin, &site.ns, name).await.unwrap();
    until_allowed(&identity, &site.ns, name).await;
    (site, identity)
}

fn bindings(site: &Site) -> Api<RoleBinding> {
    Api::namespaced(site.admin.clone(), &site.ns)
}

/// Creates host `name`'s ByoHost with its own client, as a dry run: the authorization of a
/// registration without leaving anything behind.
async fn try_register(client: &kube::Client, ns: &str, name: &str) -> Result<ByoHost, kube::Error> {
    let h = ByoHost::registered(name, ns);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<ByoHost>::namespaced(client.clone(), ns)
        .create(&dry_run, &h)
        .await
}

/// Asserts that `result` is the authorizer's refusal (403 for want of a role), not an admission
/// policy's.
fn refused_by_rbac<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("cannot") => {}
        other => panic!("{what}: expected 403 from RBAC, got {other:?}"),
    }
}

/// Waits until the API server's authorizer lets host `name` register (the grant is in effect).
async fn until_allowed(client: &kube::Client, ns: &str, name: &str) {
    wait_for(
        &format!("host {name} to be allowed to register"),
        WAIT,
        || async {
            try_register(client, ns, name)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await
}

/// Waits until the RoleBinding of host `name` is owned by the ByoHost with `uid`; returns it.
async fn until_owned(site: &Site, name: &str, uid: &str) -> RoleBinding {
    let api = bindings(site);
    let binding = pool_binding_name(name);
    wait_for(
        &format!("{binding} to be owned by ByoHost {uid}"),
        WAIT,
        || async {
            let rb = api.get(&binding).await.map_err(|e| e.to_string())?;
            let owners = rb.owner_references();
            if owners.iter().any(|o| o.uid == uid) {
                Ok(rb)
            } else {
                Err(format!("{owners:?}"))
            }
        },
    )
    .await
}

/// The provider, restartable: the site's instances stop only with the site.
struct Provider {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Provider {
    async fn start(site: &Site) -> Self {
        let client = site.env.client().await;
        let config = site.config();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let metrics = std::sync::Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
            let shutdown = async move {
                let _ = stopped.await;
            };
            bootsman_provider::run(client, config, metrics, shutdown)
                .await
                .unwrap();
        });
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

/// The host's phase as the provider last wrote it.
async fn until_phase(site: &Site, name: &str, phase: HostPhase) {
    wait_for(&format!("host {name} to be {phase:?}"), WAIT, || async {
        let h = site.byohosts().get(name).await.map_err(|e| e.to_string())?;
        let now = h.status.as_ref().and_then(|s| s.phase);
        if now == Some(phase) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await
}

/// Enrolled (the approver's grant), a host registers with its own identity; its ByoHost becomes
/// the owner of the binding, a renewal-style grant keeps it, and a restarted provider leaves it
/// as it is. Deleted by an admin, the host loses the binding to the garbage collector, and its
/// still-valid certificate may no longer register or heartbeat. Enrolled again, it gets a fresh
/// binding, owned by its new ByoHost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_host_loses_its_pool_access() {
    let name = "h1";
    let (site, identity) = enrolled("host-access", name).await;
    let ns = site.ns.clone();
    let binding = pool_binding_name(name);
    let provider = Provider::start(&site).await;
    let host = Host::register(identity.clone(), &ns, name, &[], true).await;
    let uid = host.get().await.uid().unwrap();
    let rb = until_owned(&site, name, &uid).await;
    let owner = rb
        .owner_references()
        .iter()
        .find(|o| o.uid == uid)
        .unwrap()
        .clone();
    assert_eq!(owner.kind, "ByoHost");
    assert_eq!(owner.api_version, "infrastructure.cluster.x-k8s.io/v1beta1");
    assert_eq!(owner.name, name);
    assert_eq!(owner.block_owner_deletion, Some(false));
    let managers: BTreeMap<String, String> = rb
        .managed_fields()
        .iter()
        .map(|m| {
            let fields = m.fields_v1.as_ref().map(|f| f.0.to_string()).unwrap_or_default();
            (m.manager.clone().unwrap_or_default(), fields)
        })
        .collect();
    assert!(
        managers[ACCESS_MANAGER].contains("f:ownerReferences"),
        "{managers:?}"
    );

    // A renewal-style grant by the approver's field manager keeps the owner.
    grant_pool_access(&site.admin, &ns, name).await.unwrap();
    let renewed = bindings(&site).get(&binding).await.unwrap();
    assert_eq!(renewed.uid(), rb.uid());
    assert!(
        renewed.owner_references().iter().any(|o| o.uid == uid),
        "the approver's apply dropped the owner: {:?}",
        renewed.owner_references()
    );

    // A provider that starts again finds the binding owned and does not write it: once it has
    // reconciled the host (the phase it writes when the Lease expires), the binding is unchanged.
    provider.stop().await;
    let provider = Provider::start(&site).await;
    host.heartbeat(-3600).await;
    until_phase(&site, name, HostPhase::Offline).await;
    let after = bindings(&site).get(&binding).await.unwrap();
    assert_eq!(after.resource_version(), renewed.resource_version());

    // An admin deletes the ByoHost: the garbage collector takes the binding.
    site.byohosts()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        &format!("{binding} to be deleted with its host"),
        WAIT,
        || async {
            match bindings(&site).get_opt(&binding).await {
                Ok(None) => Ok(()),
                Ok(Some(rb)) => Err(format!("still there, owners {:?}", rb.owner_references())),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    wait_for("the authorizer to forget the host", WAIT, || async {
        match try_register(&identity, &ns, name).await {
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The host's certificate is still valid, and buys nothing in the pool.
    let again = ByoHost::registered(name, &ns);
    refused_by_rbac(
        "the deleted host creates its ByoHost",
        Api::<ByoHost>::namespaced(identity.clone(), &ns)
            .create(&PostParams::default(), &again)
            .await,
    );
    let leases: Api<Lease> = Api::namespaced(identity.clone(), &ns);
    let lease = Lease {
        metadata: meta(name, &ns),
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            ..Default::default()
        }),
    };
    refused_by_rbac(
        "the deleted host creates a Lease",
        leases.create(&PostParams::default(), &lease).await,
    );
    let renew = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 60},
    });
    refused_by_rbac(
        "the deleted host renews its Lease",
        leases
            .patch(
                name,
                &PatchParams::apply("byoh-agent").force(),
                &Patch::Apply(&renew),
            )
            .await,
    );

    // Enrolled again under the same name: a fresh binding, owned by the new ByoHost only.
    grant_pool_access(&site.admin, &ns, name).await.unwrap();
    let fresh = bindings(&site).get(&binding).await.unwrap();
    assert_ne!(fresh.uid(), rb.uid());
    assert!(fresh.owner_references().is_empty());
    until_allowed(&identity, &ns, name).await;
    let host = Host::register(identity.clone(), &ns, name, &[], true).await;
    let new_uid = host.get().await.uid().unwrap();
    assert_ne!(new_uid, uid);
    let owned = until_owned(&site, name, &new_uid).await;
    assert_eq!(owned.owner_references().len(), 1);
    assert_eq!(owned.uid(), fresh.uid());
    provider.stop().await;
    site.stop().await;
}

/// A host enrolling again while its old ByoHost is still being deleted gets a fresh binding: the
/// old one, owned by the going ByoHost, is replaced rather than updated, so the garbage collector
/// (which deletes the old binding by uid once the ByoHost is gone) cannot take the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_enrolled_while_its_old_byohost_goes_keeps_its_new_binding() {
    let name = "h2";
    let (mut site, identity) = enrolled("host-reenrol", name).await;
    let ns = site.ns.clone();
    let binding = pool_binding_name(name);
    site.start_provider(site.config()).await;
    let host = Host::register(identity.clone(), &ns, name, &[], true).await;
    let old_uid = host.get().await.uid().unwrap();
    let old = until_owned(&site, name, &old_uid).await;

    // A finalizer holds the ByoHost while it is deleted.
    let hold = json!({"metadata": {"finalizers": ["test.bootsman.io/hold"]}});
    site.byohosts()
        .patch(name, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    site.byohosts()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        site.byohosts()
            .get(name)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    grant_pool_access(&site.admin, &ns, name).await.unwrap();
    let fresh = bindings(&site).get(&binding).await.unwrap();
    assert_ne!(
        fresh.uid(),
        old.uid(),
        "the old binding was updated, not replaced"
    );
    assert!(fresh.owner_references().is_empty());

    // The old ByoHost goes; the host registers again with the new binding.
    let release = json!({"metadata": {"finalizers": null}});
    site.byohosts()
        .patch(name, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    wait_for(&format!("the old ByoHost {name} to be gone"), WAIT, || async {
        match site.byohosts().get_opt(name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let host = Host::register(identity.clone(), &ns, name, &[], true).await;
    let new_uid = host.get().await.uid().unwrap();
    let owned = until_owned(&site, name, &new_uid).await;
    assert_eq!(owned.uid(), fresh.uid());
    assert_eq!(owned.owner_references().len(), 1);
    site.stop().await;
}

/// A RoleBinding of the host's name that grants anyone besides the host is not the approver's:
/// the provider does not hand it to the ByoHost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_shared_with_another_subject_is_not_adopted() {
    let name = "h3";
    let (mut site, identity) = enrolled("host-foreign", name).await;
    let ns = site.ns.clone();
    let binding = pool_binding_name(name);
    let shared = json!({"subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": format!("byoh:host:{name}")},
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
    ]});
    bindings(&site)
        .patch(&binding, &PatchParams::default(), &Patch::Merge(&shared))
        .await
        .unwrap();
    site.start_provider(site.config()).await;
    Host::register(identity.clone(), &ns, name, &[], true).await;
    // The provider has reconciled the host (its phase is written after the binding is looked at).
    until_phase(&site, name, HostPhase::Available).await;
    let rb = bindings(&site).get(&binding).await.unwrap();
    assert!(rb.owner_references().is_empty(), "{:?}", rb.owner_references());
    site.stop().await;
}

/// A pool RoleBinding never changes owner: one still owned by an earlier ByoHost (here a stand-in
/// for a ByoHost of this name that was deleted, whose binding the garbage collector has not taken
/// yet) is not handed to the host's new ByoHost, which would keep the removed host's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_owned_by_an_earlier_byohost_never_changes_owner() {
    let name = "h4";
    let (mut site, identity) = enrolled("host-owner", name).await;
    let ns = site.ns.clone();
    let binding = pool_binding_name(name);
    let mut earlier = ByoHost::new("h4-earlier", ByoHostSpec::default());
    earlier.metadata.namespace = Some(ns.clone());
    let earlier = site
        .byohosts()
        .create(&PostParams::default(), &earlier)
        .await
        .unwrap();
    let earlier_uid = earlier.uid().unwrap();
    let owned = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoHost",
        "name": "h4-earlier", "uid": earlier_uid, "blockOwnerDeletion": false}]}});
    bindings(&site)
        .patch(&binding, &PatchParams::default(), &Patch::Merge(&owned))
        .await
        .unwrap();
    site.start_provider(site.config()).await;
    let host = Host::register(identity.clone(), &ns, name, &[], true).await;
    let uid = host.get().await.uid().unwrap();
    // The provider has reconciled the host (its phase is written after the binding is looked at).
    until_phase(&site, name, HostPhase::Available).await;
    let rb = bindings(&site).get(&binding).await.unwrap();
    let owners: Vec<&str> = rb.owner_references().iter().map(|o| o.uid.as_str()).collect();
    assert_eq!(
        owners,
        [earlier_uid.as_str()],
        "the binding moved to ByoHost {uid}"
    );
    site.stop().await;
}

/// A host enrolled but never registered (or whose ByoHost was deleted before the provider handed
/// it the binding) leaves a binding the garbage collector would never take: the approver's sweep
/// removes it once it is older than the grace period, and leaves a registered host's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binding_of_a_host_that_never_registered_is_swept() {
    use bootsman_provider::enrollment::pool_access::{ORPHAN_BINDING_GRACE, sweep_orphan_bindings};
    let (site, identity) = enrolled("host-sweep", "h5").await;
    let ns = site.ns.clone();
    grant_pool_access(&site.admin, &ns, "h5-never").await.unwrap();
    let never = pool_binding_name("h5-never");
    Host::register(identity, &ns, "h5", &[], true).await;
    let now = k8s_openapi::jiff::Timestamp::now();

    // Within the grace period nothing goes.
    let swept = sweep_orphan_bindings(&site.admin, Some(&ns), ORPHAN_BINDING_GRACE, now)
        .await
        .unwrap();
    assert!(swept.is_empty(), "{swept:?}");
    assert!(bindings(&site).get_opt(&never).await.unwrap().is_some());

    // Past it (a clock an hour ahead), the unregistered host's binding goes, the other stays.
    let later = now + std::time::Duration::from_secs(3600);
    let swept = sweep_orphan_bindings(&site.admin, Some(&ns), ORPHAN_BINDING_GRACE, later)
        .await
        .unwrap();
    assert_eq!(swept, [format!("{ns}/{never}")]);
    assert!(bindings(&site).get_opt(&never).await.unwrap().is_none());
    assert!(
        bindings(&site)
            .get_opt(&pool_binding_name("h5"))
            .await
            .unwrap()
            .is_some(),
        "the registered host's binding was swept"
    );
    site.stop().await;
}
