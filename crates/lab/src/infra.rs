//! An infrastructure node: a lab host that is a Node of the infrastructure cluster itself (the
//! test control plane), so Bootsman's controllers run there as Pods from their images, installed
//! by the chart, the way a site runs them.
//!
//! The test control plane has no scheduler and no nodes of its own, so the lab adds what a
//! cluster would have: `kube-scheduler` (from the lab's programs), the `kubernetes` Service's
//! EndpointSlice pointing at the API server's lab address (the harness's API server does not
//! reconcile it), and one host whose kubelet joins with a client certificate of
//! `system:node:<host>` signed by the cluster's client CA (no kubeadm: this cluster's control
//! plane is not kubeadm's), a bridge CNI with a fixed pod range (one node needs no routes), and
//! kube-proxy as a static pod (from the lab registry) so Pods reach the API server through the
//! `kubernetes` Service.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use bootsman_testenv::TestEnv;
use bootsman_testenv::process::Component;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::error::{Error, Result, io};
use crate::site::{DISK_RESERVE, until};
use crate::{Lab, LabHost, net};

/// Label on the infrastructure node.
pub const INFRA_LABEL: &str = "bootsman.io/lab-infra";
/// The pod range of the infrastructure node (outside the lab network and the service range).
pub const POD_CIDR: &str = "10.88.0.0/24";

/// The infrastructure cluster's scheduler and its node.
#[derive(Debug)]
pub struct InfraNode {
    /// The host.
    pub host: LabHost,
    scheduler: Component,
}

impl InfraNode {
    /// Starts the scheduler, points the `kubernetes` Service at the API server's lab address,
    /// boots host number `n` named `name` and joins its kubelet; returns once the Node is Ready.
    pub async fn join(lab: &Lab, env: &TestEnv, n: u8, name: &str) -> Result<InfraNode> {
        let scheduler = Component::spawn(
            "kube-scheduler",
            &lab.labbin().program("kube-scheduler"),
            &[
                format!("--kubeconfig={}", env.kubeconfig().display()),
                format!("--authentication-kubeconfig={}", env.kubeconfig().display()),
                format!("--authorization-kubeconfig={}", env.kubeconfig().display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", bootsman_testenv::free_port()?),
            ],
            &[],
            lab.dir().join("kube-scheduler.log"),
        )?;
        let admin = env.client().await;
        let url = env.advertised_url();
        let port: i32 = url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(443);
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes-lab", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes",
                                    "endpointslice.kubernetes.io/managed-by": "bootsman-lab"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [net::GATEWAY.to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        });
        Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(admin.clone(), "default")
            .patch(
                "kubernetes-lab",
                &PatchParams::apply("bootsman-lab").force(),
                &Patch::Apply(&slice),
            )
            .await
            .map_err(crate::error::kube("apply the kubernetes EndpointSlice"))?;

        let host = LabHost::boot(lab, n, name)?;
        let pki = env.pki();
        let kubelet = pki.client(
            &format!("kubelet-{name}"),
            &format!("system:node:{name}"),
            &["system:nodes"],
        )?;
        let proxy = pki.client(&format!("kube-proxy-{name}"), "system:kube-proxy", &[])?;
        let ca_path = &pki.files().server_ca.cert;
        let ca = std::fs::read(ca_path).map_err(io("read", ca_path))?;
        write_in(
            &host,
            "/etc/kubernetes/kubelet.conf",
            &kubeconfig(&url, &ca, &kubelet.cert, &kubelet.key)?,
        )?;
        write_in(
            &host,
            "/etc/kubernetes/kube-proxy.conf",
            &kubeconfig(&url, &ca, &proxy.cert, &proxy.key)?,
        )?;
        write_in(&host, "/etc/kubernetes/pki/ca.crt", &String::from_utf8_lossy(&ca))?;
        write_in(
            &host,
            "/var/lib/kubelet/config.yaml",
            &format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
evictionHard: {{memory.available: 100Mi, nodefs.available: {DISK_RESERVE}, nodefs.inodesFree: 5%, imagefs.available: {DISK_RESERVE}, imagefs.inodesFree: 5%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 95
staticPodPath: /etc/kubernetes/manifests
clusterDomain: cluster.local
rotateCertificates: false
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: /etc/kubernetes/pki/ca.crt}}
authorization:
  mode: AlwaysAllow
"
            ),
        )?;
        write_in(
            &host,
            "/var/lib/kubelet/kubeadm-flags.env",
            &format!(
                "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip={} --node-labels={INFRA_LABEL}=true\"\n",
                host.address()
            ),
        )?;
        write_in(
            &host,
            "/etc/cni/net.d/10-infra.conflist",
            &json!({
                "cniVersion": "0.4.0",
                "name": "infra",
                "plugins": [
                    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}]}},
                    {"type": "portmap", "capabilities": {"portMappings": true}}
                ]
            })
            .to_string(),
        )?;
        write_in(
            &host,
            "/etc/kubernetes/manifests/kube-proxy.yaml",
            &json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
                "spec": {
                    "hostNetwork": true,
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": "kube-proxy",
                        "image": format!("{}/kube-proxy:{}", net::registry(), lab.labbin().kubernetes_version),
                        "command": ["/usr/local/bin/kube-proxy",
                                    "--kubeconfig=/etc/kubernetes/kube-proxy.conf",
                                    format!("--hostname-override={name}"),
                                    format!("--cluster-cidr={POD_CIDR}"),
                                    "--conntrack-max-per-core=0"],
                        "securityContext": {"privileged": true},
                        "volumeMounts": [
                            {"name": "kubeconfig", "mountPath": "/etc/kubernetes/kube-proxy.conf", "readOnly": true},
                            {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
                            {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true}
                        ]
                    }],
                    "volumes": [
                        {"name": "kubeconfig", "hostPath": {"path": "/etc/kubernetes/kube-proxy.conf", "type": "File"}},
                        {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                        {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}
                    ]
                }
            })
            .to_string(),
        )?;
        host.sh("systemctl restart kubelet")?;

        let nodes: Api<Node> = Api::all(admin);
        until(
            &format!("infrastructure Node {name} Ready"),
            Duration::from_secs(180),
            || async {
                scheduler.check_running()?;
                Ok(match nodes.get_opt(name).await {
                    Ok(Some(node)) if crate::demo::node_ready(&node) => Ok(()),
                    Ok(Some(_)) => Err("registered, not Ready".into()),
                    Ok(None) => Err("not registered".into()),
                    Err(e) => Err(e.to_string()),
                })
            },
        )
        .await?;
        Ok(InfraNode { host, scheduler })
    }

    /// Fails with the log tail if the scheduler stopped or the host is down.
    pub fn check_running(&self) -> Result<()> {
        self.scheduler.check_running()?;
        if !self.host.is_running() {
            return Err(Error::Host {
                host: self.host.name().into(),
                problem: "stopped".into(),
                tail: String::new(),
            });
        }
        Ok(())
    }
}

/// Writes a file inside a running host.
fn write_in(host: &LabHost, path: &str, text: &str) -> Result<()> {
    let p = host.path(path);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).map_err(io("create", d))?;
    }
    std::fs::write(&p, text).map_err(io("write", &p))
}

/// A kubeconfig with embedded CA and client certificate.
fn kubeconfig(server: &str, ca: &[u8], cert: &Path, key: &Path) -> Result<String> {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let cert = std::fs::read(cert).map_err(io("read", cert))?;
    let key = std::fs::read(key).map_err(io("read", key))?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "infra", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": "node", "user": {"client-certificate-data": b64(&cert), "client-key-data": b64(&key)}}],
        "contexts": [{"name": "infra", "context": {"cluster": "infra", "user": "node"}}],
        "current-context": "infra",
    })
    .to_string())
}
