//! `/readyz` of a controller process against the real API server: the replica that runs the
//! controllers is not ready until they report their caches listed, and a standby (another
//! replica holds the leader Lease) is ready while it waits.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bootsman_runtime::lifecycle::{self, Process, Readiness, Shutdown};
use bootsman_runtime::metrics::Metrics;
use bootsman_testenv::{TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// The status code of `GET /readyz`, or `None` while nothing listens.
async fn readyz(addr: SocketAddr) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.ok()?;
    raw.split(' ').nth(1)?.parse().ok()
}

async fn wait_readyz(addr: SocketAddr, want: u16) {
    wait_for(&format!("/readyz {want}"), Duration::from_secs(30), || async {
        match readyz(addr).await {
            Some(s) if s == want => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
}

fn process(ns: &str, leader_elect: bool) -> (Process, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", bootsman_testenv::free_port().unwrap())
        .parse()
        .unwrap();
    let p = Process {
        lease_name: "bootsman-lifecycle-test".into(),
        leader_elect,
        lease_namespace: ns.into(),
        metrics_bind_address: addr,
    };
    (p, addr)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_leader_is_ready_only_once_its_caches_have_listed() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("lifecycle").await;
    let (process, addr) = process(&ns, false);
    let (listed_tx, listed_rx) = oneshot::channel::<()>();
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let client = env.client().await;
    let task = tokio::spawn(async move {
        let controllers = |shutdown: Shutdown, ready: Readiness| async move {
            let _ = started_tx.send(());
            // "Listing" until the test says the caches are in.
            let _ = listed_rx.await;
            ready.ready();
            shutdown.await;
            Ok::<(), std::io::Error>(())
        };
        lifecycle::run(client, process, Arc::new(Metrics::new().unwrap()), controllers).await
    });
    started_rx.await.unwrap();
    wait_for("the server to answer", Duration::from_secs(10), || async {
        readyz(addr).await.ok_or("nothing listens".to_string())
    })
    .await;
    // The controllers run but have not listed: not ready, and it stays so.
    for _ in 0..5 {
        assert_eq!(readyz(addr).await, Some(503), "ready before the caches listed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    listed_tx.send(()).unwrap();
    wait_readyz(addr, 200).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_is_ready_while_another_replica_leads() {
    let env = TestEnv::shared().await;
    let ns = env.create_namespace("lifecycle").await;
    let (process, addr) = process(&ns, true);
    // Another replica holds the Lease for the next hour.
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(process.lease_name.clone()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("the-leader".into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(env.client().await, &ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let client = env.client().await;
    let task = tokio::spawn(async move {
        let controllers = |_shutdown: Shutdown, _ready: Readiness| async move {
            panic!("a standby ran the controllers");
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        };
        lifecycle::run(client, process, Arc::new(Metrics::new().unwrap()), controllers).await
    });
    wait_readyz(addr, 200).await;
    assert!(!task.is_finished(), "{:?}", task.await);
    task.abort();
}
