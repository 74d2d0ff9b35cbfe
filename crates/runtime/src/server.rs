//! The admin server every long-running Bootsman binary runs: `GET /livez` (the process is up),
//! `GET /readyz` (the binary says it is ready: caches synced; never tied to leadership, or
//! standbys would never become Ready) and `GET /metrics` (the Prometheus text format). Anything
//! else is 404. HTTP/1.1 only, plain text, no authentication: bind it to the pod's admin port.
//!
//! ```no_run
//! # async fn run() -> Result<(), bootsman_runtime::Error> {
//! use std::sync::Arc;
//! let metrics = Arc::new(bootsman_runtime::metrics::Metrics::new()?);
//! let (ready_tx, ready) = tokio::sync::watch::channel(false);
//! let server = bootsman_runtime::server::bind(([0, 0, 0, 0], 8080).into()).await?;
//! tokio::spawn(server.serve(metrics, ready, std::future::pending()));
//! // ... once the caches are synced:
//! ready_tx.send_replace(true);
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::Error;
use crate::metrics::Metrics;

/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish once shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The content type of plain answers.
const PLAIN_TEXT: &str = "text/plain; charset=utf-8";

/// A bound, not yet serving, admin server. Bind first to learn the port (useful with port 0),
/// then [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
}

/// Binds the admin server to `addr` (port 0 picks a free port; see [`Server::local_addr`]).
pub async fn bind(addr: SocketAddr) -> Result<Server, Error> {
    Server::bind(addr).await
}

/// Binds to `addr` and serves until `shutdown` resolves; see [`Server::serve`].
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    Server::bind(addr).await?.serve(metrics, ready, shutdown).await
}

impl Server {
    /// Binds to `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, Error> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(Self { listener, local_addr })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves `/livez`, `/readyz` (200 while `*ready.borrow()` is true, else 503) and `/metrics`
    /// until `shutdown` resolves, then stops accepting, gives open connections a few seconds to
    /// finish and returns. Failing to accept one connection is logged, not fatal.
    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        ready: watch::Receiver<bool>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let graceful = GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(addr = %self.local_addr, "serving /livez /readyz /metrics");
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Per-connection failures (aborted handshakes, too many open files)
                            // must not take the probes down; back off briefly and go on.
                            tracing::warn!(error = %e, "accepting an admin connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let metrics = metrics.clone();
                    let ready = ready.clone();
                    let service = service_fn(move |req| {
                        let response = route(&req, &metrics, &ready);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, %peer, "admin connection ended with an error");
                        }
                    });
                }
            }
        }
        drop(self.listener);
        if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("admin connections still open after the shutdown grace period");
        }
        tracing::info!(addr = %self.local_addr, "admin server stopped");
        Ok(())
    }
}

/// Answers one request.
fn route(req: &Request<Incoming>, metrics: &Metrics, ready: &watch::Receiver<bool>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if !matches!(path, "/livez" | "/readyz" | "/metrics") {
        return text(StatusCode::NOT_FOUND, "not found");
    }
    if req.method() != Method::GET {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return response;
    }
    match path {
        "/livez" => text(StatusCode::OK, "ok"),
        "/readyz" if *ready.borrow() => text(StatusCode::OK, "ok"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready"),
        _ => match metrics.try_encode() {
            Ok(body) => respond(StatusCode::OK, prometheus::TEXT_FORMAT, body),
            Err(e) => {
                tracing::error!(error = %e, "encoding metrics");
                text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics")
            }
        },
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    respond(status, PLAIN_TEXT, body)
}

fn respond(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}
