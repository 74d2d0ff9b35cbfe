//! A site for provider tests: a namespace of the real control plane, hosts played by the test
//! with their own host identities (register, heartbeat, report bootstrap and cleanup results as an
//! agent would), CAPI Clusters and Machines as CAPI would create them, and provider instances.

#![allow(dead_code, clippy::unwrap_used)] // shared by several test binaries; test code

use std::collections::BTreeMap;
use std::time::Duration;

use bootsman_api::capi::{
    Bootstrap, Cluster, ClusterSpec, ContractVersionedObjectReference, Machine, MachineSpec,
};
use bootsman_api::v1beta1::{
    ApiEndpoint, ByoCluster, ByoClusterSpec, ByoHost, ByoHostSpec, ByoMachine, ByoMachineSpec,
};
use bootsman_provider::Config;
use bootsman_testenv::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

pub const WAIT: Duration = Duration::from_secs(60);

pub struct Site {
    pub env: &'static TestEnv,
    pub ns: String,
    pub admin: kube::Client,
    providers: Vec<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

pub fn meta(name: &str, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

impl Site {
    /// A fresh namespace where hosts (group `byoh:hosts`) may register and heartbeat.
    pub async fn new(prefix: &str) -> Self {
        Self::new_in(TestEnv::shared().await, prefix).await
    }

    /// The same in a given environment (e.g. one with the Cluster API managers running).
    pub async fn new_in(env: &'static TestEnv, prefix: &str) -> Self {
        let ns = env.create_namespace(prefix).await;
        let admin = env.client().await;
        let role = Role {
            metadata: meta("test-hosts", &ns),
            rules: Some(vec![
                PolicyRule {
                    api_groups: Some(vec!["infrastructure.cluster.x-k8s.io".into()]),
                    resources: Some(vec!["byohosts".into(), "byohosts/status".into()]),
                    verbs: ["get", "list", "watch", "create", "update", "patch"]
                        .map(String::from)
                        .to_vec(),
                    ..Default::default()
                },
                PolicyRule {
                    api_groups: Some(vec!["coordination.k8s.io".into()]),
                    resources: Some(vec!["leases".into()]),
                    verbs: ["get", "create", "update", "patch"].map(String::from).to_vec(),
                    ..Default::default()
                },
            ]),
        };
        Api::<Role>::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let rb = RoleBinding {
            metadata: meta("test-hosts", &ns),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: "test-hosts".into(),
            },
            subjects: Some(vec![Subject {
                kind: "Group".into(),
                name: "byoh:hosts".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Default::default()
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &rb)
            .await
            .unwrap();
        Self {
            env,
            ns,
            admin,
            providers: Vec::new(),
        }
    }

    /// Provider settings scoped to this site's namespace.
    pub fn config(&self) -> Config {
        Config {
            namespace: Some(self.ns.clone()),
            ..Config::default()
        }
    }

    /// Starts a provider instance with its own client and pool index.
    pub async fn start_provider(&mut self, config: Config) {
        let client = self.env.client().await;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.await;
            };
            let metrics = std::sync::Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
            bootsman_provider::run(client, config, metrics, shutdown)
                .await
                .unwrap();
        });
        self.providers.push((tx, handle));
    }

    /// Registers a host as its agent would, with a fresh Lease when `online`; then an admin sets
    /// the `labels` outside `host.bootsman.io/` (placement labels, which a host may not set).
    pub async fn host(&self, name: &str, labels: &[(&str, &str)], online: bool) -> Host {
        let client = self
            .env
            .client_for(&format!("byoh:host:{name}"), &["byoh:hosts"])
            .await;
        let own_label = |(k, _): &(&str, &str)| k.starts_with(bootsman_api::labels::HOST_OWNED_PREFIX);
        let own: Vec<(&str, &str)> = labels.iter().copied().filter(own_label).collect();
        let admins: BTreeMap<&str, &str> = labels.iter().copied().filter(|l| !own_label(l)).collect();
        let host = Host::register(client, &self.ns, name, &own, online).await;
        if !admins.is_empty() {
            Api::<ByoHost>::namespaced(self.admin.clone(), &self.ns)
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": admins}})),
                )
                .await
                .unwrap();
        }
        host
    }

    /// Registers a healthy host without labels, with the admin's client (for tests about the
    /// provider at scale, where the host's own identity is not the point).
    pub async fn host_fast(&self, name: &str) -> Host {
        let mut h = ByoHost::new(name, ByoHostSpec::default());
        h.metadata.namespace = Some(self.ns.clone());
        Api::<ByoHost>::namespaced(self.admin.clone(), &self.ns)
            .create(&PostParams::default(), &h)
            .await
            .unwrap();
        let host = Host {
            name: name.into(),
            ns: self.ns.clone(),
            client: self.admin.clone(),
        };
        host.heartbeat(3600).await;
        host
    }

    /// A CAPI Cluster whose infrastructure is provisioned (as CAPI reports it).
    pub async fn cluster(&self, name: &str, paused: bool) -> Cluster {
        create_cluster(&self.admin, &self.ns, name, paused).await
    }

    /// A Machine with its bootstrap data Secret, and the ByoMachine it owns, as CAPI creates them.
    pub async fn machine(&self, cluster: &str, name: &str, selector: Option<LabelSelector>) -> ByoMachine {
        create_machine(&self.admin, &self.ns, cluster, name, selector).await
    }

    pub fn byomachines(&self) -> Api<ByoMachine> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    pub fn byohosts(&self) -> Api<ByoHost> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Stops every provider instance of this site.
    pub async fn stop(mut self) {
        for (tx, handle) in self.providers.drain(..) {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
        }
    }
}

/// A CAPI Cluster in `ns` whose infrastructure is provisioned, written with `admin` as CAPI
/// writes it and reports it.
pub async fn create_cluster(admin: &kube::Client, ns: &str, name: &str, paused: bool) -> Cluster {
    let mut c = Cluster::new(
        name,
        ClusterSpec {
            paused: paused.then_some(true),
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(ns.into());
    c.spec.infrastructure_ref = Some(ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "ByoCluster".into(),
        name: name.into(),
    });
    let api: Api<Cluster> = Api::namespaced(admin.clone(), ns);
    let c = api.create(&PostParams::default(), &c).await.unwrap();
    let status = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    c
}

/// The ByoCluster of `cluster` with control-plane endpoint `host:6443`, owned by the Cluster as
/// CAPI sets it, written with `admin`.
pub async fn create_byo_cluster(admin: &kube::Client, cluster: &Cluster, host: &str) -> ByoCluster {
    let ns = cluster.namespace().unwrap();
    let mut bc = ByoCluster::new(
        &cluster.name_any(),
        ByoClusterSpec {
            control_plane_endpoint: Some(ApiEndpoint {
                host: host.into(),
                port: Some(6443),
            }),
            ..Default::default()
        },
    );
    bc.metadata.namespace = Some(ns.clone());
    bc.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Cluster::api_version(&()).into(),
        kind: "Cluster".into(),
        name: cluster.name_any(),
        uid: cluster.uid().unwrap(),
        ..Default::default()
    }]);
    Api::<ByoCluster>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &bc)
        .await
        .unwrap()
}

/// A Machine in `ns` with its bootstrap data Secret, and the ByoMachine it owns, written with
/// `admin` as CAPI creates them.
pub async fn create_machine(
    admin: &kube::Client,
    ns: &str,
    cluster: &str,
    name: &str,
    selector: Option<LabelSelector>,
) -> ByoMachine {
    let data = format!("#cloud-config\nruncmd:\n- echo {name}\n");
    create_machine_with_data(admin, ns, cluster, name, selector, &data).await
}

/// [`create_machine`] with the bootstrap data (cloud-config) `data`.
pub async fn create_machine_with_data(
    admin: &kube::Client,
    ns: &str,
    cluster: &str,
    name: &str,
    selector: Option<LabelSelector>,
    data: &str,
) -> ByoMachine {
    let data = data.to_string();
    let secret = Secret {
        metadata: meta(&format!("{name}-bootstrap-data"), ns),
        data: Some(BTreeMap::from([
            ("value".to_string(), ByteString(data.into_bytes())),
            ("format".to_string(), ByteString(b"cloud-config".to_vec())),
        ])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mut m = Machine::new(
        name,
        MachineSpec {
            cluster_name: cluster.into(),
            bootstrap: Bootstrap {
                data_secret_name: Some(format!("{name}-bootstrap-data")),
                config_ref: None,
            },
            infrastructure_ref: ContractVersionedObjectReference {
                api_group: "infrastructure.cluster.x-k8s.io".into(),
                kind: "ByoMachine".into(),
                name: name.into(),
            },
            ..Default::default()
        },
    );
    m.metadata.namespace = Some(ns.into());
    m.metadata.labels = Some(BTreeMap::from([(
        "cluster.x-k8s.io/cluster-name".into(),
        cluster.into(),
    )]));
    let m = Api::<Machine>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &m)
        .await
        .unwrap();
    let mut bm = ByoMachine::new(
        name,
        ByoMachineSpec {
            selector,
            ..Default::default()
        },
    );
    bm.metadata.namespace = Some(ns.into());
    bm.metadata.labels = Some(BTreeMap::from([(
        "cluster.x-k8s.io/cluster-name".into(),
        cluster.into(),
    )]));
    bm.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Machine::api_version(&()).into(),
        kind: "Machine".into(),
        name: name.into(),
        uid: m.uid().unwrap(),
        controller: Some(true),
        ..Default::default()
    }]);
    Api::<ByoMachine>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &bm)
        .await
        .unwrap()
}

/// A host played by the test with its own identity (`byoh:host:<name>`, group `byoh:hosts`).
pub struct Host {
    pub name: String,
    pub ns: String,
    pub client: kube::Client,
}

impl Host {
    /// Registers host `name` in pool `ns` as its agent would, with the host's own `client`: its
    /// ByoHost with `labels`, inventory and `Registered`, and a fresh Lease when `online`.
    pub async fn register(
        client: kube::Client,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        online: bool,
    ) -> Host {
        let mut h = ByoHost::registered(name, ns);
        h.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Api::<ByoHost>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &h)
            .await
            .unwrap();
        let host = Host {
            name: name.into(),
            ns: ns.into(),
            client,
        };
        host.inventory(name).await;
        host.report("Registered", true, "Registered").await;
        host.heartbeat(if online { 3600 } else { -3600 }).await;
        host
    }

    /// Renews (or, with a negative age, backdates) the heartbeat Lease.
    pub async fn heartbeat(&self, valid_for_secs: i64) {
        let renew = if valid_for_secs >= 0 {
            Timestamp::now()
        } else {
            Timestamp::now()
                .checked_sub(SignedDuration::from_secs(-2 * valid_for_secs))
                .unwrap()
        };
        let lease = Lease {
            metadata: meta(&self.name, &self.ns),
            spec: Some(LeaseSpec {
                holder_identity: Some(self.name.clone()),
                lease_duration_seconds: Some(valid_for_secs.unsigned_abs().min(3600) as i32),
                renew_time: Some(MicroTime(renew)),
                ..Default::default()
            }),
        };
        let mut body = serde_json::to_value(&lease).unwrap();
        body["apiVersion"] = "coordination.k8s.io/v1".into();
        body["kind"] = "Lease".into();
        Api::<Lease>::namespaced(self.client.clone(), &self.ns)
            .patch(
                &self.name,
                &PatchParams::apply("byoh-agent").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }

    /// Reports an agent condition for the host's current spec (server-side apply as `byoh-agent`).
    pub async fn report(&self, type_: &str, ok: bool, reason: &str) {
        let api: Api<ByoHost> = Api::namespaced(self.client.clone(), &self.ns);
        let generation = api.get(&self.name).await.unwrap().metadata.generation;
        let body = json!({
            "apiVersion": ByoHost::api_version(&()),
            "kind": "ByoHost",
            "status": {
                "conditions": [{
                    "type": type_, "status": if ok { "True" } else { "False" }, "reason": reason, "message": "",
                    "lastTransitionTime": Timestamp::now().to_string(), "observedGeneration": generation,
                }],
            },
        });
        api.patch_status(
            &self.name,
            &PatchParams::apply(&format!("byoh-agent/{type_}")).force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    }

    /// Reports the host's inventory (host name and interfaces) as its agent would.
    pub async fn inventory(&self, hostname: &str) {
        let body = json!({
            "apiVersion": ByoHost::api_version(&()),
            "kind": "ByoHost",
            "status": {
                "agentVersion": "test",
                "hostInfo": {"hostname": hostname},
                "network": [{"networkInterfaceName": "eth0", "ipAddrs": ["127.0.0.1/8"], "isDefault": true}],
            },
        });
        Api::<ByoHost>::namespaced(self.client.clone(), &self.ns)
            .patch_status(
                &self.name,
                &PatchParams::apply("byoh-agent/inventory").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }

    /// The host's ByoHost as the host itself reads it.
    pub async fn get(&self) -> ByoHost {
        Api::<ByoHost>::namespaced(self.client.clone(), &self.ns)
            .get(&self.name)
            .await
            .unwrap()
    }
}

pub fn role(r: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([("role".to_string(), r.to_string())].into()),
        ..Default::default()
    }
}

/// The condition of a ByoMachine, as `(status, reason)`.
pub fn condition(bm: &ByoMachine, type_: &str) -> Option<(String, String)> {
    let s = bm.status.as_ref()?;
    bootsman_runtime::conditions::get(&s.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
}
