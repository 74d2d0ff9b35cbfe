//! Enrollment end to end against the real control plane: `bootsmanctl hosts token`, the agent's
//! `ensure_identity`, the provider's CSR approver (in-process) and kube-controller-manager's
//! signer. Also every way a CSR for a host identity is denied.

mod common;

use common::enrol;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bootsman_api::identity;
use bootsman_api::v1beta1::ByoHost;
use bootsman_testenv::{TestEnv, wait_for};
use byoh_agent::enroll::{self, Error, Options};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};

fn options(env: &TestEnv, host: &str, bootstrap: Option<std::path::PathBuf>) -> Options {
    let state_dir = enrol::temp_dir(env, "state").join("byoh-agent");
    Options {
        kubeconfig: state_dir.join("kubeconfig"),
        state_dir,
        bootstrap_kubeconfig: bootstrap,
        host_name: host.into(),
        approval_timeout: Duration::from_secs(60),
        certificate_lifetime: enroll::DEFAULT_CERTIFICATE_LIFETIME,
    }
}

async fn whoami(config: kube::Config) -> (String, Vec<String>) {
    let client = kube::Client::try_from(config).expect("client");
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("self subject review");
    let user = review.status.and_then(|s| s.user_info).expect("user info");
    (user.username.unwrap_or_default(), user.groups.unwrap_or_default())
}

/// CN and validity of the certificate embedded in a host kubeconfig.
fn certificate_in(kubeconfig: &std::path::Path) -> (String, enroll::Validity) {
    use base64::Engine as _;
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let data = kc.auth_infos[0]
        .auth_info
        .as_ref()
        .and_then(|a| a.client_certificate_data.clone())
        .expect("embedded certificate");
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64");
    enroll::read_certificate(&pem).expect("certificate")
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[tokio::test]
async fn a_fresh_token_enrols_once_and_the_host_renews_itself() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool = env.create_namespace("enroll").await;
    let (token, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, Some("web-1")).await;

    let opts = options(env, "web-1", Some(bootstrap.clone()));
    let config = enroll::ensure_identity(&opts).await.expect("enrollment");
    let (user, groups) = whoami(config).await;
    assert_eq!(user, "byoh:host:web-1");
    assert!(groups.contains(&identity::HOSTS_GROUP.to_string()), "{groups:?}");
    assert_eq!(mode(&opts.kubeconfig), 0o600);
    assert_eq!(mode(&opts.state_dir.join(enroll::KEY_FILE)), 0o600);
    assert_eq!(mode(&opts.state_dir), 0o700);
    // The request asked for the agent's lifetime (30 days), not the signer's year.
    let (_, v) = certificate_in(&opts.kubeconfig);
    let lifetime = v.not_after - v.not_before;
    let days30 = i64::try_from(enroll::DEFAULT_CERTIFICATE_LIFETIME.as_secs()).expect("secs");
    assert!(
        (days30..=days30 + 300).contains(&lifetime),
        "lifetime {lifetime}s"
    );

    // The spent token outlives the approval until the host has registered: the agent reads its
    // signed request with the token's identity, which must not vanish before it has.
    let secrets = Api::<Secret>::namespaced(env.client().await, identity::TOKEN_NAMESPACE);
    let spent = secrets
        .get_opt(&token.secret_name())
        .await
        .expect("read the token Secret")
        .expect("the spent token is kept until its host registers");
    assert!(
        spent.annotations().contains_key(identity::TOKEN_SPENT_BY),
        "{:?}",
        spent.annotations()
    );

    // The host may register in its pool, and only there.
    let client =
        kube::Client::try_from(enroll::ensure_identity(&opts).await.expect("identity")).expect("client");
    enrol::register(env, &client, &pool, "web-1").await;
    let elsewhere = env.create_namespace("enroll-other").await;
    let refused = Api::<ByoHost>::namespaced(client, &elsewhere)
        .create(&PostParams::default(), &ByoHost::registered("web-1", &elsewhere))
        .await
        .expect_err("the host may not register in another pool");
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 403),
        "{refused:?}"
    );

    // Registered, the host holds its certificate: the spent token's Secret goes, so the token
    // no longer even authenticates.
    wait_for(
        "the spent token's Secret to be deleted",
        Duration::from_secs(30),
        || {
            let secrets = secrets.clone();
            let name = token.secret_name();
            async move {
                match secrets.get_opt(&name).await {
                    Ok(None) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    let again = options(env, "web-1", Some(bootstrap));
    match enroll::ensure_identity(&again).await {
        Err(Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 401 => {}
        Err(Error::Denied { reason, .. }) if reason == "TokenNotFound" || reason == "TokenSpent" => {}
        other => panic!("a spent token enrolled again: {other:?}"),
    }

    // A valid certificate is reused as it is.
    let before = std::fs::read(&opts.kubeconfig).expect("kubeconfig");
    enroll::ensure_identity(&opts).await.expect("reuse");
    assert_eq!(std::fs::read(&opts.kubeconfig).expect("kubeconfig"), before);

    // Renewal with the host's own identity, for the shortest lifetime the API server allows.
    let renewed = enroll::renew(&opts, Some(Duration::from_secs(600)))
        .await
        .expect("renewal");
    assert_eq!(whoami(renewed).await.0, "byoh:host:web-1");
    let (cn, v) = certificate_in(&opts.kubeconfig);
    assert_eq!(cn, "byoh:host:web-1");
    let lifetime = v.not_after - v.not_before;
    // The signer backdates by up to 5 minutes.
    assert!((600..=900).contains(&lifetime), "lifetime {lifetime}s");
    assert_eq!(mode(&opts.kubeconfig), 0o600);

    // Once the host is removed (its pool RoleBinding goes with its ByoHost), it cannot keep
    // itself a certificate: the renewal is denied, and the certificate it holds stays as it was.
    let bindings = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(env.client().await, &pool);
    bindings
        .delete("byoh:host:web-1", &Default::default())
        .await
        .expect("remove the host's pool binding");
    let kept = std::fs::read(&opts.kubeconfig).expect("kubeconfig");
    match enroll::renew(&opts, Some(Duration::from_secs(600))).await {
        Err(Error::Denied { reason, message, .. }) if reason == "HostRemoved" => {
            assert!(message.contains("bootsmanctl hosts token"), "{message}");
        }
        other => panic!("a removed host renewed its certificate: {other:?}"),
    }
    assert_eq!(std::fs::read(&opts.kubeconfig).expect("kubeconfig"), kept);
}

#[tokio::test]
async fn a_token_for_one_host_is_denied_to_another() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool = env.create_namespace("enroll-x").await;
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, Some("host-x")).await;
    let opts = options(env, "host-y", Some(bootstrap));
    match enroll::ensure_identity(&opts).await {
        Err(Error::Denied { reason, message, .. }) => {
            assert_eq!(reason, "WrongHost", "{message}");
        }
        other => panic!("host-y enrolled with host-x's token: {other:?}"),
    }
    assert!(!opts.kubeconfig.exists());
}

#[tokio::test]
async fn forged_requests_are_denied_with_a_reason() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool = env.create_namespace("enroll-deny").await;
    let good = |h: &str| enrol::csr_pem(&enrol::host_user(h), &[identity::HOSTS_GROUP]);
    let client_auth = ["client auth"];

    // Host a renewing as host b.
    let host_a = env.client_for("byoh:host:a", &[identity::HOSTS_GROUP]).await;
    let csr = enrol::submit(&host_a, good("b"), enroll::SIGNER, &client_auth).await;
    assert_eq!(enrol::decision(env, &csr).await, Err("OtherHost".into()));

    // A user without a token asking for a host identity.
    let admin = env.client().await;
    let csr = enrol::submit(&admin, good("c"), enroll::SIGNER, &client_auth).await;
    assert_eq!(enrol::decision(env, &csr).await, Err("NoToken".into()));

    // With a valid token: extra usages, another signer, a wrong O. Each is denied before the
    // token is spent, so one token serves all three.
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, None).await;
    let token = enrol::client_of(&bootstrap).await;
    let csr = enrol::submit(&token, good("d"), enroll::SIGNER, &["client auth", "server auth"]).await;
    assert_eq!(enrol::decision(env, &csr).await, Err("WrongUsages".into()));
    let csr = enrol::submit(&token, good("d"), "example.com/host-signer", &client_auth).await;
    assert_eq!(enrol::decision(env, &csr).await, Err("WrongSigner".into()));
    let wrong_o = enrol::csr_pem(&enrol::host_user("d"), &["byoh:admins"]);
    let csr = enrol::submit(&token, wrong_o, enroll::SIGNER, &client_auth).await;
    assert_eq!(enrol::decision(env, &csr).await, Err("WrongSubject".into()));
    // A certificate for the signer's default lifetime (a year), or for longer than 30 days.
    for lifetime in [None, Some(31 * 24 * 3600)] {
        let csr = enrol::submit_for(&token, good("d"), enroll::SIGNER, &client_auth, lifetime).await;
        assert_eq!(
            enrol::decision(env, &csr).await,
            Err("LifetimeTooLong".into()),
            "{lifetime:?}"
        );
    }
    // And the token is still good for a correct request.
    let csr = enrol::submit(&token, good("d"), enroll::SIGNER, &client_auth).await;
    assert_eq!(enrol::decision(env, &csr).await, Ok(()));
}

/// A host, or a token's holder, reads only the certificate requests it made: it may `get` a
/// request by its name, which only the requester knows (32 random hex digits), and may neither
/// list nor watch them to learn the names, pools and certificates of other hosts.
#[tokio::test]
async fn a_host_reads_only_its_own_certificate_requests() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool = env.create_namespace("enroll-csr-reads").await;
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, Some("reader-1")).await;
    let opts = options(env, "reader-1", Some(bootstrap));
    let host =
        kube::Client::try_from(enroll::ensure_identity(&opts).await.expect("enrollment")).expect("client");

    let admin = Api::<CertificateSigningRequest>::all(env.client().await);
    let own: Vec<String> = admin
        .list(&ListParams::default())
        .await
        .expect("list CSRs as admin")
        .items
        .into_iter()
        .map(|c| c.name_any())
        .filter(|n| n.starts_with("byoh-host-reader-1-"))
        .collect();
    let [own] = own.as_slice() else {
        panic!("one request of reader-1 expected: {own:?}")
    };
    let suffix = own.trim_start_matches("byoh-host-reader-1-");
    assert!(
        suffix.len() == 32 && suffix.bytes().all(|b| b.is_ascii_hexdigit()),
        "the request's name is guessable: {own}"
    );

    // The host reads its own request by name, but cannot list or watch requests.
    let as_host = Api::<CertificateSigningRequest>::all(host);
    as_host.get(own).await.expect("the host reads its own request");
    let forbidden = |r: Result<(), kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: {other:?}"),
    };
    forbidden(
        as_host.list(&ListParams::default()).await.map(|_| ()),
        "a host listed certificate requests",
    );
    forbidden(
        as_host
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .map(|_| ()),
        "a host watched certificate requests",
    );
    // Nor can a token's holder, before its host is enrolled.
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, Some("reader-2")).await;
    let as_token = Api::<CertificateSigningRequest>::all(enrol::client_of(&bootstrap).await);
    forbidden(
        as_token.list(&ListParams::default()).await.map(|_| ()),
        "a token's holder listed certificate requests",
    );
}

#[tokio::test]
async fn a_token_for_a_missing_pool_is_denied() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, "no-such-pool", None).await;
    let opts = options(env, "web-2", Some(bootstrap));
    match enroll::ensure_identity(&opts).await {
        Err(Error::Denied { reason, .. }) => assert_eq!(reason, "PoolNotFound"),
        other => panic!("enrolled into a pool that does not exist: {other:?}"),
    }
}

/// The attack of a pool token's holder: enrol under the name of a host that exists (in the same
/// pool or another) to get its certificate, its bootstrap Secret and its ByoHost. Every way is
/// denied with `NameInUse`; only `bootsmanctl hosts replace` for the host's own pool takes the
/// name over.
#[tokio::test]
async fn a_pool_token_cannot_take_over_an_existing_host_name() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool_a = env.create_namespace("takeover-a").await;
    let pool_b = env.create_namespace("takeover-b").await;
    let victim = "victim-1";

    // The victim enrols and registers in pool A.
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool_a, Some(victim)).await;
    let config = enroll::ensure_identity(&options(env, victim, Some(bootstrap)))
        .await
        .expect("the victim enrols");
    Api::<ByoHost>::namespaced(kube::Client::try_from(config).expect("client"), &pool_a)
        .create(&PostParams::default(), &ByoHost::registered(victim, &pool_a))
        .await
        .expect("the victim registers");

    let attempt = |pool: String, replace: bool, pinned: bool| async move {
        let (_, bootstrap) = if replace {
            enrol::replacement_kubeconfig(env, &pool, victim).await
        } else {
            enrol::bootstrap_kubeconfig(env, &pool, pinned.then_some(victim)).await
        };
        enroll::ensure_identity(&options(env, victim, Some(bootstrap))).await
    };
    for (what, pool, replace, pinned, hint) in [
        (
            "another pool's token",
            pool_b.clone(),
            false,
            false,
            "unique across pools",
        ),
        (
            "the victim's own pool's token",
            pool_a.clone(),
            false,
            false,
            "bootsmanctl hosts replace",
        ),
        (
            "a token pinned to the name",
            pool_a.clone(),
            false,
            true,
            "bootsmanctl hosts replace",
        ),
        (
            "a replacement token of another pool",
            pool_b.clone(),
            true,
            true,
            "unique across pools",
        ),
    ] {
        match attempt(pool, replace, pinned).await {
            Err(Error::Denied { reason, message, .. }) => {
                assert_eq!(reason, "NameInUse", "{what}: {message}");
                assert!(
                    message.contains(&format!("ByoHost {pool_a}/{victim}")),
                    "{what}: {message}"
                );
                assert!(message.contains(hint), "{what}: {message}");
            }
            other => panic!("{what} took over host {victim}: {other:?}"),
        }
    }

    // The admin's replacement for the victim's pool takes the name over.
    let config = attempt(pool_a.clone(), true, true)
        .await
        .expect("the replacement enrols");
    assert_eq!(whoami(config).await.0, format!("byoh:host:{victim}"));
}

/// The same attack on a host that has enrolled but not registered yet: no ByoHost holds its name,
/// only its pool RoleBinding and its certificate. A token of another pool or of its own is denied
/// while the binding stands, and again once an admin has deleted the binding, because the
/// unexpired certificate still holds the name; each denial names what holds it.
#[tokio::test]
async fn a_name_held_only_by_a_pool_binding_or_a_certificate_is_not_free() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool_a = env.create_namespace("held-a").await;
    let pool_b = env.create_namespace("held-b").await;
    let victim = "unregistered-1";
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool_a, Some(victim)).await;
    enroll::ensure_identity(&options(env, victim, Some(bootstrap)))
        .await
        .expect("the victim enrols");
    let hosts = Api::<ByoHost>::all(env.client().await);
    let named = ListParams::default().fields(&format!("metadata.name={victim}"));
    assert!(hosts.list(&named).await.expect("list").items.is_empty());

    let attempt = |pool: String| async move {
        let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, None).await;
        enroll::ensure_identity(&options(env, victim, Some(bootstrap))).await
    };
    let binding = format!("the pool RoleBinding {pool_a}/{}", identity::host_user(victim));
    let certificate = "a certificate issued through CSR ";
    for (phase, holders, absent) in [
        (
            "while the binding stands",
            vec![binding.as_str(), certificate],
            None,
        ),
        (
            "after the binding is deleted",
            vec![certificate],
            Some(binding.as_str()),
        ),
    ] {
        if absent.is_some() {
            Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(env.client().await, &pool_a)
                .delete(&identity::host_user(victim), &Default::default())
                .await
                .expect("the admin deletes the pool binding");
        }
        for pool in [&pool_a, &pool_b] {
            match attempt(pool.clone()).await {
                Err(Error::Denied { reason, message, .. }) => {
                    assert_eq!(reason, "NameInUse", "{phase}, pool {pool}: {message}");
                    for h in &holders {
                        assert!(message.contains(h), "{phase}, pool {pool}: {message}");
                    }
                    if let Some(gone) = absent {
                        assert!(!message.contains(gone), "{phase}, pool {pool}: {message}");
                    }
                }
                other => panic!("{phase}, a token of pool {pool} took over {victim}: {other:?}"),
            }
        }
    }
}

/// The attack of a host an admin is removing: it keeps renewing its certificate. A host whose
/// binding no ByoHost has taken over yet, a host whose ByoHost is being deleted (held here by a
/// finalizer, so its pool RoleBinding still exists) and a host whose ByoHost is gone are each
/// denied, with the reason, and the certificate it holds stays as it was.
#[tokio::test]
async fn a_host_being_removed_cannot_renew_its_certificate() {
    let env = TestEnv::shared().await;
    enrol::apply_host_rbac(env);
    enrol::start_approver(env).await;
    let pool = env.create_namespace("renew-removed").await;
    let host = "leaving-1";
    let (_, bootstrap) = enrol::bootstrap_kubeconfig(env, &pool, Some(host)).await;
    let opts = options(env, host, Some(bootstrap));
    let config = enroll::ensure_identity(&opts).await.expect("enrollment");
    let denied = |expected: &'static str| {
        let opts = &opts;
        async move {
            let kept = std::fs::read(&opts.kubeconfig).expect("kubeconfig");
            match enroll::renew(opts, Some(Duration::from_secs(600))).await {
                Err(Error::Denied { reason, message, .. }) if reason == expected => {
                    assert!(message.contains(host), "{message}");
                }
                other => panic!("expected a {expected} denial, got {other:?}"),
            }
            assert_eq!(std::fs::read(&opts.kubeconfig).expect("kubeconfig"), kept);
        }
    };

    // Enrolled, its binding not yet owned by a ByoHost.
    denied("HostNotAdopted").await;

    // Registered and owning its binding: renewed.
    let client = kube::Client::try_from(config).expect("client");
    enrol::register(env, &client, &pool, host).await;
    enroll::renew(&opts, Some(Duration::from_secs(600)))
        .await
        .expect("a registered host renews");

    // Being deleted: an admin's finalizer holds the ByoHost, and with it the binding.
    let admin = env.client().await;
    let hosts = Api::<ByoHost>::namespaced(admin.clone(), &pool);
    let hold = serde_json::json!({"metadata": {"finalizers": ["test.bootsman.io/hold"]}});
    hosts
        .patch(
            host,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&hold),
        )
        .await
        .expect("hold the ByoHost");
    hosts
        .delete(host, &Default::default())
        .await
        .expect("delete the ByoHost");
    denied("HostDeleting").await;

    // Gone: its binding goes with it.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    hosts
        .patch(
            host,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&release),
        )
        .await
        .expect("release the ByoHost");
    let bindings = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin, &pool);
    wait_for(
        "the binding to go with its ByoHost",
        Duration::from_secs(60),
        || {
            let bindings = bindings.clone();
            async move {
                match bindings.get_opt(&identity::host_user(host)).await {
                    Ok(None) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    denied("HostRemoved").await;
}
