//! The control plane the harness starts is the real thing: garbage collection deletes dependents,
//! and an approved CSR yields a working client identity limited to what RBAC grants it. (That our
//! CRDs install and their CEL rules run in the API server is tested in `crates/api/tests`.)

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use bootsman_testenv::{CertPair, TestEnv, wait_for};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn garbage_collection_deletes_dependents() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("gc").await;
    let client = env.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: meta("owner"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut dep = ConfigMap {
        metadata: meta("dependent"),
        ..Default::default()
    };
    dep.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        ..Default::default()
    }]);
    cms.create(&PostParams::default(), &dep).await.unwrap();
    cms.delete("owner", &DeleteParams::background()).await.unwrap();
    wait_for(
        "the garbage collector to delete the dependent ConfigMap",
        WAIT,
        || async {
            match cms.get_opt("dependent").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("dependent still exists".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// A CSR approved through the API is signed by kube-controller-manager with the cluster's client
/// CA, and the certificate then authenticates as its subject with exactly the Role's permissions.
#[tokio::test]
async fn approved_csr_gives_a_working_identity_limited_by_rbac() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("csr").await;
    let admin = env.client().await;
    let user = format!("csr-user-{ns}");

    // The requester's key and CSR.
    let dir = env.dir().join(format!("csr-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("user.key");
    let key_pair = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&key, key_pair.serialize_pem()).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "csr-testers");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user.as_str());
    let csr_pem = params.serialize_request(&key_pair).unwrap().pem().unwrap();

    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let name = format!("{ns}-user");
    let csr = CertificateSigningRequest {
        metadata: meta(&name),
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(csr_pem.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["client auth".into()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        status: None,
    };
    csrs.create(&PostParams::default(), &csr).await.unwrap();
    let approval = serde_json::json!({"status": {"conditions": [{
        "type": "Approved", "status": "True", "reason": "TestApproval",
        "message": "approved by the integration test",
    }]}});
    csrs.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&approval))
        .await
        .unwrap();
    let cert = wait_for(
        "kube-controller-manager to sign the approved CSR",
        WAIT,
        || async {
            let c = csrs.get(&name).await.map_err(|e| e.to_string())?;
            c.status
                .and_then(|s| s.certificate)
                .map(|b| b.0)
                .ok_or_else(|| "no certificate yet".to_string())
        },
    )
    .await;
    let cert_path = dir.join("user.crt");
    std::fs::write(&cert_path, cert).unwrap();

    // A Role that allows reading ConfigMaps, nothing else.
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns);
    roles
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta("read-configmaps"),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["configmaps".into()]),
                    verbs: vec!["get".into(), "list".into()],
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta("read-configmaps"),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: "read-configmaps".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "User".into(),
                    name: user.clone(),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: meta("visible"),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    let as_user = env.client_with_cert(&CertPair { cert: cert_path, key }).await;

    // Allowed: what the Role grants.
    let cm = Api::<ConfigMap>::namespaced(as_user.clone(), &ns)
        .get("visible")
        .await
        .unwrap();
    assert_eq!(cm.name_any(), "visible");
    // Refused: everything else.
    let denied = |e: kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
    let write = Api::<ConfigMap>::namespaced(as_user.clone(), &ns)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: meta("sneaky"),
                ..Default::default()
            },
        )
        .await;
    assert!(write.is_err_and(denied), "creating a ConfigMap must be forbidden");
    let secrets = Api::<Secret>::namespaced(as_user.clone(), &ns)
        .list(&Default::default())
        .await;
    assert!(secrets.is_err_and(denied), "listing Secrets must be forbidden");
    let other_ns = Api::<ConfigMap>::namespaced(as_user, "default")
        .list(&Default::default())
        .await;
    assert!(
        other_ns.is_err_and(denied),
        "reading another namespace must be forbidden"
    );
}

/// `client_for` hands out certificate identities whose groups RBAC honours.
#[tokio::test]
async fn client_for_authenticates_as_the_given_user_and_groups() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("ident").await;
    let admin = env.client().await;
    Api::<RoleBinding>::namespaced(admin, &ns)
        .patch(
            "group-view",
            &PatchParams::apply("test"),
            &Patch::Apply(&RoleBinding {
                metadata: meta("group-view"),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: "view".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "Group".into(),
                    name: "team:viewers".into(),
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    ..Default::default()
                }]),
            }),
        )
        .await
        .unwrap();
    let member = env.client_for("alice", &["team:other", "team:viewers"]).await;
    let outsider = env.client_for("bob", &["team:other"]).await;
    // RBAC is eventually consistent: the authorizer learns the binding from its informer, and
    // `view` gets its rules from the aggregation controller, so a fresh control plane may need a
    // moment before the member is allowed.
    let member_cms = Api::<ConfigMap>::namespaced(member, &ns);
    wait_for("the group binding to allow the member", WAIT, || async {
        member_cms
            .list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let refused = Api::<ConfigMap>::namespaced(outsider, &ns)
        .list(&Default::default())
        .await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 403));
}
