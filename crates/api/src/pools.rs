//! Shared host pools: a namespace of ByoHosts that machines of other namespaces may use, as the
//! provider's and the operator's `--pool POOL=NS1,NS2` flags name it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::identity::is_dns_label;
use crate::v1alpha1::Project;

/// The label every ByoHost is matched as carrying, with its namespace (its pool) as the value,
/// whatever its real labels: a host selector picks pools with it, e.g.
/// `matchLabels: {bootsman.io/pool: rack-a}` or `{key: bootsman.io/pool, operator: In, values:
/// [rack-a, rack-b]}`. A pool the machine's namespace may not use is never reached this way;
/// in a Project's namespace, admission refuses a selector naming such a pool.
pub const POOL_LABEL: &str = "bootsman.io/pool";

/// A namespace of hosts shared with other namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedPool {
    /// Namespace holding the ByoHosts.
    pub namespace: String,
    /// Namespaces whose ByoMachines may use these hosts; `*` allows every namespace.
    pub allowed: Vec<String>,
}

impl SharedPool {
    /// Parses `POOL=NS1,NS2` (or `POOL=*`). A bare `POOL` allows every namespace.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (ns, allowed) = match s.split_once('=') {
            Some((ns, list)) => (
                ns,
                list.split(',')
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(String::from)
                    .collect(),
            ),
            None => (s, vec!["*".to_string()]),
        };
        let ns = ns.trim();
        if !is_dns_label(ns) {
            return Err(format!(
                "--pool {s:?}: {ns:?} is not a namespace name (DNS-1123 label)"
            ));
        }
        if let Some(bad) = allowed
            .iter()
            .find(|a: &&String| a.as_str() != "*" && !is_dns_label(a))
        {
            return Err(format!(
                "--pool {s:?}: {bad:?} is not a namespace name (DNS-1123 label) or *"
            ));
        }
        if allowed.is_empty() {
            return Err(format!(
                "--pool {s:?}: list the namespaces allowed to use the pool after '=' (or *)"
            ));
        }
        Ok(Self {
            namespace: ns.into(),
            allowed,
        })
    }

    /// Whether a machine in `namespace` may use this pool.
    pub fn allows(&self, namespace: &str) -> bool {
        self.allowed.iter().any(|a| a == "*" || a == namespace)
    }
}

/// Namespaces whose hosts a machine in `namespace` may use: its own first, then every pool of
/// `pools` that allows it.
pub fn pools_for(pools: &[SharedPool], namespace: &str) -> Vec<String> {
    let mut out = vec![namespace.to_string()];
    for p in pools {
        if p.allows(namespace) && !out.contains(&p.namespace) {
            out.push(p.namespace.clone());
        }
    }
    out
}

/// Namespaces whose hosts a machine in `namespace` may use, when `projects` are the live
/// Projects of the cluster.
///
/// - In a namespace a Project holds (its `status.namespaces`): the namespace itself and the
///   Project's `spec.hostPools`, nothing else; the `--pool` flags never widen a project.
/// - In a namespace some Project lists but none holds yet (the project controller has not
///   settled it): the namespace itself only, until it does.
/// - Elsewhere: [`pools_for`].
pub fn pools_in<'a>(
    pools: &[SharedPool],
    projects: impl IntoIterator<Item = &'a Project>,
    namespace: &str,
) -> Vec<String> {
    let mut listed = false;
    for p in projects {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let held = p
            .status
            .as_ref()
            .is_some_and(|s| s.namespaces.iter().any(|n| n == namespace));
        if held {
            let mut out = vec![namespace.to_string()];
            for pool in &p.spec.host_pools {
                if !out.contains(pool) {
                    out.push(pool.clone());
                }
            }
            return out;
        }
        listed |= p.spec.namespaces.iter().any(|n| n == namespace);
    }
    if listed {
        vec![namespace.to_string()]
    } else {
        pools_for(pools, namespace)
    }
}

/// The pools a host selector names through [`POOL_LABEL`]: the value of its `matchLabels` entry
/// and the values of its `In` expressions on that key. Empty when the selector does not name a
/// pool (it then reaches every pool the namespace may use).
pub fn named_pools(selector: Option<&LabelSelector>) -> Vec<String> {
    let Some(s) = selector else { return Vec::new() };
    let mut out: Vec<String> = Vec::new();
    if let Some(v) = s.match_labels.as_ref().and_then(|m| m.get(POOL_LABEL)) {
        out.push(v.clone());
    }
    for e in s.match_expressions.iter().flatten() {
        if e.key == POOL_LABEL && e.operator == "In" {
            out.extend(e.values.iter().flatten().cloned());
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pools() {
        assert_eq!(
            SharedPool::parse("rack-a").unwrap(),
            SharedPool {
                namespace: "rack-a".into(),
                allowed: vec!["*".into()]
            }
        );
        let p = SharedPool::parse("rack-a=team-1, team-2").unwrap();
        assert_eq!(p.allowed, vec!["team-1", "team-2"]);
        assert!(p.allows("team-2") && !p.allows("team-3"));
        assert!(
            SharedPool::parse("Rack_A")
                .unwrap_err()
                .contains("not a namespace name")
        );
        assert!(SharedPool::parse("rack-a=").unwrap_err().contains("after '='"));
        assert!(SharedPool::parse("rack-a=Team").unwrap_err().contains("\"Team\""));
    }

    fn project(name: &str, listed: &[&str], held: &[&str], pools: &[&str]) -> Project {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut p = Project::new(
            name,
            crate::v1alpha1::ProjectSpec {
                display_name: None,
                members: Vec::new(),
                namespaces: strings(listed),
                host_pools: strings(pools),
                quotas: None,
            },
        );
        p.status = Some(crate::v1alpha1::ProjectStatus {
            namespaces: strings(held),
            ..Default::default()
        });
        p
    }

    #[test]
    fn projects_draw_only_from_their_pools() {
        let shared = vec![SharedPool::parse("rack-open").unwrap()];
        let a = project("a", &["a-dev", "a-new"], &["a-dev"], &["rack-a"]);
        let b = project("b", &["b-dev"], &["b-dev"], &[]);
        let projects = [a, b];
        // A held namespace: itself and the project's pools, never the open shared pool.
        assert_eq!(pools_in(&shared, &projects, "a-dev"), vec!["a-dev", "rack-a"]);
        assert_eq!(pools_in(&shared, &projects, "b-dev"), vec!["b-dev"]);
        // Listed but not yet held: only itself.
        assert_eq!(pools_in(&shared, &projects, "a-new"), vec!["a-new"]);
        // Outside every project: the flags.
        assert_eq!(pools_in(&shared, &projects, "ops"), vec!["ops", "rack-open"]);
        // A project being deleted no longer decides.
        let mut gone = projects[1].clone();
        gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(pools_in(&shared, [&gone], "b-dev"), vec!["b-dev", "rack-open"]);
    }

    #[test]
    fn selectors_name_pools_by_label_and_in_expressions() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        assert!(named_pools(None).is_empty());
        let s = LabelSelector {
            match_labels: Some([(POOL_LABEL.to_string(), "rack-a".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: POOL_LABEL.into(),
                    operator: "In".into(),
                    values: Some(vec!["rack-b".into(), "rack-a".into()]),
                },
                LabelSelectorRequirement {
                    key: POOL_LABEL.into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["rack-c".into()]),
                },
                LabelSelectorRequirement {
                    key: "role".into(),
                    operator: "In".into(),
                    values: Some(vec!["rack-d".into()]),
                },
            ]),
        };
        assert_eq!(named_pools(Some(&s)), vec!["rack-a", "rack-b"]);
    }
}
