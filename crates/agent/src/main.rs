//! `byoh-agent`: see the crate documentation and the README for flags, metrics and Events.
//! Every flag can also be set from the environment (`BYOH_*`), so a systemd `EnvironmentFile`
//! configures the agent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bootsman_api::identity::{is_dns_subdomain, is_label_value};
use bootsman_api::labels::HOST_OWNED_PREFIX;
use bootsman_runtime::metrics::Metrics;
use byoh_agent::agent::{self, AgentMetrics};
use byoh_agent::enroll;
use byoh_agent::executor::Executor;
use byoh_agent::root::Root;
use byoh_agent::state::StateDir;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::watch;

/// Host agent of Bootsman: registers this server in a pool, heartbeats, runs bootstrap data and
/// resets the server on release.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The agent's own identity (client certificate of `byoh:host:<name>`).
    #[arg(
        long,
        env = "BYOH_KUBECONFIG",
        default_value = "/var/lib/byoh-agent/kubeconfig"
    )]
    kubeconfig: PathBuf,
    /// A bootstrap kubeconfig (from `bootsmanctl hosts token`) used to enrol when the identity is
    /// missing or expired.
    #[arg(long, env = "BYOH_BOOTSTRAP_KUBECONFIG")]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// Namespace of the pool the host joins.
    #[arg(long, env = "BYOH_NAMESPACE")]
    namespace: String,
    /// Host name (an RFC 1123 subdomain); the kernel's host name when not set.
    #[arg(long, env = "BYOH_NAME")]
    name: Option<String>,
    /// A label `name=value` the host reports about itself, set on the ByoHost as
    /// `host.bootsman.io/name=value` (repeatable; comma-separated in the environment). Labels
    /// that place machines are an admin's, set on the ByoHost.
    #[arg(long = "label", env = "BYOH_LABELS", value_delimiter = ',', value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Every path the bootstrap or reset touches is confined to this directory.
    #[arg(long, env = "BYOH_ROOT", default_value = "/")]
    root: PathBuf,
    /// Where progress journals, logs and the identity live.
    #[arg(long, env = "BYOH_STATE_DIR", default_value = "/var/lib/byoh-agent")]
    state_dir: PathBuf,
    /// How often the heartbeat Lease is renewed (it lasts four times as long), e.g. 10s.
    #[arg(long, env = "BYOH_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// Longest one bootstrap command may run, e.g. 10m.
    #[arg(long, env = "BYOH_COMMAND_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    command_timeout: Duration,
    /// Address of the /livez, /readyz and /metrics server.
    #[arg(long, env = "BYOH_METRICS_BIND_ADDRESS", default_value = "127.0.0.1:9440")]
    metrics_bind_address: SocketAddr,
    /// How long enrolment waits for the host's certificate request to be approved, e.g. 15m.
    #[arg(long, env = "BYOH_APPROVAL_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    approval_timeout: Duration,
    /// Lifetime the host's certificate requests ask for, e.g. 720h (30 days, the default). A host
    /// switched off for longer needs a new token. It may not exceed the provider's
    /// `--max-host-certificate-lifetime` (30 days by default), else the request is denied.
    #[arg(long, env = "BYOH_CERTIFICATE_LIFETIME", default_value = "720h", value_parser = parse_lifetime)]
    certificate_lifetime: Duration,
    /// Log format: json, text, or auto (JSON unless stderr is a terminal).
    #[arg(long, env = "BYOH_LOG_FORMAT", default_value = "auto")]
    log_format: bootsman_runtime::telemetry::Format,
}

/// A `--label`: `name=value` becomes `host.bootsman.io/name=value`; a key under another prefix
/// is refused, because placement labels are the admins'.
fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not key=value"))?;
    let k = match k.split_once('/') {
        None => format!("{HOST_OWNED_PREFIX}{k}"),
        Some(_) if k.starts_with(HOST_OWNED_PREFIX) => k.to_string(),
        Some(_) => {
            return Err(format!(
                "label key {k:?}: a host sets only labels under {HOST_OWNED_PREFIX} (a key without a \
                 prefix is put there); labels that place machines, such as role or \
                 topology.kubernetes.io/zone, are set by an admin on the ByoHost (rule: host-owned-labels)"
            ));
        }
    };
    let k = k.as_str();
    let name = k.rsplit('/').next().unwrap_or(k);
    let name_ok = !name.is_empty() && is_label_value(name);
    let prefix_ok = match k.rsplit_once('/') {
        Some((p, _)) => is_dns_subdomain(p),
        None => true,
    };
    if !name_ok || !prefix_ok {
        return Err(format!(
            "label key {k:?} must be [prefix/]name: name at most 63 characters of a-z, A-Z, 0-9, \
             '-', '_', '.', starting and ending alphanumeric; prefix an RFC 1123 subdomain"
        ));
    }
    if !is_label_value(v) {
        return Err(format!(
            "label value {v:?} must be empty or at most 63 characters of a-z, A-Z, 0-9, '-', '_', \
             '.', starting and ending alphanumeric"
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

/// A duration of more than zero (`bootsman_runtime::duration`: `500ms`, `90s`, `15m`, `1h30m`,
/// `2d`, or plain seconds).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = bootsman_runtime::duration::parse(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} must be more than zero"));
    }
    Ok(d)
}

/// A certificate lifetime: a duration of at least 10 minutes (the signer's minimum).
fn parse_lifetime(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(600) {
        return Err(format!(
            "{s:?} is shorter than 10m, the shortest certificate the signer issues"
        ));
    }
    if d.as_secs() > i32::MAX as u64 {
        return Err(format!("{s:?} is longer than expirationSeconds can say"));
    }
    Ok(d)
}

/// Whether the kubeconfig at `path` holds a client certificate that is valid now.
fn identity_valid(path: &Path) -> anyhow::Result<()> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    let auth = kc
        .auth_infos
        .first()
        .and_then(|a| a.auth_info.clone())
        .with_context(|| format!("{} has no user", path.display()))?;
    let pem = if let Some(data) = &auth.client_certificate_data {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .context("client-certificate-data is not base64")?
    } else if let Some(file) = &auth.client_certificate {
        let file = Path::new(file);
        let file = if file.is_relative() {
            path.parent().unwrap_or(Path::new(".")).join(file)
        } else {
            file.to_path_buf()
        };
        std::fs::read(&file).with_context(|| format!("read {}", file.display()))?
    } else {
        bail!("{} has no client certificate", path.display());
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).context("client certificate is not PEM")?;
    let cert = pem.parse_x509().context("client certificate is not X.509")?;
    let not_after = cert.validity().not_after.timestamp();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    if not_after <= now {
        bail!("the client certificate in {} expired", path.display());
    }
    Ok(())
}

async fn client_from(path: &Path) -> anyhow::Result<kube::Client> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("load {}", path.display()))?;
    Ok(kube::Client::try_from(cfg)?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    bootsman_runtime::telemetry::init_with("info,kube=warn", args.log_format);
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "byoh-agent stopped");
            eprintln!("byoh-agent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let name = match args.name.clone() {
        Some(n) => n,
        None => byoh_agent::inventory::kernel_hostname()
            .context("--name is not set and the kernel host name is unknown")?,
    };
    agent::check_host_name(&name).map_err(|rule| anyhow::anyhow!("--name: {rule}"))?;
    // The pool is a namespace: an RFC 1123 label, stricter than a host name (no dots).
    bootsman_api::identity::validate_pool(&args.namespace)
        .map_err(|rule| anyhow::anyhow!("--namespace: {rule}"))?;
    if !args.root.is_dir() {
        bail!("--root: {} is not a directory", args.root.display());
    }
    let root = Root::new(&args.root).context("--root")?;
    let state = StateDir::open(&args.state_dir).context("--state-dir")?;
    let labels: BTreeMap<String, String> = args.labels.iter().cloned().collect();

    let enroll_opts = enroll::Options {
        state_dir: args.state_dir.clone(),
        kubeconfig: args.kubeconfig.clone(),
        bootstrap_kubeconfig: args.bootstrap_kubeconfig.clone(),
        host_name: name.clone(),
        approval_timeout: args.approval_timeout,
        certificate_lifetime: args.certificate_lifetime,
    };
    let mut client = match identity_valid(&args.kubeconfig) {
        Ok(()) => client_from(&args.kubeconfig).await.context("--kubeconfig")?,
        Err(why) => {
            tracing::info!(reason = format!("{why:#}"), "no usable identity; enrolling");
            let cfg = enroll::ensure_identity(&enroll_opts)
                .await
                .context("--kubeconfig/--bootstrap-kubeconfig: enrolment failed")?;
            kube::Client::try_from(cfg)?
        }
    };

    let metrics = Arc::new(Metrics::new()?);
    let agent_metrics = AgentMetrics::register(metrics.registry())?;

    let stop_rx = bootsman_runtime::lifecycle::stop_on_signals(
        "draining: the watch stops, a running command is abandoned with its progress kept",
    )
    .context("install the SIGTERM handler")?;
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let server = bootsman_runtime::server::bind(args.metrics_bind_address)
        .await
        .context("--metrics-bind-address")?;
    let (ready_tx, ready_rx) = watch::channel(false);
    let server_task = tokio::spawn(server.serve(metrics.clone(), ready_rx, stopped(stop_rx.clone())));
    let ready = ready_tx.clone();
    // Ready (`/readyz`) once the host has registered.
    let registered_tx = {
        let (tx, mut rx) = watch::channel(false);
        tokio::spawn(async move {
            if rx.wait_for(|r| *r).await.is_ok() {
                ready.send_replace(true);
                tracing::info!(
                    seconds = started.elapsed().as_secs_f64(),
                    "registered after start"
                );
            }
        });
        tx
    };
    // A renewed certificate, or a rehome to another cluster, restarts the protocol with a client
    // of the new kubeconfig once the action in progress has finished (the old certificate stays
    // valid meanwhile): a running bootstrap command is never cut short by either.
    let (renewed_tx, mut renewed_rx) = watch::channel(0u64);
    let opts = agent::Options {
        name,
        namespace: args.namespace.clone(),
        labels,
        heartbeat_interval: args.heartbeat_interval,
        executor: Executor {
            root,
            state,
            command_timeout: args.command_timeout,
        },
        identity: Some(enroll_opts.clone()),
        identity_changed: Some(renewed_tx.clone()),
    };
    tokio::spawn({
        let enroll_opts = enroll_opts.clone();
        let stop = stop_rx.clone();
        async move {
            let r = enroll::renew_loop(
                &enroll_opts,
                |_| {
                    tracing::info!("host certificate renewed");
                    renewed_tx.send_modify(|n| *n += 1);
                },
                stopped(stop),
            )
            .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "host certificate renewal stopped");
            }
        }
    });
    let mut server = enroll::current_server(&enroll_opts).ok();
    let mut enrolled_again = false;
    let result = loop {
        // Marked seen before the watcher below is cloned from it, so that only a renewal after
        // this point restarts the run.
        renewed_rx.borrow_and_update();
        let (restart_tx, restart_rx) = watch::channel(false);
        let forward = tokio::spawn({
            let mut renewed = renewed_rx.clone();
            async move {
                if renewed.changed().await.is_ok() {
                    let _ = restart_tx.send(true);
                }
            }
        });
        let r = agent::run(
            client.clone(),
            opts.clone(),
            agent_metrics.clone(),
            registered_tx.clone(),
            stop_rx.clone(),
            restart_rx,
        )
        .await;
        forward.abort();
        if let Err(removed @ agent::Error::Removed { .. }) = &r
            && !enrolled_again
            && !*stop_rx.borrow()
            && args.bootstrap_kubeconfig.is_some()
        {
            // Removed from the pool: only a new token brings the host back.
            tracing::error!(error = %removed, "trying the bootstrap kubeconfig");
            enrolled_again = true;
            match enroll::enrol_again(&enroll_opts).await {
                Ok(cfg) => {
                    client = kube::Client::try_from(cfg)?;
                    server = enroll::current_server(&enroll_opts).ok();
                    continue;
                }
                Err(e) => tracing::error!(error = %e, "enrolling again failed"),
            }
        }
        if r.is_err() || *stop_rx.borrow() || !renewed_rx.has_changed().unwrap_or(false) {
            break r;
        }
        let now = enroll::current_server(&enroll_opts).ok();
        if now == server {
            tracing::info!("continuing with the renewed host certificate");
        } else {
            tracing::info!(from = ?server, to = ?now, "continuing with the new management cluster (rehomed)");
            server = now;
        }
        client = client_from(&args.kubeconfig).await.context("--kubeconfig")?;
    };
    // The server stops with the stop signal; on an error it is simply dropped with the process.
    if result.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(6), server_task).await;
    }
    result.map_err(Into::into)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn labels_are_host_owned_and_well_formed() {
        assert_eq!(
            parse_label("gpu=a100").unwrap(),
            (format!("{HOST_OWNED_PREFIX}gpu"), "a100".to_string())
        );
        let own = format!("{HOST_OWNED_PREFIX}rack=r1");
        assert_eq!(
            parse_label(&own).unwrap(),
            (format!("{HOST_OWNED_PREFIX}rack"), "r1".to_string())
        );
        assert_eq!(
            parse_label("gpu=").unwrap(),
            (format!("{HOST_OWNED_PREFIX}gpu"), String::new())
        );
        for (bad, says) in [
            ("gpu", "is not key=value"),
            ("topology.kubernetes.io/zone=a", "a host sets only labels under"),
            ("-gpu=a", "label key"),
            ("gpu=-a", "label value"),
            (&format!("gpu={}", "x".repeat(64)), "label value"),
        ] {
            let err = parse_label(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
