//! `bootsmanctl install -f site.yaml`: the install of a site, step by step (see
//! [`crate::site::plan`]), each step re-runnable from the state folder: a second `install` after
//! a crash, a Ctrl-C or a `kill -9` at any point continues where the first one stopped.
//!
//! 1. **preflight**: the Site file and this machine ([`crate::site::check`], [`crate::site::probe`]);
//! 2. **bootstrap**: the bootstrap control plane `<site>-control-plane` and Bootsman's controllers
//!    next to it ([`crate::bootstrap`]), started again on every run from the saved folder until
//!    the teardown (without the controllers once the pivot has begun);
//! 3. **enrol**: the pool namespace; a one-time token pinned to each Site host that has not
//!    enrolled (its bootstrap kubeconfig under `<state>/enrol/<host>.kubeconfig`, kept across
//!    runs while the token lives); the commands to run on each server; then it waits until the
//!    infrastructure hosts have registered, and sets each enrolled host's Site labels on its
//!    ByoHost (placement labels are the admin's, never the host's);
//! 4. **infrastructure**: the infrastructure cluster `<site>-infra` as a BootsmanCluster
//!    ([`Site::infrastructure_cluster`]) in the pool namespace, built by the bootstrap side's
//!    controllers on the labelled hosts; progress is printed as its status changes; once it is
//!    `Ready`, its admin kubeconfig goes to `<state>/infrastructure.kubeconfig` and its Nodes are
//!    checked through it;
//! 5. **controllers**: Cluster API and the Bootsman chart as Pods in the infrastructure cluster
//!    ([`crate::controllers`]), until every Deployment is Available;
//! 6. **pivot**: the pool's objects and every host's agent move into the infrastructure cluster,
//!    verified there ([`crate::pivot`]);
//! 7. **teardown**: the bootstrap control plane stops and its folder (with the saved objects and
//!    any enrolment kubeconfig left) is deleted. What stays in the state folder is
//!    `infrastructure.kubeconfig`, `state.json` and the webhook CA (`infrastructure/pki`);
//!    `install` then exits 0. A later `install` of the installed site starts nothing here: it
//!    runs the controllers step again (the webhook serving certificates issued anew, the chart
//!    upgraded), which is how those certificates are renewed.
//!
//! SIGINT or SIGTERM stops `install` at any step, cleanly. One `install` runs per site at a time
//! (a lock on `<state>/install.lock`); the steps done are recorded in `<state>/state.json`,
//! written atomically.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_api::v1beta1::ByoHost;
use bootsman_runtime::fs::replace_file;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use crate::bootstrap::{self, Bootstrap, Sources};
use crate::controllers;
use crate::pivot;
use crate::site::{self, Site, State};
use crate::token;

/// Field manager of what `install` writes.
pub const MANAGER: &str = "bootsmanctl-install";

/// How the install runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Programs and chart.
    pub sources: Sources,
    /// Lifetime of each host's enrolment token.
    pub token_ttl: Duration,
    /// Progress as JSON lines (`{"seconds", "step", "message"}`; a refused preflight as
    /// `{"step": "preflight", "findings": [...]}`) instead of text.
    pub json: bool,
}

/// Where progress goes, and how.
#[derive(Clone, Copy, Debug)]
struct Progress {
    started: Instant,
    json: bool,
}

impl Progress {
    /// One line: the seconds since the start, the step, the message.
    fn say(&self, out: &mut dyn Write, step: &str, msg: &str) {
        let secs = self.started.elapsed().as_secs();
        let _ = if self.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({"seconds": secs, "step": step, "message": msg})
            )
        } else {
            writeln!(out, "[{secs:5}s] {step:<14} {msg}")
        };
        let _ = out.flush();
    }
}

/// Runs the install of `site` from the first step its saved state does not record as done to
/// the end. SIGINT or SIGTERM stops it at any step: everything it started stops, the state
/// stays, and the next `install` continues.
pub async fn run(site: &Site, opts: &Options, out: &mut impl Write) -> anyhow::Result<()> {
    let p = Progress {
        started: Instant::now(),
        json: opts.json,
    };
    // The file first: a refused Site writes nothing, not even the state folder.
    refuse(site, &p, site::check(site), out)?;
    let state_dir = site.state_dir();
    std::fs::create_dir_all(&state_dir).with_context(|| format!("create {}", state_dir.display()))?;
    let _lock = lock(&state_dir, site)?;
    let mut signals =
        bootsman_runtime::lifecycle::StopSignals::listen().context("listen for SIGTERM and SIGINT")?;
    let stopped = tokio::select! {
        r = steps(site, opts, p, out) => return r,
        s = signals.first() => s,
    };
    p.say(
        out,
        "stop",
        &format!(
            "{stopped}: everything this install started has stopped; its state is kept, run install again to continue"
        ),
    );
    Ok(())
}

/// Fails with the preflight's findings, after printing them (one JSON line with `-o json`).
fn refuse(
    site: &Site,
    p: &Progress,
    findings: Vec<site::Finding>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if findings.is_empty() {
        return Ok(());
    }
    if p.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({"step": "preflight", "findings": findings})
        )?;
    } else {
        for f in &findings {
            writeln!(out, "{f}")?;
        }
    }
    anyhow::bail!(
        "preflight refused site {} ({} finding{}); nothing was started",
        site.metadata.name,
        findings.len(),
        if findings.len() == 1 { "" } else { "s" }
    )
}

/// The steps not done yet.
async fn steps(site: &Site, opts: &Options, p: Progress, out: &mut impl Write) -> anyhow::Result<()> {
    let state_dir = site.state_dir();
    let mut state = State::load(site)?;
    let say = |out: &mut dyn Write, step: &str, msg: &str| p.say(out, step, msg);
    let kubeconfig = state_dir.join("infrastructure.kubeconfig");
    if state.is_done("teardown") {
        // An installed site: the controllers step again (webhook serving certificates issued
        // anew, the chart upgraded to this release's), nothing started here.
        say(
            out,
            "controllers",
            &format!(
                "site {} is installed; refreshing Cluster API and Bootsman in {} (webhook certificates issued again, \
                 chart upgraded)",
                site.metadata.name,
                site.infrastructure_name()
            ),
        );
        controllers_step(site, opts, &kubeconfig, &mut |m| say(out, "controllers", m)).await?;
        say(
            out,
            "done",
            &format!(
                "site {} is installed: {} runs Cluster API and Bootsman on its own hosts (KUBECONFIG={}); its \
                 controllers are refreshed, nothing else to do",
                site.metadata.name,
                site.infrastructure_name(),
                kubeconfig.display()
            ),
        );
        return Ok(());
    }

    if !state.is_done("pivot") {
        through_pivot(site, opts, p, &kubeconfig, &mut state, out).await?;
    }
    // The pivot was verified: the bootstrap side is never started again, only removed.
    for d in ["bootstrap", "pivot", "enrol"] {
        let path = state_dir.join(d);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("delete {}", path.display())),
        }
    }
    state.mark(site, "teardown")?;
    say(
        out,
        "teardown",
        &format!(
            "{} stopped and deleted (its folder, the saved objects and the enrolment files)",
            site.bootstrap_name()
        ),
    );
    say(
        out,
        "done",
        &format!(
            "site {} is installed: {} runs Cluster API and Bootsman on its own hosts and manages pool {}; \
             KUBECONFIG={}",
            site.metadata.name,
            site.infrastructure_name(),
            site.spec.pool,
            kubeconfig.display()
        ),
    );
    Ok(())
}

/// The steps from preflight to a verified pivot; returns once the bootstrap control plane has
/// stopped.
async fn through_pivot(
    site: &Site,
    opts: &Options,
    p: Progress,
    kubeconfig: &Path,
    state: &mut State,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let state_dir = site.state_dir();
    let say = |out: &mut dyn Write, step: &str, msg: &str| p.say(out, step, msg);
    // This machine and the network, once this install holds the site's lock.
    refuse(site, &p, site::probe(site), out)?;
    say(out, "preflight", "passed");
    state.mark(site, "preflight")?;

    say(
        out,
        "bootstrap",
        &format!(
            "starting {} (state in {})",
            site.bootstrap_name(),
            state_dir.display()
        ),
    );
    // Once the pivot has begun, nothing on the bootstrap side may act on the pool's hosts again.
    let pivoting = state.is_done("pivot:paused");
    let mut boot =
        bootstrap::start(site, &opts.sources, !pivoting, &mut |m| say(out, "bootstrap", m)).await?;
    state.mark(site, "bootstrap")?;
    say(
        out,
        "bootstrap",
        &format!("admin kubeconfig: {}", boot.kubeconfig().display()),
    );
    let bundle = bootsman_controlplane::Bundle::open(&opts.sources.bundle).context("--bundle")?;

    if !pivoting {
        enrol(site, &boot, opts, &mut |m| say(out, "enrol", m)).await?;
        state.mark(site, "enrol")?;

        infrastructure(site, &boot, kubeconfig, &mut |m| say(out, "infrastructure", m)).await?;
        state.mark(site, "infrastructure")?;

        controllers_step(site, opts, kubeconfig, &mut |m| say(out, "controllers", m)).await?;
        state.mark(site, "controllers")?;
        say(
            out,
            "controllers",
            &format!(
                "every Deployment Available: Cluster API and Bootsman run as Pods in {}",
                site.infrastructure_name()
            ),
        );
    }

    let report = pivot::run(
        site,
        &mut boot,
        &bundle,
        kubeconfig,
        state,
        opts.token_ttl,
        &mut |m| say(out, "pivot", m),
    )
    .await?;
    say(
        out,
        "pivot",
        &format!(
            "verified: {} objects moved, {} hosts re-homed, {} bindings equal on both sides",
            report.objects, report.hosts, report.bindings
        ),
    );

    boot.cp.stop();
    drop(boot);
    Ok(())
}

/// The controllers step: Cluster API and Bootsman into the infrastructure cluster of
/// `kubeconfig` ([`controllers::install`]).
async fn controllers_step(
    site: &Site,
    opts: &Options,
    kubeconfig: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let bundle = bootsman_controlplane::Bundle::open(&opts.sources.bundle).context("--bundle")?;
    let infra = bootsman_controlplane::client_from(kubeconfig).await?;
    controllers::install(site, &bundle, &opts.sources.chart, &infra, kubeconfig, say).await
}

/// Takes the site's install lock, or says which process holds it.
fn lock(dir: &Path, site: &Site) -> anyhow::Result<std::fs::File> {
    let path = dir.join("install.lock");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => {
            f.set_len(0)?;
            writeln!(f, "{}", std::process::id())?;
            Ok(f)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            anyhow::bail!(
                "another bootsmanctl install of site {} runs (pid {}); one install per site at a time",
                site.metadata.name,
                holder.trim()
            )
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("lock {}", path.display())),
    }
}

/// The enrolment step (see the module header).
async fn enrol(
    site: &Site,
    boot: &Bootstrap,
    opts: &Options,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let client = boot.cp.client().await?;
    let pool = &site.spec.pool;
    let pp = PatchParams::apply(MANAGER).force();
    Api::<Namespace>::all(client.clone())
        .patch(
            pool,
            &pp,
            &Patch::Apply(
                serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": pool}}),
            ),
        )
        .await
        .with_context(|| format!("create the pool namespace {pool}"))?;
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), pool);
    let want = site.spec.infrastructure.control_plane.replicas as usize;
    let infra: BTreeSet<&str> = site
        .infrastructure_hosts()
        .iter()
        .map(|h| h.name.as_str())
        .collect();

    let before = registered(&hosts).await?;
    let dir = site.state_dir().join("enrol");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mut waiting = Vec::new();
    for h in &site.spec.hosts {
        if before.contains(&h.name) {
            continue;
        }
        let file = dir.join(format!("{}.kubeconfig", h.name));
        let fresh = ensure_token(&client, boot, site, &h.name, &file, opts.token_ttl).await?;
        waiting.push((h.name.clone(), file, fresh));
    }
    if !waiting.is_empty() {
        say(&format!(
            "on each server below, install the byoh-agent package, then (as root):\n{}",
            waiting
                .iter()
                .map(|(name, file, fresh)| format!(
                    "             {name}: install -m 0600 {} /etc/byoh-agent/bootstrap-kubeconfig && sed -i \
                     's/--namespace default/--namespace {pool} --name {name}/' /etc/byoh-agent/byoh-agent.env && \
                     systemctl enable --now byoh-agent{}",
                    file.display(),
                    if *fresh { "" } else { "   (token issued by an earlier run)" }
                ))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    say(&format!(
        "waiting for {want} infrastructure hosts of {} in pool {pool}",
        infra.iter().copied().collect::<Vec<_>>().join(", ")
    ));

    let mut labelled: BTreeSet<String> = BTreeSet::new();
    loop {
        boot.cp.check_running()?;
        let now = registered(&hosts).await?;
        for h in site.spec.hosts.iter().filter(|h| now.contains(&h.name)) {
            if labelled.contains(&h.name) {
                continue;
            }
            set_labels(&hosts, &h.name, &h.labels).await?;
            labelled.insert(h.name.clone());
            let _ = std::fs::remove_file(dir.join(format!("{}.kubeconfig", h.name)));
            say(&format!(
                "host {} enrolled{}",
                h.name,
                if h.labels.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; labelled {}",
                        h.labels
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                }
            ));
        }
        let ready = infra.iter().filter(|n| labelled.contains(**n)).count();
        if ready >= want {
            say(&format!(
                "{ready} of {want} infrastructure hosts enrolled and labelled"
            ));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The infrastructure step: applies the infrastructure cluster's BootsmanCluster
/// ([`Site::infrastructure_cluster`]), reports its progress as its status changes, and once it
/// is `Ready` writes its admin kubeconfig to `path` (`<state>/infrastructure.kubeconfig`, 0600)
/// and checks through it that every control-plane Node is `Ready`.
async fn infrastructure(
    site: &Site,
    boot: &Bootstrap,
    path: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let client = boot.cp.client().await?;
    let name = site.infrastructure_name();
    let pool = &site.spec.pool;
    let api: Api<BootsmanCluster> = Api::namespaced(client.clone(), pool);
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(site.infrastructure_cluster()),
    )
    .await
    .with_context(|| format!("apply BootsmanCluster {pool}/{name}"))?;
    say(&format!(
        "BootsmanCluster {pool}/{name} applied: {} schedulable control-plane hosts, Kubernetes {}, endpoint {}:{}",
        site.spec.infrastructure.control_plane.replicas,
        site.spec.infrastructure.kubernetes_version,
        site.spec.infrastructure.control_plane.endpoint.host,
        site.spec.infrastructure.control_plane.endpoint.port
    ));
    let mut last = String::new();
    let secret = loop {
        boot.cp.check_running()?;
        let bc = api
            .get(&name)
            .await
            .with_context(|| format!("read BootsmanCluster {pool}/{name}"))?;
        let status = bc.status.unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        let cp = status.control_plane.clone().unwrap_or_default();
        let now = format!(
            "{} control plane {}/{} ready{}",
            status
                .phase
                .map(|p| format!("{p:?}"))
                .unwrap_or_else(|| "Pending".into()),
            cp.ready,
            cp.desired,
            ready
                .filter(|c| !c.message.is_empty())
                .map(|c| format!(": {}", c.message))
                .unwrap_or_default()
        );
        if now != last {
            say(&now);
            last = now;
        }
        if ready.is_some_and(|c| c.status == "True")
            && let Some(secret) = status.kubeconfig_secret
        {
            break secret;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let data = Api::<Secret>::namespaced(client, pool)
        .get(&secret)
        .await
        .with_context(|| format!("read the infrastructure cluster's kubeconfig Secret {pool}/{secret}"))?
        .data
        .and_then(|mut d| d.remove("value"))
        .with_context(|| format!("Secret {pool}/{secret} has no key value"))?;
    replace_file(path, &data.0, 0o600).with_context(|| format!("write {}", path.display()))?;
    let infra = bootsman_controlplane::client_from(path).await?;
    let nodes = Api::<Node>::all(infra)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("list the Nodes of {name}"))?;
    let ready: Vec<String> = nodes
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let want = site.spec.infrastructure.control_plane.replicas as usize;
    if ready.len() < want {
        anyhow::bail!(
            "{name} is Ready by its status, yet only {} of {want} Nodes are Ready ({}); run install again to re-check",
            ready.len(),
            ready.join(", ")
        );
    }
    say(&format!(
        "{name} Ready: Nodes {} Ready; admin kubeconfig {}",
        ready.join(", "),
        path.display()
    ));
    Ok(())
}

/// Names of the ByoHosts in the pool.
async fn registered(hosts: &Api<ByoHost>) -> anyhow::Result<BTreeSet<String>> {
    Ok(hosts
        .list(&ListParams::default())
        .await
        .context("list the pool's ByoHosts")?
        .items
        .into_iter()
        .filter_map(|h| h.metadata.name)
        .collect())
}

/// Makes sure `file` holds the bootstrap kubeconfig of a live token pinned to `host`: the one
/// an earlier run wrote while its token Secret exists, else a new one. Returns whether it is new.
async fn ensure_token(
    client: &kube::Client,
    boot: &Bootstrap,
    site: &Site,
    host: &str,
    file: &PathBuf,
    ttl: Duration,
) -> anyhow::Result<bool> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), bootsman_api::identity::TOKEN_NAMESPACE);
    if let Ok(text) = std::fs::read_to_string(file)
        && let Some(id) = token_id(&text)
        && secrets
            .get_opt(&bootsman_api::identity::token_secret_name(&id))
            .await
            .context("look up an earlier enrolment token")?
            .is_some()
    {
        return Ok(false);
    }
    let req = token::Request {
        pool: site.spec.pool.clone(),
        host: Some(host.to_string()),
        ttl,
        replace: false,
    };
    let t = token::create(client, &req).await?;
    let text = token::bootstrap_kubeconfig(&boot.server, &boot.ca_pem, &t);
    replace_file(file, text.as_bytes(), 0o600).with_context(|| format!("write {}", file.display()))?;
    Ok(true)
}

/// The token id in a bootstrap kubeconfig this module wrote (`token: <id>.<secret>`).
fn token_id(kubeconfig: &str) -> Option<String> {
    kubeconfig.lines().find_map(|l| {
        let t = l.trim().strip_prefix("token:")?.trim().trim_matches('"');
        let (id, _) = t.split_once('.')?;
        Some(id.to_string())
    })
}

/// Sets the Site's labels of `host` on its ByoHost (a merge patch: other labels stay).
async fn set_labels(
    hosts: &Api<ByoHost>,
    host: &str,
    labels: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    if labels.is_empty() {
        return Ok(());
    }
    hosts
        .patch(
            host,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": labels}})),
        )
        .await
        .with_context(|| format!("label ByoHost {host}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_token_id_is_read_back_from_a_bootstrap_kubeconfig() {
        let t = token::Token {
            id: "abc123".into(),
            secret: "0123456789abcdef".into(),
            expiration: k8s_openapi::jiff::Timestamp::now(),
            pool: "p".into(),
            host: Some("h".into()),
            replace: false,
        };
        let text = token::bootstrap_kubeconfig("https://10.0.0.5:6443", b"ca", &t);
        assert_eq!(token_id(&text).as_deref(), Some("abc123"));
        assert_eq!(token_id("apiVersion: v1\n"), None);
    }
}
