//! Identities of hosts and the bootstrap tokens they enrol with.
//!
//! A host authenticates as user `byoh:host:<name>` in group `byoh:hosts` (the CN and O of its
//! client certificate). Before it has a certificate it authenticates with a Kubernetes bootstrap
//! token issued by `bootsmanctl hosts token`: the token's Secret `kube-system/bootstrap-token-<id>`
//! puts it in group `system:bootstrappers:byoh:<pool>` and records the pool in a label (and, optionally, the one
//! host name it may enrol in an annotation) for the provider's CSR approver reads. The token is spent on first
//! use: the approver marks it with [`TOKEN_SPENT_BY`] before approving and deletes it once the host
//! holds its certificate.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Group of every enrolled host (the O of its client certificate).
pub const HOSTS_GROUP: &str = "byoh:hosts";
/// Prefix of a host's user name (the CN of its client certificate): `byoh:host:<name>`.
pub const HOST_USER_PREFIX: &str = "byoh:host:";
/// Prefix of the group a bootstrap token for a pool puts its holder in: `…:<pool>`.
pub const BOOTSTRAPPERS_GROUP_PREFIX: &str = "system:bootstrappers:byoh:";
/// Prefix of the user name the API server gives a bootstrap token's holder: `…<token-id>`.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";
/// Namespace of bootstrap-token Secrets.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// Prefix of a bootstrap-token Secret's name: `bootstrap-token-<id>`.
pub const TOKEN_SECRET_PREFIX: &str = "bootstrap-token-";
/// Type of a bootstrap-token Secret.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Label on a token Secret: the pool namespace the token enrols into.
pub const TOKEN_POOL: &str = "bootsman.io/pool";
/// Annotation on a token Secret (a host name may exceed a label value's 63 characters): the only host name the token may enrol (absent: any name).
pub const TOKEN_HOST: &str = "bootsman.io/host";
/// Annotation on a token Secret issued by `bootsmanctl hosts replace`: the host name (equal to
/// [`TOKEN_HOST`]) the token may take over although it is held already.
pub const TOKEN_REPLACES: &str = "bootsman.io/replaces";
/// Label on a token Secret issued by `bootsmanctl hosts token` (value `byoh-host`).
pub const TOKEN_PURPOSE: &str = "bootsman.io/token-purpose";
/// Value of [`TOKEN_PURPOSE`].
pub const TOKEN_PURPOSE_HOST: &str = "byoh-host";
/// Annotation on a token Secret: the CertificateSigningRequest (`<name>/<uid>`) that spent it.
pub const TOKEN_SPENT_BY: &str = "bootsman.io/spent-by";

/// User name of host `name`.
pub fn host_user(name: &str) -> String {
    format!("{HOST_USER_PREFIX}{name}")
}

/// Group a bootstrap token for `pool` puts its holder in.
pub fn bootstrappers_group(pool: &str) -> String {
    format!("{BOOTSTRAPPERS_GROUP_PREFIX}{pool}")
}

/// Name of the Secret of bootstrap token `id`.
pub fn token_secret_name(id: &str) -> String {
    format!("{TOKEN_SECRET_PREFIX}{id}")
}

/// A host bootstrap token as `bootsmanctl hosts token` issues it, and the Secret that makes it
/// one ([`BootstrapToken::secret`]).
#[derive(Clone, Debug)]
pub struct BootstrapToken {
    /// The 6-character token ID (public: it names the Secret).
    pub id: String,
    /// The 16-character secret part.
    pub secret: String,
    /// When the token expires.
    pub expiration: k8s_openapi::jiff::Timestamp,
    /// The pool it enrols into.
    pub pool: String,
    /// The only host it may enrol, if any.
    pub host: Option<String>,
    /// Whether it takes over `host`, whose name is held already ([`TOKEN_REPLACES`]).
    pub replace: bool,
}

impl BootstrapToken {
    /// `<id>.<secret>`: the bearer token.
    pub fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Name of the token's Secret in [`TOKEN_NAMESPACE`].
    pub fn secret_name(&self) -> String {
        token_secret_name(&self.id)
    }

    /// The Secret in [`TOKEN_NAMESPACE`] that makes this a bootstrap token for its pool, usable
    /// for authentication only, with the pool, host and purpose the CSR approver reads.
    pub fn secret(&self) -> k8s_openapi::api::core::v1::Secret {
        use k8s_openapi::ByteString;
        use std::collections::BTreeMap;
        let labels = BTreeMap::from([
            (TOKEN_PURPOSE.to_string(), TOKEN_PURPOSE_HOST.to_string()),
            (TOKEN_POOL.to_string(), self.pool.clone()),
        ]);
        let description = match &self.host {
            Some(h) => format!("bootsman: enrols host {h} into pool {}", self.pool),
            None => format!("bootsman: enrols one host into pool {}", self.pool),
        };
        let data = [
            ("description", description),
            ("token-id", self.id.clone()),
            ("token-secret", self.secret.clone()),
            ("expiration", self.expiration.to_string()),
            ("usage-bootstrap-authentication", "true".to_string()),
            ("auth-extra-groups", bootstrappers_group(&self.pool)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
        .collect();
        k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(self.secret_name()),
                namespace: Some(TOKEN_NAMESPACE.to_string()),
                labels: Some(labels),
                // Annotations: a host name may be longer than a label value.
                annotations: self.host.as_ref().map(|h| {
                    let mut a = BTreeMap::from([(TOKEN_HOST.to_string(), h.clone())]);
                    if self.replace {
                        a.insert(TOKEN_REPLACES.to_string(), h.clone());
                    }
                    a
                }),
                ..Default::default()
            },
            type_: Some(TOKEN_SECRET_TYPE.to_string()),
            data: Some(data),
            ..Default::default()
        }
    }
}

/// Whether `s` is an RFC 1123 label (a namespace name): at most 63 lower-case letters, digits and
/// '-', starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is an RFC 1123 subdomain (an object name such as a ByoHost's): at most 253
/// characters of dot-separated labels ([`is_dns_label`], so at most 63 characters each, as in a
/// host name).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Whether `s` is a Kubernetes label value, which is also the rule for the name part of a label
/// key: empty, or at most 63 characters of letters, digits, '-', '_' and '.', starting and ending
/// with a letter or digit.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

/// Checks that `name` is a host name: an RFC 1123 subdomain. The error says why not.
pub fn validate_host_name(name: &str) -> Result<(), String> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not an RFC 1123 host name: at most 253 characters of dot-separated labels, \
             each of lower-case letters, digits and '-', starting and ending with a letter or digit"
        ))
    }
}

/// Checks that `pool` is a pool (namespace) name: an RFC 1123 label. The error says why not.
pub fn validate_pool(pool: &str) -> Result<(), String> {
    if is_dns_label(pool) {
        Ok(())
    } else {
        Err(format!(
            "{pool:?} is not a namespace name (RFC 1123 label): at most 63 lower-case letters, \
             digits and '-', starting and ending with a letter or digit"
        ))
    }
}

/// A Role that lets host `host` do `verbs` on the one Secret `secret`, and the RoleBinding that
/// gives it to the host's user; both carry `meta` (their name, namespace, labels and owners).
/// How a Secret meant for one host (its bootstrap data, its rehome kubeconfig) is that host's
/// alone.
pub fn host_secret_access(meta: ObjectMeta, host: &str, secret: &str, verbs: &[&str]) -> (Role, RoleBinding) {
    let role = Role {
        metadata: meta.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(vec![secret.to_string()]),
            verbs: verbs.iter().map(|v| (*v).to_string()).collect(),
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: meta.name.clone().unwrap_or_default(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            name: host_user(host),
            ..Subject::default()
        }]),
        metadata: meta,
    };
    (role, binding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "web1", "rack-1.dc-2", "0"] {
            assert!(validate_host_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Web1", "-a", "a-", "a..b", "a_b", &"x".repeat(254)] {
            assert!(validate_host_name(bad).is_err(), "{bad}");
        }
        assert!(validate_pool("pool-1").is_ok());
        for bad in ["pool.1", "", &"x".repeat(64), "Pool"] {
            assert!(validate_pool(bad).is_err(), "{bad}");
        }
        assert_eq!(host_user("h"), "byoh:host:h");
        assert_eq!(bootstrappers_group("p"), "system:bootstrappers:byoh:p");
    }

    #[test]
    fn label_values() {
        for ok in ["", "a", "Rack_1.b-2", &"x".repeat(63)] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in ["-a", "a.", "_", "a b", "a/b", &"x".repeat(64)] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }
}
