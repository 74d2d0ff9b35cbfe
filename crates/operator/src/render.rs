//! Render: a pure function from a BootsmanCluster and the operator settings to the Cluster API
//! objects of the child cluster. No I/O happens here, so the same input always gives the same
//! objects (the render fixtures under `tests/fixtures` pin the output).
//!
//! What is rendered, all in the BootsmanCluster's namespace, labelled `bootsman.io/cluster` and
//! `cluster.x-k8s.io/cluster-name`, and owned (controller) by the BootsmanCluster:
//! - `Cluster` (v1beta2) `<name>` with the networks, endpoint and references below;
//! - `ByoCluster` `<name>` holding the endpoint;
//! - `KubeadmControlPlane` `<name>-control-plane` with rollout `maxSurge: 0` (no spare host
//!   needed), a kube-vip static pod holding the endpoint address (ARP mode, leader election)
//!   unless the endpoint's load balancer is `external`, kubeadm's `imageRepository` from
//!   `spec.imageRepository`, and the node settings of `spec.nodes` (preflight checks, cgroup v1);
//! - `ByoMachineTemplate` `<name>-control-plane` and, per worker pool, `<name>-<pool>`;
//! - per worker pool a `KubeadmConfigTemplate` and a `MachineDeployment` `<name>-<pool>`
//!   (rollout `maxSurge: 0`, `maxUnavailable: 1`);
//! - the CNI: with `cilium`, a `HelmChartProxy` (and kube-proxy is not installed); with
//!   `kube-router`, a `ConfigMap` `<name>-cni-kube-router` holding its manifests and a
//!   `ClusterResourceSet` `<name>-cni` that applies them once to the child cluster (Cluster API
//!   core; no add-on provider needed);
//! - with `network.isolation`, a `ConfigMap` `<name>-isolation-policies` holding the projects'
//!   labelled namespaces and their ingress policies ([`isolation_manifests`]) and a
//!   `ClusterResourceSet` `<name>-isolation` that applies them again whenever they change;
//! - the other addons as `HelmChartProxy` objects selecting the CAPI Cluster by
//!   `bootsman.io/addons: <name>`: Longhorn, ingress-nginx and MetalLB when enabled. MetalLB's BGPPeer,
//!   IPAddressPool and BGPAdvertisement objects go into a second HelmChartProxy
//!   (`<name>-metallb-config`) built on a chart that installs the objects listed in its values
//!   (`bedag/raw` by default), because CAAPH installs charts only.

use std::collections::BTreeMap;

use bootsman_api::labels;
use bootsman_api::v1alpha1::{BootsmanCluster, Cni, DEFAULT_EVICTION_HARD, EndpointLoadBalancer, Nodes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use serde_json::{Value, json};

use crate::settings::{ChartSource, OperatorSettings};

/// Label on worker Nodes (set through the kubelet's `--node-labels`) naming their role.
pub const NODE_ROLE_LABEL: &str = "bootsman.io/role";
/// Label on worker Nodes and Machines naming their worker pool.
pub const POOL_LABEL: &str = "bootsman.io/pool";
/// Path of the kube-vip static pod manifest on control-plane machines.
pub const KUBE_VIP_MANIFEST: &str = "/etc/kubernetes/manifests/kube-vip.yaml";
/// kubeadm's patches folder on every machine (`spec.nodes` settings of the kubelet).
pub const KUBEADM_PATCHES: &str = "/etc/kubernetes/patches";
/// kube-router's manifests (ServiceAccount, RBAC, ConfigMap with the CNI conflist, DaemonSet);
/// `__IMAGE__` stands for the image.
const KUBE_ROUTER_MANIFESTS: &str = include_str!("../manifests/kube-router.yaml");

/// Name of the KubeadmControlPlane and of its ByoMachineTemplate.
pub fn control_plane_name(cluster: &str) -> String {
    format!("{cluster}-control-plane")
}

/// Name of the MachineDeployment, KubeadmConfigTemplate and ByoMachineTemplate of a pool.
pub fn pool_object_name(cluster: &str, pool: &str) -> String {
    format!("{cluster}-{pool}")
}

/// Renders every object of the child cluster, in apply order (infrastructure and templates
/// before the objects that reference them). Each object is JSON with `apiVersion`, `kind` and
/// `metadata`, ready for server-side apply.
pub fn render(bc: &BootsmanCluster, settings: &OperatorSettings) -> Vec<Value> {
    let name = bc.metadata.name.clone().unwrap_or_default();
    let ctx = Ctx {
        name: &name,
        namespace: bc.metadata.namespace.clone().unwrap_or_default(),
        owner: owner_reference(bc),
    };
    let spec = &bc.spec;
    let mut out = Vec::new();

    out.push(ctx.object(
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "ByoCluster",
        &name,
        json!({"spec": {"controlPlaneEndpoint": {
            "host": spec.control_plane.endpoint.host,
            "port": spec.control_plane.endpoint.port,
        }}}),
    ));

    let cp = control_plane_name(&name);
    out.push(ctx.byo_machine_template(&cp, spec.control_plane.host_selector.as_ref()));
    out.push(ctx.object(
        "controlplane.cluster.x-k8s.io/v1beta2",
        "KubeadmControlPlane",
        &cp,
        json!({"spec": {
            "replicas": spec.control_plane.replicas,
            "version": spec.kubernetes_version,
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "ByoMachineTemplate",
                "name": cp,
            }}},
            "kubeadmConfigSpec": control_plane_kubeadm(bc, settings),
            "rollout": {"strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0},
            }},
        }}),
    ));

    for pool in &spec.workers {
        let obj = pool_object_name(&name, &pool.name);
        out.push(ctx.byo_machine_template(&obj, pool.host_selector.as_ref()));
        out.push(ctx.object(
            "bootstrap.cluster.x-k8s.io/v1beta2",
            "KubeadmConfigTemplate",
            &obj,
            json!({"spec": {"template": {"spec": worker_kubeadm(&spec.nodes, &pool.name)}}}),
        ));
        let machine_labels = json!({
            labels::CLUSTER_NAME: name,
            POOL_LABEL: pool.name,
        });
        out.push(ctx.object(
            "cluster.x-k8s.io/v1beta2",
            "MachineDeployment",
            &obj,
            json!({"spec": {
                "clusterName": name,
                "replicas": pool.replicas,
                "selector": {"matchLabels": machine_labels},
                "template": {
                    "metadata": {"labels": machine_labels},
                    "spec": {
                        "clusterName": name,
                        "version": spec.kubernetes_version,
                        "bootstrap": {"configRef": {
                            "apiGroup": "bootstrap.cluster.x-k8s.io",
                            "kind": "KubeadmConfigTemplate",
                            "name": obj,
                        }},
                        "infrastructureRef": {
                            "apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "ByoMachineTemplate",
                            "name": obj,
                        },
                    },
                },
                "rollout": {"strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
                }},
            }}),
        ));
    }

    let mut cluster = ctx.object(
        "cluster.x-k8s.io/v1beta2",
        "Cluster",
        &name,
        json!({"spec": {
            "clusterNetwork": {
                "pods": {"cidrBlocks": [spec.network.pod_cidr]},
                "services": {"cidrBlocks": [spec.network.service_cidr]},
            },
            "controlPlaneEndpoint": {
                "host": spec.control_plane.endpoint.host,
                "port": spec.control_plane.endpoint.port,
            },
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "ByoCluster",
                "name": name,
            },
            "controlPlaneRef": {
                "apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "KubeadmControlPlane",
                "name": cp,
            },
        }}),
    );
    cluster["metadata"]["labels"][labels::ADDONS_SELECTOR] = json!(name);
    if spec.rancher.auto_import {
        cluster["metadata"]["labels"][labels::RANCHER_AUTO_IMPORT] = json!("true");
    }
    out.push(cluster);

    out.extend(addons(&ctx, bc, settings));
    out
}

/// Common metadata of every rendered object.
struct Ctx<'a> {
    name: &'a str,
    namespace: String,
    owner: Value,
}

impl Ctx<'_> {
    fn object(&self, api_version: &str, kind: &str, name: &str, body: Value) -> Value {
        let mut v = json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {
                    labels::BOOTSMAN_CLUSTER: self.name,
                    labels::CLUSTER_NAME: self.name,
                },
                "ownerReferences": [self.owner],
            },
        });
        if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), body) {
            obj.extend(extra);
        }
        v
    }

    fn byo_machine_template(&self, name: &str, selector: Option<&LabelSelector>) -> Value {
        let mut spec = json!({});
        if let Some(sel) = selector {
            spec["selector"] = serde_json::to_value(sel).unwrap_or_default();
        }
        self.object(
            "infrastructure.cluster.x-k8s.io/v1beta1",
            "ByoMachineTemplate",
            name,
            json!({"spec": {"template": {"spec": spec}}}),
        )
    }
}

fn owner_reference(bc: &BootsmanCluster) -> Value {
    json!({
        "apiVersion": BootsmanCluster::api_version(&()),
        "kind": BootsmanCluster::kind(&()),
        "name": bc.metadata.name.clone().unwrap_or_default(),
        "uid": bc.metadata.uid.clone().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// kubeadm configuration of the control plane: kube-proxy skipped where Cilium replaces it; the
/// kube-vip static pod when kube-vip holds the endpoint (on the first machine kubeadm's
/// `admin.conf` is not yet bound to any RBAC when kube-vip starts, so kube-vip uses
/// `super-admin.conf` until `kubeadm init` is done); the image repository; kube-proxy's
/// conntrack setting (a `KubeProxyConfiguration` appended to the first machine's kubeadm
/// configuration, which Cluster API has no field for); the node settings; no taints on a
/// schedulable control plane.
fn control_plane_kubeadm(bc: &BootsmanCluster, settings: &OperatorSettings) -> Value {
    let spec = &bc.spec;
    let mut out = json!({});
    let node = node_settings(&spec.nodes);
    let mut init = json!({});
    let mut join = json!({});
    if !node.ignore_preflight_errors.is_empty() {
        let registration = json!({"ignorePreflightErrors": node.ignore_preflight_errors});
        init["nodeRegistration"] = registration.clone();
        join["nodeRegistration"] = registration;
    }
    if spec.control_plane.schedulable {
        // An empty list, not an absent one: kubeadm then registers the node without its
        // default control-plane NoSchedule taint.
        init["nodeRegistration"]["taints"] = json!([]);
        join["nodeRegistration"]["taints"] = json!([]);
    }
    if !node.files.is_empty() {
        init["patches"] = json!({"directory": KUBEADM_PATCHES});
        join["patches"] = json!({"directory": KUBEADM_PATCHES});
    }
    if spec.network.cni == Cni::Cilium {
        init["skipPhases"] = json!(["addon/kube-proxy"]);
    }
    let mut files = node.files;
    let mut pre = Vec::new();
    let mut post = Vec::new();
    if let Some(repo) = &spec.image_repository {
        out["clusterConfiguration"] = json!({"imageRepository": repo});
    }
    if spec.control_plane.endpoint.load_balancer == EndpointLoadBalancer::KubeVip {
        let sed = |from: &str, to: &str| {
            format!(
                "if [ -f /run/kubeadm/kubeadm.yaml ]; then sed -i 's#path: /etc/kubernetes/{from}#path: /etc/kubernetes/{to}#' {KUBE_VIP_MANIFEST}; fi"
            )
        };
        let image = mirrored(&settings.kube_vip_image, spec.image_repository.as_deref());
        files.push(json!({
            "path": KUBE_VIP_MANIFEST,
            "owner": "root:root",
            "permissions": "0644",
            "content": kube_vip_manifest(bc, &image),
        }));
        pre.push(sed("admin.conf", "super-admin.conf"));
        post.push(sed("super-admin.conf", "admin.conf"));
    }
    if spec.network.cni != Cni::Cilium
        && let Some(per_core) = spec
            .network
            .kube_proxy
            .as_ref()
            .and_then(|k| k.conntrack_max_per_core)
    {
        // Only the first machine's file holds an InitConfiguration; joining machines read
        // kube-proxy's settings from the cluster.
        pre.push(format!(
            "if grep -q '^kind: InitConfiguration' /run/kubeadm/kubeadm.yaml; then printf -- '---\\napiVersion: kubeproxy.config.k8s.io/v1alpha1\\nkind: KubeProxyConfiguration\\nconntrack:\\n  maxPerCore: {per_core}\\n' >> /run/kubeadm/kubeadm.yaml; fi"
        ));
    }
    for (key, v) in [("initConfiguration", init), ("joinConfiguration", join)] {
        if v.as_object().is_some_and(|o| !o.is_empty()) {
            out[key] = v;
        }
    }
    if !files.is_empty() {
        out["files"] = json!(files);
    }
    if !pre.is_empty() {
        out["preKubeadmCommands"] = json!(pre);
    }
    if !post.is_empty() {
        out["postKubeadmCommands"] = json!(post);
    }
    out
}

/// kubeadm configuration of a worker pool's machines: the node labels and the node settings.
fn worker_kubeadm(nodes: &Nodes, pool: &str) -> Value {
    let node = node_settings(nodes);
    let mut join = json!({"nodeRegistration": {
        "kubeletExtraArgs": [{
            "name": "node-labels",
            "value": format!("{NODE_ROLE_LABEL}=worker,{POOL_LABEL}={pool}"),
        }],
    }});
    if !node.ignore_preflight_errors.is_empty() {
        join["nodeRegistration"]["ignorePreflightErrors"] = json!(node.ignore_preflight_errors);
    }
    let mut out = json!({});
    if !node.files.is_empty() {
        join["patches"] = json!({"directory": KUBEADM_PATCHES});
        out["files"] = json!(node.files);
    }
    out["joinConfiguration"] = join;
    out
}

/// What `spec.nodes` asks of every machine.
struct NodeSettings {
    ignore_preflight_errors: Vec<String>,
    /// kubeadm patch files (under [`KUBEADM_PATCHES`]).
    files: Vec<Value>,
}

fn node_settings(nodes: &Nodes) -> NodeSettings {
    let mut ignore = nodes.ignore_preflight_errors.clone();
    let mut files = Vec::new();
    if nodes.allow_cgroup_v1 && !ignore.iter().any(|c| c == "SystemVerification") {
        ignore.push("SystemVerification".into());
    }
    if let Some(patch) = kubelet_patch(nodes) {
        files.push(json!({
            "path": format!("{KUBEADM_PATCHES}/kubeletconfiguration0+strategic.yaml"),
            "owner": "root:root",
            "permissions": "0644",
            "content": patch,
        }));
    }
    NodeSettings {
        ignore_preflight_errors: ignore,
        files,
    }
}

/// The kubeadm patch (YAML) of the kubelet's configuration that `spec.nodes` asks for; `None` when it asks nothing of the kubelet. `evictionHard` is written whole: the
/// kubelet's defaults with the cluster's thresholds over them, because a kubelet handed some
/// thresholds turns off every signal it was not handed.
fn kubelet_patch(nodes: &Nodes) -> Option<String> {
    let kubelet = &nodes.kubelet;
    let mut patch = serde_json::Map::new();
    if nodes.allow_cgroup_v1 {
        patch.insert("failCgroupV1".into(), json!(false));
    }
    if !kubelet.eviction_hard.is_empty() {
        let mut thresholds: BTreeMap<&str, &str> = DEFAULT_EVICTION_HARD.iter().copied().collect();
        for (signal, threshold) in &kubelet.eviction_hard {
            thresholds.insert(signal, threshold);
        }
        patch.insert("evictionHard".into(), json!(thresholds));
    }
    if let Some(high) = kubelet.image_gc_high_threshold_percent {
        patch.insert("imageGCHighThresholdPercent".into(), json!(high));
    }
    if let Some(low) = kubelet.image_gc_low_threshold_percent {
        patch.insert("imageGCLowThresholdPercent".into(), json!(low));
    }
    (!patch.is_empty()).then(|| {
        let patch = Value::Object(patch);
        // JSON is YAML too, should the YAML writer ever refuse.
        serde_saphyr::to_string(&patch).unwrap_or_else(|_| format!("{patch}\n"))
    })
}

/// `image` from `repository` when the cluster names one: `<repository>/<last path element>`
/// (`ghcr.io/kube-vip/kube-vip:v0.9.2` → `registry.example.internal/k8s/kube-vip:v0.9.2`).
pub fn mirrored(image: &str, repository: Option<&str>) -> String {
    match repository {
        Some(repo) => {
            let last = image.rsplit('/').next().unwrap_or(image);
            format!("{}/{last}", repo.trim_end_matches('/'))
        }
        None => image.to_string(),
    }
}

/// The kube-vip static pod: ARP mode, leader election among the control-plane machines, the
/// endpoint address as the VIP.
pub fn kube_vip_manifest(bc: &BootsmanCluster, image: &str) -> String {
    let ep = &bc.spec.control_plane.endpoint;
    let env: Vec<Value> = [
        ("vip_arp", "true".to_string()),
        ("port", ep.port.to_string()),
        // The VIP is one address: /32, or /128 for an IPv6 endpoint.
        (
            "vip_cidr",
            if ep.host.parse::<std::net::Ipv6Addr>().is_ok() {
                "128"
            } else {
                "32"
            }
            .to_string(),
        ),
        ("cp_enable", "true".to_string()),
        ("cp_namespace", "kube-system".to_string()),
        ("vip_leaderelection", "true".to_string()),
        ("vip_leasename", "plndr-cp-lock".to_string()),
        ("vip_leaseduration", "15".to_string()),
        ("vip_renewdeadline", "10".to_string()),
        ("vip_retryperiod", "2".to_string()),
        ("address", ep.host.clone()),
    ]
    .into_iter()
    .map(|(k, v)| json!({"name": k, "value": v}))
    .collect();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-vip", "namespace": "kube-system"},
        "spec": {
            "hostNetwork": true,
            "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["kubernetes"]}],
            "containers": [{
                "name": "kube-vip",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "args": ["manager"],
                "env": env,
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}},
                "volumeMounts": [{"mountPath": "/etc/kubernetes/admin.conf", "name": "kubeconfig"}],
            }],
            "volumes": [{
                "name": "kubeconfig",
                "hostPath": {"path": "/etc/kubernetes/admin.conf", "type": "FileOrCreate"},
            }],
        },
    });
    serde_saphyr::to_string(&pod).unwrap_or_else(|_| pod.to_string())
}

fn addons(ctx: &Ctx<'_>, bc: &BootsmanCluster, settings: &OperatorSettings) -> Vec<Value> {
    let spec = &bc.spec;
    let a = &settings.addons;
    let mut out = Vec::new();

    let reg = |src: &ChartSource, upstream: &str| match &src.image_registry {
        Some(r) => r.trim_end_matches('/').to_string(),
        None => upstream.to_string(),
    };

    match spec.network.cni {
        Cni::Cilium => {
            // Cilium reaches the API server through the endpoint (kube-proxy is not installed).
            let cilium_reg = reg(&a.cilium, "quay.io");
            let cilium = json!({
                "k8sServiceHost": "{{ .Cluster.spec.controlPlaneEndpoint.host }}",
                "k8sServicePort": "{{ .Cluster.spec.controlPlaneEndpoint.port }}",
                "kubeProxyReplacement": true,
                "ipam": {"mode": "kubernetes"},
                "image": {"repository": format!("{cilium_reg}/cilium/cilium"), "useDigest": false},
                "operator": {"image": {"repository": format!("{cilium_reg}/cilium/operator"), "useDigest": false}},
                "envoy": {"image": {"repository": format!("{cilium_reg}/cilium/cilium-envoy"), "useDigest": false}},
            });
            out.push(ctx.chart("cilium", &a.cilium, "kube-system", &cilium));
        }
        Cni::KubeRouter => {
            let image = mirrored(&settings.kube_router_image, spec.image_repository.as_deref());
            let manifests = KUBE_ROUTER_MANIFESTS.replace("__IMAGE__", &image);
            out.extend(ctx.resource_set("cni", "kube-router", &manifests, "ApplyOnce"));
        }
    }

    if let Some(iso) = &spec.network.isolation {
        let manifests = isolation_manifests(iso, spec.network.cni)
            .iter()
            .map(|o| serde_saphyr::to_string(o).unwrap_or_else(|_| o.to_string()))
            .collect::<Vec<_>>()
            .join("---\n");
        out.extend(ctx.resource_set("isolation", "policies", &manifests, "Reconcile"));
    }

    if spec.storage.longhorn.enabled {
        let mut values = json!({"defaultSettings": {"createDefaultDiskLabeledNodes": false}});
        if let Some(r) = &a.longhorn.image_registry {
            values["global"] = json!({"imageRegistry": r.trim_end_matches('/')});
        }
        out.push(ctx.chart("longhorn", &a.longhorn, "longhorn-system", &values));
    }

    if spec.ingress.nginx.enabled {
        let ingress_reg = reg(&a.ingress_nginx, "registry.k8s.io");
        let mut config = BTreeMap::new();
        if spec.ingress.nginx.proxy_protocol {
            config.insert("use-proxy-protocol", "true");
        }
        let values = json!({"controller": {
            "kind": "DaemonSet",
            "nodeSelector": {NODE_ROLE_LABEL: "worker"},
            "config": config,
            "image": {"registry": ingress_reg, "digest": ""},
            "admissionWebhooks": {"patch": {"image": {"registry": ingress_reg, "digest": ""}}},
        }});
        out.push(ctx.chart("ingress-nginx", &a.ingress_nginx, "ingress-nginx", &values));
    }

    let mlb = &spec.load_balancer.metallb;
    if mlb.enabled {
        let mut values = json!({});
        if let Some(r) = &a.metallb.image_registry {
            let r = r.trim_end_matches('/');
            values = json!({
                "controller": {"image": {"repository": format!("{r}/metallb/controller")}},
                "speaker": {
                    "image": {"repository": format!("{r}/metallb/speaker")},
                    "frr": {"image": {"repository": format!("{r}/frrouting/frr")}},
                },
            });
        }
        out.push(ctx.chart("metallb", &a.metallb, "metallb-system", &values));

        let mut resources = Vec::new();
        for (i, p) in mlb.bgp_peers.iter().enumerate() {
            let mut spec = json!({"peerAddress": p.peer_address, "peerASN": p.peer_asn, "myASN": p.my_asn});
            if let Some(port) = p.peer_port {
                spec["peerPort"] = json!(port);
            }
            resources.push(json!({
                "apiVersion": "metallb.io/v1beta2",
                "kind": "BGPPeer",
                "metadata": {"name": format!("peer-{i}"), "namespace": "metallb-system"},
                "spec": spec,
            }));
        }
        for pool in &mlb.address_pools {
            let mut spec = json!({"addresses": pool.addresses});
            if let Some(auto) = pool.auto_assign {
                spec["autoAssign"] = json!(auto);
            }
            resources.push(json!({
                "apiVersion": "metallb.io/v1beta1",
                "kind": "IPAddressPool",
                "metadata": {"name": pool.name, "namespace": "metallb-system"},
                "spec": spec,
            }));
        }
        let pools: Vec<&str> = mlb.address_pools.iter().map(|p| p.name.as_str()).collect();
        resources.push(json!({
            "apiVersion": "metallb.io/v1beta1",
            "kind": "BGPAdvertisement",
            "metadata": {"name": "bootsman", "namespace": "metallb-system"},
            "spec": {"ipAddressPools": pools},
        }));
        out.push(ctx.chart(
            "metallb-config",
            &a.raw,
            "metallb-system",
            &json!({"resources": resources}),
        ));
    }
    out
}

/// Label on the namespaces of a project of the child cluster (`spec.network.isolation`).
pub const CHILD_PROJECT_LABEL: &str = "bootsman.io/project";
/// Name of the NetworkPolicy isolating each project namespace (CNIs other than Cilium).
pub const ISOLATION_POLICY: &str = "bootsman-project-isolation";
/// Namespace of the ingress controller, admitted into every project.
const INGRESS_NAMESPACE: &str = "ingress-nginx";

/// The objects that isolate the projects of a child cluster from one another (see
/// [`bootsman_api::v1alpha1::Isolation`]): the labelled namespaces, then the policies.
pub fn isolation_manifests(iso: &bootsman_api::v1alpha1::Isolation, cni: Cni) -> Vec<Value> {
    let mut out = Vec::new();
    for p in &iso.projects {
        for ns in &p.namespaces {
            out.push(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {CHILD_PROJECT_LABEL: p.name}},
            }));
        }
    }
    for p in &iso.projects {
        match cni {
            Cni::Cilium => {
                let ns_label = format!("k8s:io.cilium.k8s.namespace.labels.{CHILD_PROJECT_LABEL}");
                out.push(json!({
                    "apiVersion": "cilium.io/v2", "kind": "CiliumClusterwideNetworkPolicy",
                    "metadata": {"name": format!("bootsman-project-{}", p.name)},
                    "spec": {
                        "description": format!("project {}: admits its own pods, the ingress controller and the hosts", p.name),
                        "endpointSelector": {"matchLabels": {&ns_label: p.name}},
                        "ingress": [
                            {"fromEndpoints": [
                                {"matchLabels": {&ns_label: p.name}},
                                {"matchLabels": {"k8s:io.kubernetes.pod.namespace": INGRESS_NAMESPACE}},
                            ]},
                            // A hostNetwork ingress DaemonSet and the kubelets' probes.
                            {"fromEntities": ["host", "remote-node"]},
                        ],
                    },
                }));
            }
            Cni::KubeRouter => {
                let hosts: Vec<Value> = iso
                    .host_networks
                    .iter()
                    .map(|c| json!({"ipBlock": {"cidr": c}}))
                    .collect();
                for ns in &p.namespaces {
                    let mut ingress = vec![json!({"from": [
                        {"namespaceSelector": {"matchLabels": {CHILD_PROJECT_LABEL: p.name}}},
                        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": INGRESS_NAMESPACE}}},
                    ]})];
                    if !hosts.is_empty() {
                        ingress.push(json!({"from": hosts}));
                    }
                    out.push(json!({
                        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": ISOLATION_POLICY, "namespace": ns,
                                     "labels": {CHILD_PROJECT_LABEL: p.name}},
                        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": ingress},
                    }));
                }
            }
        }
    }
    out
}

/// Name of the ClusterResourceSet that applies the manifests of `addon` (e.g. `cni`).
pub fn resource_set_name(cluster: &str, addon: &str) -> String {
    format!("{cluster}-{addon}")
}

impl Ctx<'_> {
    /// A ConfigMap `<cluster>-<addon>-<what>` holding `manifests`, and a ClusterResourceSet
    /// `<cluster>-<addon>` that applies them to the child cluster when it is reachable: once
    /// (`ApplyOnce`), or again whenever they change (`Reconcile`).
    fn resource_set(&self, addon: &str, what: &str, manifests: &str, strategy: &str) -> [Value; 2] {
        let cm = format!("{}-{addon}-{what}", self.name);
        [
            self.object(
                "v1",
                "ConfigMap",
                &cm,
                json!({"data": {format!("{what}.yaml"): manifests}}),
            ),
            self.object(
                "addons.cluster.x-k8s.io/v1beta2",
                "ClusterResourceSet",
                &resource_set_name(self.name, addon),
                json!({"spec": {
                    "clusterSelector": {"matchLabels": {labels::ADDONS_SELECTOR: self.name}},
                    "resources": [{"kind": "ConfigMap", "name": cm}],
                    "strategy": strategy,
                }}),
            ),
        ]
    }

    /// A HelmChartProxy `<cluster>-<addon>` installing `src` into `namespace` of the child cluster.
    fn chart(&self, addon: &str, src: &ChartSource, namespace: &str, values: &Value) -> Value {
        let values = serde_saphyr::to_string(values).unwrap_or_else(|_| values.to_string());
        self.object(
            "addons.cluster.x-k8s.io/v1alpha1",
            "HelmChartProxy",
            &format!("{}-{addon}", self.name),
            json!({"spec": {
                "clusterSelector": {"matchLabels": {labels::ADDONS_SELECTOR: self.name}},
                "repoURL": src.repo_url,
                "chartName": src.chart_name,
                "version": src.version,
                "releaseName": addon,
                "namespace": namespace,
                "valuesTemplate": values,
                "options": {"install": {"createNamespace": true}, "wait": true, "timeout": "10m0s"},
            }}),
        )
    }
}
