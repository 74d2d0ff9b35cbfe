//! Leader election against the real API server: one leader at a time, a fast hand-over when the
//! leader stops, a takeover only after a vanished holder's lease has run out, and a clear error
//! when RBAC forbids the Lease.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bootsman_runtime::leader::LeaderElection;
use bootsman_testenv::{TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const LEASE: &str = "bootsman-test";
const WAIT: Duration = Duration::from_secs(30);

/// Short durations: 3 s lease, 2 s renew deadline, 500 ms renew interval.
fn election(client: Client, ns: &str, identity: &str) -> LeaderElection {
    LeaderElection::new(client, ns, LEASE, identity)
        .with_lease_duration(Duration::from_secs(3))
        .with_renew_deadline(Duration::from_secs(2))
        .with_renew_interval(Duration::from_millis(500))
}

async fn holder(api: &Api<Lease>) -> Option<String> {
    api.get(LEASE).await.unwrap().spec.and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn one_leader_and_a_fast_hand_over() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("leader").await;
    let client = env.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);

    let (a, a_handle) = election(client.clone(), &ns, "replica-a").start().await.unwrap();
    let (b, b_handle) = election(client.clone(), &ns, "replica-b").start().await.unwrap();
    let rxs: [&watch::Receiver<bool>; 2] = [&a, &b];

    let leader = wait_for("a leader", WAIT, || async {
        match (*a.borrow(), *b.borrow()) {
            (true, false) => Ok(0),
            (false, true) => Ok(1),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
    let names = ["replica-a", "replica-b"];
    assert_eq!(holder(&leases).await.as_deref(), Some(names[leader]));

    // Over two lease durations the leader keeps renewing and nobody else ever leads.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert!(*rxs[leader].borrow(), "the leader lost the lease while renewing");
        assert!(!*rxs[1 - leader].borrow(), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let transitions = leases.get(LEASE).await.unwrap().spec.unwrap().lease_transitions;

    // Stop the leader: it lets go of the lease and the standby takes over quickly.
    let (leader_handle, standby_handle) = if leader == 0 {
        (a_handle, b_handle)
    } else {
        (b_handle, a_handle)
    };
    let stopped = Instant::now();
    leader_handle.stop().await.unwrap();
    assert!(!*rxs[leader].borrow(), "a stopped election still says leader");
    wait_for("the standby to lead", Duration::from_secs(10), || async {
        if *rxs[1 - leader].borrow() {
            Ok(())
        } else {
            Err("standby".to_string())
        }
    })
    .await;
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "hand-over took {:?}: the lease was not released",
        stopped.elapsed()
    );
    let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some(names[1 - leader]));
    assert_eq!(lease.lease_transitions, transitions.map(|t| t + 1));
    assert_eq!(lease.lease_duration_seconds, Some(3));

    // Dropping the handle releases too.
    drop(standby_handle);
    wait_for("the lease to be released", WAIT, || async {
        match holder(&leases).await {
            None => Ok(()),
            Some(h) => Err(h),
        }
    })
    .await;
    assert!(!*rxs[1 - leader].borrow());
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

async fn wait_leader(rx: &watch::Receiver<bool>, want: bool, timeout: Duration) {
    wait_for(&format!("leadership {want}"), timeout, || async {
        if *rx.borrow() == want {
            Ok(())
        } else {
            Err(format!("{}", !want))
        }
    })
    .await;
}

#[tokio::test]
async fn a_leader_that_sees_another_holder_stops_leading_at_once() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("leader-steal").await;
    let client = env.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let (rx, handle) = election(client, &ns, "replica-a").start().await.unwrap();
    wait_leader(&rx, true, WAIT).await;

    // Someone else (a misbehaving replica, an admin) writes the lease over ours.
    let mut lease = leases.get(LEASE).await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("thief".into());
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(30);
    leases
        .replace(LEASE, &PostParams::default(), &lease)
        .await
        .unwrap();

    wait_leader(&rx, false, Duration::from_secs(5)).await;
    // It stands by and leaves the thief's lease alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!*rx.borrow());
    assert_eq!(holder(&leases).await.as_deref(), Some("thief"));
    handle.stop().await.unwrap();
    assert_eq!(
        holder(&leases).await.as_deref(),
        Some("thief"),
        "released a lease it did not hold"
    );
}

/// A TCP proxy to the API server that can be cut: from then on connections hang, as with a
/// network partition.
async fn cuttable_proxy(upstream: String) -> (String, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cut = Arc::new(AtomicBool::new(false));
    let flag = cut.clone();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = listener.accept().await.unwrap();
            let upstream = upstream.clone();
            let flag = flag.clone();
            tokio::spawn(async move {
                if flag.load(Ordering::SeqCst) {
                    // Hold the connection open and never answer.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    drop(inbound);
                    return;
                }
                let mut outbound = TcpStream::connect(upstream).await.unwrap();
                let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                let watch_cut = async {
                    while !flag.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                };
                let cut_now = tokio::select! {
                    _ = copy => false,
                    () = watch_cut => true,
                };
                if cut_now {
                    // Stop forwarding but keep both ends open: requests hang.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    drop((inbound, outbound));
                }
            });
        }
    });
    (format!("https://{addr}"), cut)
}

#[tokio::test]
async fn a_partitioned_leader_gives_up_before_its_lease_can_be_taken() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("leader-partition").await;
    let admin = env.client().await;

    // Replica a talks to the API server through a proxy we can cut.
    let kubeconfig = Kubeconfig::read_from(env.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let upstream = config.cluster_url.authority().unwrap().to_string();
    let (proxy_url, cut) = cuttable_proxy(upstream).await;
    config.cluster_url = proxy_url.parse().unwrap();
    let partitioned = Client::try_from(config).unwrap();

    let (a, a_handle) = election(partitioned, &ns, "replica-a").start().await.unwrap();
    wait_leader(&a, true, WAIT).await;
    let (b, b_handle) = election(admin.clone(), &ns, "replica-b").start().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!*b.borrow());

    cut.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    // a gives up within its renew deadline (2 s, plus one renew interval of slack) ...
    let mut a_watch = a.clone();
    let mut b_watch = b.clone();
    let lost_at = tokio::time::timeout(Duration::from_secs(10), async {
        a_watch.wait_for(|held| !*held).await.unwrap();
        Instant::now()
    })
    .await
    .unwrap();
    assert!(
        lost_at - cut_at < Duration::from_millis(3_500),
        "a still led {:?} after the partition",
        lost_at - cut_at
    );
    // ... and only then, once the 3 s lease has run out unrenewed, b takes over.
    tokio::time::timeout(Duration::from_secs(15), b_watch.wait_for(|held| *held))
        .await
        .unwrap()
        .unwrap();
    let won_at = Instant::now();
    assert!(lost_at < won_at, "two leaders at once");
    assert!(!*a.borrow());
    assert_eq!(
        holder(&Api::namespaced(admin, &ns)).await.as_deref(),
        Some("replica-b")
    );

    b_handle.stop().await.unwrap();
    // a cannot reach the API server to release; stopping still ends within its renew deadline.
    tokio::time::timeout(Duration::from_secs(10), a_handle.stop())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn losing_rbac_ends_the_election_with_an_error() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("leader-revoke").await;
    let admin = env.client().await;
    let user = "system:serviceaccount:bootsman:replica";
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &Role {
                metadata: ObjectMeta {
                    name: Some("leases".into()),
                    ..ObjectMeta::default()
                },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["coordination.k8s.io".into()]),
                    resources: Some(vec!["leases".into()]),
                    verbs: vec!["get".into(), "create".into(), "update".into()],
                    ..PolicyRule::default()
                }]),
            },
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &ns);
    bindings
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some("leases".into()),
                    ..ObjectMeta::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: "leases".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "User".into(),
                    name: user.into(),
                    ..Subject::default()
                }]),
            },
        )
        .await
        .unwrap();

    let client = env.client_for(user, &[]).await;
    let (rx, mut handle) = election(client, &ns, "replica-a").start().await.unwrap();
    wait_leader(&rx, true, WAIT).await;

    bindings.delete("leases", &DeleteParams::default()).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(15), &mut handle)
        .await
        .expect("the election should end when RBAC forbids the lease");
    let err = result.unwrap_err();
    assert!(matches!(err.label(), "get_lease" | "update_lease"), "{err}");
    assert!(!*rx.borrow());
    assert!(handle.is_finished());
}

#[tokio::test]
async fn a_vanished_holder_is_replaced_only_after_its_lease_runs_out() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("leader-stale").await;
    let client = env.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    // A holder that renewed just now and then died without releasing.
    leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE.into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("ghost".into()),
                    lease_duration_seconds: Some(3),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(4),
                    ..LeaseSpec::default()
                }),
            },
        )
        .await
        .unwrap();

    let started = Instant::now();
    let (rx, handle) = election(client, &ns, "replica-a").start().await.unwrap();
    wait_for("the candidate to take over", WAIT, || async {
        if *rx.borrow() {
            Ok(())
        } else {
            Err("not leader".to_string())
        }
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(2_900),
        "took over a valid lease after {:?}",
        started.elapsed()
    );
    let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("replica-a"));
    assert_eq!(lease.lease_transitions, Some(5));
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn forbidden_lease_fails_at_start() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("leader-rbac").await;
    let nobody = env.client_for("nobody", &[]).await;
    let err = election(nobody, &ns, "replica-a").start().await.unwrap_err();
    assert_eq!(err.label(), "get_lease");
    match err.kube_error() {
        Some(kube::Error::Api(status)) => assert!(status.is_forbidden(), "{status:?}"),
        other => panic!("expected a forbidden API error, got {other:?}"),
    }
}

#[tokio::test]
async fn invalid_durations_fail_at_start() {
    let env = TestEnv::shared().await;
    let client = env.client().await;
    let err = LeaderElection::new(client, "default", LEASE, "replica-a")
        .with_lease_duration(Duration::from_secs(2))
        .with_renew_deadline(Duration::from_secs(2))
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.label(), "leader_config");
}
