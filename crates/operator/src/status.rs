//! A BootsmanCluster's status as a pure function of its spec, its stored status and what the
//! operator observed ([`Observed`]): conditions, phase, counts, and the Events a change of them
//! deserves. The controller gathers the observation; nothing here reads the API server, so every
//! condition's reasons are tested from YAML fixtures (`tests/fixtures/status/`).
//!
//! Conditions (kstatus): `Ready` and `Reconciling` sum up `ControlPlaneReady`, `WorkersReady`
//! and `AddonsReady`; `HostsAvailable` says whether the pool holds enough free hosts for what is
//! still unbound; `Stalled` holds for a spec that breaks a rule ([`invalid`]); `Paused` is
//! `False` whenever the cluster is reconciled.

use std::collections::{BTreeMap, BTreeSet};

use bootsman_api::capi::{KubeadmControlPlaneStatus, MachineDeploymentStatus};
use bootsman_api::v1alpha1::{BootsmanCluster, BootsmanClusterStatus, ClusterPhase, Cni, ReplicaCounts};
use bootsman_api::v1beta1::{ByoHost, HostPhase};
use bootsman_runtime::conditions::{self, Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::ResourceExt;
use serde::Deserialize;

use crate::render::pool_object_name;
use crate::validate::Violation;

/// Key of [`Observed::serving`] for the control plane (worker pools are keyed by their
/// MachineDeployment's name).
pub const CONTROL_PLANE_ROLE: &str = "control-plane";

/// What the operator read for one BootsmanCluster, as it read it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Observed {
    /// The KubeadmControlPlane's status; `None` while it does not exist.
    pub control_plane: Option<KubeadmControlPlaneStatus>,
    /// The status of each worker pool's MachineDeployment, by the MachineDeployment's name (a
    /// missing one counts nothing ready).
    pub machine_deployments: BTreeMap<String, MachineDeploymentStatus>,
    /// Hosts already serving the cluster, per role ([`CONTROL_PLANE_ROLE`] or a worker pool's
    /// MachineDeployment name): Machines whose ByoMachine has a host bound.
    pub serving: BTreeMap<String, i32>,
    /// The ByoHosts of every pool the cluster's namespace may use (free or not: [`is_free`]
    /// decides).
    pub hosts: Vec<ByoHost>,
    /// The cluster's kubeconfig Secret (`<name>-kubeconfig`) exists.
    pub kubeconfig: bool,
    /// kube-router's ClusterResourceSet reports `ResourcesApplied=True`.
    pub cni_resources_applied: bool,
    /// The ClusterResourceSet of `spec.network.isolation` (`<name>-isolation`) reports
    /// `ResourcesApplied=True`.
    pub isolation_resources_applied: bool,
    /// The HelmChartProxy API (CAAPH) is not served.
    pub chart_proxy_api_missing: bool,
    /// Names of the cluster's HelmChartProxies that report `Ready=True`.
    pub ready_chart_proxies: BTreeSet<String>,
}

/// An Event to publish on the BootsmanCluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's note.
    pub message: String,
}

/// The status to write and the Events to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The new status (equal to the stored one when nothing changed).
    pub status: BootsmanClusterStatus,
    /// Events, in order.
    pub notes: Vec<Note>,
}

/// Whether `host` may be claimed now: `Available`, unclaimed, not in maintenance, not
/// quarantined and not being deleted.
pub fn is_free(host: &ByoHost) -> bool {
    host.status.as_ref().and_then(|s| s.phase) == Some(HostPhase::Available)
        && host.spec.machine_ref.is_none()
        && host.spec.maintenance != Some(true)
        && host.spec.quarantine.is_none()
        && host.metadata.deletion_timestamp.is_none()
}

/// Whether `labels` satisfy `selector` (no selector, or an empty one, selects everything).
pub fn matches(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = selector else { return true };
    let ml = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let me = sel.match_expressions.iter().flatten().all(|e| {
        let vals = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    ml && me
}

/// The addons of this cluster installed as Helm charts (HelmChartProxy `<cluster>-<addon>`).
pub fn chart_addons(bc: &BootsmanCluster) -> Vec<&'static str> {
    let spec = &bc.spec;
    let mut out = Vec::new();
    if spec.network.cni == Cni::Cilium {
        out.push("cilium");
    }
    if spec.storage.longhorn.enabled {
        out.push("longhorn");
    }
    if spec.ingress.nginx.enabled {
        out.push("ingress-nginx");
    }
    if spec.load_balancer.metallb.enabled {
        out.extend(["metallb", "metallb-config"]);
    }
    out
}

/// The status of a spec that breaks `violations` (never empty): `Stalled=True` and
/// `Ready=False` naming every rule, phase `Failed`, and a Warning the first time.
pub fn invalid(bc: &BootsmanCluster, violations: &[Violation], now: &Time) -> Report {
    let generation = bc.metadata.generation;
    let mut status = bc.status.clone().unwrap_or_default();
    let msg = violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let was_stalled = conditions::is_true(&status.conditions, "Stalled");
    for (type_, st, m) in [
        ("Stalled", Status::True, msg.as_str()),
        ("Ready", Status::False, msg.as_str()),
        ("Reconciling", Status::False, ""),
    ] {
        set(
            &mut status.conditions,
            type_,
            st,
            "InvalidSpec",
            m,
            generation,
            now,
        );
    }
    status.phase = Some(ClusterPhase::Failed);
    status.observed_generation = generation;
    let notes = if was_stalled {
        Vec::new()
    } else {
        vec![Note {
            warning: true,
            reason: "InvalidSpec",
            message: msg,
        }]
    };
    Report { status, notes }
}

/// The status of a valid, reconciled BootsmanCluster given what was `observed`.
pub fn compute(bc: &BootsmanCluster, observed: &Observed, now: &Time) -> Report {
    let name = bc.name_any();
    let gen_ = bc.metadata.generation;
    let mut status = bc.status.clone().unwrap_or_default();
    let mut notes = Vec::new();

    let kcp_status = observed.control_plane.clone().unwrap_or_default();
    let cp = ReplicaCounts {
        desired: bc.spec.control_plane.replicas,
        ready: kcp_status.ready_replicas.unwrap_or(0),
    };
    let free: Vec<&ByoHost> = observed.hosts.iter().filter(|h| is_free(h)).collect();
    let count = |sel: Option<&LabelSelector>| free.iter().filter(|h| matches(sel, h.labels())).count() as i32;

    let mut pool_missing = Vec::new();
    let cp_bound = observed.serving.get(CONTROL_PLANE_ROLE).copied().unwrap_or(0);
    let cp_needed = (cp.desired - cp_bound).max(0);
    let cp_free = count(bc.spec.control_plane.host_selector.as_ref());
    if cp_needed > cp_free {
        pool_missing.push(format!(
            "control-plane: {} more host(s) needed",
            cp_needed - cp_free
        ));
    }
    let mut workers = ReplicaCounts::default();
    for pool in &bc.spec.workers {
        let md_name = pool_object_name(&name, &pool.name);
        let ready = observed
            .machine_deployments
            .get(&md_name)
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        workers.desired += pool.replicas;
        workers.ready += ready;
        let bound = observed.serving.get(md_name.as_str()).copied().unwrap_or(0);
        let needed = (pool.replicas - bound).max(0);
        let avail = count(pool.host_selector.as_ref());
        if needed > avail {
            pool_missing.push(format!(
                "workers/{}: {} more host(s) needed",
                pool.name,
                needed - avail
            ));
        }
    }

    let (addons_ready, addons_reason, addons_msg) = addons(bc, observed);
    let cp_ready = cp.ready >= cp.desired;
    let w_ready = workers.ready >= workers.desired;
    let ready = cp_ready && w_ready && addons_ready;
    let hosts_ok = pool_missing.is_empty();

    let c = &mut status.conditions;
    let was_hosts_ok = conditions::get(c, "HostsAvailable").map(|x| x.status == "True");
    set(c, "Stalled", Status::False, "Valid", "", gen_, now);
    let hosts_msg = if hosts_ok {
        "enough free hosts for every role".to_string()
    } else {
        pool_missing.join("; ")
    };
    // (type, holds, reason when it holds, reason when not, message)
    let table = [
        (
            "ControlPlaneReady",
            cp_ready,
            "Ready",
            "WaitingForMachines",
            control_plane_message(&cp, &kcp_status.conditions),
        ),
        (
            "WorkersReady",
            w_ready,
            "Ready",
            "WaitingForMachines",
            format!("{}/{} worker machines ready", workers.ready, workers.desired),
        ),
        ("HostsAvailable", hosts_ok, "Enough", "NotEnoughHosts", hosts_msg),
        (
            "AddonsReady",
            addons_ready,
            addons_reason,
            addons_reason,
            addons_msg,
        ),
    ];
    let waiting = if ready {
        String::new()
    } else {
        waiting_message(&table)
    };
    let table = table.into_iter().chain([
        ("Ready", ready, "Ready", "NotReady", waiting.clone()),
        ("Reconciling", !ready, "Provisioning", "Done", waiting),
    ]);
    for (type_, holds, yes, no, msg) in table {
        let reason = if holds { yes } else { no };
        set(c, type_, Status::from_bool(holds), reason, &msg, gen_, now);
    }
    set(c, "Paused", Status::False, "NotPaused", "", gen_, now);
    if was_hosts_ok != Some(hosts_ok) && !hosts_ok {
        notes.push(Note {
            warning: true,
            reason: "NotEnoughHosts",
            message: pool_missing.join("; "),
        });
    }

    // A scale lasts from the replica change until the cluster is Ready again.
    let old_phase = status.phase;
    status.phase = Some(if ready {
        ClusterPhase::Ready
    } else if kcp_status.replicas.unwrap_or(0) == 0 && workers.ready == 0 {
        ClusterPhase::Pending
    } else if old_phase == Some(ClusterPhase::Scaling)
        || status
            .control_plane
            .as_ref()
            .is_some_and(|o| o.desired != cp.desired)
        || status
            .workers
            .as_ref()
            .is_some_and(|o| o.desired != workers.desired)
    {
        ClusterPhase::Scaling
    } else {
        ClusterPhase::Provisioning
    });
    if old_phase != status.phase
        && let Some(p) = status.phase
    {
        notes.push(Note {
            warning: false,
            reason: "PhaseChanged",
            message: format!("phase is now {p:?}"),
        });
    }
    status.observed_generation = gen_;
    status.control_plane = Some(cp);
    status.workers = Some(workers);
    status.kubeconfig_secret = observed.kubeconfig.then(|| format!("{name}-kubeconfig"));
    Report { status, notes }
}

/// `AddonsReady` by the path each addon takes: the ClusterResourceSet of a plain-manifest addon
/// (kube-router, the isolation policies) reports `ResourcesApplied`, each HelmChartProxy (Cilium, Longhorn, ingress-nginx,
/// MetalLB) reports `Ready`. Returns whether all are, the reason, and a message naming each addon,
/// its path and where it stands.
fn addons(bc: &BootsmanCluster, observed: &Observed) -> (bool, &'static str, String) {
    let name = bc.name_any();
    let mut parts = Vec::new();
    let mut all = true;
    if bc.spec.network.cni == Cni::KubeRouter {
        let crs_name = crate::render::resource_set_name(&name, "cni");
        let applied = observed.cni_resources_applied;
        all &= applied;
        parts.push(format!(
            "cni kube-router: ClusterResourceSet {crs_name}, {}",
            if applied { "applied" } else { "not applied yet" }
        ));
    }
    if bc.spec.network.isolation.is_some() {
        let crs_name = crate::render::resource_set_name(&name, "isolation");
        let applied = observed.isolation_resources_applied;
        all &= applied;
        parts.push(format!(
            "isolation: ClusterResourceSet {crs_name}, {}",
            if applied { "applied" } else { "not applied yet" }
        ));
    }
    let charts = chart_addons(bc);
    let api_missing = observed.chart_proxy_api_missing;
    if !charts.is_empty() {
        if api_missing {
            all = false;
            parts.push(format!(
                "{}: HelmChartProxy, the HelmChartProxy API (CAAPH) is not installed",
                charts.join(", ")
            ));
        } else {
            for addon in &charts {
                let ready = observed.ready_chart_proxies.contains(&format!("{name}-{addon}"));
                all &= ready;
                parts.push(format!(
                    "{addon}: HelmChartProxy, {}",
                    if ready { "ready" } else { "installing" }
                ));
            }
        }
    }
    let reason = if all {
        "Ready"
    } else if api_missing && !charts.is_empty() {
        "HelmChartProxyUnavailable"
    } else {
        "Installing"
    };
    (all, reason, parts.join("; "))
}

/// The message of `Ready` and `Reconciling`: every condition that does not hold yet, with its
/// own message, so `kubectl get -o wide` and GitOps tools show what the cluster waits for without a
/// `describe`. Empty once everything holds.
fn waiting_message(table: &[(&str, bool, &str, &str, String)]) -> String {
    let waits: Vec<String> = table
        .iter()
        .filter(|(_, holds, ..)| !holds)
        .map(|(type_, _, _, _, msg)| {
            if msg.is_empty() {
                type_.to_string()
            } else {
                format!("{type_}: {msg}")
            }
        })
        .collect();
    if waits.is_empty() {
        String::new()
    } else {
        format!("waiting for {}", waits.join(" | "))
    }
}

/// `ControlPlaneReady`'s message: the ready count and, while not all are ready, what the
/// KubeadmControlPlane itself says it waits for (a blocked scale-up, or why it is not available).
fn control_plane_message(cp: &ReplicaCounts, kcp: &[Condition]) -> String {
    let counts = format!("{}/{} control-plane machines ready", cp.ready, cp.desired);
    if cp.ready >= cp.desired {
        return counts;
    }
    let waiting = kcp
        .iter()
        .find(|c| c.type_ == "ScalingUp" && c.status == "True" && !c.message.is_empty())
        .or_else(|| {
            kcp.iter()
                .find(|c| c.type_ == "Available" && c.status == "False" && !c.message.is_empty())
        });
    match waiting {
        Some(c) => {
            // CAPI's messages are lines with `* ` bullets; one line reads `a: b; c`.
            let mut text = String::new();
            for line in c
                .message
                .lines()
                .map(|l| l.trim().trim_start_matches("* ").trim())
            {
                if line.is_empty() {
                    continue;
                }
                if !text.is_empty() {
                    text.push_str(if text.ends_with(':') { " " } else { "; " });
                }
                text.push_str(line);
            }
            if text.len() > 400 {
                let cut = (0..=400).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
                text.truncate(cut);
                text.push('…');
            }
            format!("{counts}; KubeadmControlPlane {}: {text}", c.type_)
        }
        None => counts,
    }
}

/// Sets condition `type_` (see [`conditions::set`]).
pub(crate) fn set(
    c: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    conditions::set(c, type_, status, reason, message, generation, now.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: message.into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        }
    }

    #[test]
    fn ready_names_every_condition_that_does_not_hold() {
        let row = |t, holds, msg: &str| (t, holds, "Ready", "NotReady", msg.to_string());
        let table = [
            row("ControlPlaneReady", false, "1/3 control-plane machines ready"),
            row("WorkersReady", true, "3/3 worker machines ready"),
            row("HostsAvailable", false, "control-plane: 2 more host(s) needed"),
            row("AddonsReady", false, ""),
        ];
        assert_eq!(
            waiting_message(&table),
            "waiting for ControlPlaneReady: 1/3 control-plane machines ready | \
             HostsAvailable: control-plane: 2 more host(s) needed | AddonsReady"
        );
        let done = [
            row("ControlPlaneReady", true, "3/3"),
            row("AddonsReady", true, ""),
        ];
        assert_eq!(waiting_message(&done), "");
    }

    #[test]
    fn control_plane_message_says_what_the_control_plane_waits_for() {
        let cp = ReplicaCounts { desired: 3, ready: 0 };
        let blocked = cond(
            "ScalingUp",
            "True",
            "Scaling up from 1 to 3 replicas is blocked because:\n* Machine m1 does not have a corresponding Node yet",
        );
        assert_eq!(
            control_plane_message(&cp, &[cond("Available", "False", "not yet"), blocked]),
            "0/3 control-plane machines ready; KubeadmControlPlane ScalingUp: Scaling up from 1 to 3 \
             replicas is blocked because: Machine m1 does not have a corresponding Node yet"
        );
        assert_eq!(
            control_plane_message(&cp, &[cond("Available", "False", "no etcd quorum")]),
            "0/3 control-plane machines ready; KubeadmControlPlane Available: no etcd quorum"
        );
        assert_eq!(
            control_plane_message(&cp, &[]),
            "0/3 control-plane machines ready"
        );
        let done = ReplicaCounts { desired: 3, ready: 3 };
        assert_eq!(
            control_plane_message(&done, &[cond("Available", "False", "x")]),
            "3/3 control-plane machines ready"
        );
        let long = cond("Available", "False", &"é".repeat(300));
        assert!(control_plane_message(&cp, &[long]).ends_with('…'));
    }
}
