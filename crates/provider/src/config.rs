//! Provider settings: which namespaces it watches, which shared pools machines may draw hosts
//! from, how long a release may take and how long a host whose machine is gone stays claimed.

use std::time::Duration;

pub use bootsman_api::pools::SharedPool;

/// Everything the controllers need to know about their deployment.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (clusterctl `--namespace`); all namespaces when `None`.
    pub namespace: Option<String>,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Pools of hosts in other namespaces that machines may use besides their own namespace.
    pub shared_pools: Vec<SharedPool>,
    /// Honour Projects (`bootsman.io/v1alpha1`): a machine in a namespace a Project holds draws
    /// only from that namespace and the Project's `spec.hostPools`
    /// ([`bootsman_api::pools::pools_in`]). Needs the Project CRD and the right to list and watch
    /// Projects; ignored with [`Self::namespace`].
    pub projects: bool,
    /// How long a released host may take to report `CleanupSucceeded` before it is quarantined.
    pub release_timeout: Duration,
    /// How long a claimed host whose machine is gone stays claimed before it is released (see
    /// [`crate::byo_machine::orphans`]).
    pub orphan_grace: Duration,
    /// Name under which Events are reported and field managers are named.
    pub instance: String,
    /// The namespaces whose Secrets the provider reads and writes (bootstrap data, workload
    /// kubeconfigs, the per-host copies), when its rights to Secrets are namespaced; its cache of
    /// cluster Secrets then watches each of them instead of every namespace. Empty: every
    /// namespace (or [`Self::namespace`] alone).
    pub secret_namespaces: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            shared_pools: Vec::new(),
            projects: false,
            release_timeout: Duration::from_secs(15 * 60),
            orphan_grace: Duration::from_secs(10 * 60),
            instance: "bootsman-provider".into(),
            secret_namespaces: Vec::new(),
        }
    }
}

impl Config {
    /// The defaults, watching only `namespace` (clusterctl `--namespace`).
    pub fn namespaced(namespace: &str) -> Self {
        Self {
            namespace: Some(namespace.into()),
            ..Self::default()
        }
    }

    /// Namespaces whose hosts a machine in `namespace` may use: its own first, then every shared
    /// pool that allows it.
    pub fn pools_for(&self, namespace: &str) -> Vec<String> {
        bootsman_api::pools::pools_for(&self.shared_pools, namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
