//! The form of a host's CSR: which CSRs are ours, what they ask for ([`examine`]) and whether
//! their lifetime is bounded ([`check_lifetime`]). Pure: no API call.

use std::time::Duration;

use bootsman_api::identity;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use x509_parser::prelude::FromDer;

use super::{Denial, SIGNER, USAGE_CLIENT_AUTH, deny};
use crate::error::Result;

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
/// is checked afterwards by [`super::token::check_token`].
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

/// The host a CSR's request names in its CN (`byoh:host:<name>`), whatever else it asks for;
/// `None` when the request does not parse or names no host.
pub fn requested_host(pem: &[u8]) -> Option<String> {
    parse_request(pem).ok().and_then(|s| {
        s.common_names
            .iter()
            .find_map(|cn| cn.strip_prefix(identity::HOST_USER_PREFIX).map(str::to_string))
    })
}

/// `<name>/<uid>` of a CSR: what a spent token records.
pub fn csr_ref(csr: &CertificateSigningRequest) -> String {
    format!("{}/{}", csr.name_any(), csr.uid().unwrap_or_default())
}

#[cfg(test)]
pub(super) mod tests {

    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    };
    use kube::api::ObjectMeta;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    use super::*;

    pub(in crate::enrollment) fn pem(
        cn: Option<&str>,
        orgs: &[&str],
        extra: Option<DnType>,
        sans: &[&str],
    ) -> Vec<u8> {
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

    pub(in crate::enrollment) fn good_pem(host: &str) -> Vec<u8> {
        pem(Some(&format!("byoh:host:{host}")), &["byoh:hosts"], None, &[])
    }

    pub(in crate::enrollment) fn csr(
        request: Vec<u8>,
        user: &str,
        groups: &[&str],
    ) -> CertificateSigningRequest {
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

    pub(in crate::enrollment) fn enrolling(host: &str) -> CertificateSigningRequest {
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
}
