//! Approval of the client-certificate requests of hosts.
//!
//! Watches `certificates.k8s.io/v1` CertificateSigningRequests (cluster-scoped) and decides those
//! that concern hosts: a CSR whose subject claims a host identity (CN `byoh:host:…` or O
//! `byoh:hosts`), or whose requester is a host or holds a host enrollment token (group
//! `system:bootstrappers:byoh:<pool>`). Every other CSR (kubelets, other tools) is left alone for
//! its own approver. An already approved, denied or failed CSR is never touched again.
//!
//! A CSR is approved only when all of this holds, and denied with a reason otherwise:
//! - signer `kubernetes.io/kube-apiserver-client`, usages exactly `[client auth]`;
//! - the PEM request parses; its subject is exactly CN `byoh:host:<name>` (an RFC 1123 name) and
//!   O `byoh:hosts`, with no other subject attribute and no requested extension (no SANs);
//! - and either **enrollment**: the requester is `system:bootstrap:<id>`, in exactly one group
//!   `system:bootstrappers:byoh:<pool>`, and the Secret `kube-system/bootstrap-token-<id>` was issued
//!   by `bootsmanctl hosts token` for that pool (and that host, if it names one), is unexpired and
//!   unspent; or **renewal**: the requester is `byoh:host:<name>` itself, in group `byoh:hosts`,
//!   and still holds the pool RoleBinding enrollment gave it, owned by its live ByoHost (not being
//!   deleted): see [`check_renewal`].
//!
//! Every approved CSR asks for a bounded lifetime: `spec.expirationSeconds` must be set and at
//! most [`Options::max_certificate_lifetime`] (30 days unless configured), else the CSR is denied
//! with `LifetimeTooLong` ([`check_lifetime`]). Without it the signer would issue for its own
//! `--cluster-signing-duration`, a year by default, and a stolen or forgotten certificate would
//! outlive any reasonable rotation.
//!
//! A host name is taken once: an enrollment is denied (`NameInUse`) when a ByoHost, a live pool
//! RoleBinding or an unexpired certificate from another CSR already holds the name, in any pool,
//! unless its token was issued by `bootsmanctl hosts replace` for that very name and pool
//! ([`check_name`]). So a pool's token cannot be used to become another host.
//!
//! The pool comes from the API server's authentication of the token (its group) and from the token
//! Secret, never from anything the host wrote. A token is spent before the approval: the Secret is
//! annotated with the CSR (`bootsman.io/spent-by: <name>/<uid>`) by a write preconditioned on its
//! `resourceVersion`, so of two approvers (or two CSRs) racing, one wins and the other sees a spent
//! token. A crash between the steps is safe: the CSR that spent the token is approved on the next
//! attempt, any other is denied. The spent Secret is deleted once the host has its certificate
//! (its ByoHost registered since the approval) or two minutes after the approval, not at once:
//! the agent reads its signed CSR with the token's identity, and a token gone before the signer
//! issued the certificate would leave the host unable ever to read it.
//!
//! An enrolled host's rights live in its pool only: before approving, the approver binds the
//! ClusterRole `bootsman:host` to user `byoh:host:<name>` with a RoleBinding in the pool namespace
//! (see [`grant_pool_access`]). A token for a pool whose namespace does not exist is denied.
//! Once the host's ByoHost exists, the provider's host-health controller makes the ByoHost the
//! binding's owner, so the garbage collector takes the binding, and the host's rights, with the
//! ByoHost. A binding still owned by a ByoHost that is gone is replaced, never reused, when the
//! host enrols again. A binding that no ByoHost took over, whose host has no ByoHost, is removed
//! after [`ORPHAN_BINDING_GRACE`] ([`sweep_orphan_bindings`], every minute).
//!
//! Decisions are counted in `bootsman_provider_host_csrs_total{decision,reason}` and logged with
//! the CSR's name, requester and reason.

use bootsman_runtime::api_errors;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bootsman_api::identity;
use bootsman_api::v1beta1::ByoHost;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use prometheus::{IntCounterVec, Opts};
use serde_json::json;
use x509_parser::prelude::FromDer;

use crate::error::{Error, Result, is_not_found, kube as kerr};

/// The only signer the approver approves for.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// The only usage a host certificate may carry.
pub const USAGE_CLIENT_AUTH: &str = "client auth";
/// Reason of the approval condition.
pub const APPROVED_REASON: &str = "BootsmanHostIdentity";
/// ClusterRole (config/rbac/hosts.yaml) granted to an enrolled host in its pool's namespace only.
pub const HOST_CLUSTER_ROLE: &str = "bootsman:host";
/// Field manager of the pool RoleBindings the approver writes.
pub const FIELD_MANAGER: &str = "bootsman-host-csr-approver";

/// How the approver decides.
#[derive(Clone, Debug)]
pub struct Options {
    /// Longest lifetime a host certificate may ask for (`spec.expirationSeconds`).
    pub max_certificate_lifetime: Duration,
}

/// The default [`Options::max_certificate_lifetime`]: 30 days, what the agent asks for by default.
pub const DEFAULT_MAX_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

impl Default for Options {
    fn default() -> Self {
        Self {
            max_certificate_lifetime: DEFAULT_MAX_CERTIFICATE_LIFETIME,
        }
    }
}

/// Name of the RoleBinding that gives host `host` its rights in its pool: `byoh:host:<host>`.
pub fn pool_binding_name(host: &str) -> String {
    identity::host_user(host)
}

/// Whether host `host` may renew its certificate: it still has the pool access enrollment gave
/// it, and that access is held by a live host. That is a binding as [`grant_pool_access`] writes
/// it (in any namespace) whose namespace has the host's ByoHost, not being deleted, as the
/// binding's owner. A removed host (binding gone with its ByoHost), a host being deleted (a
/// ByoHost held by a finalizer keeps its binding until it is gone) and a binding no ByoHost has
/// taken over yet are all denied, with the reason: a host cannot keep itself a certificate past
/// its removal.
pub async fn check_renewal(client: &kube::Client, host: &str) -> Result<Result<(), Denial>> {
    let name = pool_binding_name(host);
    let bindings = Api::<RoleBinding>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(kerr(format!("list RoleBindings {name}")))?;
    let mut why = None;
    for b in bindings.items.iter().filter(|b| is_pool_binding(b, host)) {
        let ns = b.namespace().unwrap_or_default();
        let byohost = Api::<ByoHost>::namespaced(client.clone(), &ns)
            .get_opt(host)
            .await
            .map_err(kerr(format!("read ByoHost {ns}/{host}")))?;
        let owned = b.owner_references().iter().any(is_host_owner);
        let d = match byohost {
            None if !owned => deny(
                "HostNotAdopted",
                format!(
                    "host {host:?} has not registered its ByoHost in pool {ns:?} yet: a host renews once its ByoHost owns the pool RoleBinding {ns}/{name}; retry later"
                ),
            ),
            None => deny(
                "HostRemoved",
                format!(
                    "host {host:?} has no ByoHost in its pool {ns:?} any more; enrol it again with `bootsmanctl hosts token`"
                ),
            ),
            Some(h) if h.metadata.deletion_timestamp.is_some() => deny(
                "HostDeleting",
                format!(
                    "ByoHost {ns}/{host} is being deleted: a host being removed gets no new certificate; enrol it again with `bootsmanctl hosts token` once it is gone"
                ),
            ),
            Some(h)
                if !b
                    .owner_references()
                    .iter()
                    .any(|o| is_host_owner(o) && Some(&o.uid) == h.metadata.uid.as_ref()) =>
            {
                deny(
                    "HostNotAdopted",
                    format!(
                        "the pool RoleBinding {ns}/{name} is not owned by ByoHost {ns}/{host}: the provider hands it over once the host has registered; retry later"
                    ),
                )
            }
            Some(_) => return Ok(Ok(())),
        };
        why.get_or_insert(d);
    }
    Ok(Err(why.unwrap_or_else(|| {
        deny(
            "HostRemoved",
            format!(
                "host {host:?} has no pool access any more (no RoleBinding {name} in any namespace: its ByoHost was deleted); enrol it again with `bootsmanctl hosts token`"
            ),
        )
    })))
}

/// Whether `binding` is exactly what [`grant_pool_access`] writes for host `host`: named
/// `byoh:host:<host>`, binding ClusterRole [`HOST_CLUSTER_ROLE`] to user `byoh:host:<host>` and
/// to no one else. Only such a binding is handed to the host's ByoHost as its owner.
pub fn is_pool_binding(binding: &RoleBinding, host: &str) -> bool {
    let user = identity::host_user(host);
    let role = &binding.role_ref;
    let subject_is_host = match binding.subjects.as_deref() {
        Some([s]) => {
            s.kind == "User"
                && s.name == user
                && s.api_group.as_deref() == Some("rbac.authorization.k8s.io")
                && s.namespace.as_deref().unwrap_or_default().is_empty()
        }
        _ => false,
    };
    binding.metadata.name.as_deref() == Some(pool_binding_name(host).as_str())
        && role.api_group == "rbac.authorization.k8s.io"
        && role.kind == "ClusterRole"
        && role.name == HOST_CLUSTER_ROLE
        && subject_is_host
}

/// Whether `owner` names a ByoHost (any version of its API group).
pub fn is_host_owner(owner: &OwnerReference) -> bool {
    let group = ByoHost::group(&());
    owner.kind == ByoHost::kind(&()) && owner.api_version.split('/').next() == Some(group.as_ref())
}

/// Whether `binding` belongs to a ByoHost that is gone: it names ByoHost owners, and none of them
/// is `live_host` (the uid of the host's current ByoHost, if it has one that is not being
/// deleted). The garbage collector deletes such a binding, so it must not carry a re-enrolled
/// host's rights.
pub fn owned_by_a_gone_host(binding: &RoleBinding, live_host: Option<&str>) -> bool {
    let owners: Vec<_> = binding
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| is_host_owner(o))
        .collect();
    !owners.is_empty() && !owners.iter().any(|o| Some(o.uid.as_str()) == live_host)
}

/// Grants host `host` the ClusterRole [`HOST_CLUSTER_ROLE`] in namespace `pool`, and only there:
/// a RoleBinding for user `byoh:host:<host>`, written with server-side apply (idempotent). The
/// pool comes from the token the API server authenticated, so a host cannot pick it.
///
/// The apply leaves `metadata.ownerReferences` alone (the provider writes the host's ByoHost there
/// with a field manager of its own), so a repeated grant keeps the binding owned. A binding whose
/// ByoHost owner is gone (or going) is deleted first and written afresh: the garbage collector
/// deletes by uid, so it cannot take the new one.
pub async fn grant_pool_access(client: &kube::Client, pool: &str, host: &str) -> Result<(), kube::Error> {
    let name = pool_binding_name(host);
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), pool);
    if let Some(old) = bindings.get_opt(&name).await?
        && old.metadata.owner_references.iter().flatten().any(is_host_owner)
    {
        // A ByoHost being deleted is as good as gone: the binding would go with it.
        let live = Api::<ByoHost>::namespaced(client.clone(), pool)
            .get_opt(host)
            .await?
            .filter(|h| h.metadata.deletion_timestamp.is_none())
            .and_then(|h| h.uid());
        if owned_by_a_gone_host(&old, live.as_deref()) {
            delete_exactly(&bindings, &name, old.uid()).await?;
            tracing::info!(%pool, %host, "replaced the pool RoleBinding of a deleted ByoHost");
        }
    }
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": name,
            "namespace": pool,
            "labels": {"app.kubernetes.io/part-of": "bootsman"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": HOST_CLUSTER_ROLE,
        },
        "subjects": [{
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "User",
            "name": identity::host_user(host),
        }],
    });
    bindings
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await
        .map(|_| ())
}

/// How long a pool RoleBinding may wait for a ByoHost to take it over before
/// [`sweep_orphan_bindings`] removes it. An agent registers within seconds of its enrollment.
pub const ORPHAN_BINDING_GRACE: Duration = Duration::from_secs(15 * 60);
/// How often the approver sweeps.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Deletes the pool RoleBindings that no ByoHost took over and whose host has no ByoHost: hosts
/// enrolled that never registered, or whose ByoHost was deleted before the provider handed it the
/// binding, so that the garbage collector would never take it. Only bindings as
/// [`grant_pool_access`] writes them (labelled `app.kubernetes.io/part-of: bootsman`), older than
/// `grace`, owned by no ByoHost, with no ByoHost of their host in their namespace; each deleted
/// by uid, so a binding granted again meanwhile stays. In `namespace` only, or in every one.
/// Returns `namespace/name` of each deleted.
pub async fn sweep_orphan_bindings(
    client: &kube::Client,
    namespace: Option<&str>,
    grace: Duration,
    now: Timestamp,
) -> Result<Vec<String>> {
    let api = match namespace {
        Some(ns) => Api::<RoleBinding>::namespaced(client.clone(), ns),
        None => Api::<RoleBinding>::all(client.clone()),
    };
    let all = api
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=bootsman"))
        .await
        .map_err(kerr("list pool RoleBindings"))?;
    let mut swept = Vec::new();
    for b in &all.items {
        let name = b.name_any();
        let Some(host) = name.strip_prefix(identity::HOST_USER_PREFIX) else {
            continue;
        };
        let old_enough = b.metadata.creation_timestamp.as_ref().is_some_and(|t| {
            now.as_second() - t.0.as_second() >= i64::try_from(grace.as_secs()).unwrap_or(i64::MAX)
        });
        if !is_pool_binding(b, host) || !old_enough || b.owner_references().iter().any(is_host_owner) {
            continue;
        }
        let ns = b.namespace().unwrap_or_default();
        let registered = Api::<ByoHost>::namespaced(client.clone(), &ns)
            .get_opt(host)
            .await
            .map_err(kerr(format!("read ByoHost {ns}/{host}")))?
            .is_some();
        if registered {
            continue;
        }
        let api = Api::<RoleBinding>::namespaced(client.clone(), &ns);
        match delete_exactly(&api, &name, b.uid()).await {
            Ok(()) => {
                tracing::info!(namespace = %ns, %host, "removed the pool RoleBinding of a host that has no ByoHost");
                swept.push(format!("{ns}/{name}"));
            }
            // Granted again since the list: a new uid, not this binding any more.
            Err(kube::Error::Api(s)) if api_errors::conflict(&s) => {}
            Err(e) => return Err(kerr(format!("delete RoleBinding {ns}/{name}"))(e)),
        }
    }
    Ok(swept)
}

/// Why a CSR is denied: `reason` is the CSR condition's reason and the metric label, `message`
/// says what was wrong, naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// CamelCase reason, stable and low-cardinality.
    pub reason: &'static str,
    /// What was wrong.
    pub message: String,
}

fn deny(reason: &'static str, message: impl Into<String>) -> Denial {
    Denial {
        reason,
        message: message.into(),
    }
}

/// What a CSR asks for, once its form has been checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A first certificate for `host` in `pool`, requested with bootstrap token `token_id`.
    Enroll {
        /// Host name (CN without the `byoh:host:` prefix).
        host: String,
        /// Pool namespace, from the token's group.
        pool: String,
        /// ID of the bootstrap token.
        token_id: String,
    },
    /// A new certificate for `host`, requested by the host itself.
    Renew {
        /// Host name.
        host: String,
    },
}

/// The verdict on a CSR's form, before any token is looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not about hosts, or already decided: left alone.
    Ignore,
    /// Denied.
    Deny(Denial),
    /// Well-formed; an enrollment still needs its token checked.
    Admissible(Request),
}

/// Whether the CSR carries an `Approved`, `Denied` or `Failed` condition.
pub fn is_decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
        })
}

/// The subject of a parsed request.
#[derive(Debug, Default)]
struct Subject {
    common_names: Vec<String>,
    organizations: Vec<String>,
    /// Attributes other than CN and O, by OID.
    others: Vec<String>,
    /// Whether the request asks for any extension (SANs, key usages, …).
    has_extensions: bool,
}

fn parse_request(pem: &[u8]) -> std::result::Result<Subject, String> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("spec.request is not PEM: {e}"))?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(format!(
            "spec.request holds a PEM block {:?}, not a CERTIFICATE REQUEST",
            pem.label
        ));
    }
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| format!("spec.request is not a PKCS #10 request: {e}"))?;
    let info = &req.certification_request_info;
    let mut subject = Subject {
        has_extensions: req.requested_extensions().is_some_and(|mut e| e.next().is_some()),
        ..Subject::default()
    };
    for attr in info.subject.iter_attributes() {
        let oid = attr.attr_type();
        let value = || {
            attr.as_str()
                .map(str::to_string)
                .map_err(|e| format!("spec.request: subject attribute {oid} is not a string: {e}"))
        };
        if *oid == x509_parser::oid_registry::OID_X509_COMMON_NAME {
            subject.common_names.push(value()?);
        } else if *oid == x509_parser::oid_registry::OID_X509_ORGANIZATION_NAME {
            subject.organizations.push(value()?);
        } else {
            subject.others.push(oid.to_id_string());
        }
    }
    Ok(subject)
}

/// Judges a CSR's form: signer, usages, subject and requester. Pure; the token of an enrollment
/// is checked afterwards by [`check_token`].
pub fn examine(csr: &CertificateSigningRequest) -> Verdict {
    if is_decided(csr) {
        return Verdict::Ignore;
    }
    let spec = &csr.spec;
    let user = spec.username.as_deref().unwrap_or_default();
    let groups = spec.groups.as_deref().unwrap_or_default();
    let subject = parse_request(&spec.request.0);
    let pools: Vec<&str> = groups
        .iter()
        .filter_map(|g| g.strip_prefix(identity::BOOTSTRAPPERS_GROUP_PREFIX))
        .collect();
    let by_host =
        user.starts_with(identity::HOST_USER_PREFIX) || groups.iter().any(|g| g == identity::HOSTS_GROUP);
    let claims_host = subject.as_ref().is_ok_and(|s| {
        s.common_names
            .iter()
            .any(|cn| cn.starts_with(identity::HOST_USER_PREFIX))
            || s.organizations.iter().any(|o| o == identity::HOSTS_GROUP)
    });
    if pools.is_empty() && !by_host && !claims_host {
        return Verdict::Ignore;
    }

    if spec.signer_name != SIGNER {
        return Verdict::Deny(deny(
            "WrongSigner",
            format!(
                "spec.signerName is {:?}; a host certificate must use {SIGNER:?}",
                spec.signer_name
            ),
        ));
    }
    let usages = spec.usages.as_deref().unwrap_or_default();
    if usages != [USAGE_CLIENT_AUTH] {
        return Verdict::Deny(deny(
            "WrongUsages",
            format!("spec.usages is {usages:?}; a host certificate must have exactly [\"client auth\"]"),
        ));
    }
    let subject = match subject {
        Ok(s) => s,
        Err(e) => return Verdict::Deny(deny("InvalidRequest", e)),
    };
    if subject.has_extensions {
        return Verdict::Deny(deny(
            "ExtensionsRequested",
            "spec.request asks for extensions (such as subject alternative names); a host \
             certificate carries none",
        ));
    }
    if !subject.others.is_empty() {
        return Verdict::Deny(deny(
            "WrongSubject",
            format!(
                "spec.request subject has attributes {:?} besides CN and O; a host certificate has \
                 only CN byoh:host:<name> and O byoh:hosts",
                subject.others
            ),
        ));
    }
    let host = match subject.common_names.as_slice() {
        [cn] => match cn.strip_prefix(identity::HOST_USER_PREFIX) {
            Some(h) => h.to_string(),
            None => {
                return Verdict::Deny(deny(
                    "WrongSubject",
                    format!("spec.request subject CN is {cn:?}; it must be byoh:host:<name>"),
                ));
            }
        },
        cns => {
            return Verdict::Deny(deny(
                "WrongSubject",
                format!(
                    "spec.request subject has {} CNs; it must have exactly one",
                    cns.len()
                ),
            ));
        }
    };
    if let Err(e) = identity::validate_host_name(&host) {
        return Verdict::Deny(deny("InvalidHostName", format!("spec.request subject CN: {e}")));
    }
    if subject.organizations != [identity::HOSTS_GROUP] {
        return Verdict::Deny(deny(
            "WrongSubject",
            format!(
                "spec.request subject O is {:?}; it must be exactly [\"byoh:hosts\"]",
                subject.organizations
            ),
        ));
    }

    if let Some(token_id) = user.strip_prefix(identity::BOOTSTRAP_USER_PREFIX) {
        let pool = match pools.as_slice() {
            [pool] => pool.to_string(),
            [] => {
                return Verdict::Deny(deny(
                    "NotHostToken",
                    format!(
                        "requester {user:?} holds a bootstrap token that is not a host enrollment \
                         token (no group {}<pool>)",
                        identity::BOOTSTRAPPERS_GROUP_PREFIX
                    ),
                ));
            }
            many => {
                return Verdict::Deny(deny(
                    "AmbiguousPool",
                    format!("requester {user:?} is in the groups of several pools: {many:?}"),
                ));
            }
        };
        return Verdict::Admissible(Request::Enroll {
            host,
            pool,
            token_id: token_id.to_string(),
        });
    }
    if user == identity::host_user(&host) {
        if groups.iter().any(|g| g == identity::HOSTS_GROUP) {
            return Verdict::Admissible(Request::Renew { host });
        }
        return Verdict::Deny(deny(
            "NotAHost",
            format!("requester {user:?} is not in group byoh:hosts"),
        ));
    }
    if user.starts_with(identity::HOST_USER_PREFIX) {
        return Verdict::Deny(deny(
            "OtherHost",
            format!(
                "requester {user:?} asks for the identity of another host ({}); a host renews only \
                 its own certificate",
                identity::host_user(&host)
            ),
        ));
    }
    Verdict::Deny(deny(
        "NoToken",
        format!(
            "requester {user:?} neither holds a host enrollment token nor is host {host:?}; \
             issue a token with `bootsmanctl hosts token`"
        ),
    ))
}

/// Denies a host CSR whose `spec.expirationSeconds` is unset or longer than `max`.
pub fn check_lifetime(csr: &CertificateSigningRequest, max: Duration) -> Result<(), Denial> {
    let max_secs = max.as_secs();
    match csr.spec.expiration_seconds {
        Some(s) if s > 0 && u64::try_from(s).is_ok_and(|s| s <= max_secs) => Ok(()),
        Some(s) => Err(deny(
            "LifetimeTooLong",
            format!(
                "spec.expirationSeconds is {s}; a host certificate may live at most {max_secs} \
                 seconds (the provider's --max-host-certificate-lifetime)"
            ),
        )),
        None => Err(deny(
            "LifetimeTooLong",
            format!(
                "spec.expirationSeconds is not set, so the signer would choose the lifetime (a \
                 year by default); a host certificate must ask for at most {max_secs} seconds \
                 (the provider's --max-host-certificate-lifetime)"
            ),
        )),
    }
}

/// `<name>/<uid>` of a CSR: what a spent token records.
pub fn csr_ref(csr: &CertificateSigningRequest) -> String {
    format!("{}/{}", csr.name_any(), csr.uid().unwrap_or_default())
}

fn data_str<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
}

/// Whether the token Secret allows enrollment `req` by the CSR `by` (see [`csr_ref`]) at `now`.
/// A token spent by that same CSR passes, so an approval interrupted after spending completes.
pub fn check_token(secret: Option<&Secret>, req: &Request, by: &str, now: Timestamp) -> Result<(), Denial> {
    let Request::Enroll { host, pool, token_id } = req else {
        return Ok(());
    };
    let name = identity::token_secret_name(token_id);
    let Some(secret) = secret else {
        return Err(deny(
            "TokenNotFound",
            format!(
                "bootstrap token {token_id:?} has no Secret {}/{name}: it was spent, revoked or has \
                 expired",
                identity::TOKEN_NAMESPACE
            ),
        ));
    };
    if secret.metadata.deletion_timestamp.is_some() {
        return Err(deny(
            "TokenSpent",
            format!("bootstrap token {token_id:?} is being deleted"),
        ));
    }
    let labels = secret.labels();
    if labels.get(identity::TOKEN_PURPOSE).map(String::as_str) != Some(identity::TOKEN_PURPOSE_HOST)
        || secret.type_.as_deref() != Some(identity::TOKEN_SECRET_TYPE)
    {
        return Err(deny(
            "NotHostToken",
            format!("bootstrap token {token_id:?} was not issued by `bootsmanctl hosts token`"),
        ));
    }
    if labels.get(identity::TOKEN_POOL) != Some(pool) {
        return Err(deny(
            "WrongPool",
            format!(
                "bootstrap token {token_id:?} is for pool {:?}, but the requester is in the group \
                 of pool {pool:?}",
                labels.get(identity::TOKEN_POOL)
            ),
        ));
    }
    if data_str(secret, "auth-extra-groups").is_none_or(|g| {
        !g.split(',')
            .any(|g| g.trim() == identity::bootstrappers_group(pool))
    }) {
        return Err(deny(
            "WrongPool",
            format!(
                "bootstrap token {token_id:?} does not put its holder in group {}",
                identity::bootstrappers_group(pool)
            ),
        ));
    }
    if let Some(allowed) = secret.annotations().get(identity::TOKEN_HOST)
        && allowed != host
    {
        return Err(deny(
            "WrongHost",
            format!("bootstrap token {token_id:?} enrols only host {allowed:?}, not {host:?}"),
        ));
    }
    match data_str(secret, "expiration").map(str::parse::<Timestamp>) {
        Some(Ok(exp)) if exp > now => {}
        Some(Ok(exp)) => {
            return Err(deny(
                "TokenExpired",
                format!("bootstrap token {token_id:?} expired at {exp}"),
            ));
        }
        Some(Err(e)) => {
            return Err(deny(
                "NotHostToken",
                format!("bootstrap token {token_id:?} has an unreadable expiration: {e}"),
            ));
        }
        None => {
            return Err(deny(
                "NotHostToken",
                format!("bootstrap token {token_id:?} has no expiration; host tokens always expire"),
            ));
        }
    }
    if let Some(spent) = secret.annotations().get(identity::TOKEN_SPENT_BY)
        && spent != by
    {
        return Err(deny(
            "TokenSpent",
            format!("bootstrap token {token_id:?} was already used by CSR {spent}"),
        ));
    }
    Ok(())
}

/// Something that already holds a host name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The pool (namespace) it belongs to, when it has one.
    pub pool: Option<String>,
    /// What it is, for the denial message.
    pub what: String,
}

/// Who holds host name `host` already, in any namespace: a ByoHost of that name, a pool RoleBinding
/// `byoh:host:<host>` that is not owned by a ByoHost that is gone, and a certificate for
/// `byoh:host:<host>` issued through another CSR (`except`) that has not expired. Certificates
/// whose CSR was already cleaned up (an hour after issue) are not seen; host certificates are short
/// enough lived that renewal, which needs the pool binding, decides their fate.
pub async fn name_holders(
    client: &kube::Client,
    host: &str,
    except: &str,
    now: Timestamp,
) -> Result<Vec<Holder>> {
    let mut out = Vec::new();
    let hosts = Api::<ByoHost>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={host}")))
        .await
        .map_err(kerr(format!("list ByoHosts named {host}")))?;
    let mut live: Vec<(String, String)> = Vec::new();
    for h in &hosts.items {
        let ns = h.namespace().unwrap_or_default();
        out.push(Holder {
            pool: Some(ns.clone()),
            what: format!("ByoHost {ns}/{host}"),
        });
        if h.metadata.deletion_timestamp.is_none() {
            live.push((ns, h.uid().unwrap_or_default()));
        }
    }
    let name = pool_binding_name(host);
    let bindings = Api::<RoleBinding>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(kerr(format!("list RoleBindings {name}")))?;
    for b in bindings.items.iter().filter(|b| is_pool_binding(b, host)) {
        let ns = b.namespace().unwrap_or_default();
        let live_uid = live.iter().find(|(n, _)| *n == ns).map(|(_, u)| u.as_str());
        if !owned_by_a_gone_host(b, live_uid) {
            out.push(Holder {
                pool: Some(ns.clone()),
                what: format!("the pool RoleBinding {ns}/{name}"),
            });
        }
    }
    let user = identity::host_user(host);
    let csrs = Api::<CertificateSigningRequest>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kerr("list CertificateSigningRequests"))?;
    for c in csrs
        .items
        .iter()
        .filter(|c| c.name_any() != except && c.spec.signer_name == SIGNER)
    {
        let Some(cert) = c.status.as_ref().and_then(|s| s.certificate.as_ref()) else {
            continue;
        };
        if let Some((cn, not_after)) = certificate_subject(&cert.0)
            && cn == user
            && not_after > now.as_second()
        {
            out.push(Holder {
                pool: None,
                what: format!(
                    "a certificate issued through CSR {} (valid until {})",
                    c.name_any(),
                    Timestamp::from_second(not_after)
                        .map(|t| t.to_string())
                        .unwrap_or_default()
                ),
            });
        }
    }
    Ok(out)
}

/// CN and notAfter (Unix seconds) of the first certificate of a PEM bundle.
fn certificate_subject(pem: &[u8]) -> Option<(String, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&pem.contents).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    Some((cn, cert.validity().not_after.timestamp()))
}

/// Whether enrollment `req` may take its host name, given who holds it already. A free name needs
/// nothing more. A held name (in any pool: host names are unique across pools) is taken over only
/// by a token pinned to it and issued as a replacement (`bootsmanctl hosts replace`), for the
/// pool the name lives in: an explicit admin action, never a side effect of a pool token.
pub fn check_name(req: &Request, token: &Secret, holders: &[Holder]) -> Result<(), Denial> {
    let Request::Enroll { host, pool, .. } = req else {
        return Ok(());
    };
    if holders.is_empty() {
        return Ok(());
    }
    let annotations = token.annotations();
    let replaces = annotations.get(identity::TOKEN_HOST) == Some(host)
        && annotations.get(identity::TOKEN_REPLACES) == Some(host);
    let other_pool = holders
        .iter()
        .find(|h| h.pool.as_ref().is_some_and(|p| p != pool));
    if replaces && other_pool.is_none() {
        return Ok(());
    }
    let held: Vec<&str> = holders.iter().map(|h| h.what.as_str()).collect();
    let hint = match other_pool {
        Some(h) => format!(
            "host names are unique across pools, and this one lives in pool {:?}",
            h.pool.clone().unwrap_or_default()
        ),
        None => format!(
            "to replace that host, issue a token with `bootsmanctl hosts replace {host} --namespace {pool}`"
        ),
    };
    Err(deny(
        "NameInUse",
        format!(
            "host name {host:?} is already held by {}; {hint}",
            held.join(", ")
        ),
    ))
}

/// Counts decisions.
#[derive(Clone, Debug)]
struct Metrics {
    decisions: IntCounterVec,
}

impl Metrics {
    fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let decisions = IntCounterVec::new(
            Opts::new(
                "provider_host_csrs_total",
                "Host certificate requests decided, by decision (approved, denied) and reason",
            ),
            &["decision", "reason"],
        )?;
        registry.register(Box::new(decisions.clone()))?;
        Ok(Self { decisions })
    }
}

struct Ctx {
    client: kube::Client,
    metrics: Metrics,
    options: Options,
}

/// Runs the approver until `shutdown` resolves. Run it under leader election (it spends tokens,
/// which is safe with several replicas, but one approver is enough).
pub async fn run(
    client: kube::Client,
    metrics: Arc<bootsman_runtime::metrics::Metrics>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        metrics: Metrics::register(metrics.registry())?,
        options,
    });
    tracing::info!("host CSR approver running");
    let sweeper = {
        let client = client.clone();
        async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                if let Err(e) =
                    sweep_orphan_bindings(&client, None, ORPHAN_BINDING_GRACE, Timestamp::now()).await
                {
                    tracing::warn!(error = %e, "sweeping the pool RoleBindings of unregistered hosts failed");
                }
            }
        }
    };
    let approver = Controller::new(
        Api::<CertificateSigningRequest>::all(client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown)
    .run(reconcile, error_policy, ctx)
    .for_each(|_| async {});
    // The sweeper never ends; the approver ends at shutdown, and the sweeper with it.
    tokio::select! {
        () = approver => {}
        () = sweeper => {}
    }
    Ok(())
}

fn error_policy(csr: Arc<CertificateSigningRequest>, err: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(csr = %csr.name_any(), error = %err, "deciding the CSR failed; retrying");
    Action::requeue(crate::error::retry_after(err).unwrap_or(Duration::from_secs(5)))
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action> {
    let name = csr.name_any();
    let user = csr.spec.username.clone().unwrap_or_default();
    if approved_at(&csr).is_some() && user.starts_with(identity::BOOTSTRAP_USER_PREFIX) {
        return retire_spent_token(&csr, &ctx).await;
    }
    let req = match examine(&csr) {
        Verdict::Ignore => return Ok(Action::await_change()),
        Verdict::Deny(d) => return decide(&csr, &ctx, Err(d)).await,
        Verdict::Admissible(r) => r,
    };
    if let Err(d) = check_lifetime(&csr, ctx.options.max_certificate_lifetime) {
        return decide(&csr, &ctx, Err(d)).await;
    }
    let Request::Enroll { token_id, .. } = &req else {
        if let Request::Renew { host } = &req
            && let Err(d) = check_renewal(&ctx.client, host).await?
        {
            return decide(&csr, &ctx, Err(d)).await;
        }
        return decide(&csr, &ctx, Ok(&req)).await;
    };
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), identity::TOKEN_NAMESPACE);
    let secret_name = identity::token_secret_name(token_id);
    let secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(kerr(format!("read token Secret {secret_name}")))?;
    let by = csr_ref(&csr);
    if let Err(d) = check_token(secret.as_ref(), &req, &by, Timestamp::now()) {
        return decide(&csr, &ctx, Err(d)).await;
    }
    let Some(mut secret) = secret else {
        return Err(Error::Invalid(format!("token Secret {secret_name} vanished")));
    };
    // A token this CSR already spent passed this check before the approver stopped; its own
    // grant may exist by now and must not count against it.
    if secret.annotations().get(identity::TOKEN_SPENT_BY) != Some(&by)
        && let Request::Enroll { host, .. } = &req
    {
        let holders = name_holders(&ctx.client, host, &csr.name_any(), Timestamp::now()).await?;
        if let Err(d) = check_name(&req, &secret, &holders) {
            return decide(&csr, &ctx, Err(d)).await;
        }
    }
    if !secret.annotations().contains_key(identity::TOKEN_SPENT_BY) {
        // Spend first: the replace carries the resourceVersion just read, so only one CSR (and
        // one approver) can ever spend this token.
        secret
            .annotations_mut()
            .insert(identity::TOKEN_SPENT_BY.into(), by.clone());
        secrets
            .replace(&secret_name, &PostParams::default(), &secret)
            .await
            .map_err(kerr(format!("spend token Secret {secret_name} for CSR {name}")))?;
        tracing::info!(csr = %name, requester = %user, token = %secret_name, "spent bootstrap token");
    }
    // The host's rights in its pool, before it holds a certificate to use them with.
    if let Request::Enroll { host, pool, .. } = &req {
        match grant_pool_access(&ctx.client, pool, host).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {
                let d = deny(
                    "PoolNotFound",
                    format!("the pool namespace {pool:?} of bootstrap token {token_id:?} does not exist"),
                );
                return decide(&csr, &ctx, Err(d)).await;
            }
            Err(e) => return Err(kerr(format!("grant host {host:?} access to pool {pool:?}"))(e)),
        }
    }
    decide(&csr, &ctx, Ok(&req)).await?;
    // The spent token goes once the host holds its certificate (`retire_spent_token`).
    Ok(Action::requeue(TOKEN_RETIRE_POLL))
}

/// How long a spent token outlives the approval of the CSR that spent it when nothing shows
/// that the host has its certificate: the agent reads its CSR with the token at least every
/// 10 s, so after this it has its certificate or has given up.
pub const TOKEN_READ_GRACE: Duration = Duration::from_secs(120);
/// How often an approved enrollment is looked at again until its token is deleted.
const TOKEN_RETIRE_POLL: Duration = Duration::from_secs(5);

/// When the CSR was approved (the `Approved` condition's `lastUpdateTime`, else
/// `lastTransitionTime`, else the epoch), if it was.
fn approved_at(csr: &CertificateSigningRequest) -> Option<Timestamp> {
    let c = csr
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Approved" && c.status == "True")?;
    Some(
        c.last_update_time
            .as_ref()
            .or(c.last_transition_time.as_ref())
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
    )
}

/// Deletes the bootstrap token an approved enrollment spent, once the host no longer needs it.
/// The agent reads its CSR, and so its certificate, with the token's identity: a token deleted
/// the moment the CSR is approved (before the signer has issued the certificate) would leave
/// the host unable ever to read it. So the token stays, spent (denied for any other CSR),
/// until the host's ByoHost has been registered since the approval (it has its certificate),
/// or [`TOKEN_READ_GRACE`] after the approval. A token replacing an existing host waits for
/// the grace, since that host's ByoHost exists already.
async fn retire_spent_token(csr: &CertificateSigningRequest, ctx: &Ctx) -> Result<Action> {
    let user = csr.spec.username.as_deref().unwrap_or_default();
    let token_id = user.trim_start_matches(identity::BOOTSTRAP_USER_PREFIX);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), identity::TOKEN_NAMESPACE);
    let secret_name = identity::token_secret_name(token_id);
    let Some(secret) = secrets
        .get_opt(&secret_name)
        .await
        .map_err(kerr(format!("read token Secret {secret_name}")))?
    else {
        return Ok(Action::await_change());
    };
    if secret.annotations().get(identity::TOKEN_SPENT_BY) != Some(&csr_ref(csr)) {
        return Ok(Action::await_change());
    }
    let approved = approved_at(csr).unwrap_or(Timestamp::UNIX_EPOCH);
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    let annotations = secret.annotations();
    let replaces = annotations.contains_key(identity::TOKEN_REPLACES);
    let host = parse_request(&csr.spec.request.0).ok().and_then(|s| {
        s.common_names
            .iter()
            .find_map(|cn| cn.strip_prefix(identity::HOST_USER_PREFIX).map(str::to_string))
    });
    let registered = match (
        issued && !replaces,
        secret.labels().get(identity::TOKEN_POOL),
        &host,
    ) {
        (true, Some(pool), Some(host)) => Api::<ByoHost>::namespaced(ctx.client.clone(), pool)
            .get_opt(host)
            .await
            .map_err(kerr(format!("read ByoHost {pool}/{host}")))?
            .and_then(|h| h.metadata.creation_timestamp)
            .is_some_and(|t| t.0.as_second() >= approved.as_second()),
        _ => false,
    };
    let grace_over = Timestamp::now().as_second() - approved.as_second()
        >= i64::try_from(TOKEN_READ_GRACE.as_secs()).unwrap_or(i64::MAX);
    if !registered && !grace_over {
        return Ok(Action::requeue(TOKEN_RETIRE_POLL));
    }
    match delete_exactly(&secrets, &secret_name, secret.uid()).await {
        Ok(()) => {
            tracing::info!(csr = %csr.name_any(), token = %secret_name,
                reason = if registered { "the host registered" } else { "grace over" },
                "deleted the spent bootstrap token");
            Ok(Action::await_change())
        }
        // The approval stands; the spent token is denied for any other CSR, and expires anyway.
        Err(e) => Err(kerr(format!("delete the spent token Secret {secret_name}"))(e)),
    }
}

/// Deletes object `name` if it is still the one with `uid` (a successor of the same name stays);
/// an object already gone is no error.
async fn delete_exactly<K>(api: &Api<K>, name: &str, uid: Option<String>) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes the decision through the `approval` subresource, preconditioned on the CSR's
/// `resourceVersion` so a CSR changed meanwhile is looked at again.
async fn decide(
    csr: &CertificateSigningRequest,
    ctx: &Ctx,
    decision: Result<&Request, Denial>,
) -> Result<Action> {
    let name = csr.name_any();
    let user = csr.spec.username.clone().unwrap_or_default();
    let (type_, reason, message, label) = match &decision {
        Ok(Request::Enroll { host, pool, .. }) => (
            "Approved",
            APPROVED_REASON,
            format!("host {host:?} of pool {pool:?} enrolled with an unspent bootstrap token"),
            "enroll",
        ),
        Ok(Request::Renew { host }) => (
            "Approved",
            APPROVED_REASON,
            format!("host {host:?} renews its own certificate"),
            "renew",
        ),
        Err(d) => ("Denied", d.reason, d.message.clone(), d.reason),
    };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now());
    let patch = json!({
        "metadata": {"resourceVersion": csr.resource_version()},
        "status": {"conditions": [{
            "type": type_,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
        }]},
    });
    Api::<CertificateSigningRequest>::all(ctx.client.clone())
        .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr(format!("{type_} CSR {name}")))?;
    let decision_label = if type_ == "Approved" { "approved" } else { "denied" };
    ctx.metrics
        .decisions
        .with_label_values(&[decision_label, label])
        .inc();
    if type_ == "Approved" {
        tracing::info!(csr = %name, requester = %user, reason = label, %message, "approved host CSR");
    } else {
        tracing::warn!(csr = %name, requester = %user, reason, %message, "denied host CSR");
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    };
    use kube::api::ObjectMeta;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    use super::*;

    fn pem(cn: Option<&str>, orgs: &[&str], extra: Option<DnType>, sans: &[&str]) -> Vec<u8> {
        let mut p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        let mut dn = DistinguishedName::new();
        if let Some(cn) = cn {
            dn.push(DnType::CommonName, cn);
        }
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        if let Some(t) = extra {
            dn.push(t, "x");
        }
        p.distinguished_name = dn;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        p.serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
            .into_bytes()
    }

    fn good_pem(host: &str) -> Vec<u8> {
        pem(Some(&format!("byoh:host:{host}")), &["byoh:hosts"], None, &[])
    }

    fn csr(request: Vec<u8>, user: &str, groups: &[&str]) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some("csr-1".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request),
                signer_name: SIGNER.into(),
                usages: Some(vec![USAGE_CLIENT_AUTH.into()]),
                username: Some(user.into()),
                groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                ..Default::default()
            },
            status: None,
        }
    }

    const TOKEN_USER: &str = "system:bootstrap:abc123";
    const POOL_GROUP: &str = "system:bootstrappers:byoh:pool-a";

    fn enrolling(host: &str) -> CertificateSigningRequest {
        csr(
            good_pem(host),
            TOKEN_USER,
            &[POOL_GROUP, "system:bootstrappers", "system:authenticated"],
        )
    }

    fn reason(v: Verdict) -> &'static str {
        match v {
            Verdict::Deny(d) => d.reason,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn lifetimes_are_bounded() {
        let max = Duration::from_secs(86_400);
        let mut c = enrolling("h1");
        let unset = check_lifetime(&c, max).expect_err("no expirationSeconds");
        assert_eq!(unset.reason, "LifetimeTooLong");
        assert!(
            unset.message.contains("spec.expirationSeconds is not set"),
            "{}",
            unset.message
        );
        for too_long in [86_401, i32::MAX] {
            c.spec.expiration_seconds = Some(too_long);
            let d = check_lifetime(&c, max).expect_err("too long");
            assert!(d.message.contains("at most 86400 seconds"), "{}", d.message);
        }
        c.spec.expiration_seconds = Some(-1);
        assert!(check_lifetime(&c, max).is_err(), "a negative lifetime");
        for fine in [600, 86_400] {
            c.spec.expiration_seconds = Some(fine);
            assert_eq!(check_lifetime(&c, max), Ok(()), "{fine}");
        }
    }

    #[test]
    fn form_of_requests() {
        let enroll = Request::Enroll {
            host: "h1".into(),
            pool: "pool-a".into(),
            token_id: "abc123".into(),
        };
        assert_eq!(examine(&enrolling("h1")), Verdict::Admissible(enroll));
        let renew = csr(
            good_pem("h1"),
            "byoh:host:h1",
            &["byoh:hosts", "system:authenticated"],
        );
        assert_eq!(
            examine(&renew),
            Verdict::Admissible(Request::Renew { host: "h1".into() })
        );

        let mut c = enrolling("h1");
        c.spec.signer_name = "kubernetes.io/kubelet-serving".into();
        assert_eq!(reason(examine(&c)), "WrongSigner");
        for usages in [
            vec!["client auth", "server auth"],
            vec!["digital signature", "client auth"],
            vec![],
        ] {
            let mut c = enrolling("h1");
            c.spec.usages = Some(usages.iter().map(|u| u.to_string()).collect());
            assert_eq!(reason(examine(&c)), "WrongUsages", "{usages:?}");
        }
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"not pem".to_vec(), "InvalidRequest"),
            (
                pem(Some("byoh:host:h1"), &["byoh:hosts"], None, &["h1.example.com"]),
                "ExtensionsRequested",
            ),
            (
                pem(
                    Some("byoh:host:h1"),
                    &["byoh:hosts"],
                    Some(DnType::CountryName),
                    &[],
                ),
                "WrongSubject",
            ),
            (
                pem(Some("byoh:host:h1"), &["system:masters"], None, &[]),
                "WrongSubject",
            ),
            (
                pem(Some("byoh:host:h1"), &["byoh:hosts", "system:masters"], None, &[]),
                "WrongSubject",
            ),
            (pem(Some("byoh:host:h1"), &[], None, &[]), "WrongSubject"),
            (pem(Some("admin"), &["byoh:hosts"], None, &[]), "WrongSubject"),
            (pem(None, &["byoh:hosts"], None, &[]), "WrongSubject"),
            (
                pem(Some("byoh:host:H_1"), &["byoh:hosts"], None, &[]),
                "InvalidHostName",
            ),
        ];
        for (request, want) in cases {
            let c = csr(request, TOKEN_USER, &[POOL_GROUP]);
            assert_eq!(reason(examine(&c)), want);
        }

        // Renewal for another host, by a host.
        let c = csr(good_pem("b"), "byoh:host:a", &["byoh:hosts"]);
        assert_eq!(reason(examine(&c)), "OtherHost");
        // A host's name without the group.
        let c = csr(good_pem("a"), "byoh:host:a", &["system:authenticated"]);
        assert_eq!(reason(examine(&c)), "NotAHost");
        // A plain user asking for a host identity.
        let c = csr(good_pem("a"), "alice", &["system:authenticated"]);
        assert_eq!(reason(examine(&c)), "NoToken");
        // Another kind of bootstrap token (kubeadm's) asking for a host identity.
        let c = csr(
            good_pem("a"),
            TOKEN_USER,
            &[
                "system:bootstrappers:kubeadm:default-node-token",
                "system:bootstrappers",
            ],
        );
        assert_eq!(reason(examine(&c)), "NotHostToken");
        let c = csr(
            good_pem("a"),
            TOKEN_USER,
            &[POOL_GROUP, "system:bootstrappers:byoh:pool-b"],
        );
        assert_eq!(reason(examine(&c)), "AmbiguousPool");
    }

    #[test]
    fn leaves_other_csrs_alone() {
        // A kubelet's client CSR: not about hosts.
        let mut c = csr(
            pem(Some("system:node:n1"), &["system:nodes"], None, &[]),
            "system:node:n1",
            &["system:nodes"],
        );
        c.spec.signer_name = "kubernetes.io/kube-apiserver-client-kubelet".into();
        assert_eq!(examine(&c), Verdict::Ignore);
        // Decided CSRs are never looked at again.
        let mut c = enrolling("h1");
        c.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            certificate: None,
        });
        assert_eq!(examine(&c), Verdict::Ignore);
    }

    fn token(pool: &str, host: Option<&str>, expires: Timestamp) -> Secret {
        let labels = BTreeMap::from([
            (
                identity::TOKEN_PURPOSE.to_string(),
                identity::TOKEN_PURPOSE_HOST.to_string(),
            ),
            (identity::TOKEN_POOL.to_string(), pool.to_string()),
        ]);
        let data = [
            ("token-id", "abc123".to_string()),
            ("token-secret", "0123456789abcdef".to_string()),
            ("usage-bootstrap-authentication", "true".to_string()),
            ("auth-extra-groups", identity::bootstrappers_group(pool)),
            ("expiration", expires.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
        .collect();
        Secret {
            metadata: ObjectMeta {
                name: Some("bootstrap-token-abc123".into()),
                labels: Some(labels),
                annotations: host
                    .map(|h| BTreeMap::from([(identity::TOKEN_HOST.to_string(), h.to_string())])),
                ..Default::default()
            },
            type_: Some(identity::TOKEN_SECRET_TYPE.into()),
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn tokens() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let later: Timestamp = "2026-01-01T01:00:00Z".parse().expect("time");
        let earlier: Timestamp = "2025-12-31T23:00:00Z".parse().expect("time");
        let Verdict::Admissible(req) = examine(&enrolling("h1")) else {
            panic!("admissible")
        };
        let check = |s: Option<&Secret>| check_token(s, &req, "csr-1/u1", now).map_err(|d| d.reason);

        assert_eq!(check(Some(&token("pool-a", None, later))), Ok(()));
        assert_eq!(check(Some(&token("pool-a", Some("h1"), later))), Ok(()));
        assert_eq!(check(None), Err("TokenNotFound"));
        assert_eq!(check(Some(&token("pool-a", Some("h2"), later))), Err("WrongHost"));
        assert_eq!(check(Some(&token("pool-b", None, later))), Err("WrongPool"));
        assert_eq!(check(Some(&token("pool-a", None, earlier))), Err("TokenExpired"));

        let mut spent = token("pool-a", None, later);
        spent
            .annotations_mut()
            .insert(identity::TOKEN_SPENT_BY.into(), "csr-0/u0".into());
        assert_eq!(check(Some(&spent)), Err("TokenSpent"));
        // Spent by this very CSR: an interrupted approval completes.
        spent
            .annotations_mut()
            .insert(identity::TOKEN_SPENT_BY.into(), "csr-1/u1".into());
        assert_eq!(check(Some(&spent)), Ok(()));

        let mut foreign = token("pool-a", None, later);
        foreign.labels_mut().remove(identity::TOKEN_PURPOSE);
        assert_eq!(check(Some(&foreign)), Err("NotHostToken"));
        let mut no_exp = token("pool-a", None, later);
        no_exp.data.as_mut().expect("data").remove("expiration");
        assert_eq!(check(Some(&no_exp)), Err("NotHostToken"));
        let mut other_group = token("pool-a", None, later);
        other_group.data.as_mut().expect("data").insert(
            "auth-extra-groups".into(),
            ByteString(b"system:bootstrappers:byoh:pool-b".to_vec()),
        );
        assert_eq!(check(Some(&other_group)), Err("WrongPool"));
        // Renewals need no token.
        assert_eq!(
            check_token(None, &Request::Renew { host: "h1".into() }, "x", now),
            Ok(())
        );
    }

    #[test]
    fn a_held_name_needs_a_replacement_token_of_its_pool() {
        let later: Timestamp = "2026-01-01T01:00:00Z".parse().expect("time");
        let Verdict::Admissible(req) = examine(&enrolling("h1")) else {
            panic!("admissible")
        };
        let Request::Enroll { pool, .. } = &req else {
            panic!("enroll")
        };
        let held = |pool: Option<&str>| Holder {
            pool: pool.map(Into::into),
            what: "ByoHost x/h1".into(),
        };
        let replacement = |host: &str| {
            let mut t = token(pool, Some(host), later);
            t.annotations_mut()
                .insert(identity::TOKEN_REPLACES.into(), host.into());
            t
        };
        let check = |t: &Secret, holders: &[Holder]| check_name(&req, t, holders).map_err(|d| d.reason);
        let free: &[Holder] = &[];
        assert_eq!(check(&token(pool, None, later), free), Ok(()));
        assert_eq!(
            check(&token(pool, None, later), &[held(Some(pool))]),
            Err("NameInUse")
        );
        assert_eq!(
            check(&token(pool, Some("h1"), later), &[held(Some(pool))]),
            Err("NameInUse")
        );
        assert_eq!(check(&replacement("h1"), &[held(Some(pool)), held(None)]), Ok(()));
        assert_eq!(
            check(&replacement("h1"), &[held(Some("pool-other"))]),
            Err("NameInUse")
        );
        // A replacement names the host it replaces: the token's host must be the request's.
        assert_eq!(check(&replacement("h2"), &[held(Some(pool))]), Err("NameInUse"));
        let d = check_name(&req, &token(pool, None, later), &[held(Some("pool-other"))]).expect_err("held");
        assert!(d.message.contains("unique across pools"), "{}", d.message);
    }

    fn binding(host: &str) -> RoleBinding {
        RoleBinding {
            metadata: ObjectMeta {
                name: Some(pool_binding_name(host)),
                ..Default::default()
            },
            role_ref: k8s_openapi::api::rbac::v1::RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: HOST_CLUSTER_ROLE.into(),
            },
            subjects: Some(vec![k8s_openapi::api::rbac::v1::Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "User".into(),
                name: identity::host_user(host),
                namespace: None,
            }]),
        }
    }

    #[test]
    fn pool_bindings() {
        assert!(is_pool_binding(&binding("h1"), "h1"));
        assert!(!is_pool_binding(&binding("h1"), "h2"), "another host's binding");
        let mut b = binding("h1");
        let mut alice = b.subjects.as_ref().expect("subjects")[0].clone();
        alice.name = "alice".into();
        b.subjects.as_mut().expect("subjects").push(alice);
        assert!(!is_pool_binding(&b, "h1"), "a second subject");
        let mut b = binding("h1");
        b.subjects.as_mut().expect("subjects")[0].kind = "Group".into();
        assert!(!is_pool_binding(&b, "h1"), "a group of that name");
        let mut b = binding("h1");
        b.subjects = None;
        assert!(!is_pool_binding(&b, "h1"), "no subject");
        let mut b = binding("h1");
        b.role_ref.name = "admin".into();
        assert!(!is_pool_binding(&b, "h1"), "another role");
        let mut b = binding("h1");
        b.role_ref.kind = "Role".into();
        assert!(!is_pool_binding(&b, "h1"), "a Role of that name");
        let mut b = binding("h1");
        b.metadata.name = Some("other".into());
        assert!(!is_pool_binding(&b, "h1"), "another name");
    }

    #[test]
    fn bindings_of_gone_hosts() {
        let owner = |kind: &str, api_version: &str, uid: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "h1".into(),
            uid: uid.into(),
            ..Default::default()
        };
        let host = |uid: &str| owner("ByoHost", "infrastructure.cluster.x-k8s.io/v1beta1", uid);
        let mut b = binding("h1");
        assert!(
            !owned_by_a_gone_host(&b, None),
            "never owned: fresh from the approver"
        );
        b.metadata.owner_references = Some(vec![host("u1")]);
        assert!(!owned_by_a_gone_host(&b, Some("u1")), "owned by the live host");
        assert!(
            owned_by_a_gone_host(&b, Some("u2")),
            "the host was deleted and registered again"
        );
        assert!(owned_by_a_gone_host(&b, None), "the host was deleted");
        b.metadata.owner_references = Some(vec![host("u1"), host("u2")]);
        assert!(!owned_by_a_gone_host(&b, Some("u2")), "one owner is live");
        b.metadata.owner_references = Some(vec![owner("ConfigMap", "v1", "u3")]);
        assert!(!owned_by_a_gone_host(&b, None), "not owned by a host");
        b.metadata.owner_references = Some(vec![owner("ByoHost", "example.com/v1", "u3")]);
        assert!(!owned_by_a_gone_host(&b, None), "a ByoHost of another API group");
    }
}
