//! The admin server answers the probes and the scrape over real TCP, and stops when asked.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bootsman_runtime::metrics::Metrics;
use bootsman_runtime::server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

/// Status code, headers and body of one HTTP/1.0 request.
async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{method} {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test]
async fn probes_and_metrics() {
    let metrics = Arc::new(Metrics::new().unwrap());
    drop(metrics.reconcile_timer("byomachine"));
    metrics.reconcile_failed("byomachine", "get_host");

    let (ready_tx, ready) = watch::channel(false);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let bound = server::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let addr = bound.local_addr();
    assert_ne!(addr.port(), 0);
    let serving = tokio::spawn(bound.serve(metrics.clone(), ready, async {
        let _ = stop_rx.await;
    }));

    let (status, _, body) = request(addr, "GET", "/livez").await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    let (status, _, body) = request(addr, "GET", "/readyz").await;
    assert_eq!((status, body.as_str()), (503, "not ready"));
    ready_tx.send_replace(true);
    let (status, _, body) = request(addr, "GET", "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    let (status, head, body) = request(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    assert!(
        body.contains("bootsman_reconcile_total{controller=\"byomachine\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("bootsman_reconcile_errors_total{controller=\"byomachine\",error=\"get_host\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("bootsman_reconcile_duration_seconds_bucket"),
        "{body}"
    );

    let (status, _, _) = request(addr, "GET", "/nope").await;
    assert_eq!(status, 404);
    let (status, head, _) = request(addr, "POST", "/livez").await;
    assert_eq!(status, 405);
    assert!(head.contains("allow: get"), "{head}");

    // HTTP/1.1 keep-alive: two requests on one connection.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\nGET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut raw))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(raw.matches("HTTP/1.1 200 OK").count(), 2, "{raw}");

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
}

#[tokio::test]
async fn serve_reports_a_taken_port() {
    let taken = server::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let err = server::serve(
        taken.local_addr(),
        Arc::new(Metrics::new().unwrap()),
        watch::channel(true).1,
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "bind");
    assert!(err.to_string().contains(&taken.local_addr().to_string()), "{err}");
}
