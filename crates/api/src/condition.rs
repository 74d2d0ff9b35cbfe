//! Condition types and reasons used in the status of our kinds (`metav1.Condition`).

/// Condition types.
pub mod types {
    /// The object has reached its desired state (mirrored by CAPI into the Machine or Cluster).
    pub const READY: &str = "Ready";
    /// Reconciliation is paused by `Cluster.spec.paused` or the `cluster.x-k8s.io/paused` annotation.
    pub const PAUSED: &str = "Paused";
    /// ByoMachine: a host of the pool is bound to this machine.
    pub const HOST_ASSIGNED: &str = "HostAssigned";
    /// ByoMachine: the bound host ran its bootstrap data successfully.
    pub const HOST_BOOTSTRAPPED: &str = "HostBootstrapped";
    /// ByoHost: the agent registered this host and keeps its inventory current.
    pub const REGISTERED: &str = "Registered";
    /// ByoHost: the agent's heartbeat Lease is current.
    pub const AGENT_HEALTHY: &str = "AgentHealthy";
    /// ByoHost: the bootstrap data ran to completion.
    pub const BOOTSTRAP_SUCCEEDED: &str = "BootstrapSucceeded";
    /// ByoHost: the host was reset after its machine went away.
    pub const CLEANUP_SUCCEEDED: &str = "CleanupSucceeded";
    /// ByoHost: the agent enrolled with the cluster `spec.rehome` names and talks only to it now.
    pub const REHOMED: &str = "Rehomed";
    /// BootsmanCluster: the control plane has the desired number of ready machines.
    pub const CONTROL_PLANE_READY: &str = "ControlPlaneReady";
    /// BootsmanCluster: every worker pool has the desired number of ready machines.
    pub const WORKERS_READY: &str = "WorkersReady";
    /// BootsmanCluster: the pool has enough matching free hosts for what the spec asks.
    pub const HOSTS_AVAILABLE: &str = "HostsAvailable";
    /// BootsmanCluster: every addon is installed in the child cluster.
    pub const ADDONS_READY: &str = "AddonsReady";
    /// kstatus: the controller is still working towards the desired state.
    pub const RECONCILING: &str = "Reconciling";
    /// kstatus: the controller cannot make progress without a change from outside.
    pub const STALLED: &str = "Stalled";
}
