//! One-time bootstrap tokens for hosts.
//!
//! A token is a Kubernetes bootstrap token (`kube-system/bootstrap-token-<id>`, type
//! `bootstrap.kubernetes.io/token`) usable only for authentication. The API server authenticates
//! its holder as `system:bootstrap:<id>` in group `system:bootstrappers:byoh:<pool>`, which may only
//! create and read CertificateSigningRequests. A label records the pool and an annotation, optionally, the single
//! host name the token may enrol; the provider's CSR approver checks both and spends the token on
//! its first approved CSR. The token expires after its TTL whether used or not (the
//! kube-controller-manager's token cleaner deletes it).

use std::time::Duration;

use base64::Engine;
use bootsman_api::identity;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;
use rand::Rng;

/// Characters of token IDs and secrets (the bootstrap-token format: `[a-z0-9]{6}.[a-z0-9]{16}`).
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// Shortest TTL: enough for a host to boot and enrol.
pub const MIN_TTL: Duration = Duration::from_secs(60);
/// Longest TTL: a one-time credential should not outlive a week of imaging.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Errors of token commands. Each names the flag or object concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value breaks a rule.
    #[error("{flag}: {message}")]
    Invalid {
        /// The flag, e.g. `--namespace`.
        flag: &'static str,
        /// What rule was broken.
        message: String,
    },
    /// The API server refused or failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

/// What to issue a token for.
#[derive(Clone, Debug)]
pub struct Request {
    /// The pool: the namespace the host's ByoHost will live in.
    pub pool: String,
    /// The only host name the token may enrol; any name when `None`.
    pub host: Option<String>,
    /// How long the token is valid.
    pub ttl: Duration,
    /// The token replaces host `host`, whose name is held already (its ByoHost, pool access or
    /// certificate): the explicit admin action `bootsmanctl hosts replace`. Needs `host`.
    pub replace: bool,
}

/// An issued token (its Secret: [`secret_for`]).
pub use bootsman_api::identity::BootstrapToken as Token;

/// Parses a duration in the one syntax of every Bootsman flag (`bootsman_runtime::duration`:
/// `90s`, `15m`, `1h30m`, `2d`, or plain seconds). The error names `flag`.
pub fn parse_duration(flag: &'static str, s: &str) -> Result<Duration, Error> {
    bootsman_runtime::duration::parse(s).map_err(|message| Error::Invalid { flag, message })
}

/// Checks a request: pool an RFC 1123 label, host an RFC 1123 subdomain, TTL within
/// [`MIN_TTL`]..=[`MAX_TTL`].
pub fn validate(req: &Request) -> Result<(), Error> {
    identity::validate_pool(&req.pool).map_err(|message| Error::Invalid {
        flag: "--namespace",
        message,
    })?;
    if let Some(host) = &req.host {
        identity::validate_host_name(host).map_err(|message| Error::Invalid {
            flag: "--name",
            message,
        })?;
    } else if req.replace {
        return Err(Error::Invalid {
            flag: "--name",
            message: "a replacement token names the host it replaces".into(),
        });
    }
    if req.ttl < MIN_TTL || req.ttl > MAX_TTL {
        return Err(Error::Invalid {
            flag: "--ttl",
            message: format!(
                "{}s is out of range: a host token lives between {}s and {}s (7d)",
                req.ttl.as_secs(),
                MIN_TTL.as_secs(),
                MAX_TTL.as_secs()
            ),
        });
    }
    Ok(())
}

fn random(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// The Secret that makes `token` a bootstrap token for its pool.
pub fn secret_for(token: &Token) -> Secret {
    token.secret()
}

/// Issues a token: validates `req` and creates its Secret in `kube-system`.
pub async fn create(client: &kube::Client, req: &Request) -> Result<Token, Error> {
    validate(req)?;
    let ttl = SignedDuration::try_from(req.ttl).map_err(|e| Error::Invalid {
        flag: "--ttl",
        message: e.to_string(),
    })?;
    let expiration = Timestamp::now()
        .checked_add(ttl)
        .map_err(|e| Error::Invalid {
            flag: "--ttl",
            message: e.to_string(),
        })?
        .round(k8s_openapi::jiff::Unit::Second)
        .map_err(|e| Error::Invalid {
            flag: "--ttl",
            message: e.to_string(),
        })?;
    let secrets = Api::<Secret>::namespaced(client.clone(), identity::TOKEN_NAMESPACE);
    // A clash of random IDs (1 in 2 billion) is retried with a new ID.
    let mut attempts = 0;
    loop {
        let token = Token {
            id: random(6),
            secret: random(16),
            expiration,
            pool: req.pool.clone(),
            host: req.host.clone(),
            replace: req.replace,
        };
        match secrets.create(&PostParams::default(), &secret_for(&token)).await {
            Ok(_) => return Ok(token),
            Err(kube::Error::Api(s)) if bootsman_runtime::api_errors::conflict(&s) && attempts < 3 => {
                attempts += 1
            }
            Err(source) => {
                return Err(Error::Kube {
                    what: format!(
                        "create Secret {}/{}",
                        identity::TOKEN_NAMESPACE,
                        token.secret_name()
                    ),
                    source,
                });
            }
        }
    }
}

/// A kubeconfig (YAML) that authenticates with `token` to `server`, trusting the PEM CA bundle
/// `ca_pem`: what a host enrols with.
pub fn bootstrap_kubeconfig(server: &str, ca_pem: &[u8], token: &Token) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user = format!("bootstrap-{}", token.id);
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bootsman", "cluster": {
            "server": server,
            "certificate-authority-data": ca,
        }}],
        "users": [{"name": user, "user": {"token": token.bearer()}}],
        "contexts": [{"name": "bootsman", "context": {"cluster": "bootsman", "user": user}}],
        "current-context": "bootsman",
    });
    serde_saphyr::to_string(&kubeconfig).unwrap_or_else(|_| kubeconfig.to_string())
}

/// PEM of the CA bundle `config` trusts (its DER roots).
pub fn ca_pem(config: &kube::Config) -> Vec<u8> {
    let mut out = String::new();
    for der in config.root_cert.iter().flatten() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let d = |s| parse_duration("--ttl", s).map(|d| d.as_secs());
        assert_eq!(d("90s").ok(), Some(90));
        assert_eq!(d("15m").ok(), Some(900));
        assert_eq!(d("1h30m").ok(), Some(5400));
        assert_eq!(d("2d").ok(), Some(172_800));
        assert_eq!(d("600").ok(), Some(600), "plain seconds, as every Bootsman flag");
        for bad in ["", "h", "1x", "-1h", "1.5h"] {
            let e = d(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--ttl: "), "{e}");
        }
    }

    #[test]
    fn requests() {
        let req = |pool: &str, host: Option<&str>, ttl: u64| Request {
            pool: pool.into(),
            host: host.map(Into::into),
            ttl: Duration::from_secs(ttl),
            replace: false,
        };
        assert!(validate(&req("pool-a", Some("web-1.rack2"), 3600)).is_ok());
        let flag = |r: Request| match validate(&r) {
            Err(Error::Invalid { flag, .. }) => flag,
            other => panic!("{other:?}"),
        };
        assert_eq!(flag(req("Pool_A", None, 3600)), "--namespace");
        assert_eq!(flag(req("pool.a", None, 3600)), "--namespace");
        assert_eq!(flag(req("pool-a", Some("Web1"), 3600)), "--name");
        assert_eq!(flag(req("pool-a", None, 10)), "--ttl");
        assert_eq!(flag(req("pool-a", None, 8 * 86400)), "--ttl");
        let mut r = req("pool-a", None, 3600);
        r.replace = true;
        assert_eq!(flag(r), "--name");
    }

    #[test]
    fn token_format() {
        let t = Token {
            id: random(6),
            secret: random(16),
            expiration: Timestamp::UNIX_EPOCH,
            pool: "p".into(),
            host: Some("h".into()),
            replace: false,
        };
        let ok = |s: &str, n| s.len() == n && s.bytes().all(|b| ALPHABET.contains(&b));
        assert!(ok(&t.id, 6) && ok(&t.secret, 16), "{t:?}");
        let s = secret_for(&t);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some(format!("bootstrap-token-{}", t.id).as_str())
        );
        let annotations = s.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations.get(identity::TOKEN_HOST).map(String::as_str),
            Some("h")
        );
        let labels = s.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get(identity::TOKEN_POOL).map(String::as_str), Some("p"));
    }
}
