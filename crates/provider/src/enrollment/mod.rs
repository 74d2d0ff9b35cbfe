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
//!   deleted): see [`pool_access::check_renewal`].
//!
//! Every approved CSR asks for a bounded lifetime: `spec.expirationSeconds` must be set and at
//! most [`Options::max_certificate_lifetime`] (30 days unless configured), else the CSR is denied
//! with `LifetimeTooLong` ([`csr_form::check_lifetime`]). Without it the signer would issue for
//! its own `--cluster-signing-duration`, a year by default, and a stolen or forgotten certificate would
//! outlive any reasonable rotation.
//!
//! A host name is taken once: an enrollment is denied (`NameInUse`) when a ByoHost, a live pool
//! RoleBinding or an unexpired certificate from another CSR already holds the name, in any pool,
//! unless its token was issued by `bootsmanctl hosts replace` for that very name and pool
//! ([`token::check_name`]). So a pool's token cannot be used to become another host.
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
//! (see [`pool_access::grant_pool_access`]). A token for a pool whose namespace does not exist is
//! denied.
//! Once the host's ByoHost exists, the provider's host-health controller makes the ByoHost the
//! binding's owner, so the garbage collector takes the binding, and the host's rights, with the
//! ByoHost. A binding still owned by a ByoHost that is gone is replaced, never reused, when the
//! host enrols again. A binding that no ByoHost took over, whose host has no ByoHost, is removed
//! after [`pool_access::ORPHAN_BINDING_GRACE`] ([`pool_access::sweep_orphan_bindings`], every
//! minute).
//!
//! Decisions are counted in `bootsman_provider_host_csrs_total{decision,reason}` and logged with
//! the CSR's name, requester and reason.

//!
//! ## Where each part lives
//! - [`csr_form`]: what a CSR asks for ([`csr_form::examine`]), its form and lifetime;
//! - [`token`]: whether an enrollment's bootstrap token allows it, and who holds a name already;
//! - [`pool_access`]: the pool RoleBinding that is a host's rights, its renewal check and the
//!   sweep of bindings nobody took over (the host-health controller uses it too);
//! - [`approver`]: the controller that puts these together, spends tokens and decides.

pub mod approver;
pub mod csr_form;
pub mod pool_access;
pub mod token;

use kube::Api;
use kube::api::{DeleteParams, Preconditions};

use crate::error::is_not_found;

pub use approver::{DEFAULT_MAX_CERTIFICATE_LIFETIME, Options, run};

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
