//! What the host-identity tests share: the host RBAC of config/rbac, an in-process CSR approver,
//! tokens and raw CSRs.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bootsman_api::identity;
use bootsman_testenv::TestEnv;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::json;

/// Applies config/rbac (`kubectl apply -k`), as an installation does, once per control plane.
pub fn apply_host_rbac(env: &TestEnv) {
    let dir = bootsman_testenv::repo_root().join("config/rbac");
    if let Err(e) = env.apply_kustomization(&dir) {
        panic!("{e}");
    }
}

/// Runs the provider's CSR approver on this test's runtime until the test ends.
pub async fn start_approver(env: &TestEnv) {
    let metrics = Arc::new(bootsman_runtime::metrics::Metrics::new().expect("metrics"));
    let client = env.client().await;
    tokio::spawn(async move {
        if let Err(e) = bootsman_provider::csr_approver::run(
            client,
            metrics,
            Default::default(),
            futures::future::pending(),
        )
        .await
        {
            panic!("CSR approver: {e:#}");
        }
    });
}

/// A fresh directory under the environment's.
pub fn temp_dir(env: &TestEnv, name: &str) -> PathBuf {
    let dir = env.dir().join(format!("{name}-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Issues a token for `pool` (and `host`) and writes its bootstrap kubeconfig to a file.
pub async fn bootstrap_kubeconfig(
    env: &TestEnv,
    pool: &str,
    host: Option<&str>,
) -> (bootsmanctl::token::Token, PathBuf) {
    issue(env, pool, host, false).await
}

/// Like [`bootstrap_kubeconfig`] for a token of `bootsmanctl hosts replace HOST`.
pub async fn replacement_kubeconfig(
    env: &TestEnv,
    pool: &str,
    host: &str,
) -> (bootsmanctl::token::Token, PathBuf) {
    issue(env, pool, Some(host), true).await
}

async fn issue(
    env: &TestEnv,
    pool: &str,
    host: Option<&str>,
    replace: bool,
) -> (bootsmanctl::token::Token, PathBuf) {
    let admin = env.client().await;
    let token = bootsmanctl::token::create(
        &admin,
        &bootsmanctl::token::Request {
            pool: pool.into(),
            host: host.map(Into::into),
            ttl: Duration::from_secs(600),
            replace,
        },
    )
    .await
    .expect("issue token");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(env.kubeconfig()).expect("admin kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("admin config");
    let yaml =
        bootsmanctl::token::bootstrap_kubeconfig(env.api_url(), &bootsmanctl::token::ca_pem(&config), &token);
    let path = temp_dir(env, "bootstrap").join("bootstrap-kubeconfig");
    std::fs::write(&path, yaml).expect("write bootstrap kubeconfig");
    (token, path)
}

/// A client of the kubeconfig at `path` (a bootstrap kubeconfig, say).
pub async fn client_of(path: &std::path::Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(path).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// PEM of a request for CN `cn` and O `orgs`.
pub fn csr_pem(cn: &str, orgs: &[&str]) -> Vec<u8> {
    let mut p = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, cn);
    for o in orgs {
        dn.push(rcgen::DnType::OrganizationName, *o);
    }
    p.distinguished_name = dn;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    p.serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem")
        .into_bytes()
}

/// Submits a CSR as `client` asking for a one-hour certificate, returning its name.
pub async fn submit(client: &kube::Client, request: Vec<u8>, signer: &str, usages: &[&str]) -> String {
    submit_for(client, request, signer, usages, Some(3600)).await
}

/// Submits a CSR as `client` with `spec.expirationSeconds` = `lifetime`, returning its name.
pub async fn submit_for(
    client: &kube::Client,
    request: Vec<u8>,
    signer: &str,
    usages: &[&str],
    lifetime: Option<i32>,
) -> String {
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("test-host-".into()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(request),
            signer_name: signer.into(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            expiration_seconds: lifetime,
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    Api::<CertificateSigningRequest>::all(client.clone())
        .create(&PostParams::default(), &csr)
        .await
        .expect("submit CSR")
        .metadata
        .name
        .expect("name")
}

/// Waits for the CSR's decision: `Ok(())` when approved, `Err(reason)` when denied.
pub async fn decision(env: &TestEnv, name: &str) -> Result<(), String> {
    let csrs = Api::<CertificateSigningRequest>::all(env.client().await);
    bootsman_testenv::wait_for(
        &format!("a decision on CSR {name}"),
        Duration::from_secs(60),
        || {
            let csrs = csrs.clone();
            async move {
                let csr = csrs.get(name).await.map_err(|e| e.to_string())?;
                let conds = csr.status.and_then(|s| s.conditions).unwrap_or_default();
                conds
                    .iter()
                    .find_map(|c| match c.type_.as_str() {
                        "Approved" => Some(Ok(())),
                        "Denied" => Some(Err(c.reason.clone().unwrap_or_default())),
                        _ => None,
                    })
                    .ok_or_else(|| format!("conditions {conds:?}"))
            }
        },
    )
    .await
}

/// Waits until the token Secret `name` is gone (spent tokens are deleted after the approval).
pub async fn wait_token_deleted(env: &TestEnv, name: &str) {
    let secrets = Api::<Secret>::namespaced(env.client().await, identity::TOKEN_NAMESPACE);
    bootsman_testenv::wait_for(
        &format!("the spent token Secret {name} to be deleted"),
        Duration::from_secs(30),
        || {
            let secrets = secrets.clone();
            async move {
                match secrets.get_opt(name).await {
                    Ok(None) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
}

/// A host's user name.
pub fn host_user(name: &str) -> String {
    identity::host_user(name)
}

/// Registers host `host` in `pool` with its own `client` (its ByoHost, as its agent does) and
/// hands it its pool RoleBinding as the provider's host-health controller does (the ByoHost
/// becomes the binding's owner): the state in which a host may renew its certificate.
pub async fn register(env: &TestEnv, client: &kube::Client, pool: &str, host: &str) -> String {
    use bootsman_api::v1beta1::ByoHost;
    use kube::{Resource, ResourceExt};
    let h = ByoHost::registered(host, pool);
    let h = Api::<ByoHost>::namespaced(client.clone(), pool)
        .create(&PostParams::default(), &h)
        .await
        .expect("the host registers its ByoHost");
    let uid = h.uid().expect("uid");
    let owner = json!({"metadata": {"ownerReferences": [{
        "apiVersion": ByoHost::api_version(&()), "kind": ByoHost::kind(&()),
        "name": host, "uid": uid, "blockOwnerDeletion": false}]}});
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(env.client().await, pool)
        .patch(
            &identity::host_user(host),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&owner),
        )
        .await
        .expect("the ByoHost takes over its pool RoleBinding");
    uid
}
