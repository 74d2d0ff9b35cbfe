//! Shared host pools: a namespace of ByoHosts that machines of other namespaces may use, as the
//! provider's and the operator's `--pool POOL=NS1,NS2` flags name it.

use crate::identity::is_dns_label;

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
}
