//! Provider settings: which namespaces it watches, which shared pools machines may draw hosts
//! from, and how long a release may take.

use std::time::Duration;

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

use bootsman_api::identity::is_dns_label;

/// Everything the controllers need to know about their deployment.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (clusterctl `--namespace`); all namespaces when `None`.
    pub namespace: Option<String>,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Pools of hosts in other namespaces that machines may use besides their own namespace.
    pub shared_pools: Vec<SharedPool>,
    /// How long a released host may take to report `CleanupSucceeded` before it is quarantined.
    pub release_timeout: Duration,
    /// Name under which Events are reported and field managers are named.
    pub instance: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            shared_pools: Vec::new(),
            release_timeout: Duration::from_secs(15 * 60),
            instance: "bootsman-provider".into(),
        }
    }
}

impl Config {
    /// Namespaces whose hosts a machine in `namespace` may use: its own first, then every shared
    /// pool that allows it.
    pub fn pools_for(&self, namespace: &str) -> Vec<String> {
        let mut out = vec![namespace.to_string()];
        for p in &self.shared_pools {
            if p.allows(namespace) && !out.contains(&p.namespace) {
                out.push(p.namespace.clone());
            }
        }
        out
    }
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

    #[test]
    fn own_namespace_first_then_allowed_pools() {
        let cfg = Config {
            shared_pools: vec![
                SharedPool::parse("rack-a=team-1").unwrap(),
                SharedPool::parse("rack-b").unwrap(),
            ],
            ..Config::default()
        };
        assert_eq!(cfg.pools_for("team-1"), vec!["team-1", "rack-a", "rack-b"]);
        assert_eq!(cfg.pools_for("team-2"), vec!["team-2", "rack-b"]);
        assert_eq!(cfg.pools_for("rack-a"), vec!["rack-a", "rack-b"]);
    }
}
