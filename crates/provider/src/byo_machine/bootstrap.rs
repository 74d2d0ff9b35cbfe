//! Handing the Machine's bootstrap data to its host, readable by that host alone.
//!
//! The data is copied into `<host>-bootstrap` in the host's namespace (owned by the ByoHost, so it
//! goes with it), a Role `<host>-bootstrap-reader` allows `get` on exactly that Secret
//! (`resourceNames`), and a RoleBinding grants it to the host's identity `byoh:host:<host>`.
//! Then `ByoHost.spec.bootstrapSecret` names the Secret.

use std::collections::BTreeMap;

use bootsman_api::capi::{Cluster, Machine};
use bootsman_api::identity::host_secret_access;
use bootsman_api::labels;
use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use bootsman_runtime::ssa;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::MANAGER;
use crate::context::Context;
use crate::error::{Error, Result, is_not_found, kube as kerr};

/// Name of the per-host bootstrap Secret.
pub fn secret_name(host: &str) -> String {
    format!("{host}-bootstrap")
}

/// Name of the per-host Role and RoleBinding.
pub fn role_name(host: &str) -> String {
    format!("{host}-bootstrap-reader")
}

/// Makes sure the host has its bootstrap Secret, its Role and RoleBinding, and
/// `spec.bootstrapSecret`. Returns the host as last written, and whether this call handed the
/// data over (the caller announces it).
pub async fn ensure(
    bm: &ByoMachine,
    ctx: &Context,
    host: &ByoHost,
    machine: &Machine,
    cluster: &Cluster,
    data_secret: &str,
) -> Result<(ByoHost, bool)> {
    let name = host.name_any();
    let hns = host.namespace().unwrap_or_default();
    let secret = secret_name(&name);
    if host
        .spec
        .bootstrap_secret
        .as_ref()
        .is_some_and(|s| s.name == secret)
    {
        return Ok((host.clone(), false));
    }
    let ns = bm.namespace().unwrap_or_default();
    let read = format!(
        "read bootstrap data Secret {ns}/{data_secret} of Machine {}",
        machine.name_any()
    );
    // CAPI's bootstrap providers label their data Secrets with the cluster name, so they are
    // usually in the cache; the data of a Machine's Secret does not change once written.
    let source = ctx
        .secret(&ns, data_secret)
        .await
        .map_err(kerr(read.clone()))?
        .ok_or_else(|| Error::Invalid(format!("{read}: it does not exist yet")))?;
    let data = source.data.clone().unwrap_or_default();
    if !data.contains_key("value") {
        return Err(Error::Invalid(format!(
            "bootstrap data Secret {ns}/{data_secret} has no `value` key"
        )));
    }
    let owner = OwnerReference {
        api_version: ByoHost::api_version(&()).into(),
        kind: ByoHost::kind(&()).into(),
        name: name.clone(),
        uid: host.uid().unwrap_or_default(),
        ..Default::default()
    };
    let meta = |n: String| ObjectMeta {
        name: Some(n),
        namespace: Some(hns.clone()),
        labels: Some(BTreeMap::from([
            (labels::CLUSTER_NAME.to_string(), cluster.name_any()),
            (
                "infrastructure.cluster.x-k8s.io/byohost".to_string(),
                name.clone(),
            ),
        ])),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let pp = PatchParams::apply(MANAGER).force();
    let copy = Secret {
        metadata: meta(secret.clone()),
        data: Some(data),
        type_: source.type_.clone(),
        ..Default::default()
    };
    let (role, binding) =
        host_secret_access(meta(role_name(&name)), &name, &secret, &["get", "watch", "list"]);
    // The three are independent of each other and written at once; the host is pointed at the
    // Secret only once all three exist.
    let (copy, role, binding) = (
        with_type::<Secret>(&copy)?,
        with_type::<Role>(&role)?,
        with_type::<RoleBinding>(&binding)?,
    );
    let role_name = role_name(&name);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &hns);
    let roles = Api::<Role>::namespaced(ctx.client.clone(), &hns);
    let bindings = Api::<RoleBinding>::namespaced(ctx.client.clone(), &hns);
    futures::try_join!(
        async {
            secrets
                .patch(&secret, &pp, &Patch::Apply(&copy))
                .await
                .map_err(kerr(format!("write bootstrap Secret {hns}/{secret}")))
        },
        async {
            roles
                .patch(&role_name, &pp, &Patch::Apply(&role))
                .await
                .map_err(kerr(format!("write Role {hns}/{role_name}")))
        },
        async {
            bindings
                .patch(&role_name, &pp, &Patch::Apply(&binding))
                .await
                .map_err(kerr(format!("write RoleBinding {hns}/{role_name}")))
        },
    )?;

    let patch = json!({"spec": {"bootstrapSecret": {"name": secret, "namespace": hns}}});
    let host = Api::<ByoHost>::namespaced(ctx.client.clone(), &hns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!(
            "point ByoHost {hns}/{name} at its bootstrap Secret"
        )))?;
    Ok((host, true))
}

/// Announces the hand-over of the bootstrap data to `host`.
pub async fn delivered_event(bm: &ByoMachine, ctx: &Context, host: &ByoHost) {
    let note = format!(
        "bootstrap data handed to host {}/{}",
        host.namespace().unwrap_or_default(),
        host.name_any()
    );
    ctx.event(bm, false, "BootstrapDataDelivered", "Bootstrap", note)
        .await;
}

/// Deletes the host's bootstrap Secret, Role and RoleBinding (absent ones are fine).
pub async fn remove(ctx: &Context, host: &ByoHost) -> Result<()> {
    let name = host.name_any();
    let hns = host.namespace().unwrap_or_default();
    let dp = Default::default();
    let r = Api::<Secret>::namespaced(ctx.client.clone(), &hns)
        .delete(&secret_name(&name), &dp)
        .await;
    ignore_not_found(
        r.map(|_| ()),
        format!("delete Secret {hns}/{}", secret_name(&name)),
    )?;
    let r = Api::<RoleBinding>::namespaced(ctx.client.clone(), &hns)
        .delete(&role_name(&name), &dp)
        .await;
    ignore_not_found(
        r.map(|_| ()),
        format!("delete RoleBinding {hns}/{}", role_name(&name)),
    )?;
    let r = Api::<Role>::namespaced(ctx.client.clone(), &hns)
        .delete(&role_name(&name), &dp)
        .await;
    ignore_not_found(r.map(|_| ()), format!("delete Role {hns}/{}", role_name(&name)))
}

fn ignore_not_found(r: Result<(), kube::Error>, what: String) -> Result<()> {
    match r {
        Err(e) if !is_not_found(&e) => Err(kerr(what)(e)),
        _ => Ok(()),
    }
}

/// Where `<cluster>-kubeconfig` exists, gives the workload Node of this host (found by host
/// name) the machine's providerID. `Ok` when there is no kubeconfig yet or the Node already has it.
pub async fn set_node_provider_id(
    ctx: &Context,
    ns: &str,
    cluster: &Cluster,
    host: &ByoHost,
    provider_id: &str,
) -> Result<()> {
    let secret = format!("{}-kubeconfig", cluster.name_any());
    let Some(s) = ctx
        .secret(ns, &secret)
        .await
        .map_err(kerr(format!("read {ns}/{secret}")))?
    else {
        return Ok(());
    };
    let Some(value) = s.data.as_ref().and_then(|d| d.get("value")) else {
        return Err(Error::Invalid(format!("{ns}/{secret} has no `value` key")));
    };
    let text = String::from_utf8_lossy(&value.0);
    let kc = Kubeconfig::from_yaml(&text).map_err(|e| Error::Invalid(format!("{ns}/{secret}: {e}")))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Invalid(format!("{ns}/{secret}: {e}")))?;
    let workload = kube::Client::try_from(cfg).map_err(kerr(format!(
        "client for workload cluster {}",
        cluster.name_any()
    )))?;
    let node_name = host
        .status
        .as_ref()
        .and_then(|s| s.host_info.as_ref())
        .and_then(|i| i.hostname.clone())
        .unwrap_or_else(|| host.name_any());
    let nodes: Api<Node> = Api::all(workload);
    let node = nodes
        .get_opt(&node_name)
        .await
        .map_err(kerr(format!("get workload Node {node_name}")))?;
    let Some(node) = node else {
        return Err(Error::Invalid(format!(
            "workload Node {node_name} has not joined yet"
        )));
    };
    match node.spec.and_then(|s| s.provider_id) {
        Some(id) if id == provider_id => Ok(()),
        Some(other) => Err(Error::Invalid(format!(
            "workload Node {node_name} has providerID {other}, expected {provider_id}"
        ))),
        None => {
            let patch = json!({"spec": {"providerID": provider_id}});
            nodes
                .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kerr(format!("set providerID of workload Node {node_name}")))?;
            Ok(())
        }
    }
}

/// The object as an apply body ([`ssa::typed`]).
fn with_type<K: Resource<DynamicType = ()> + serde::Serialize>(obj: &K) -> Result<serde_json::Value> {
    ssa::typed(obj).map_err(|e| Error::Invalid(e.to_string()))
}
