//! `bootsmanctl hosts token` against the real control plane: the Secret it creates is a valid
//! bootstrap token for the pool, and the kubeconfig it prints authenticates as that token and may
//! submit a CertificateSigningRequest.

mod common;

use bootsman_api::identity;
use bootsman_testenv::TestEnv;
use bootsmanctl::cli::{Cli, run};
use clap::Parser;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

async fn run_cli(args: &[&str]) -> anyhow::Result<String> {
    let cli = Cli::try_parse_from(args)?;
    let mut out = Vec::new();
    run(cli, &mut out).await?;
    Ok(String::from_utf8(out)?)
}

#[tokio::test]
async fn token_authenticates_as_pool_bootstrapper_and_may_submit_a_csr() {
    let env = TestEnv::shared().await;
    common::apply_host_rbac(env);
    let pool = env.create_namespace("token").await;
    let kubeconfig = env.kubeconfig().to_str().expect("utf-8 path").to_string();
    let token_cli = |flags: &[&str]| {
        let mut args = vec!["bootsmanctl", "--kubeconfig", &kubeconfig, "hosts", "token"];
        args.extend_from_slice(flags);
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        async move { run_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    let printed = token_cli(&["--namespace", &pool, "--name", "web-1", "--ttl", "30m"])
        .await
        .expect("hosts token");
    let missing = token_cli(&["--namespace", "no-such-pool"])
        .await
        .expect_err("a token for a missing pool")
        .to_string();
    assert!(
        missing.contains("--namespace") && missing.contains("does not exist"),
        "{missing}"
    );

    let kc = kube::config::Kubeconfig::from_yaml(&printed).expect("printed kubeconfig parses");
    let raw: serde_json::Value = serde_saphyr::from_str(&printed).expect("printed YAML");
    let bearer = raw["users"][0]["user"]["token"]
        .as_str()
        .expect("token in kubeconfig")
        .to_string();
    let (id, secret) = bearer.split_once('.').expect("<id>.<secret>");
    assert_eq!(id.len(), 6);
    assert_eq!(secret.len(), 16);

    // The Secret is a bootstrap token for the pool and the one host.
    let admin = env.client().await;
    let s = Api::<Secret>::namespaced(admin.clone(), identity::TOKEN_NAMESPACE)
        .get(&identity::token_secret_name(id))
        .await
        .expect("token Secret");
    assert_eq!(s.type_.as_deref(), Some(identity::TOKEN_SECRET_TYPE));
    let data = s.data.clone().unwrap_or_default();
    let get = |k: &str| String::from_utf8(data.get(k).expect(k).0.clone()).expect("utf-8");
    assert_eq!(get("token-id"), id);
    assert_eq!(get("token-secret"), secret);
    assert_eq!(get("usage-bootstrap-authentication"), "true");
    assert!(!data.contains_key("usage-bootstrap-signing"));
    assert_eq!(
        get("auth-extra-groups"),
        format!("system:bootstrappers:byoh:{pool}")
    );
    let exp: Timestamp = get("expiration").parse().expect("RFC 3339 expiration");
    let left = exp.as_second() - Timestamp::now().as_second();
    // The expiration is rounded to the second.
    assert!((25 * 60..=30 * 60 + 1).contains(&left), "expires in {left}s");
    let labels = s.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(identity::TOKEN_POOL), Some(&pool));
    let annotations = s.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(identity::TOKEN_HOST).map(String::as_str),
        Some("web-1")
    );

    // The printed kubeconfig authenticates as the token.
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("self subject review");
    let user = review.status.and_then(|s| s.user_info).expect("user info");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:bootstrap:{id}").as_str())
    );
    let groups = user.groups.unwrap_or_default();
    assert!(
        groups.contains(&format!("system:bootstrappers:byoh:{pool}")),
        "{groups:?}"
    );

    // It may submit and read a CSR, and nothing else.
    let csrs = Api::<CertificateSigningRequest>::all(client.clone());
    let name = format!("token-test-{id}");
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(common::csr_pem("byoh:host:web-1", &[identity::HOSTS_GROUP])),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["client auth".into()]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let created = csrs
        .create(&PostParams::default(), &csr)
        .await
        .expect("create CSR");
    assert_eq!(
        created.spec.username.as_deref(),
        Some(format!("system:bootstrap:{id}").as_str())
    );
    csrs.get(&name).await.expect("read own CSR");
    let denied = Api::<Secret>::namespaced(client, &pool)
        .list(&Default::default())
        .await
        .expect_err("a token may not list Secrets");
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403),
        "{denied:?}"
    );
    let _ = Api::<CertificateSigningRequest>::all(admin)
        .delete(&name, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn bad_flags_are_rejected_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--namespace", "Pool_A"], "--namespace"),
        (&["--namespace", "pool.a"], "--namespace"),
        (&["--namespace", "p", "--name", "Web_1"], "--name"),
        (&["--namespace", "p", "--ttl", "10s"], "--ttl"),
        (&["--namespace", "p", "--ttl", "8d"], "--ttl"),
        (&["--namespace", "p", "--ttl", "soon"], "--ttl"),
        (&["--namespace", "p", "--server", "http://x"], "--server"),
    ];
    for (flags, want) in cases {
        let mut args = vec!["bootsmanctl", "--kubeconfig", "/nonexistent", "hosts", "token"];
        args.extend_from_slice(flags);
        let err = run_cli(&args).await.expect_err("rejected").to_string();
        assert!(err.contains(want), "{flags:?}: {err}");
    }
}
