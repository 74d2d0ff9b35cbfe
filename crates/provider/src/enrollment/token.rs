//! Whether an enrollment may have the name it asks for: its bootstrap token Secret
//! ([`check_token`]: issued for that pool and host, unexpired, unspent) and who already holds the
//! name, in any pool ([`name_holders`], [`check_name`]).

use bootsman_api::identity;
use bootsman_api::v1beta1::ByoHost;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use x509_parser::prelude::FromDer;

use super::csr_form::Request;
use super::pool_access::{is_pool_binding, owned_by_a_gone_host, pool_binding_name};
use super::{Denial, SIGNER, deny};
use crate::error::{Result, kube as kerr};

fn data_str<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
}

/// Whether the token Secret allows enrollment `req` by the CSR `by` (see
/// [`super::csr_form::csr_ref`]) at `now`.
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::super::csr_form::tests::enrolling;
    use super::super::csr_form::{Verdict, examine};
    use super::*;

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
}
