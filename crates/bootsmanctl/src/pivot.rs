//! The pivot of `bootsmanctl install`: the site's Cluster API, Bootsman and host objects move
//! from the bootstrap control plane (the source) into the infrastructure cluster (the target),
//! every agent follows them there, and only what was verified on the target is trusted.
//!
//! Each part is recorded in the install's saved state once it is done (`pivot:paused`,
//! `pivot:saved`, `pivot:moved`, `pivot:rehomed`, then `pivot`), so a re-run after a crash at
//! any point continues with the part that had not finished, and never repeats one that had:
//!
//! 1. **paused**: every Cluster of the pool namespace gets `spec.paused`; the operator answers
//!    by clearing its `clusterctl.cluster.x-k8s.io/block-move` annotation, the provider by
//!    finishing the claim that set one. Once no object of the namespace blocks the move,
//!    `bootsman-provider` and `bootsman-operator` stop on the source for good: nothing there
//!    may release, reset or claim a host any more (a re-run does not start them again).
//! 2. **saved**: `clusterctl move --to-directory` writes the namespace's objects, the
//!    host↔machine bindings with them, to `<state>/pivot/objects`. It refuses paused Clusters,
//!    so they are resumed just before (only Cluster API's managers run on the source now) and
//!    paused again right after; the saved copies are paused.
//! 3. **moved**: `clusterctl move --from-directory` creates them in the target, rewrites their
//!    owner references to the new uids and resumes the Clusters there, where Cluster API and
//!    Bootsman run as Pods. Nothing is deleted from the source: a plain `clusterctl move` would
//!    delete the source's ByoHosts, and with them the rights the agents need to learn where to go.
//! 4. **rehomed**: every host of the pool, the infrastructure cluster's own and the free ones,
//!    is asked to move to the target's endpoint and CA ([`crate::rehome`]); the step waits until
//!    each one answered `Rehomed=True` on the source and renewed its Lease on the target.
//! 5. **verified** (`pivot`): on the target, every BootsmanCluster of the namespace is `Ready`,
//!    every host is there with the same binding it had on the source, every bound ByoMachine
//!    carries that host's providerID, and the set of Machines is the source's (nothing was
//!    rebuilt).
//!
//! The teardown (stopping the bootstrap control plane and deleting its folder) follows in
//! [`crate::install`], only after the verification passed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::labels;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_api::v1beta1::{ByoCluster, ByoHost, ByoMachine};
use bootsman_controlplane::Bundle;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::bootstrap::{self, Bootstrap};
use crate::rehome;
use crate::site::{Site, State};

/// How long the objects of the namespace may block the move once their Clusters are paused.
const UNBLOCK_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the agents have to move to the target.
const REHOME_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the moved clusters have to be `Ready` again on the target.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// What the pivot did, for the closing lines of `install`.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Files `clusterctl move --to-directory` wrote (one per object).
    pub objects: usize,
    /// Hosts re-homed to the target.
    pub hosts: usize,
    /// Hosts bound to a machine, the same on both sides.
    pub bindings: usize,
}

/// Runs the parts of the pivot that `state` does not record as done, from the bootstrap side
/// `boot` into the cluster of `target_kubeconfig`. `say` is told each part's progress.
pub async fn run(
    site: &Site,
    boot: &mut Bootstrap,
    bundle: &Bundle,
    target_kubeconfig: &Path,
    state: &mut State,
    token_ttl: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Report> {
    let pool = site.spec.pool.clone();
    let source = boot.cp.client().await?;
    let target = bootsman_controlplane::client_from(target_kubeconfig).await?;
    let dir = site.state_dir().join("pivot");
    let objects = dir.join("objects");
    let mut report = Report::default();

    if !state.is_done("pivot:paused") {
        let clusters = set_paused(&source, &pool, true).await?;
        say(&format!(
            "paused {} Cluster{} in {pool} on the source: {}",
            clusters.len(),
            plural(clusters.len()),
            clusters.join(", ")
        ));
        wait_unblocked(&source, &pool, || boot.cp.check_running().map_err(Into::into)).await?;
        for name in bootstrap::CONTROLLERS {
            boot.cp.stop_component(name);
        }
        state.mark(site, "pivot:paused")?;
        say(&format!(
            "nothing in {pool} blocks the move; {} stopped on the source for good (no host is released, reset or \
             claimed there any more)",
            bootstrap::CONTROLLERS.join(" and ")
        ));
    }

    if !state.is_done("pivot:saved") {
        // A save cut short is started afresh. The objects include the clusters' CA keys: the
        // folder is the owner's alone.
        let _ = std::fs::remove_dir_all(&objects);
        std::fs::create_dir_all(&objects).with_context(|| format!("create {}", objects.display()))?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .with_context(|| format!("restrict {}", dir.display()))?;
        set_paused(&source, &pool, false).await?;
        let moved = clusterctl(
            bundle,
            &dir,
            &[
                "move",
                "--namespace",
                &pool,
                "--kubeconfig",
                &boot.kubeconfig().display().to_string(),
                "--to-directory",
                &objects.display().to_string(),
            ],
        );
        // Paused again whatever clusterctl did: only the target may act on these clusters now.
        set_paused(&source, &pool, true).await?;
        moved.context("save the objects of the pool namespace (clusterctl move --to-directory)")?;
        state.mark(site, "pivot:saved")?;
        say(&format!(
            "{} objects of {pool} saved to {} with their bindings; the source's Clusters stay paused",
            count_files(&objects),
            objects.display()
        ));
    }
    report.objects = count_files(&objects);

    if !state.is_done("pivot:moved") {
        clusterctl(
            bundle,
            &dir,
            &[
                "move",
                "--from-directory",
                &objects.display().to_string(),
                "--to-kubeconfig",
                &target_kubeconfig.display().to_string(),
            ],
        )
        .context(
            "create the saved objects in the infrastructure cluster (clusterctl move --from-directory)",
        )?;
        state.mark(site, "pivot:moved")?;
        say(&format!(
            "{} objects created in {} and its Clusters resumed there",
            report.objects,
            site.infrastructure_name()
        ));
    }

    let (server, ca_pem) = endpoint_of(target_kubeconfig)?;
    if !state.is_done("pivot:rehomed") {
        let req = rehome::Request {
            pool: pool.clone(),
            hosts: Vec::new(),
            server: server.clone(),
            ca_pem,
            ttl: token_ttl,
        };
        let requested = rehome::request(&source, &target, &req).await?;
        say(&format!(
            "asked {} host{} to move to {server}: {}",
            requested.len(),
            plural(requested.len()),
            requested
                .iter()
                .map(|r| r.host.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        rehome::wait(&source, &target, &pool, &requested, REHOME_TIMEOUT, |l| say(l)).await?;
        state.mark(site, "pivot:rehomed")?;
    }

    let checked = verify(&source, &target, &pool, say).await?;
    report.hosts = checked.hosts.len();
    report.bindings = checked.bindings;
    let absent: Vec<&str> = site
        .spec
        .hosts
        .iter()
        .map(|h| h.name.as_str())
        .filter(|n| !checked.hosts.iter().any(|c| c == n))
        .collect();
    if !absent.is_empty() {
        say(&format!(
            "Site host{} {} never enrolled: enrol {} with the infrastructure cluster (bootsmanctl hosts token \
             --namespace {pool} --name HOST, with its KUBECONFIG)",
            plural(absent.len()),
            absent.join(", "),
            if absent.len() == 1 { "it" } else { "them" }
        ));
    }
    state.mark(site, "pivot")?;
    Ok(report)
}

/// What [`verify`] found equal on both sides.
struct Checked {
    /// The hosts of the pool.
    hosts: Vec<String>,
    /// How many are bound.
    bindings: usize,
}

/// The checks of part 5 (see the module docs), waiting up to [`READY_TIMEOUT`] for the moved
/// BootsmanClusters to be `Ready` on the target.
async fn verify(
    source: &kube::Client,
    target: &kube::Client,
    pool: &str,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Checked> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let clusters: Api<BootsmanCluster> = Api::namespaced(target.clone(), pool);
    loop {
        let list = list(&clusters, "BootsmanClusters on the target").await?;
        let waiting: Vec<String> = list
            .iter()
            .filter_map(|bc| {
                let ready = bc
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
                match ready {
                    Some(c) if c.status == "True" => None,
                    Some(c) => Some(format!("{}: Ready={} {}", bc.name_any(), c.status, c.message)),
                    None => Some(format!("{}: no Ready condition yet", bc.name_any())),
                }
            })
            .collect();
        if waiting.is_empty() {
            say(&format!(
                "on the target: BootsmanCluster{} {} Ready",
                plural(list.len()),
                list.iter()
                    .map(ResourceExt::name_any)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "verify: after {}s on the target, {}",
                READY_TIMEOUT.as_secs(),
                waiting.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }

    let before = bindings(source, pool).await?;
    let after = bindings(target, pool).await?;
    if before != after {
        anyhow::bail!(
            "verify: the hosts and their bindings differ: source {}; target {}",
            show(&before),
            show(&after)
        );
    }
    let machines: Api<ByoMachine> = Api::namespaced(target.clone(), pool);
    for (host, machine) in before.iter().filter_map(|(h, m)| Some((h, m.as_ref()?))) {
        let want = format!("byoh://{pool}/{host}");
        let bm = machines
            .get_opt(machine)
            .await
            .with_context(|| format!("read ByoMachine {pool}/{machine} on the target"))?
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "verify: host {host} is bound to ByoMachine {machine}, which the target lacks"
                )
            })?;
        if bm.spec.provider_id.as_deref() != Some(want.as_str()) {
            anyhow::bail!(
                "verify: ByoMachine {pool}/{machine} on the target has providerID {:?}, not {want:?}",
                bm.spec.provider_id
            );
        }
    }
    let src_machines = names::<Machine>(source, pool).await?;
    let dst_machines = names::<Machine>(target, pool).await?;
    if src_machines != dst_machines {
        anyhow::bail!(
            "verify: the target's Machines ({}) are not the source's ({}): a machine was created or deleted \
             during the move",
            dst_machines.join(", "),
            src_machines.join(", ")
        );
    }
    let bound = before.values().filter(|m| m.is_some()).count();
    say(&format!(
        "on the target: {} host{} with the source's bindings ({bound} bound), {} Machine{} as on the source",
        before.len(),
        plural(before.len()),
        dst_machines.len(),
        plural(dst_machines.len())
    ));
    Ok(Checked {
        hosts: before.into_keys().collect(),
        bindings: bound,
    })
}

/// Host name → the ByoMachine it is bound to, in `pool`.
async fn bindings(client: &kube::Client, pool: &str) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    let api: Api<ByoHost> = Api::namespaced(client.clone(), pool);
    Ok(list(&api, "ByoHosts")
        .await?
        .into_iter()
        .map(|h| {
            let m = h.spec.machine_ref.as_ref().map(|r| r.name.clone());
            (h.name_any(), m)
        })
        .collect())
}

fn show(b: &BTreeMap<String, Option<String>>) -> String {
    b.iter()
        .map(|(h, m)| format!("{h}→{}", m.as_deref().unwrap_or("free")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A namespaced kind with a static type, as listed here.
trait Namespaced:
    Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Namespaced for K where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// Sorted names of the `K`s in `ns`.
async fn names<K: Namespaced>(client: &kube::Client, ns: &str) -> anyhow::Result<Vec<String>> {
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let mut n: Vec<String> = list(&api, &format!("{}s", K::kind(&())))
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    n.sort();
    Ok(n)
}

async fn list<K>(api: &Api<K>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("list the {what}"))?
        .items)
}

/// Sets `spec.paused` of every Cluster in `ns` to `paused`; returns their names.
async fn set_paused(client: &kube::Client, ns: &str, paused: bool) -> anyhow::Result<Vec<String>> {
    let api: Api<Cluster> = Api::namespaced(client.clone(), ns);
    let mut names = Vec::new();
    for c in list(&api, "Clusters").await? {
        let name = c.name_any();
        if c.spec.paused.unwrap_or(false) != paused {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": paused}})),
            )
            .await
            .with_context(|| format!("set spec.paused={paused} on Cluster {ns}/{name}"))?;
        }
        names.push(name);
    }
    Ok(names)
}

/// Waits until no BootsmanCluster, ByoCluster or ByoMachine of `ns` carries
/// `clusterctl.cluster.x-k8s.io/block-move`, checking `alive` between looks.
async fn wait_unblocked(
    client: &kube::Client,
    ns: &str,
    alive: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + UNBLOCK_TIMEOUT;
    loop {
        alive()?;
        let mut blocking = blocked::<BootsmanCluster>(client, ns).await?;
        blocking.extend(blocked::<ByoCluster>(client, ns).await?);
        blocking.extend(blocked::<ByoMachine>(client, ns).await?);
        if blocking.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "after {}s with their Clusters paused, these still block the move ({}): {}",
                UNBLOCK_TIMEOUT.as_secs(),
                labels::CLUSTERCTL_BLOCK_MOVE,
                blocking.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `Kind/name: reason` of each `K` in `ns` that blocks the move.
async fn blocked<K: Namespaced>(client: &kube::Client, ns: &str) -> anyhow::Result<Vec<String>> {
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    Ok(list(&api, &format!("{}s", K::kind(&())))
        .await?
        .iter()
        .filter_map(|o| {
            let why = o.annotations().get(labels::CLUSTERCTL_BLOCK_MOVE)?;
            Some(format!("{}/{}: {why}", K::kind(&()), o.name_any()))
        })
        .collect())
}

/// Runs the bundle's `clusterctl` with `args`, its configuration and caches under `dir` (it
/// reads no file of the user's and asks no release server for updates).
fn clusterctl(bundle: &Bundle, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let home = dir.join("clusterctl");
    std::fs::create_dir_all(&home).with_context(|| format!("create {}", home.display()))?;
    let config = home.join("clusterctl.yaml");
    if !config.exists() {
        std::fs::write(
            &config,
            "# clusterctl as bootsmanctl runs it: no provider repositories.\nproviders: []\n",
        )
        .with_context(|| format!("write {}", config.display()))?;
    }
    let program = bundle.require("clusterctl").context("--bundle")?;
    let out = Command::new(&program)
        .args(args)
        .arg("--config")
        .arg(&config)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .output()
        .with_context(|| format!("run {}", program.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "clusterctl {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}

/// Number of files in `dir` (0 when it does not exist).
fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter(|e| e.is_ok()).count())
}

/// The server and CA (PEM) of the first cluster of `kubeconfig`: the target as hosts reach it.
fn endpoint_of(kubeconfig: &Path) -> anyhow::Result<(String, Vec<u8>)> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| anyhow::anyhow!("{} names no cluster", kubeconfig.display()))?;
    let server = cluster
        .server
        .ok_or_else(|| anyhow::anyhow!("{}: its cluster has no server", kubeconfig.display()))?;
    let ca = cluster.certificate_authority_data.ok_or_else(|| {
        anyhow::anyhow!(
            "{}: its cluster has no certificate-authority-data",
            kubeconfig.display()
        )
    })?;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca.trim())
        .with_context(|| {
            format!(
                "{}: certificate-authority-data is not base64",
                kubeconfig.display()
            )
        })?;
    Ok((server, ca))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_target_endpoint_and_ca_come_from_its_kubeconfig() {
        let dir = std::env::temp_dir().join(format!("bootsman-pivot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("infra.kubeconfig");
        let ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: infra\n  cluster:\n    server: https://10.0.0.10:6443\n    \
             certificate-authority-data: {}\ncontexts: []\nusers: []\n",
            base64::engine::general_purpose::STANDARD.encode(ca)
        );
        std::fs::write(&file, text).unwrap();
        let (server, pem) = endpoint_of(&file).unwrap();
        assert_eq!(server, "https://10.0.0.10:6443");
        assert_eq!(pem, ca);

        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: https://a:1\n",
        )
        .unwrap();
        let err = endpoint_of(&file).unwrap_err().to_string();
        assert!(err.contains("certificate-authority-data"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bindings_are_shown_host_by_host() {
        let b = BTreeMap::from([
            ("h1".to_string(), Some("m1".to_string())),
            ("h2".to_string(), None),
        ]);
        assert_eq!(show(&b), "h1→m1, h2→free");
    }
}
