//! `Project`: one team's share of the infrastructure cluster: its people and their roles, the
//! namespaces its child clusters live in, the host pools those clusters may draw from, and its
//! limits.
//!
//! The operator's project controller creates (or adopts) the namespaces, labels them
//! `bootsman.io/project=<name>`, and binds the members there to the shipped ClusterRoles
//! `bootsman:project:owner`, `bootsman:project:member` and `bootsman:project:viewer` (each
//! aggregating every ClusterRole labelled `bootsman.io/aggregate-to-project-<role>: "true"`, so a
//! site adds rights without editing them). Members may read the ByoHosts of the project's pools.
//! Owners may edit the project's members and display name; its namespaces, pools and quotas are
//! the platform admins' (an admission policy refuses anyone else's change to them).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ResourceQuotaSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A team sharing the infrastructure cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "bootsman.io",
    version = "v1alpha1",
    kind = "Project",
    status = "ProjectStatus",
    shortname = "proj",
    category = "bootsman",
    label("clusterctl.cluster.x-k8s.io", ""),
    label("clusterctl.cluster.x-k8s.io/move", ""),
    doc = "A team's share of the infrastructure cluster: members, namespaces, host pools and quotas.",
    derive = "PartialEq",
    validation = Rule::new("size(self.metadata.name) <= 52").message(
        "metadata.name must be at most 52 characters: it is the value of the bootsman.io/project \
         label and part of the project's RBAC object names (rule: project-name-length)"
    ),
    printcolumn(name = "Display-Name", type_ = "string", json_path = ".spec.displayName"),
    printcolumn(
        name = "Clusters",
        type_ = "integer",
        json_path = ".status.usage.clusters",
        description = "BootsmanClusters in the project's namespaces"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ProjectSpec {
    /// Human-readable name, shown by `bootsmanctl projects` (free text, at most 128 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub display_name: Option<String>,

    /// The people and automation of the project, each with one role. A subject listed twice
    /// gets every role it is listed with.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub members: Vec<ProjectMember>,

    /// Namespaces the project owns (DNS-1123 labels, each once): created by the operator when missing, labelled
    /// `bootsman.io/project=<name>`. An existing namespace is adopted unless it already belongs to
    /// another project (then `Ready=False`, reason `NamespaceTaken`). Removing a namespace from
    /// the list removes the project's RoleBindings there; the namespace itself stays.
    #[schemars(
        length(min = 1, max = 64),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    #[x_kube(
        merge_strategy = ListMerge::Set,
        validation = Rule::new(
            "self.all(n, !(n in ['default', 'kube-system', 'kube-public', 'kube-node-lease']))"
        )
        .message("a project cannot own default, kube-system, kube-public or kube-node-lease (rule: project-namespace-reserved)")
    )]
    pub namespaces: Vec<String>,

    /// Namespaces of the host pools (where ByoHosts register) the project's clusters may draw
    /// from, each once: with the provider's `--projects`, a machine in the project's namespaces
    /// draws from these and its own namespace only (the provider's `--pool` flags do not widen
    /// it), and admission refuses a host selector naming another pool by `bootsman.io/pool`.
    /// Members may read the ByoHosts there. A pool whose namespace does not exist yet makes
    /// `Ready=False`, reason `HostPoolMissing`.
    #[serde(default)]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub host_pools: Vec<String>,

    /// Limits on what the project's namespaces may hold; none when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<ProjectQuotas>,
}

/// One subject of a project and its role.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.kind == 'ServiceAccount' ? (has(self.__namespace__) && size(self.__namespace__) > 0) : !has(self.__namespace__)"
)
.message("namespace is required for a ServiceAccount member and not allowed for a User or Group (rule: member-namespace)"))]
pub struct ProjectMember {
    /// What the subject is: `User`, `Group` or `ServiceAccount`.
    pub kind: MemberKind,
    /// The user name, group name or ServiceAccount name, as the API server authenticates it.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The ServiceAccount's namespace (ServiceAccounts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    /// The member's role in the project.
    pub role: ProjectRole,
}

/// The kind of a project member.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
pub enum MemberKind {
    /// A user (client-certificate CN, OIDC user, ...).
    User,
    /// A group of users.
    Group,
    /// A ServiceAccount (needs `namespace`).
    ServiceAccount,
}

/// A member's role.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProjectRole {
    /// Manages the project's BootsmanClusters, reads their kubeconfigs, and edits the project's
    /// members.
    Owner,
    /// Manages the project's BootsmanClusters and reads their kubeconfigs.
    Member,
    /// Reads the project's BootsmanClusters and their status; no Secrets.
    Viewer,
}

impl ProjectRole {
    /// Every role, in order.
    pub const ALL: [ProjectRole; 3] = [Self::Owner, Self::Member, Self::Viewer];

    /// The role's name as written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Owner => "owner",
            Self::Member => "member",
            Self::Viewer => "viewer",
        }
    }

    /// The shipped ClusterRole a member of this role is bound to in the project's namespaces.
    pub fn cluster_role(self) -> String {
        format!("bootsman:project:{}", self.as_str())
    }
}

/// Limits of a project. Each is unset for no limit.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectQuotas {
    /// Most BootsmanClusters in the project's namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub clusters: Option<i32>,
    /// Most control-plane hosts, summed over the project's clusters (`spec.controlPlane.replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub control_plane_hosts: Option<i32>,
    /// Most worker hosts, summed over the project's clusters and their pools
    /// (`spec.workers[].replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub worker_hosts: Option<i32>,
    /// A ResourceQuota the operator keeps in each of the project's namespaces (named
    /// `bootsman-project`), e.g. to bound Secrets or ConfigMaps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_quota: Option<ResourceQuotaSpec>,
}

/// What the project uses and whether its namespaces and bindings are in place.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Usage, to compare with `spec.quotas`.
    #[serde(default)]
    pub usage: ProjectUsage,
    /// The namespaces the project holds now (labelled as its own).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// `Ready` (namespaces and bindings in place), `QuotaExceeded` (usage above a quota, e.g.
    /// after the quota was lowered).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// What a project's clusters take.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectUsage {
    /// BootsmanClusters in the project's namespaces.
    pub clusters: i32,
    /// Control-plane hosts they ask for.
    pub control_plane_hosts: i32,
    /// Worker hosts they ask for.
    pub worker_hosts: i32,
}

impl Project {
    /// Every namespace the Project names: those it asks for and those it holds now. A change of
    /// the Project concerns what lives in any of them.
    pub fn named_namespaces(&self) -> BTreeSet<&str> {
        let held = self.status.iter().flat_map(|s| s.namespaces.iter());
        self.spec
            .namespaces
            .iter()
            .chain(held)
            .map(String::as_str)
            .collect()
    }
}

impl ProjectUsage {
    /// What `clusters` ask for together.
    pub fn of<'a>(clusters: impl IntoIterator<Item = &'a super::BootsmanCluster>) -> Self {
        let mut u = Self::default();
        for c in clusters {
            u.clusters += 1;
            u.control_plane_hosts += c.spec.control_plane.replicas;
            u.worker_hosts += c.spec.worker_replicas();
        }
        u
    }
}
