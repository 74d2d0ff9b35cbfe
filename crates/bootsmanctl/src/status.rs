//! `bootsmanctl status [CLUSTER]`: a cluster's objects as a tree with their conditions, in the
//! spirit of `clusterctl describe cluster`:
//!
//! ```text
//! BootsmanCluster/demo
//! └─Cluster/demo
//!   ├─KubeadmControlPlane/demo-control-plane
//!   │ └─Machine/demo-control-plane-x7k2p
//!   │   └─ByoMachine/demo-control-plane-x7k2p
//!   │     └─ByoHost/host-1
//!   └─MachineDeployment/demo-default
//!     └─Machine/…
//! ```
//!
//! Each object shows its summary condition (`Ready` where the kind has one, else Cluster API's
//! v1beta2 `Available`), how long ago it last changed, its reason and message, and a few facts
//! (replicas, phase, provider ID; for a host its agent's health and the age of its last
//! heartbeat, read off the host's Lease). `--all-conditions` lists every condition under each
//! object.
//!
//! The work is split so that most of it is pure: [`gather`] reads the objects (a handful of
//! LISTs and one GET per host and Lease), [`tree`] builds the [`Node`] tree from them, and
//! [`render`] prints it; `-o json` prints the tree as JSON instead.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use bootsman_api::condition::types;
use bootsman_api::v1alpha1::BootsmanCluster;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};

use crate::hosts::age;

/// One condition as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cond {
    /// The condition's type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason, when set.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Its message, when set.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When its status last changed (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// One object of the tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Its kind.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The condition that sums it up (see the module documentation); `None` when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<Cond>,
    /// Facts worth a glance: replicas, phase, provider ID, heartbeat.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub facts: Vec<String>,
    /// For a ByoHost: when its agent last renewed the host's Lease (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<String>,
    /// Every condition it reports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Cond>,
    /// The objects below it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Node>,
}

/// What [`tree`] is built from; everything as JSON, typed objects included, so a kind whose
/// API version moves on is still read field by field.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// The BootsmanCluster.
    pub bootsman_cluster: Value,
    /// The Cluster API Cluster of the same name, when it exists.
    pub cluster: Option<Value>,
    /// The Cluster's control plane (its `spec.controlPlaneRef`), when it exists.
    pub control_plane: Option<Value>,
    /// MachineDeployments whose `spec.clusterName` is the cluster.
    pub machine_deployments: Vec<Value>,
    /// Machines whose `spec.clusterName` is the cluster.
    pub machines: Vec<Value>,
    /// The ByoMachines of those Machines.
    pub byo_machines: Vec<Value>,
    /// The ByoHosts the ByoMachines are bound to, wherever they live.
    pub hosts: Vec<Value>,
    /// Heartbeat Leases of those hosts: `(namespace, name)` → `spec.renewTime`.
    pub heartbeats: BTreeMap<(String, String), String>,
}

fn capi(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// Lists `ar` in `namespace`, treating an API that is not served (no Cluster API installed) as
/// empty.
async fn list_dynamic(
    client: &kube::Client,
    namespace: &str,
    ar: &ApiResource,
) -> Result<Vec<Value>, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, ar);
    match api.list(&ListParams::default()).await {
        Ok(l) => Ok(l.items.into_iter().map(to_value).collect()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Object `name` of `ar` in `namespace`; `None` when it, or its API, does not exist.
async fn get_dynamic(
    client: &kube::Client,
    namespace: &str,
    ar: &ApiResource,
    name: &str,
) -> Result<Option<Value>, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, ar);
    Ok(api.get_opt(name).await?.map(to_value))
}

fn to_value(o: impl Serialize) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// Reads what the tree of BootsmanCluster `name` in `namespace` shows; an error names a
/// cluster that does not exist (`CLUSTER: …`) or the read that failed.
pub async fn gather(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<Objects> {
    read(client, namespace, name)
        .await
        .with_context(|| format!("read the objects of BootsmanCluster {namespace}/{name}"))?
        .ok_or_else(|| anyhow::anyhow!("CLUSTER: no BootsmanCluster {name:?} in namespace {namespace:?}"))
}

/// [`gather`], with `None` for a BootsmanCluster that does not exist.
async fn read(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<Objects>, kube::Error> {
    let Some(bc) = Api::<BootsmanCluster>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let mut o = Objects {
        bootsman_cluster: to_value(&bc),
        ..Objects::default()
    };
    o.cluster = get_dynamic(
        client,
        namespace,
        &capi("cluster.x-k8s.io", "v1beta2", "Cluster"),
        name,
    )
    .await?;
    if let Some(r) = o.cluster.as_ref().map(|c| &c["spec"]["controlPlaneRef"])
        && let (Some(kind), Some(cp_name)) = (r["kind"].as_str(), r["name"].as_str())
        && kind == "KubeadmControlPlane"
    {
        let kcp = capi("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane");
        o.control_plane = get_dynamic(client, namespace, &kcp, cp_name).await?;
    }
    let of_cluster = |v: &Value| v["spec"]["clusterName"] == name;
    o.machine_deployments = list_dynamic(
        client,
        namespace,
        &capi("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
    )
    .await?
    .into_iter()
    .filter(of_cluster)
    .collect();
    o.machines = list_dynamic(client, namespace, &capi("cluster.x-k8s.io", "v1beta2", "Machine"))
        .await?
        .into_iter()
        .filter(of_cluster)
        .collect();
    // Only the ByoMachines of this cluster's Machines, and so only their hosts.
    let wanted: BTreeSet<&str> = o
        .machines
        .iter()
        .filter(|m| m["spec"]["infrastructureRef"]["kind"] == "ByoMachine")
        .filter_map(|m| m["spec"]["infrastructureRef"]["name"].as_str())
        .collect();
    let byo_machines: Vec<Value> = Api::<ByoMachine>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(to_value)
        .filter(|b| b["metadata"]["name"].as_str().is_some_and(|n| wanted.contains(n)))
        .collect();
    o.byo_machines = byo_machines;
    for bm in &o.byo_machines {
        let r = &bm["status"]["hostRef"];
        let (Some(hns), Some(hname)) = (r["namespace"].as_str(), r["name"].as_str()) else {
            continue;
        };
        if let Some(h) = Api::<ByoHost>::namespaced(client.clone(), hns)
            .get_opt(hname)
            .await?
        {
            o.hosts.push(to_value(&h));
        }
        if let Some(renewed) = Api::<Lease>::namespaced(client.clone(), hns)
            .get_opt(hname)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
        {
            o.heartbeats
                .insert((hns.to_string(), hname.to_string()), renewed.0.to_string());
        }
    }
    Ok(Some(o))
}

/// The conditions of `obj` (`status.conditions`, metav1 form).
fn conditions(obj: &Value) -> Vec<Cond> {
    obj["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| Cond {
                    type_: c["type"].as_str().unwrap_or_default().to_string(),
                    status: c["status"].as_str().unwrap_or("Unknown").to_string(),
                    reason: c["reason"].as_str().unwrap_or_default().to_string(),
                    message: c["message"].as_str().unwrap_or_default().to_string(),
                    last_transition_time: c["lastTransitionTime"].as_str().map(String::from),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A node for `obj` summed up by the first of `summary_types` it reports.
fn node(obj: &Value, summary_types: &[&str]) -> Node {
    let conditions = conditions(obj);
    let summary = summary_types
        .iter()
        .find_map(|t| conditions.iter().find(|c| c.type_ == *t))
        .cloned();
    Node {
        kind: obj["kind"].as_str().unwrap_or_default().to_string(),
        namespace: obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        name: obj["metadata"]["name"].as_str().unwrap_or_default().to_string(),
        summary,
        facts: Vec::new(),
        heartbeat: None,
        conditions,
        children: Vec::new(),
    }
}

fn name_of(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

/// `<ready>/<desired> ready` from `status.readyReplicas` and `spec.replicas`.
fn replicas(obj: &Value) -> Option<String> {
    let desired = obj["spec"]["replicas"].as_i64()?;
    let ready = obj["status"]["readyReplicas"].as_i64().unwrap_or(0);
    Some(format!("{ready}/{desired} ready"))
}

fn machine_node(m: &Value, o: &Objects, now: Timestamp) -> Node {
    let mut n = node(m, &[types::READY, "Available"]);
    if let Some(p) = m["status"]["phase"].as_str() {
        n.facts.push(format!("phase {p}"));
    }
    if let Some(p) = m["spec"]["providerID"].as_str() {
        n.facts.push(p.to_string());
    }
    let infra = &m["spec"]["infrastructureRef"];
    if infra["kind"] == "ByoMachine"
        && let Some(bm) = o
            .byo_machines
            .iter()
            .find(|b| b["metadata"]["name"] == infra["name"])
    {
        n.children.push(byo_machine_node(bm, o, now));
    }
    n
}

fn byo_machine_node(bm: &Value, o: &Objects, now: Timestamp) -> Node {
    let mut n = node(bm, &[types::READY]);
    let r = &bm["status"]["hostRef"];
    if let Some(h) = o
        .hosts
        .iter()
        .find(|h| h["metadata"]["name"] == r["name"] && h["metadata"]["namespace"] == r["namespace"])
    {
        n.children.push(host_node(h, o, now));
    } else if let Some(hname) = r["name"].as_str() {
        n.facts.push(format!("host {hname} not found"));
    } else {
        n.facts.push("no host bound".into());
    }
    n
}

fn host_node(h: &Value, o: &Objects, now: Timestamp) -> Node {
    let mut n = node(h, &[types::AGENT_HEALTHY]);
    if let Some(p) = h["status"]["phase"].as_str() {
        n.facts.push(format!("phase {p}"));
    }
    match o.heartbeats.get(&(n.namespace.clone(), n.name.clone())) {
        Some(t) => {
            n.facts.push(format!("heartbeat {} ago", since(Some(t), now)));
            n.heartbeat = Some(t.clone());
        }
        None => n.facts.push("no heartbeat".into()),
    }
    if let Some(v) = h["status"]["agentVersion"].as_str() {
        n.facts.push(format!("agent {v}"));
    }
    if let Some(q) = h["spec"]["quarantine"]["reason"].as_str() {
        n.facts.push(format!("quarantined: {q}"));
    }
    if let Some(to) = h["spec"]["rehome"]["server"].as_str() {
        n.facts.push(format!("rehome to {to}"));
    }
    n
}

/// The tree of `o` as of `now`.
pub fn tree(o: &Objects, now: Timestamp) -> Node {
    let mut root = node(&o.bootsman_cluster, &[types::READY]);
    if let Some(p) = o.bootsman_cluster["status"]["phase"].as_str() {
        root.facts.push(format!("phase {p}"));
    }
    let Some(cluster) = &o.cluster else {
        root.facts.push("no Cluster yet".into());
        return root;
    };
    let mut c = node(cluster, &["Available", types::READY]);
    let mut shown = Vec::new();
    if let Some(cp) = &o.control_plane {
        let mut cpn = node(cp, &["Available", types::READY]);
        cpn.facts.extend(replicas(cp));
        for m in o.machines.iter().filter(|m| {
            m["metadata"]["labels"]
                .get(bootsman_api::labels::CONTROL_PLANE)
                .is_some()
        }) {
            shown.push(name_of(m).to_string());
            cpn.children.push(machine_node(m, o, now));
        }
        c.children.push(cpn);
    }
    for md in &o.machine_deployments {
        let mut mdn = node(md, &["Available", types::READY]);
        mdn.facts.extend(replicas(md));
        for m in o.machines.iter().filter(|m| {
            m["metadata"]["labels"][bootsman_api::labels::DEPLOYMENT_NAME] == md["metadata"]["name"]
        }) {
            shown.push(name_of(m).to_string());
            mdn.children.push(machine_node(m, o, now));
        }
        c.children.push(mdn);
    }
    // Machines of neither (a MachineSet or a Machine made by hand) hang off the Cluster.
    for m in o
        .machines
        .iter()
        .filter(|m| !shown.iter().any(|s| s == name_of(m)))
    {
        c.children.push(machine_node(m, o, now));
    }
    root.children.push(c);
    sort(&mut root);
    root
}

fn sort(n: &mut Node) {
    // Control plane before workers (by kind), then by name.
    let rank = |k: &str| match k {
        "KubeadmControlPlane" => 0,
        "MachineDeployment" => 1,
        _ => 2,
    };
    n.children
        .sort_by(|a, b| (rank(&a.kind), &a.name).cmp(&(rank(&b.kind), &b.name)));
    for c in &mut n.children {
        sort(c);
    }
}

/// How long ago RFC 3339 time `t` was, as `hosts list` shows ages; `-` when unknown.
fn since(t: Option<&str>, now: Timestamp) -> String {
    t.and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| age(now.duration_since(t).as_secs().max(0)))
        .unwrap_or_else(|| "-".into())
}

/// The longest message shown in a row; `-o json` keeps messages whole.
const MESSAGE_WIDTH: usize = 100;

/// The tree as a table: the tree in the first column, then the summary condition's status,
/// its age, reason and message (or the facts), one row per object; with `all_conditions`, one
/// more row per condition below each object.
pub fn render(root: &Node, now: Timestamp, all_conditions: bool) -> String {
    let mut rows: Vec<[String; 5]> = vec![[
        "NAME".into(),
        "READY".into(),
        "SINCE".into(),
        "REASON".into(),
        "MESSAGE".into(),
    ]];
    walk(root, "", "", now, all_conditions, &mut rows);
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, w) in widths.iter().enumerate() {
            line.push_str(&r[i]);
            line.push_str(&" ".repeat(w - r[i].chars().count() + 2));
        }
        line.push_str(&r[4]);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn clip(s: &str) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > MESSAGE_WIDTH {
        format!(
            "{}…",
            one_line.chars().take(MESSAGE_WIDTH - 1).collect::<String>()
        )
    } else {
        one_line
    }
}

fn walk(n: &Node, lead: &str, child_lead: &str, now: Timestamp, all: bool, rows: &mut Vec<[String; 5]>) {
    let (ready, since_, reason, message) = match &n.summary {
        Some(c) => (
            c.status.clone(),
            since(c.last_transition_time.as_deref(), now),
            c.reason.clone(),
            c.message.clone(),
        ),
        None => ("-".into(), "-".into(), String::new(), String::new()),
    };
    let message = [n.facts.join(", "), message]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    rows.push([
        format!("{lead}{}/{}", n.kind, n.name),
        ready,
        since_,
        reason,
        clip(&message),
    ]);
    let kids = n.children.len();
    if all {
        for c in &n.conditions {
            let bar = if kids > 0 { "│ " } else { "  " };
            rows.push([
                format!("{child_lead}{bar}· {}", c.type_),
                c.status.clone(),
                since(c.last_transition_time.as_deref(), now),
                c.reason.clone(),
                clip(&c.message),
            ]);
        }
    }
    for (i, c) in n.children.iter().enumerate() {
        let last = i + 1 == kids;
        let (l, cl) = if last {
            ("└─", "  ")
        } else {
            ("├─", "│ ")
        };
        walk(
            c,
            &format!("{child_lead}{l}"),
            &format!("{child_lead}{cl}"),
            now,
            all,
            rows,
        );
    }
}

/// Names of the BootsmanClusters of `namespace`, sorted.
pub async fn names(client: &kube::Client, namespace: &str) -> Result<Vec<String>, kube::Error> {
    let mut names: Vec<String> = Api::<BootsmanCluster>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|b| b.name_any())
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn cond(t: &str, s: &str, reason: &str, at: &str) -> Value {
        json!({"type": t, "status": s, "reason": reason, "message": format!("{t} says {s}"), "lastTransitionTime": at})
    }

    fn objects() -> Objects {
        let at = "2026-12-06T10:00:00Z";
        let machine = |name: &str, labels: Value, bm: &str| {
            json!({"kind": "Machine", "metadata": {"name": name, "namespace": "ns", "labels": labels},
                   "spec": {"clusterName": "demo", "infrastructureRef": {"kind": "ByoMachine", "name": bm},
                            "providerID": format!("byoh://{bm}")},
                   "status": {"phase": "Running", "conditions": [cond("Ready", "True", "Ready", at)]}})
        };
        let byo_machine = |name: &str, host: Option<&str>| {
            json!({"kind": "ByoMachine", "metadata": {"name": name, "namespace": "ns"},
                   "status": {"hostRef": host.map(|h| json!({"namespace": "pool", "name": h})),
                              "conditions": [cond("Ready", if host.is_some() {"True"} else {"False"}, "WaitingForHost", at)]}})
        };
        Objects {
            bootsman_cluster: json!({"kind": "BootsmanCluster", "metadata": {"name": "demo", "namespace": "ns"},
                "status": {"phase": "Ready", "conditions": [cond("Ready", "True", "Ready", at), cond("Stalled", "False", "Valid", at)]}}),
            cluster: Some(
                json!({"kind": "Cluster", "metadata": {"name": "demo", "namespace": "ns"},
                "status": {"conditions": [cond("Available", "True", "Available", at)]}}),
            ),
            control_plane: Some(
                json!({"kind": "KubeadmControlPlane", "metadata": {"name": "demo-control-plane", "namespace": "ns"},
                "spec": {"replicas": 3}, "status": {"readyReplicas": 1, "conditions": [cond("Available", "False", "NotEnoughReplicas", at)]}}),
            ),
            machine_deployments: vec![
                json!({"kind": "MachineDeployment", "metadata": {"name": "demo-default", "namespace": "ns"},
                "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}),
            ],
            machines: vec![
                machine(
                    "demo-default-b",
                    json!({"cluster.x-k8s.io/deployment-name": "demo-default"}),
                    "bm-w",
                ),
                machine(
                    "demo-control-plane-a",
                    json!({"cluster.x-k8s.io/control-plane": ""}),
                    "bm-cp",
                ),
                machine("stray", json!({}), "bm-none"),
            ],
            byo_machines: vec![
                byo_machine("bm-cp", Some("h1")),
                byo_machine("bm-w", Some("h2")),
                byo_machine("bm-none", None),
            ],
            hosts: vec![
                json!({"kind": "ByoHost", "metadata": {"name": "h1", "namespace": "pool"},
                       "status": {"phase": "Provisioned", "agentVersion": "0.1.0", "conditions": [cond("AgentHealthy", "True", "LeaseRenewed", at)]}}),
                json!({"kind": "ByoHost", "metadata": {"name": "h2", "namespace": "pool"}, "spec": {"quarantine": {"reason": "reset failed"}},
                       "status": {"phase": "Offline", "conditions": [cond("AgentHealthy", "False", "LeaseExpired", at)]}}),
            ],
            heartbeats: [(
                ("pool".to_string(), "h1".to_string()),
                "2026-12-06T10:59:57Z".to_string(),
            )]
            .into(),
        }
    }

    #[test]
    fn the_tree_follows_references_and_puts_the_control_plane_first() {
        let now: Timestamp = "2026-12-06T11:00:00Z".parse().unwrap();
        let t = tree(&objects(), now);
        let shape = |n: &Node| format!("{}/{}", n.kind, n.name);
        assert_eq!(shape(&t), "BootsmanCluster/demo");
        let c = &t.children[0];
        let kids: Vec<String> = c.children.iter().map(shape).collect();
        assert_eq!(
            kids,
            [
                "KubeadmControlPlane/demo-control-plane",
                "MachineDeployment/demo-default",
                "Machine/stray"
            ]
        );
        let cp_host = &c.children[0].children[0].children[0].children[0];
        assert_eq!(shape(cp_host), "ByoHost/h1");
        assert_eq!(
            cp_host.facts,
            ["phase Provisioned", "heartbeat 3s ago", "agent 0.1.0"]
        );
        let w_host = &c.children[1].children[0].children[0].children[0];
        assert_eq!(w_host.summary.as_ref().unwrap().reason, "LeaseExpired");
        assert!(w_host.facts.contains(&"no heartbeat".to_string()));
        assert!(w_host.facts.contains(&"quarantined: reset failed".to_string()));
        assert_eq!(c.children[0].facts, ["1/3 ready"]);
        assert_eq!(c.children[2].children[0].facts, ["no host bound"]);
    }

    /// The first column of a row: the tree drawing and `Kind/name`.
    fn tree_column(row: &str) -> &str {
        let end = row
            .find('/')
            .map_or(0, |i| i + row[i..].find(' ').unwrap_or(row.len() - i));
        if end == 0 {
            row.split_whitespace().next().unwrap()
        } else {
            &row[..end]
        }
    }

    #[test]
    fn the_table_draws_the_tree_and_lists_conditions_on_request() {
        let now: Timestamp = "2026-12-06T11:00:00Z".parse().unwrap();
        let t = tree(&objects(), now);
        let out = render(&t, now, false);
        let names: Vec<&str> = out.lines().map(tree_column).collect();
        assert_eq!(
            names,
            [
                "NAME",
                "BootsmanCluster/demo",
                "└─Cluster/demo",
                "  ├─KubeadmControlPlane/demo-control-plane",
                "  │ └─Machine/demo-control-plane-a",
                "  │   └─ByoMachine/bm-cp",
                "  │     └─ByoHost/h1",
                "  ├─MachineDeployment/demo-default",
                "  │ └─Machine/demo-default-b",
                "  │   └─ByoMachine/bm-w",
                "  │     └─ByoHost/h2",
                "  └─Machine/stray",
                "    └─ByoMachine/bm-none",
            ],
            "{out}"
        );
        let cp = out.lines().find(|l| l.contains("KubeadmControlPlane")).unwrap();
        assert!(
            cp.contains("False") && cp.contains("1h0m") && cp.contains("NotEnoughReplicas"),
            "{cp}"
        );
        assert!(cp.contains("1/3 ready; Available says False"), "{cp}");
        let all = render(&t, now, true);
        assert!(
            all.lines()
                .any(|l| l.starts_with("│ · Stalled") && l.contains("Valid")),
            "{all}"
        );
        assert!(all.lines().count() > out.lines().count());
    }
}
