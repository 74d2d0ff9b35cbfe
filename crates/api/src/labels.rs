//! Well-known labels, annotations and finalizers shared by the provider, the operator and the agent.

/// CRD label that tells Cluster API which contract a provider CRD implements and which of its API
/// versions to use for `ContractVersionedObjectReference`s (the last `_`-separated entry wins).
pub const CAPI_CONTRACT_V1BETA2: &str = "cluster.x-k8s.io/v1beta2";
/// CRD label that marks a CRD as part of a clusterctl-managed provider.
pub const CLUSTERCTL: &str = "clusterctl.cluster.x-k8s.io";
/// CRD label that makes `clusterctl move` move objects of this kind even without an owner chain.
pub const CLUSTERCTL_MOVE: &str = "clusterctl.cluster.x-k8s.io/move";
/// CRD label that makes `clusterctl move` move objects of this kind with everything they own
/// (the BootsmanCluster owns its CAPI Cluster).
pub const CLUSTERCTL_MOVE_HIERARCHY: &str = "clusterctl.cluster.x-k8s.io/move-hierarchy";
/// Annotation that blocks `clusterctl move` while a claim or release is half done, and while the
/// operator reconciles a BootsmanCluster (it removes it once it has seen the Cluster paused).
pub const CLUSTERCTL_BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// Label CAPI puts on every object belonging to a cluster; the operator puts it on what it renders.
pub const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
/// Label CAPI puts on control-plane Machines (and their infrastructure machines).
pub const CONTROL_PLANE: &str = "cluster.x-k8s.io/control-plane";
/// Label CAPI puts on the Machines of a MachineDeployment, with the MachineDeployment's name.
pub const DEPLOYMENT_NAME: &str = "cluster.x-k8s.io/deployment-name";
/// Annotation that pauses reconciliation of one object (CAPI convention).
pub const PAUSED: &str = "cluster.x-k8s.io/paused";
/// Annotation the operator puts on a BootsmanCluster it stopped reconciling because its Cluster
/// was paused (as `clusterctl move` pauses it): it moves with the BootsmanCluster, so neither the
/// source (whose Cluster is deleted next) nor the target (whose Cluster arrives later, paused)
/// recreates anything; the operator removes it once it sees the Cluster unpaused.
pub const PAUSED_WITH_CLUSTER: &str = "bootsman.io/paused-with-cluster";
/// Label on a CAPI Cluster that Rancher Turtles watches to import the cluster automatically.
pub const RANCHER_AUTO_IMPORT: &str = "cluster-api.cattle.io/rancher-auto-import";
/// Standard zone label; on a ByoHost it becomes a failure domain of the ByoClusters that may use
/// it. An admin's label: a host may not set or change it.
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// Prefix of the only ByoHost labels a host may set itself (the agent's `--label rack=r12` is
/// `host.bootsman.io/rack=r12`): what a host says about itself. Every other label of a ByoHost,
/// above all those that place machines (host selectors, the zone), is an admin's or the
/// provider's, and the host policy refuses a host's write that adds, changes or removes one.
pub const HOST_OWNED_PREFIX: &str = "host.bootsman.io/";
/// Label the operator puts on everything it renders for one BootsmanCluster.
pub const BOOTSMAN_CLUSTER: &str = "bootsman.io/cluster";
/// Label on a namespace a Project owns, and on the RBAC objects the operator makes for the
/// Project: the Project's name.
pub const PROJECT: &str = "bootsman.io/project";
/// Per-cluster label that selects the addon `HelmChartProxy` objects of one child cluster.
pub const ADDONS_SELECTOR: &str = "bootsman.io/addons";
