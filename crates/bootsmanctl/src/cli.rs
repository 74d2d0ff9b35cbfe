//! Flags of `bootsmanctl` and the dispatch to the library commands.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::{bootstrap, diagnose, hosts, install, projects, rehome, site, status, token};

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
    /// Print a commented example Site file for `install`.
    Init,
    /// Install a site from its Site file: preflight, the bootstrap control plane
    /// `<site>-control-plane` with Bootsman's controllers, host enrolment. Every step is
    /// re-runnable from the state folder. `--validate` runs the preflight checks (the file, this
    /// machine's address and port, the registry) and starts nothing; `--dry-run` runs them and
    /// prints the install's plan, marking the steps a saved state says are done.
    #[command(group(clap::ArgGroup::new("mode").args(["validate", "dry_run"])))]
    Install {
        /// The Site file.
        #[arg(long, short = 'f')]
        file: PathBuf,
        /// Run the preflight checks only.
        #[arg(long)]
        validate: bool,
        /// Run the preflight checks and print the plan.
        #[arg(long)]
        dry_run: bool,
        /// `table` for people, `json` for scripts: findings and plan with `--validate` and
        /// `--dry-run`; progress as JSON lines when installing.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
        /// The bundle the bootstrap control plane runs from: `bin/` (etcd, kube-apiserver,
        /// kube-controller-manager, helm, the Cluster API managers, and bootsman-provider and
        /// bootsman-operator unless they sit next to bootsmanctl) and `crds/`.
        #[arg(long, env = "BOOTSMAN_BUNDLE")]
        bundle: Option<PathBuf>,
        /// The Bootsman chart (a folder); `<bundle>/charts/bootsman` when not set.
        #[arg(long, env = "BOOTSMAN_CHART")]
        chart: Option<PathBuf>,
        /// Lifetime of each host's enrolment token.
        #[arg(long, default_value = "24h")]
        token_ttl: String,
    },
    /// Manage the hosts of a pool.
    #[command(subcommand)]
    Hosts(HostsCommand),
    /// Show a BootsmanCluster's objects as a tree with their conditions: BootsmanCluster →
    /// Cluster → control plane and MachineDeployments → Machines → ByoMachines → ByoHosts (with
    /// the agent's health and last heartbeat). Every cluster of the namespace when CLUSTER is
    /// not given.
    Status {
        /// The BootsmanCluster.
        cluster: Option<String>,
        /// Its namespace; the kubeconfig context's namespace when not set.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// List every condition of each object, not only the one that sums it up.
        #[arg(long)]
        all_conditions: bool,
        /// `table` for people, `json` for scripts (the whole tree with every condition).
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// The Projects sharing this cluster, and one project's use of its quotas.
    #[command(subcommand)]
    Projects(ProjectsCommand),
    /// Write a support bundle (.tar.gz) of a BootsmanCluster (every cluster of the namespace
    /// when CLUSTER is not given): a summary of what is wrong, the status tree, its objects, its
    /// hosts' state and Events, and the controllers' logs. Secret values are never read; tokens,
    /// keys and passwords are redacted.
    Diagnose {
        /// The BootsmanCluster.
        cluster: Option<String>,
        /// Its namespace; the kubeconfig context's namespace when not set.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// The bundle to write; `bootsman-diagnose-<namespace>-<time>.tar.gz` when not set.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// A namespace whose Pods' logs go into the bundle (repeatable); Bootsman's and Cluster
        /// API's namespaces when not set.
        #[arg(long = "controllers-namespace")]
        controllers_namespaces: Vec<String>,
        /// Lines of each container's log.
        #[arg(long, default_value_t = 500)]
        log_lines: i64,
    },
}

/// `bootsmanctl projects …`.
#[derive(Debug, Subcommand)]
pub enum ProjectsCommand {
    /// Every Project: display name, namespaces, host pools, members, clusters against the
    /// cluster quota, Ready. Needs `list` on Projects (platform admins).
    List {
        /// `table` for people, `json` for scripts.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// One project's quotas (used, limit, left) and the clusters that use them, read from the
    /// clusters as they are now. Its members may run it.
    Usage {
        /// The Project.
        project: String,
        /// `table` for people, `json` for scripts.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// How a command prints what it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for a terminal.
    Table,
    /// JSON, one document.
    Json,
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
    /// Move hosts' agents to another management cluster, one step per host, as a pivot does
    /// once the host objects are there: a replacement token for each host on the target, handed
    /// to that host alone through a Secret here, and `spec.rehome` on its ByoHost. The agent
    /// enrols with the target, reports `Rehomed=True` here and talks only to the target.
    Rehome {
        /// The hosts to move.
        hosts: Vec<String>,
        /// Move every host of the pool.
        #[arg(long, conflicts_with = "hosts")]
        all: bool,
        /// The pool (the same namespace on both clusters).
        #[arg(long, short = 'n')]
        namespace: String,
        /// Kubeconfig of the cluster the hosts move to (an admin of it).
        #[arg(long)]
        to: PathBuf,
        /// The target's API server URL as the hosts reach it; the --to kubeconfig's server when
        /// not set.
        #[arg(long)]
        server: Option<String>,
        /// How long each host's token stays valid if unused (e.g. 30m, 1h; at most 7d).
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// Wait this long for every host to answer from the target (e.g. 5m); 0 returns once the
        /// requests are written.
        #[arg(long, default_value = "0")]
        wait: String,
    },
    /// List the hosts of a pool (of every pool when --namespace is not set).
    List {
        /// The pool.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// `table` for people, `json` for scripts (phase and machine `null` when unset).
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
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

/// Checks `--server` (an https:// URL) before any connection is made.
fn check_server(server: Option<&String>) -> anyhow::Result<()> {
    match server {
        Some(s) if !s.starts_with("https://") => anyhow::bail!("--server: {s:?} must be an https:// URL"),
        _ => Ok(()),
    }
}

/// `--server`, else the API server of `config`, as hosts are told to reach it.
fn server_or(server: Option<String>, config: &kube::Config) -> String {
    server.unwrap_or_else(|| config.cluster_url.to_string().trim_end_matches('/').to_string())
}

/// Writes `value` as pretty JSON and a newline: the `-o json` of every command.
fn write_json(out: &mut impl Write, value: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
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
    check_server(server.as_ref())?;
    let config = load_config(kubeconfig).await?;
    let server = server_or(server, &config);
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

/// The namespace (validated, else the kubeconfig context's), a client, and the BootsmanClusters
/// a command is about (`cluster`, else every one of the namespace).
async fn clusters(
    kubeconfig: Option<&PathBuf>,
    namespace: Option<String>,
    cluster: Option<String>,
) -> anyhow::Result<(String, kube::Client, Vec<String>)> {
    if let Some(ns) = &namespace {
        bootsman_api::identity::validate_pool(ns).map_err(|m| anyhow::anyhow!("--namespace: {m}"))?;
    }
    let config = load_config(kubeconfig).await?;
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config)?;
    let names = match cluster {
        Some(c) => vec![c],
        None => status::names(&client, &namespace)
            .await
            .with_context(|| format!("list the BootsmanClusters of namespace {namespace}"))?,
    };
    Ok((namespace, client, names))
}

/// Runs a parsed command line, writing its output to `out`.
pub async fn run(cli: Cli, out: &mut impl Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Init => out.write_all(site::EXAMPLE.as_bytes())?,
        Command::Install {
            file,
            validate,
            dry_run,
            output,
            bundle,
            chart,
            token_ttl,
        } => {
            let s = site::load(&file)?;
            if !validate && !dry_run {
                let token_ttl = token::parse_duration("--token-ttl", &token_ttl)?;
                let Some(bundle) = bundle else {
                    anyhow::bail!(
                        "--bundle: the folder the bootstrap control plane runs from (bin/, crds/) is required \
                         (or BOOTSMAN_BUNDLE); hack/testbin --print-dir names a development one"
                    );
                };
                let chart = chart.unwrap_or_else(|| bundle.join("charts/bootsman"));
                if !chart.join("Chart.yaml").is_file() {
                    anyhow::bail!("--chart: {} holds no Chart.yaml", chart.display());
                }
                let opts = install::Options {
                    sources: bootstrap::Sources { bundle, chart },
                    token_ttl,
                    json: output == Output::Json,
                };
                return install::run(&s, &opts, out).await;
            }
            let mut findings = site::check(&s);
            findings.extend(site::probe(&s));
            let plan = site::plan(&s, &site::State::load(&s)?);
            if output == Output::Json {
                let doc = serde_json::json!({
                    "site": s.metadata.name,
                    "findings": findings,
                    "plan": if dry_run { serde_json::to_value(&plan)? } else { serde_json::Value::Null },
                });
                write_json(out, &doc)?;
            } else if findings.is_empty() {
                writeln!(
                    out,
                    "preflight passed for site {}: the Site file, {}:{} free on this machine, registry {} answers",
                    s.metadata.name, s.spec.bootstrap.address, s.spec.bootstrap.port, s.spec.registry
                )?;
                if dry_run {
                    out.write_all(site::render_plan(&plan).as_bytes())?;
                }
            } else {
                for f in &findings {
                    writeln!(out, "{f}")?;
                }
            }
            if !findings.is_empty() {
                anyhow::bail!(
                    "preflight refused site {} ({} finding{}); nothing was started",
                    s.metadata.name,
                    findings.len(),
                    if findings.len() == 1 { "" } else { "s" }
                );
            }
        }
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
        Command::Hosts(HostsCommand::Rehome {
            hosts,
            all,
            namespace,
            to,
            server,
            ttl,
            wait,
        }) => {
            bootsman_api::identity::validate_pool(&namespace)
                .map_err(|m| anyhow::anyhow!("--namespace: {m}"))?;
            if hosts.is_empty() && !all {
                anyhow::bail!(
                    "HOST: name the hosts to move, or pass --all for every host of pool {namespace}"
                );
            }
            let ttl = token::parse_duration("--ttl", &ttl)?;
            token::validate(&token::Request {
                pool: namespace.clone(),
                host: Some("h".into()),
                ttl,
                replace: true,
            })?;
            let wait = token::parse_duration("--wait", &wait)?;
            check_server(server.as_ref())?;
            let target_config = load_config(Some(&to))
                .await
                .map_err(|e| anyhow::anyhow!("--to: {e:#}"))?;
            let server = server_or(server, &target_config);
            let req = rehome::Request {
                pool: namespace.clone(),
                hosts,
                server,
                ca_pem: token::ca_pem(&target_config),
                ttl,
            };
            let target = kube::Client::try_from(target_config)?;
            let source = kube::Client::try_from(load_config(cli.kubeconfig.as_ref()).await?)?;
            let requested = rehome::request(&source, &target, &req).await?;
            for r in &requested {
                if r.already {
                    writeln!(out, "{}: rehomed to {} already", r.host, req.server)?;
                } else {
                    writeln!(out, "{}: rehome to {} requested", r.host, req.server)?;
                }
            }
            if !wait.is_zero() {
                let started = std::time::Instant::now();
                let progress = |line: &str| eprintln!("[{:>4}s] {line}", started.elapsed().as_secs());
                for line in rehome::wait(&source, &target, &namespace, &requested, wait, progress).await? {
                    writeln!(out, "{line}")?;
                }
            }
        }
        Command::Hosts(HostsCommand::List { namespace, output }) => {
            if let Some(ns) = &namespace {
                bootsman_api::identity::validate_pool(ns).map_err(|m| anyhow::anyhow!("--namespace: {m}"))?;
            }
            let client = kube::Client::try_from(load_config(cli.kubeconfig.as_ref()).await?)?;
            let rows = hosts::list(&client, namespace.as_deref()).await?;
            match output {
                Output::Table => out.write_all(hosts::table(&rows, namespace.is_none()).as_bytes())?,
                Output::Json => write_json(out, &rows)?,
            }
        }
        Command::Status {
            cluster,
            namespace,
            all_conditions,
            output,
        } => {
            let (namespace, client, names) = clusters(cli.kubeconfig.as_ref(), namespace, cluster).await?;
            let now = k8s_openapi::jiff::Timestamp::now();
            let mut trees = Vec::new();
            for name in &names {
                let objects = status::gather(&client, &namespace, name).await?;
                trees.push(status::tree(&objects, now));
            }
            match output {
                Output::Json => write_json(out, &trees)?,
                Output::Table if trees.is_empty() => {
                    eprintln!("no BootsmanCluster in namespace {namespace}");
                }
                Output::Table => {
                    for (i, t) in trees.iter().enumerate() {
                        if i > 0 {
                            out.write_all(b"\n")?;
                        }
                        out.write_all(status::render(t, now, all_conditions).as_bytes())?;
                    }
                }
            }
        }
        Command::Projects(command) => {
            let client = kube::Client::try_from(load_config(cli.kubeconfig.as_ref()).await?)?;
            match command {
                ProjectsCommand::List { output } => {
                    let rows = projects::list(&client).await?;
                    match output {
                        Output::Json => write_json(out, &rows)?,
                        Output::Table if rows.is_empty() => eprintln!("no Project"),
                        Output::Table => out.write_all(projects::render_list(&rows).as_bytes())?,
                    }
                }
                ProjectsCommand::Usage { project, output } => {
                    let usage = projects::usage_of(&client, &project).await?;
                    match output {
                        Output::Json => write_json(out, &usage)?,
                        Output::Table => out.write_all(projects::render_usage(&usage).as_bytes())?,
                    }
                }
            }
        }
        Command::Diagnose {
            cluster,
            namespace,
            output,
            controllers_namespaces,
            log_lines,
        } => {
            if log_lines < 1 {
                anyhow::bail!("--log-lines: {log_lines} must be at least 1");
            }
            let (namespace, client, names) = clusters(cli.kubeconfig.as_ref(), namespace, cluster).await?;
            if names.is_empty() {
                anyhow::bail!("CLUSTER: no BootsmanCluster in namespace {namespace:?}");
            }
            let opts = diagnose::Options {
                namespace: namespace.clone(),
                clusters: names,
                controller_namespaces: if controllers_namespaces.is_empty() {
                    diagnose::CONTROLLER_NAMESPACES.map(String::from).to_vec()
                } else {
                    controllers_namespaces
                },
                log_lines,
            };
            let files = diagnose::collect(&client, &opts).await?;
            let stamp = k8s_openapi::jiff::Timestamp::now().as_second();
            let top = format!("bootsman-diagnose-{namespace}-{stamp}");
            let path = output.unwrap_or_else(|| PathBuf::from(format!("{top}.tar.gz")));
            diagnose::write_bundle(&path, &top, &files)?;
            writeln!(out, "{}", path.display())?;
            eprintln!(
                "wrote {} ({} files); start with {top}/SUMMARY.txt",
                path.display(),
                files.len()
            );
        }
    }
    Ok(())
}
