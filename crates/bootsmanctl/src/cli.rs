//! Flags of `bootsmanctl` and the dispatch to the library commands.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::{hosts, token};

/// Command-line tool of Bootsman.
#[derive(Debug, Parser)]
#[command(name = "bootsmanctl", version, about)]
pub struct Cli {
    /// Kubeconfig of the management cluster; `$KUBECONFIG` or `~/.kube/config` when not set.
    #[arg(long, global = true, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage the hosts of a pool.
    #[command(subcommand)]
    Hosts(HostsCommand),
}

/// `bootsmanctl hosts …`.
#[derive(Debug, Subcommand)]
pub enum HostsCommand {
    /// Issue a one-time bootstrap token for a host of a pool and print its bootstrap kubeconfig.
    Token {
        /// The pool: the namespace the host registers its ByoHost in.
        #[arg(long, short = 'n')]
        namespace: String,
        /// Restrict the token to this host name (the host's ByoHost name); any name when not set.
        #[arg(long)]
        name: Option<String>,
        /// How long the token stays valid if unused (e.g. 30m, 1h, 2d; at most 7d).
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// API server URL written into the printed kubeconfig, as the host reaches it; the
        /// management kubeconfig's server when not set.
        #[arg(long)]
        server: Option<String>,
    },
    /// Issue a one-time token that lets a new server take over host NAME, whose name is held
    /// already (a reinstalled server, or one whose identity was lost): the only way to enrol a
    /// name that a ByoHost, a pool binding or a certificate holds. Prints its bootstrap kubeconfig.
    Replace {
        /// The host name to take over.
        name: String,
        /// The pool the host lives in.
        #[arg(long, short = 'n')]
        namespace: String,
        /// How long the token stays valid if unused (e.g. 30m, 1h, 2d; at most 7d).
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// API server URL written into the printed kubeconfig, as the host reaches it.
        #[arg(long)]
        server: Option<String>,
    },
    /// List the hosts of a pool (of every pool when --namespace is not set).
    List {
        /// The pool.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
    },
}

/// Loads the client configuration from `path`, or the default one.
pub async fn load_config(path: Option<&PathBuf>) -> anyhow::Result<kube::Config> {
    match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("--kubeconfig: cannot read {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig: {} is not usable", p.display()))
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found: pass --kubeconfig or set KUBECONFIG"),
    }
}

/// Issues the token `req` asks for and writes its bootstrap kubeconfig to `out`.
async fn issue(
    kubeconfig: Option<&PathBuf>,
    req: &token::Request,
    server: Option<String>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    // Bad flags fail before any connection is made.
    token::validate(req)?;
    if let Some(s) = &server
        && !s.starts_with("https://")
    {
        anyhow::bail!("--server: {s:?} must be an https:// URL");
    }
    let config = load_config(kubeconfig).await?;
    let server = server.unwrap_or_else(|| config.cluster_url.to_string().trim_end_matches('/').to_string());
    let ca = token::ca_pem(&config);
    let client = kube::Client::try_from(config)?;
    // The approver denies a token for a pool that does not exist; say so now.
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    if namespaces
        .get_opt(&req.pool)
        .await
        .with_context(|| format!("--namespace: look up namespace {}", req.pool))?
        .is_none()
    {
        anyhow::bail!(
            "--namespace: namespace {:?} does not exist; create the pool namespace first",
            req.pool
        );
    }
    let t = token::create(&client, req).await?;
    out.write_all(token::bootstrap_kubeconfig(&server, &ca, &t).as_bytes())?;
    eprintln!(
        "issued token {} for pool {}{}, valid until {} and spent on first use",
        t.id,
        t.pool,
        match (&t.host, t.replace) {
            (Some(h), true) => format!(" (replaces host {h})"),
            (Some(h), false) => format!(" (host {h} only)"),
            _ => String::new(),
        },
        t.expiration
    );
    Ok(())
}

/// Runs a parsed command line, writing its output to `out`.
pub async fn run(cli: Cli, out: &mut impl Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Hosts(HostsCommand::Token {
            namespace,
            name,
            ttl,
            server,
        }) => {
            let req = token::Request {
                pool: namespace,
                host: name,
                ttl: token::parse_duration("--ttl", &ttl)?,
                replace: false,
            };
            issue(cli.kubeconfig.as_ref(), &req, server, out).await?;
        }
        Command::Hosts(HostsCommand::Replace {
            name,
            namespace,
            ttl,
            server,
        }) => {
            let req = token::Request {
                pool: namespace,
                host: Some(name),
                ttl: token::parse_duration("--ttl", &ttl)?,
                replace: true,
            };
            issue(cli.kubeconfig.as_ref(), &req, server, out).await?;
        }
        Command::Hosts(HostsCommand::List { namespace }) => {
            if let Some(ns) = &namespace {
                bootsman_api::identity::validate_pool(ns).map_err(|m| anyhow::anyhow!("--namespace: {m}"))?;
            }
            let client = kube::Client::try_from(load_config(cli.kubeconfig.as_ref()).await?)?;
            let rows = hosts::list(&client, namespace.as_deref()).await?;
            out.write_all(hosts::table(&rows, namespace.is_none()).as_bytes())?;
        }
    }
    Ok(())
}
