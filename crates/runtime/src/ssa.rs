//! Server-side apply with a stable field manager per writer, for objects and their status.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Applies `obj` (a full or partial object with `apiVersion`, `kind` and `metadata.name`) as
/// `manager`, taking ownership of the fields it sets.
pub async fn apply<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    obj: &(impl Serialize + std::fmt::Debug),
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::apply(manager).force(), &Patch::Apply(obj))
        .await
}

/// Applies `obj` to the status subresource as `manager`.
pub async fn apply_status<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    obj: &(impl Serialize + std::fmt::Debug),
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(name, &PatchParams::apply(manager).force(), &Patch::Apply(obj))
        .await
}

/// A minimal apply body for `K`: `apiVersion`, `kind`, `metadata.name` (and namespace), plus
/// the given top-level fields (e.g. `{"status": {...}}`).
pub fn body<K: Resource<DynamicType = ()>>(
    name: &str,
    namespace: Option<&str>,
    fields: serde_json::Value,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name},
    });
    if let Some(ns) = namespace {
        v["metadata"]["namespace"] = ns.into();
    }
    if let (Some(obj), serde_json::Value::Object(extra)) = (v.as_object_mut(), fields) {
        obj.extend(extra);
    }
    v
}

/// A typed object as an apply body, with the `apiVersion` and `kind` that k8s-openapi values
/// leave out when serialized.
pub fn typed<K: Resource<DynamicType = ()> + Serialize>(
    obj: &K,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(obj)?;
    v["apiVersion"] = K::api_version(&()).into();
    v["kind"] = K::kind(&()).into();
    Ok(v)
}
