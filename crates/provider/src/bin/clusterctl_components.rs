//! `clusterctl-components`: assembles the provider's `infrastructure-components.yaml` for
//! clusterctl (`hack/release` runs it): one Namespace, the infrastructure CRDs of `config/crd`,
//! and the provider's objects as the chart renders them (Deployment, RBAC, host policy), every
//! object labelled `cluster.x-k8s.io/provider=infrastructure-byoh`, Helm's own labels dropped.
//!
//! ```text
//! clusterctl-components --namespace byoh-system --version 0.1.0 \
//!     --rendered target/release/.provider.yaml --out target/release/infrastructure-components.yaml
//! ```
//!
//! clusterctl puts every namespaced object into the provider's namespace, so the approver's Role
//! and RoleBinding in `kube-system` (bootstrap-token Secrets) become cluster-wide ones here.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Map, Value, json};

/// The label clusterctl finds a provider's objects by.
const PROVIDER_LABEL: (&str, &str) = ("cluster.x-k8s.io/provider", "infrastructure-byoh");
/// Helm's labels, which mean nothing once clusterctl installs the objects.
const HELM_LABELS: [&str; 3] = [
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "app.kubernetes.io/instance",
];

struct Args {
    namespace: String,
    version: String,
    rendered: PathBuf,
    out: PathBuf,
    crds: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut namespace, mut version, mut rendered, mut out) = (None, None, None, None);
    let mut crds = repo_root().join("config/crd");
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag}: needs a value"));
        match flag.as_str() {
            "--namespace" => namespace = Some(value()?),
            "--version" => version = Some(value()?),
            "--rendered" => rendered = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--crds" => crds = PathBuf::from(value()?),
            other => return Err(format!("{other}: unknown flag")),
        }
    }
    Ok(Args {
        namespace: namespace.ok_or("--namespace is required")?,
        version: version.ok_or("--version is required")?,
        rendered: rendered.ok_or("--rendered is required (the chart's provider objects)")?,
        out: out.ok_or("--out is required")?,
        crds,
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read_docs(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn run(args: &Args) -> Result<usize, String> {
    let mut docs = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": args.namespace}})];
    let mut crd_files: Vec<PathBuf> = std::fs::read_dir(&args.crds)
        .map_err(|e| format!("{}: {e}", args.crds.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".infrastructure.cluster.x-k8s.io.yaml"))
        })
        .collect();
    crd_files.sort();
    for f in &crd_files {
        docs.extend(read_docs(f)?);
    }
    docs.extend(read_docs(&args.rendered)?);
    let kept: Vec<Value> = docs.into_iter().filter_map(for_clusterctl).collect();
    let yaml = serde_saphyr::to_string_multiple(&kept).map_err(|e| e.to_string())?;
    let text = format!(
        "# Bootsman infrastructure provider v{} for clusterctl (contract v1beta2).\n{yaml}",
        args.version
    );
    std::fs::write(&args.out, text).map_err(|e| format!("{}: {e}", args.out.display()))?;
    Ok(kept.len())
}

/// `labels` without Helm's, with the provider label.
fn relabel(labels: Option<&Value>) -> Value {
    let mut m: Map<String, Value> = labels.and_then(Value::as_object).cloned().unwrap_or_default();
    for l in HELM_LABELS {
        m.remove(l);
    }
    m.insert(PROVIDER_LABEL.0.into(), PROVIDER_LABEL.1.into());
    Value::Object(m)
}

/// One object as clusterctl installs it, or `None` for what it cannot (ServiceMonitors).
fn for_clusterctl(mut d: Value) -> Option<Value> {
    let kind = d["kind"].as_str().unwrap_or_default().to_string();
    if kind == "ServiceMonitor" {
        return None;
    }
    if !d["metadata"].is_object() {
        d["metadata"] = json!({});
    }
    if (kind == "Role" || kind == "RoleBinding") && d["metadata"]["namespace"] == "kube-system" {
        d["kind"] = format!("Cluster{kind}").into();
        if let Some(m) = d["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        if kind == "RoleBinding" {
            d["roleRef"]["kind"] = "ClusterRole".into();
        }
    }
    d["metadata"]["labels"] = relabel(d["metadata"].get("labels"));
    match kind.as_str() {
        "Deployment" => {
            let spec = &mut d["spec"];
            spec["selector"]["matchLabels"] = relabel(spec["selector"].get("matchLabels"));
            spec["template"]["metadata"]["labels"] = relabel(spec["template"]["metadata"].get("labels"));
            if let Some(containers) = spec["template"]["spec"]["containers"].as_array_mut() {
                for c in containers {
                    if let Some(args) = c["args"].as_array_mut() {
                        for a in args.iter_mut() {
                            if a.as_str().is_some_and(|s| s.starts_with("--release-timeout=")) {
                                *a = "--release-timeout=${BYOH_RELEASE_TIMEOUT:=15m}".into();
                            }
                        }
                    }
                }
            }
        }
        "Service" => {
            d["spec"]["selector"] = relabel(d["spec"].get("selector"));
        }
        _ => {}
    }
    Some(d)
}

fn main() -> ExitCode {
    match parse_args().and_then(|a| run(&a).map(|n| (n, a))) {
        Ok((n, a)) => {
            println!("    wrote {} ({n} objects)", a.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("clusterctl-components: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_relabelled_and_kube_system_rights_made_cluster_wide() {
        let rb = for_clusterctl(json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "a", "namespace": "kube-system",
                "labels": {"helm.sh/chart": "x", "app.kubernetes.io/name": "p"}},
            "roleRef": {"kind": "Role", "name": "a"}}))
        .unwrap();
        assert_eq!(rb["kind"], "ClusterRoleBinding");
        assert_eq!(rb["roleRef"]["kind"], "ClusterRole");
        assert!(rb["metadata"].get("namespace").is_none());
        assert_eq!(
            rb["metadata"]["labels"],
            json!({"app.kubernetes.io/name": "p", "cluster.x-k8s.io/provider": "infrastructure-byoh"})
        );
        assert!(for_clusterctl(json!({"kind": "ServiceMonitor", "metadata": {}})).is_none());
        let dep = for_clusterctl(json!({"kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/instance": "b", "app": "p"}},
                "template": {"metadata": {"labels": {"app": "p"}},
                    "spec": {"containers": [{"args": ["--x", "--release-timeout=3m"]}]}}}}))
        .unwrap();
        assert_eq!(
            dep["spec"]["selector"]["matchLabels"],
            json!({"app": "p", "cluster.x-k8s.io/provider": "infrastructure-byoh"})
        );
        assert_eq!(
            dep["spec"]["template"]["spec"]["containers"][0]["args"][1],
            "--release-timeout=${BYOH_RELEASE_TIMEOUT:=15m}"
        );
    }
}
