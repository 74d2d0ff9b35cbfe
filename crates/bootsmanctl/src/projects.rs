//! `bootsmanctl projects`: the Projects sharing the infrastructure cluster (`list`, for platform
//! admins) and one project's use of its quotas, cluster by cluster (`usage`, for its members
//! too: it reads the Project by name and the clusters of its namespaces).

use bootsman_api::v1alpha1::{BootsmanCluster, Project, ProjectUsage};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

/// One row of `projects list`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProjectRow {
    /// The Project's name.
    pub name: String,
    /// Its display name.
    pub display_name: String,
    /// The namespaces it holds (status), else those it asks for.
    pub namespaces: Vec<String>,
    /// Its host pools.
    pub host_pools: Vec<String>,
    /// How many members it lists.
    pub members: usize,
    /// BootsmanClusters (status).
    pub clusters: i32,
    /// `quotas.clusters`, when set.
    pub cluster_quota: Option<i32>,
    /// `Ready` condition status and reason, `Unknown` before the operator has seen it.
    pub ready: String,
}

/// The row of project `p`.
pub fn row(p: &Project) -> ProjectRow {
    let status = p.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            if c.status == "True" {
                "True".to_string()
            } else {
                format!("{} ({})", c.status, c.reason)
            }
        })
        .unwrap_or_else(|| "Unknown".into());
    ProjectRow {
        name: p.name_any(),
        display_name: p.spec.display_name.clone().unwrap_or_default(),
        namespaces: if status.namespaces.is_empty() {
            p.spec.namespaces.clone()
        } else {
            status.namespaces.clone()
        },
        host_pools: p.spec.host_pools.clone(),
        members: p.spec.members.len(),
        clusters: status.usage.clusters,
        cluster_quota: p.spec.quotas.as_ref().and_then(|q| q.clusters),
        ready,
    }
}

/// Aligned columns of `rows`.
pub fn render_list(rows: &[ProjectRow]) -> String {
    let mut table = vec![[
        "NAME".to_string(),
        "DISPLAY NAME".into(),
        "NAMESPACES".into(),
        "HOST POOLS".into(),
        "MEMBERS".into(),
        "CLUSTERS".into(),
        "READY".into(),
    ]];
    for r in rows {
        let join = |v: &[String]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(",")
            }
        };
        table.push([
            r.name.clone(),
            if r.display_name.is_empty() {
                "-".into()
            } else {
                r.display_name.clone()
            },
            join(&r.namespaces),
            join(&r.host_pools),
            r.members.to_string(),
            match r.cluster_quota {
                Some(q) => format!("{}/{q}", r.clusters),
                None => r.clusters.to_string(),
            },
            r.ready.clone(),
        ]);
    }
    columns(&table)
}

/// A project's use of its quotas, with the clusters that make it up.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// The Project.
    pub project: String,
    /// Each quota: name, used, limit (`None`: no limit).
    pub quotas: Vec<QuotaUse>,
    /// The clusters counted.
    pub clusters: Vec<ClusterUse>,
}

/// One quota's use.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuotaUse {
    /// `clusters`, `controlPlaneHosts` or `workerHosts`.
    pub quota: &'static str,
    /// What the project's clusters ask for now.
    pub used: i32,
    /// The limit, if any.
    pub limit: Option<i32>,
}

/// What one cluster asks for.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUse {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Control-plane hosts (`spec.controlPlane.replicas`).
    pub control_plane_hosts: i32,
    /// Worker hosts (sum of `spec.workers[].replicas`).
    pub worker_hosts: i32,
}

/// The usage of `p` made of `clusters` (those of its namespaces).
pub fn usage(p: &Project, clusters: &[BootsmanCluster]) -> Usage {
    let total = ProjectUsage::of(clusters);
    let rows = clusters
        .iter()
        .map(|c| ClusterUse {
            namespace: c.namespace().unwrap_or_default(),
            name: c.name_any(),
            control_plane_hosts: c.spec.control_plane.replicas,
            worker_hosts: c.spec.worker_replicas(),
        })
        .collect();
    let q = p.spec.quotas.clone().unwrap_or_default();
    Usage {
        project: p.name_any(),
        quotas: vec![
            QuotaUse {
                quota: "clusters",
                used: total.clusters,
                limit: q.clusters,
            },
            QuotaUse {
                quota: "controlPlaneHosts",
                used: total.control_plane_hosts,
                limit: q.control_plane_hosts,
            },
            QuotaUse {
                quota: "workerHosts",
                used: total.worker_hosts,
                limit: q.worker_hosts,
            },
        ],
        clusters: rows,
    }
}

/// Aligned columns of `u`: the quotas, then the clusters.
pub fn render_usage(u: &Usage) -> String {
    let mut quotas = vec![["QUOTA".to_string(), "USED".into(), "LIMIT".into(), "LEFT".into()]];
    for q in &u.quotas {
        quotas.push([
            q.quota.to_string(),
            q.used.to_string(),
            q.limit.map_or("-".into(), |l| l.to_string()),
            q.limit.map_or("-".into(), |l| {
                let left = l - q.used;
                if left < 0 {
                    format!("{left} (over)")
                } else {
                    left.to_string()
                }
            }),
        ]);
    }
    let mut clusters = vec![[
        "CLUSTER".to_string(),
        "CONTROL-PLANE HOSTS".into(),
        "WORKER HOSTS".into(),
    ]];
    for c in &u.clusters {
        clusters.push([
            format!("{}/{}", c.namespace, c.name),
            c.control_plane_hosts.to_string(),
            c.worker_hosts.to_string(),
        ]);
    }
    let mut out = format!("Project {}\n", u.project);
    out.push_str(&columns(&quotas));
    out.push('\n');
    if u.clusters.is_empty() {
        out.push_str("no BootsmanCluster in the project's namespaces\n");
    } else {
        out.push_str(&columns(&clusters));
    }
    out
}

/// Left-aligned columns separated by three spaces.
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// Every Project, as rows.
pub async fn list(client: &kube::Client) -> anyhow::Result<Vec<ProjectRow>> {
    let projects = Api::<Project>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 403 => anyhow::anyhow!(
                "listing Projects is for platform admins (verb list on projects.bootsman.io); a \
                 member sees its own project with `bootsmanctl projects usage <name>`: {}",
                s.message
            ),
            _ => anyhow::anyhow!("listing Projects: {e}"),
        })?;
    let mut rows: Vec<ProjectRow> = projects.items.iter().map(row).collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

/// Project `name`'s usage, from its clusters as they are now.
pub async fn usage_of(client: &kube::Client, name: &str) -> anyhow::Result<Usage> {
    let p = Api::<Project>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(|e| anyhow::anyhow!("reading Project {name}: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("no Project named {name}"))?;
    let held = p
        .status
        .as_ref()
        .map(|s| s.namespaces.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| p.spec.namespaces.clone());
    let mut clusters = Vec::new();
    for ns in &held {
        let list = Api::<BootsmanCluster>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| anyhow::anyhow!("listing BootsmanClusters in {ns}: {e}"))?;
        clusters.extend(list.items);
    }
    clusters.sort_by_key(|c| (c.namespace(), c.name_any()));
    Ok(usage(&p, &clusters))
}
