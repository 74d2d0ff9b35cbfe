//! Render: a pure function from a BootsmanCluster and the operator settings to the Cluster API
//! objects of the child cluster. No I/O happens here, so the same input always gives the same
//! objects (the render fixtures under `tests/fixtures` pin the output).
//!
//! What is rendered, all in the BootsmanCluster's namespace, labelled `bootsman.io/cluster` and
//! `cluster.x-k8s.io/cluster-name`, and owned (controller) by the BootsmanCluster:
//! - `Cluster` (v1beta2) `<name>` with the networks, endpoint and references below;
//! - `ByoCluster` `<name>` holding the endpoint;
//! - `KubeadmControlPlane` `<name>-control-plane` with a kube-vip static pod holding the endpoint
//!   address (ARP mode, leader election) and rollout `maxSurge: 0` (no spare host needed);
//! - `ByoMachineTemplate` `<name>-control-plane` and, per worker pool, `<name>-<pool>`;
//! - per worker pool a `KubeadmConfigTemplate` and a `MachineDeployment` `<name>-<pool>`
//!   (rollout `maxSurge: 0`, `maxUnavailable: 1`);
//! - addons as `HelmChartProxy` objects selecting the CAPI Cluster by `bootsman.io/addons: <name>`:
//!   Cilium always, Longhorn, ingress-nginx and MetalLB when enabled. MetalLB's BGPPeer,
//!   IPAddressPool and BGPAdvertisement objects go into a second HelmChartProxy
//!   (`<name>-metallb-config`) built on a chart that installs the objects listed in its values
//!   (`bedag/raw` by default), because CAAPH installs charts only.

use std::collections::BTreeMap;

use bootsman_api::labels;
use bootsman_api::v1alpha1::BootsmanCluster;
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
            json!({"spec": {"template": {"spec": {
                "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{
                    "name": "node-labels",
                    "value": format!("{NODE_ROLE_LABEL}=worker,{POOL_LABEL}={}", pool.name),
                }]}},
            }}}}),
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

/// kubeadm configuration of the control plane: the kube-vip static pod, kube-proxy skipped
/// (Cilium replaces it). On the first machine kubeadm's `admin.conf` is not yet bound to any
/// RBAC when kube-vip starts, so kube-vip uses `super-admin.conf` until `kubeadm init` is done.
fn control_plane_kubeadm(bc: &BootsmanCluster, settings: &OperatorSettings) -> Value {
    let sed = |from: &str, to: &str| {
        format!(
            "if [ -f /run/kubeadm/kubeadm.yaml ]; then sed -i 's#path: /etc/kubernetes/{from}#path: /etc/kubernetes/{to}#' {KUBE_VIP_MANIFEST}; fi"
        )
    };
    json!({
        "initConfiguration": {"skipPhases": ["addon/kube-proxy"]},
        "files": [{
            "path": KUBE_VIP_MANIFEST,
            "owner": "root:root",
            "permissions": "0644",
            "content": kube_vip_manifest(bc, &settings.kube_vip_image),
        }],
        "preKubeadmCommands": [sed("admin.conf", "super-admin.conf")],
        "postKubeadmCommands": [sed("super-admin.conf", "admin.conf")],
    })
}

/// The kube-vip static pod: ARP mode, leader election among the control-plane machines, the
/// endpoint address as the VIP.
pub fn kube_vip_manifest(bc: &BootsmanCluster, image: &str) -> String {
    let ep = &bc.spec.control_plane.endpoint;
    let env: Vec<Value> = [
        ("vip_arp", "true".to_string()),
        ("port", ep.port.to_string()),
        ("vip_cidr", "32".to_string()),
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

impl Ctx<'_> {
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
