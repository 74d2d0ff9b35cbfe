//! `bootsmanctl diagnose [CLUSTER] -o bundle.tar.gz`: a support bundle of what is needed to
//! find why a cluster or a host is stuck, with every secret value left out.
//!
//! For each BootsmanCluster it holds:
//!
//! - `SUMMARY.txt`: what is wrong, first: every condition down the [`status`] tree that is not
//!   `True` (with its path), and each host whose bootstrap or reset failed with the agent's own
//!   account of it (the step, the command and its output tail);
//! - `status.txt`, `status.json`: the tree with every condition;
//! - `objects/<Kind>/<name>.yaml`: each object of the tree, without `managedFields`;
//! - `hosts/<pool>/<host>/`: the host's ByoHost (its agent's state: phase, conditions, version,
//!   inventory), its heartbeat Lease and its Events;
//! - `events.txt`: the Events of the cluster's objects and hosts, oldest first;
//! - `secrets.txt`: the names of the namespace's Secrets, read as metadata only;
//! - `logs/<namespace>/<pod>/<container>.log`: the last lines of each controller Pod's log
//!   (Bootsman's and Cluster API's namespaces).
//!
//! **Redaction.** Secret values are never read (Secrets are listed as metadata only). Everything
//! else passes through [`redact_value`] (string fields whose name says token, password, secret
//! or key) and [`redact_text`] (bootstrap tokens, private-key PEM blocks, JWTs, `--token`,
//! `--certificate-key` and `token=`/`password:` pairs in free text, logs included) before it
//! is written.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::LazyLock;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, LogParams};
use regex::Regex;
use serde_json::Value;

use crate::status::{self, Node};

/// Where Bootsman's and Cluster API's controllers run when installed by the chart and
/// `clusterctl init`.
pub const CONTROLLER_NAMESPACES: [&str; 4] = [
    "bootsman-system",
    "capi-system",
    "capi-kubeadm-bootstrap-system",
    "capi-kubeadm-control-plane-system",
];

/// One file of the bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    /// Its path inside the bundle.
    pub path: String,
    /// Its content, redacted.
    pub text: String,
}

/// What to collect.
#[derive(Clone, Debug)]
pub struct Options {
    /// The clusters' namespace.
    pub namespace: String,
    /// The BootsmanClusters (names).
    pub clusters: Vec<String>,
    /// Namespaces whose Pods' logs are collected.
    pub controller_namespaces: Vec<String>,
    /// Lines of each container's log.
    pub log_lines: i64,
}

/// Collects the bundle's files (redacted) for `opts`.
pub async fn collect(client: &kube::Client, opts: &Options) -> anyhow::Result<Vec<File>> {
    let now = Timestamp::now();
    let mut files = Vec::new();
    let mut summary = Vec::new();
    let mut involved: BTreeSet<(String, String)> = BTreeSet::new();
    let mut pools = BTreeSet::from([opts.namespace.clone()]);
    for name in &opts.clusters {
        let objects = status::gather(client, &opts.namespace, name).await?;
        let tree = status::tree(&objects, now);
        let dir = format!("clusters/{name}");
        summary.push(format!("BootsmanCluster {}/{name}", opts.namespace));
        summary.extend(
            problems(&tree, &objects.hosts)
                .into_iter()
                .map(|p| format!("  {p}")),
        );
        files.push(text(
            &format!("{dir}/status.txt"),
            status::render(&tree, now, true),
        ));
        files.push(text(
            &format!("{dir}/status.json"),
            serde_json::to_string_pretty(&redacted(serde_json::to_value(&tree)?))?,
        ));
        let mut all: Vec<&Value> = vec![&objects.bootsman_cluster];
        all.extend(objects.cluster.iter());
        all.extend(objects.control_plane.iter());
        all.extend(objects.machine_deployments.iter());
        all.extend(objects.machines.iter());
        all.extend(objects.byo_machines.iter());
        for o in all {
            let (kind, oname) = (str_of(&o["kind"]), str_of(&o["metadata"]["name"]));
            involved.insert((kind.clone(), oname.clone()));
            files.push(text(&format!("{dir}/objects/{kind}/{oname}.yaml"), yaml(o)));
        }
        for h in &objects.hosts {
            let (pool, hname) = (
                str_of(&h["metadata"]["namespace"]),
                str_of(&h["metadata"]["name"]),
            );
            involved.insert(("ByoHost".into(), hname.clone()));
            pools.insert(pool.clone());
            let hdir = format!("hosts/{pool}/{hname}");
            files.push(text(&format!("{hdir}/byohost.yaml"), yaml(h)));
            if let Some(t) = objects.heartbeats.get(&(pool.clone(), hname.clone())) {
                files.push(text(
                    &format!("{hdir}/heartbeat.txt"),
                    format!("Lease {pool}/{hname} renewed at {t}\n"),
                ));
            }
        }
    }
    // Events of everything involved, in the clusters' namespace and the hosts' pools.
    let mut events = Vec::new();
    for ns in &pools {
        let list = Api::<Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("list the Events of namespace {ns}"))?;
        events.extend(list.items.into_iter().filter(|e| {
            involved.contains(&(
                e.involved_object.kind.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default(),
            ))
        }));
    }
    events.sort_by_key(event_time);
    let mut ev = String::from("LAST SEEN  TYPE  REASON  OBJECT  MESSAGE\n");
    for e in &events {
        let line = format!(
            "{}  {}  {}  {}/{}  {}\n",
            event_time(e).map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
            e.type_.as_deref().unwrap_or("-"),
            e.reason.as_deref().unwrap_or("-"),
            e.involved_object.kind.as_deref().unwrap_or("-"),
            e.involved_object.name.as_deref().unwrap_or("-"),
            e.message.as_deref().unwrap_or_default().replace('\n', " ")
        );
        if e.involved_object.kind.as_deref() == Some("ByoHost") {
            let hdir = format!(
                "hosts/{}/{}/events.txt",
                e.metadata.namespace.as_deref().unwrap_or_default(),
                e.involved_object.name.as_deref().unwrap_or_default()
            );
            match files.iter_mut().find(|f| f.path == hdir) {
                Some(f) => f.text.push_str(&redact_text(&line)),
                None => files.push(text(&hdir, line.clone())),
            }
        }
        ev.push_str(&line);
    }
    files.push(text("events.txt", ev));
    // Secrets by name only: their values are never read.
    let mut names = String::from("# Secrets of the namespace, as metadata only: no value was read.\n");
    for s in Api::<Secret>::namespaced(client.clone(), &opts.namespace)
        .list_metadata(&ListParams::default())
        .await
        .with_context(|| format!("list the Secrets of namespace {}", opts.namespace))?
        .items
    {
        names.push_str(s.metadata.name.as_deref().unwrap_or_default());
        names.push('\n');
    }
    files.push(text("secrets.txt", names));
    // Controller logs.
    let mut missing = Vec::new();
    for ns in &opts.controller_namespaces {
        let pods = match Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
        {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_forbidden() => {
                missing.push(format!("{ns}: {}", s.message));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("list the Pods of namespace {ns}")),
        };
        if pods.is_empty() {
            missing.push(format!("{ns}: no Pods"));
        }
        let api = Api::<Pod>::namespaced(client.clone(), ns);
        for p in pods {
            let pname = p.metadata.name.clone().unwrap_or_default();
            for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
                let lp = LogParams {
                    container: Some(c.name.clone()),
                    tail_lines: Some(opts.log_lines),
                    ..LogParams::default()
                };
                let log = api
                    .logs(&pname, &lp)
                    .await
                    .unwrap_or_else(|e| format!("(the log could not be read: {e})\n"));
                files.push(text(&format!("logs/{ns}/{pname}/{}.log", c.name), log));
            }
        }
    }
    let mut readme = format!(
        "Bootsman support bundle, made {now} by bootsmanctl {}.\n\
         Namespace {}, clusters: {}.\n\
         Secret values are never read; tokens, keys and passwords in objects, messages and logs are\n\
         replaced by <redacted>.\n",
        env!("CARGO_PKG_VERSION"),
        opts.namespace,
        opts.clusters.join(", ")
    );
    if !missing.is_empty() {
        readme.push_str("\nNo controller logs from:\n");
        for m in &missing {
            readme.push_str(&format!("  {m}\n"));
        }
    }
    files.insert(0, text("README.txt", readme));
    let mut s = summary.join("\n");
    s.push('\n');
    files.insert(1, text("SUMMARY.txt", s));
    Ok(files)
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn text(path: &str, t: String) -> File {
    File {
        path: path.to_string(),
        text: redact_text(&t),
    }
}

fn yaml(o: &Value) -> String {
    let mut o = redacted(o.clone());
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    serde_saphyr::to_string(&o).unwrap_or_else(|_| format!("{o:#}\n"))
}

/// What is wrong in `tree`, one line each: every condition that is not `True` (a `Stalled` or
/// `Reconciling` condition that is `False` is fine) with the object's path, and for a host
/// whose bootstrap or reset failed, the agent's full account.
pub fn problems(tree: &Node, hosts: &[Value]) -> Vec<String> {
    fn walk(n: &Node, path: &str, out: &mut Vec<String>) {
        let here = format!("{path}{}/{}", n.kind, n.name);
        for c in &n.conditions {
            // A host's bootstrap and reset are told in full below.
            if n.kind == "ByoHost" && matches!(c.type_.as_str(), "BootstrapSucceeded" | "CleanupSucceeded") {
                continue;
            }
            let fine = match c.type_.as_str() {
                "Stalled" | "Reconciling" | "Paused" | "Deleting" | "RollingOut" | "ScalingUp"
                | "ScalingDown" | "Remediating" => c.status != "True",
                _ => c.status == "True",
            };
            if !fine {
                out.push(format!(
                    "{here}: {}={} {}: {}",
                    c.type_,
                    c.status,
                    c.reason,
                    c.message.split_whitespace().collect::<Vec<_>>().join(" ")
                ));
            }
        }
        for ch in &n.children {
            walk(ch, &format!("{here} > "), out);
        }
    }
    let mut out = Vec::new();
    walk(tree, "", &mut out);
    for h in hosts {
        for c in h["status"]["conditions"].as_array().into_iter().flatten() {
            let t = c["type"].as_str().unwrap_or_default();
            if matches!(t, "BootstrapSucceeded" | "CleanupSucceeded") && c["status"] == "False" {
                out.push(format!(
                    "host {}/{}: {t}=False {}:\n{}",
                    str_of(&h["metadata"]["namespace"]),
                    str_of(&h["metadata"]["name"]),
                    str_of(&c["reason"]),
                    indent(c["message"].as_str().unwrap_or_default())
                ));
            }
        }
        if let Some(q) = h["spec"]["quarantine"]["reason"].as_str() {
            out.push(format!(
                "host {}/{}: quarantined: {q}",
                str_of(&h["metadata"]["namespace"]),
                str_of(&h["metadata"]["name"])
            ));
        }
    }
    if out.is_empty() {
        out.push("nothing reports a problem".into());
    }
    out
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The replacement for whatever was redacted.
pub const REDACTED: &str = "<redacted>";

/// Whether a field of this name holds a secret when its value is a string.
fn secret_field(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("token")
        || n.contains("password")
        || n.contains("passwd")
        || n.contains("secret")
        || n == "key"
        || n.ends_with("key-data")
        || n.ends_with("keydata")
        || n.contains("privatekey")
        || n.contains("private-key")
        || n.contains("certificatekey")
        || n.contains("certificate-key")
}

/// `v` with every string field whose name says it holds a secret replaced by [`REDACTED`],
/// at any depth. References (objects such as `bootstrapSecret: {name: …}`) keep their names.
pub fn redacted(mut v: Value) -> Value {
    redact_value(&mut v);
    v
}

/// In place: see [`redacted`].
pub fn redact_value(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if x.is_string() && secret_field(k) {
                    *x = Value::String(REDACTED.into());
                } else {
                    redact_value(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact_value),
        _ => {}
    }
}

static PATTERNS: LazyLock<Vec<(Regex, String)>> = LazyLock::new(|| {
    [
        // A private key in PEM form, whole.
        (
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
            REDACTED.to_string(),
        ),
        // A bootstrap token `abcdef.0123456789abcdef`.
        (r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b", REDACTED.to_string()),
        // A JSON Web Token (ServiceAccount tokens).
        (r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", REDACTED.to_string()),
        // Flags and pairs: `--token X`, `--certificate-key=X`, `password: X`, `"token":"X"`.
        (
            r#"(?i)(--(?:token|certificate-key|password)[= ]|\b(?:token|password|passwd|secret|client-key-data|certificate-key)"?\s*[:=]\s*"?)[^\s"',}]+"#,
            format!("${{1}}{REDACTED}"),
        ),
    ]
    .into_iter()
    .map(|(p, r)| (Regex::new(p).unwrap_or_else(|e| panic!("pattern {p}: {e}")), r))
    .collect()
});

/// `t` with bootstrap tokens, private keys, JWTs and `token`/`password`/`--certificate-key`
/// values replaced by [`REDACTED`].
pub fn redact_text(t: &str) -> String {
    let mut out = t.to_string();
    for (re, with) in PATTERNS.iter() {
        out = re.replace_all(&out, with.as_str()).into_owned();
    }
    out
}

/// Writes `files` as a gzip-compressed tar at `path`, each under `<top>/`.
pub fn write_bundle(path: &Path, top: &str, files: &[File]) -> anyhow::Result<()> {
    let out = std::fs::File::create(path).with_context(|| format!("-o: cannot create {}", path.display()))?;
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
    for f in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(f.text.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(mtime);
        h.set_cksum();
        tar.append_data(&mut h, format!("{top}/{}", f.path), f.text.as_bytes())
            .with_context(|| format!("write {} into {}", f.path, path.display()))?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .with_context(|| format!("finish {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_in_fields_and_text_are_redacted() {
        let v = redacted(json!({
            "spec": {"joinConfiguration": {"discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef",
                "apiServerEndpoint": "10.0.0.1:6443"}}},
                "bootstrapSecret": {"name": "host-1-bootstrap", "namespace": "pool"},
                "users": [{"name": "ops", "passwd": "hunter2"}],
                "kubeconfig": {"client-key-data": "LS0tLS1CRUdJTg=="}}
        }));
        assert_eq!(
            v["spec"]["joinConfiguration"]["discovery"]["bootstrapToken"]["token"],
            REDACTED
        );
        assert_eq!(
            v["spec"]["joinConfiguration"]["discovery"]["bootstrapToken"]["apiServerEndpoint"],
            "10.0.0.1:6443"
        );
        assert_eq!(v["spec"]["bootstrapSecret"]["name"], "host-1-bootstrap");
        assert_eq!(v["spec"]["users"][0]["passwd"], REDACTED);
        assert_eq!(v["spec"]["kubeconfig"]["client-key-data"], REDACTED);

        let t = "step 12 of 13 (run `kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef \
                 --discovery-token-ca-cert-hash sha256:00ff --control-plane --certificate-key 0a1b2c3d4e`) failed\n\
                 -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n\
                 Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0.c2lnbmF0dXJlAAAA\n\
                 password: hunter2 token=s3cr3t {\"token\":\"q\"}";
        let r = redact_text(t);
        for secret in [
            "abcdef.0123456789abcdef",
            "0a1b2c3d4e",
            "MIIEowIBAAKCAQEA",
            "eyJhbGci",
            "hunter2",
            "s3cr3t",
            "\"q\"",
        ] {
            assert!(!r.contains(secret), "{secret} left in {r}");
        }
        // What helps is kept: the step, the command, the endpoint, the CA hash.
        for kept in [
            "step 12 of 13",
            "kubeadm join 10.0.0.1:6443",
            "sha256:00ff",
            "--control-plane",
        ] {
            assert!(r.contains(kept), "{kept} lost from {r}");
        }
    }

    #[test]
    fn problems_name_false_conditions_with_their_path_and_failed_hosts() {
        let c = |t: &str, s: &str| status::Cond {
            type_: t.into(),
            status: s.into(),
            reason: format!("{t}Reason"),
            message: format!("{t}\nmessage"),
            last_transition_time: None,
        };
        let leaf = Node {
            kind: "Machine".into(),
            name: "m".into(),
            conditions: vec![c("Ready", "False"), c("Deleting", "False")],
            ..Node::default()
        };
        let root = Node {
            kind: "BootsmanCluster".into(),
            name: "demo".into(),
            conditions: vec![c("Ready", "True"), c("Stalled", "False")],
            children: vec![leaf],
            ..Node::default()
        };
        let host = json!({"metadata": {"name": "h1", "namespace": "pool"}, "status": {"conditions": [
            {"type": "BootstrapSucceeded", "status": "False", "reason": "BootstrapFailed",
             "message": "step 3 of 5 (run `kubeadm init`) failed: exited 1\noutput tail"}]}});
        let p = problems(&root, &[host]);
        assert_eq!(
            p[0],
            "BootsmanCluster/demo > Machine/m: Ready=False ReadyReason: Ready message"
        );
        assert!(p[1].starts_with(
            "host pool/h1: BootstrapSucceeded=False BootstrapFailed:\n      step 3 of 5 (run `kubeadm init`)"
        ));
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
