//! The host's identity: a client certificate for user `byoh:host:<name>` in group `byoh:hosts`.
//!
//! On first start the agent holds only a bootstrap kubeconfig (a one-time token from
//! `bootsmanctl hosts token`). It generates an ECDSA P-256 key in its state directory (mode 0600
//! from creation), submits a CertificateSigningRequest for CN `byoh:host:<name>`, O `byoh:hosts`
//! to signer `kubernetes.io/kube-apiserver-client` with usage `client auth`, waits for the
//! provider's approver and the cluster's signer, and writes its kubeconfig (mode 0600, written
//! atomically) with the certificate and key embedded. The token is spent by that approval.
//!
//! A certificate is used while more than 20 % of its lifetime is left; before that the agent
//! renews it with its own identity ([`renew_loop`]), with a fresh key each time.

use std::future::Future;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use bootsman_api::identity;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Signer of host client certificates.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// File in the state directory holding the key of the current certificate.
pub const KEY_FILE: &str = "client-key.pem";
/// File in the state directory holding the key of a certificate still being requested.
pub const PENDING_KEY_FILE: &str = "client-key.pending.pem";

/// Where the identity lives and how to get one.
#[derive(Clone, Debug)]
pub struct Options {
    /// The agent's state directory (created with mode 0700); the private key lives here.
    pub state_dir: PathBuf,
    /// The host's own kubeconfig: read when it exists, (re)written on enrollment and renewal.
    pub kubeconfig: PathBuf,
    /// The bootstrap kubeconfig with a one-time token; needed only without a valid certificate.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// The host's name: its ByoHost's name and the CN suffix of its certificate.
    pub host_name: String,
    /// How long to wait for the CSR to be approved and signed.
    pub approval_timeout: Duration,
    /// The lifetime every certificate request asks for (`spec.expirationSeconds`). The
    /// provider's approver denies a request without one, or with more than its
    /// `--max-host-certificate-lifetime`; the signer may shorten it further.
    pub certificate_lifetime: Duration,
}

/// The lifetime a host certificate asks for by default: 30 days. A host that is switched off
/// for longer needs a new token to come back.
pub const DEFAULT_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// Name of a new certificate request of `host`: `byoh-host-<host>-<32 random hex digits>`.
/// Hosts may `get` a request only by its name (they cannot list or watch them), so a name
/// nobody can guess keeps each host's requests its own.
pub fn csr_name(host: &str) -> String {
    let prefix: String = host.chars().take(200).collect();
    format!("byoh-host-{prefix}-{:032x}", rand::random::<u128>())
}

/// Why the host has no identity.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The options break a rule.
    #[error("{0}")]
    Invalid(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A kubeconfig is unusable.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Generating the key or request failed.
    #[error("generating the key or certificate request: {0}")]
    Crypto(String),
    /// The API server refused or failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The approver denied the request.
    #[error("CSR {csr} was denied ({reason}): {message}")]
    Denied {
        /// Name of the CSR.
        csr: String,
        /// Reason of the `Denied` condition.
        reason: String,
        /// Message of the `Denied` condition.
        message: String,
    },
    /// The signer failed to issue the certificate.
    #[error("CSR {csr} failed ({reason}): {message}")]
    Failed {
        /// Name of the CSR.
        csr: String,
        /// Reason of the `Failed` condition.
        reason: String,
        /// Message of the `Failed` condition.
        message: String,
    },
    /// No decision within the approval timeout.
    #[error(
        "CSR {csr} was not approved and signed within {timeout:?}; is the provider's host CSR approver running?"
    )]
    Timeout {
        /// Name of the CSR.
        csr: String,
        /// The timeout.
        timeout: Duration,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The validity of a certificate, in Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// Start of validity.
    pub not_before: i64,
    /// End of validity.
    pub not_after: i64,
}

impl Validity {
    /// When the certificate is due for renewal: after 80 % of its lifetime.
    pub fn renew_at(&self) -> i64 {
        self.not_before + (self.not_after - self.not_before).max(0) * 8 / 10
    }

    /// Whether at `now` less than 20 % of the lifetime is left (or the certificate is not valid).
    pub fn needs_renewal(&self, now: i64) -> bool {
        now < self.not_before || now >= self.renew_at()
    }

    /// Whether the certificate is valid at `now` (it can still authenticate a renewal).
    pub fn is_valid(&self, now: i64) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// Reads a PEM certificate: its subject CN and validity.
pub fn read_certificate(pem: &[u8]) -> Result<(String, Validity), String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("not PEM: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let v = cert.validity();
    Ok((
        cn,
        Validity {
            not_before: v.not_before.timestamp(),
            not_after: v.not_after.timestamp(),
        },
    ))
}

/// The host's current certificate from its kubeconfig, if the file exists and holds one for
/// this host.
fn current_certificate(opts: &Options) -> Result<Option<Validity>, Error> {
    if !opts.kubeconfig.exists() {
        return Ok(None);
    }
    let bad = |message: String| Error::Kubeconfig {
        path: opts.kubeconfig.clone(),
        message,
    };
    let kc = Kubeconfig::read_from(&opts.kubeconfig).map_err(|e| bad(e.to_string()))?;
    let Some(data) = kc
        .auth_infos
        .iter()
        .find_map(|a| a.auth_info.as_ref()?.client_certificate_data.clone())
    else {
        return Ok(None);
    };
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(format!("client-certificate-data is not base64: {e}")))?;
    let (cn, validity) = read_certificate(&pem).map_err(|e| bad(format!("client certificate: {e}")))?;
    if cn != identity::host_user(&opts.host_name) {
        tracing::warn!(path = %opts.kubeconfig.display(), %cn, host = %opts.host_name,
            "the kubeconfig holds the certificate of another identity; enrolling anew");
        return Ok(None);
    }
    Ok(Some(counted_from_receipt(validity, written_at(&opts.kubeconfig))))
}

/// The validity that renewal counts with: signers backdate `notBefore` (kube-controller-manager
/// by 5 minutes, without moving `notAfter` for short lifetimes), so 80 % of the nominal lifetime
/// can lie in the past the moment a short-lived certificate arrives, and the agent would renew it
/// again at once, forever. The lifetime therefore counts from when the certificate was written
/// (`written`, if later than `notBefore` and not in the future): renewal comes at 80 % of what
/// was left then, always before `notAfter`.
fn counted_from_receipt(v: Validity, written: Option<i64>) -> Validity {
    let start = written.map_or(v.not_before, |w| v.not_before.max(w.min(now())));
    Validity {
        not_before: start.min(v.not_after),
        not_after: v.not_after,
    }
}

/// When `path` was last written, in Unix seconds.
fn written_at(path: &Path) -> Option<i64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let secs = modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok()
}

async fn load(path: &Path) -> Result<kube::Config, Error> {
    let bad = |message: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        message,
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))
}

/// Server URL and base64 CA bundle of the current context of the kubeconfig at `path`.
fn cluster_of(path: &Path) -> Result<(String, Option<String>), Error> {
    let kc = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    cluster_in(&kc, path)
}

/// Server URL and base64 CA bundle of the current context of `kc`, read from `path` (a CA file
/// it names is relative to `path`'s folder; errors name `path`).
fn cluster_in(kc: &Kubeconfig, path: &Path) -> Result<(String, Option<String>), Error> {
    let bad = |message: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        message,
    };
    let context = kc
        .current_context
        .as_ref()
        .and_then(|c| kc.contexts.iter().find(|n| &n.name == c))
        .or_else(|| kc.contexts.first())
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| bad("has no context".into()))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| bad(format!("has no cluster {:?}", context.cluster)))?;
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| bad(format!("cluster {:?} has no server", context.cluster)))?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(file)) => {
            let file = path.parent().unwrap_or(Path::new(".")).join(file);
            let pem = std::fs::read(&file).map_err(io(&file))?;
            Some(base64::engine::general_purpose::STANDARD.encode(pem))
        }
        (None, None) => None,
    };
    Ok((server, ca))
}

/// Creates `dir` (mode 0700) if missing.
fn ensure_private_dir(dir: &Path) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))
}

/// Writes `data` to `path` atomically, readable by root alone (0600, in a 0700 directory): the
/// agent's one atomic write, [`crate::state::replace_file`].
pub fn write_private(path: &Path, data: &[u8]) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    ensure_private_dir(dir)?;
    crate::state::replace_file(path, data, 0o600).map_err(io(path))
}

/// A kubeconfig (YAML) for `server`, trusting `ca` (base64 PEM), authenticating with the
/// embedded certificate and key.
fn host_kubeconfig(server: &str, ca: Option<&str>, host: &str, cert_pem: &[u8], key_pem: &str) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let user = identity::host_user(host);
    let mut cluster = serde_json::json!({ "server": server });
    if let Some(ca) = ca {
        cluster["certificate-authority-data"] = ca.into();
    }
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bootsman", "cluster": cluster}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem.as_bytes()),
        }}],
        "contexts": [{"name": "bootsman", "context": {"cluster": "bootsman", "user": user}}],
        "current-context": "bootsman",
    });
    serde_saphyr::to_string(&kc).unwrap_or_else(|_| kc.to_string())
}

/// Returns a configuration for the host's identity, enrolling or renewing first when the current
/// certificate is missing, for another identity, or has less than 20 % of its lifetime left.
pub async fn ensure_identity(opts: &Options) -> Result<kube::Config, Error> {
    identity::validate_host_name(&opts.host_name).map_err(|e| Error::Invalid(format!("host name: {e}")))?;
    let current = current_certificate(opts)?;
    let now = now();
    match current {
        Some(v) if !v.needs_renewal(now) => {
            tracing::debug!(path = %opts.kubeconfig.display(), "using the host's current certificate");
            load(&opts.kubeconfig).await
        }
        Some(v) if v.is_valid(now) => {
            tracing::info!(host = %opts.host_name, "the host certificate is due for renewal; renewing");
            request(opts, &opts.kubeconfig.clone(), None).await
        }
        _ => {
            let Some(bootstrap) = &opts.bootstrap_kubeconfig else {
                return Err(Error::Invalid(format!(
                    "no valid host certificate in {} and no bootstrap kubeconfig: issue a token \
                     with `bootsmanctl hosts token --namespace <pool> --name {}` and pass it as \
                     the bootstrap kubeconfig",
                    opts.kubeconfig.display(),
                    opts.host_name
                )));
            };
            tracing::info!(host = %opts.host_name, bootstrap = %bootstrap.display(),
                "enrolling with the bootstrap token");
            request(opts, bootstrap, None).await
        }
    }
}

/// Enrols again with the bootstrap kubeconfig (a new token), whatever the current certificate:
/// how a host removed from its pool comes back.
pub async fn enrol_again(opts: &Options) -> Result<kube::Config, Error> {
    identity::validate_host_name(&opts.host_name).map_err(|e| Error::Invalid(format!("host name: {e}")))?;
    let Some(bootstrap) = &opts.bootstrap_kubeconfig else {
        return Err(Error::Invalid(format!(
            "no bootstrap kubeconfig to enrol again with: issue a token with `bootsmanctl hosts \
             token --namespace <pool> --name {}` and pass it as the bootstrap kubeconfig",
            opts.host_name
        )));
    };
    tracing::info!(host = %opts.host_name, bootstrap = %bootstrap.display(),
        "enrolling again with the bootstrap token");
    request(opts, bootstrap, None).await
}

/// Renews the certificate now, with the host's own identity and a fresh key; `expiration`
/// asks the signer for that lifetime (at least 10 minutes) instead of the configured one.
pub async fn renew(opts: &Options, expiration: Option<Duration>) -> Result<kube::Config, Error> {
    identity::validate_host_name(&opts.host_name).map_err(|e| Error::Invalid(format!("host name: {e}")))?;
    request(opts, &opts.kubeconfig.clone(), expiration).await
}

/// Renews the certificate whenever 80 % of its lifetime has passed, calling `on_renewed` with
/// the new configuration, until `shutdown`. A failed renewal (or an unreadable kubeconfig) is
/// retried every minute; once the certificate has expired it falls back to the bootstrap
/// kubeconfig, if there is one. Returns only at `shutdown`.
pub async fn renew_loop(
    opts: &Options,
    mut on_renewed: impl FnMut(kube::Config),
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    tokio::pin!(shutdown);
    loop {
        let result = match current_certificate(opts) {
            Ok(Some(v)) if !v.needs_renewal(now()) => {
                // Looked at again at least daily: the clock may jump, and a long wait must not
                // overflow the timer.
                let wait = Duration::from_secs((v.renew_at() - now()).clamp(1, 86_400).unsigned_abs());
                tracing::debug!(in_secs = wait.as_secs(), "next look at the host certificate");
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            // Shutdown also ends a renewal in progress (waiting for approval can take minutes).
            Ok(_) => tokio::select! {
                () = &mut shutdown => return Ok(()),
                r = ensure_identity(opts) => r,
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(config) => on_renewed(config),
            Err(e) => {
                tracing::warn!(error = %e, "renewing the host certificate failed; retrying in 1m");
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
            }
        }
    }
}

/// File in the state directory holding the bootstrap kubeconfig of a rehome in progress.
pub const REHOME_BOOTSTRAP_FILE: &str = "rehome-bootstrap.kubeconfig";
/// File in the state directory holding the host's kubeconfig for the cluster it is moving to,
/// until [`commit_rehome`] puts it in place of the current one.
pub const REHOME_KUBECONFIG_FILE: &str = "rehome.kubeconfig";

/// Whether a kubeconfig for the cluster the host moves to is kept aside, not yet in use.
pub fn rehome_staged(opts: &Options) -> bool {
    opts.state_dir.join(REHOME_KUBECONFIG_FILE).exists()
}

/// The API server of the host's current kubeconfig.
pub fn current_server(opts: &Options) -> Result<String, Error> {
    cluster_of(&opts.kubeconfig).map(|(server, _)| server)
}

/// The API server a bootstrap kubeconfig (as bytes) points at.
pub fn server_of(bootstrap: &[u8]) -> Result<String, Error> {
    let path = Path::new(REHOME_BOOTSTRAP_FILE);
    let kc: Kubeconfig = serde_saphyr::from_slice(bootstrap).map_err(|e| Error::Kubeconfig {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    cluster_in(&kc, path).map(|(server, _)| server)
}

/// First half of a rehome: enrols the host with the cluster of `bootstrap` (a bootstrap
/// kubeconfig with a one-time token for this host's name) and keeps the new kubeconfig aside
/// ([`REHOME_KUBECONFIG_FILE`]); the current identity stays in use. Returns the new server.
///
/// A rehome interrupted after its certificate was issued (the token is spent by then) finds
/// that kubeconfig again and does not ask twice.
pub async fn rehome(opts: &Options, bootstrap: &[u8]) -> Result<String, Error> {
    identity::validate_host_name(&opts.host_name).map_err(|e| Error::Invalid(format!("host name: {e}")))?;
    ensure_private_dir(&opts.state_dir)?;
    let via = opts.state_dir.join(REHOME_BOOTSTRAP_FILE);
    write_private(&via, bootstrap)?;
    let (server, _) = cluster_of(&via)?;
    let staged = Options {
        kubeconfig: opts.state_dir.join(REHOME_KUBECONFIG_FILE),
        ..opts.clone()
    };
    let ready = match current_certificate(&staged) {
        Ok(Some(v)) => v.is_valid(now()) && cluster_of(&staged.kubeconfig).is_ok_and(|(s, _)| s == server),
        _ => false,
    };
    if ready {
        tracing::info!(%server, "the certificate for the new cluster was issued before; using it");
    } else {
        tracing::info!(%server, host = %opts.host_name, "enrolling with the cluster the host moves to");
        request(&staged, &via, None).await?;
    }
    Ok(server)
}

/// Second half of a rehome: the kubeconfig for the new cluster replaces the current one (one
/// atomic write), then the kept copy and the rehome's bootstrap kubeconfig, whose token is
/// spent, are removed.
pub fn commit_rehome(opts: &Options) -> Result<(), Error> {
    let staged = opts.state_dir.join(REHOME_KUBECONFIG_FILE);
    let new = std::fs::read(&staged).map_err(io(&staged))?;
    write_private(&opts.kubeconfig, &new)?;
    for f in [staged, opts.state_dir.join(REHOME_BOOTSTRAP_FILE)] {
        match std::fs::remove_file(&f) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&f)(e)),
            _ => {}
        }
    }
    Ok(())
}

/// Generates a key, submits a CSR with the identity of the kubeconfig `via`, waits for the
/// certificate and writes the host's kubeconfig.
async fn request(opts: &Options, via: &Path, expiration: Option<Duration>) -> Result<kube::Config, Error> {
    ensure_private_dir(&opts.state_dir)?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Error::Crypto(e.to_string()))?;
    let key_pem = key.serialize_pem();
    let pending = opts.state_dir.join(PENDING_KEY_FILE);
    write_private(&pending, key_pem.as_bytes())?;

    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, identity::host_user(&opts.host_name));
    dn.push(rcgen::DnType::OrganizationName, identity::HOSTS_GROUP);
    params.distinguished_name = dn;
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| Error::Crypto(e.to_string()))?;

    let (server, ca) = cluster_of(via)?;
    let client = kube::Client::try_from(load(via).await?).map_err(|source| Error::Kube {
        what: format!("client from {}", via.display()),
        source,
    })?;
    let csrs = Api::<CertificateSigningRequest>::all(client);
    let lifetime = expiration.unwrap_or(opts.certificate_lifetime);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(csr_name(&opts.host_name)),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["client auth".into()]),
            expiration_seconds: Some(i32::try_from(lifetime.as_secs()).unwrap_or(i32::MAX)),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let created = csrs
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|source| Error::Kube {
            what: format!(
                "submit the CertificateSigningRequest for {}",
                identity::host_user(&opts.host_name)
            ),
            source,
        })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, host = %opts.host_name, "submitted the host certificate request");
    let cert = wait_for_certificate(&csrs, &name, opts.approval_timeout).await?;

    let kubeconfig = host_kubeconfig(&server, ca.as_deref(), &opts.host_name, &cert, &key_pem);
    write_private(&opts.kubeconfig, kubeconfig.as_bytes())?;
    if via != opts.kubeconfig {
        // Enrolled with a token: a new enrolment, which may register the ByoHost again.
        crate::state::forget_registration(&opts.state_dir).map_err(|e| Error::Io {
            path: opts.state_dir.join(crate::state::REGISTRATION_FILE),
            source: std::io::Error::other(e),
        })?;
    }
    let key_path = opts.state_dir.join(KEY_FILE);
    std::fs::rename(&pending, &key_path).map_err(io(&key_path))?;
    if let Ok((_, v)) = read_certificate(&cert) {
        tracing::info!(csr = %name, host = %opts.host_name, not_after = v.not_after,
            path = %opts.kubeconfig.display(), "host certificate issued");
    }
    load(&opts.kubeconfig).await
}

/// Polls the CSR with backoff (1 s doubling to 10 s) until it is signed, denied or failed.
async fn wait_for_certificate(
    csrs: &Api<CertificateSigningRequest>,
    name: &str,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_secs(1);
    let mut last_log = tokio::time::Instant::now();
    tracing::info!(csr = %name, "waiting for approval of CSR {name}");
    loop {
        match csrs.get(name).await {
            Ok(csr) => {
                let status = csr.status.unwrap_or_default();
                for c in status.conditions.iter().flatten() {
                    let reason = c.reason.clone().unwrap_or_default();
                    let message = c.message.clone().unwrap_or_default();
                    match c.type_.as_str() {
                        "Denied" => {
                            return Err(Error::Denied {
                                csr: name.into(),
                                reason,
                                message,
                            });
                        }
                        "Failed" => {
                            return Err(Error::Failed {
                                csr: name.into(),
                                reason,
                                message,
                            });
                        }
                        _ => {}
                    }
                }
                if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                    return Ok(cert.0);
                }
            }
            Err(e) => tracing::warn!(csr = %name, error = %e, "reading the CSR failed; retrying"),
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                csr: name.into(),
                timeout,
            });
        }
        if now.duration_since(last_log) >= Duration::from_secs(30) {
            tracing::info!(csr = %name, "still waiting for approval of CSR {name}");
            last_log = now;
        }
        tokio::time::sleep(delay.min(deadline - now)).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_backdated_certificate_counts_from_its_receipt() {
        // kube-controller-manager with a 1-minute signing duration: notBefore 5 min back.
        let t = now();
        let v = Validity {
            not_before: t - 300,
            not_after: t + 60,
        };
        assert!(
            v.needs_renewal(t),
            "nominally, 80 % of the lifetime has passed already"
        );
        let counted = counted_from_receipt(v, Some(t));
        assert!(!counted.needs_renewal(t));
        assert_eq!(counted.renew_at(), t + 48);
        // Written long ago (or no mtime): the certificate's own notBefore.
        assert_eq!(counted_from_receipt(v, Some(t - 1000)), v);
        assert_eq!(counted_from_receipt(v, None), v);
        // A file written after notAfter: due at once, never later than notAfter.
        let late = counted_from_receipt(v, Some(t + 100));
        assert!(late.renew_at() <= v.not_after);
    }

    #[test]
    fn renewal_after_80_percent() {
        // A 10-day certificate issued at t=1000.
        let v = Validity {
            not_before: 1000,
            not_after: 1000 + 864_000,
        };
        assert_eq!(v.renew_at(), 1000 + 691_200);
        assert!(!v.needs_renewal(1000));
        assert!(!v.needs_renewal(1000 + 691_199));
        assert!(v.needs_renewal(1000 + 691_200));
        assert!(v.needs_renewal(1000 + 864_000));
        // Not yet valid: treated as needing a new one.
        assert!(v.needs_renewal(999));
        assert!(v.is_valid(1000 + 864_000 - 1));
        assert!(!v.is_valid(1000 + 864_000));
        // The 10-minute minimum lifetime renews after 8 minutes.
        let short = Validity {
            not_before: 0,
            not_after: 600,
        };
        assert_eq!(short.renew_at(), 480);
    }

    #[test]
    fn private_files_are_0600_from_the_start() {
        let dir = std::env::temp_dir().join(format!("enroll-test-{}", std::process::id()));
        let path = dir.join("state").join("key.pem");
        write_private(&path, b"one").expect("write");
        write_private(&path, b"two").expect("overwrite");
        let meta = std::fs::metadata(&path).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        let dmeta = std::fs::metadata(dir.join("state")).expect("stat dir");
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn request_names_are_unguessable_and_valid() {
        let a = csr_name("web-1");
        let b = csr_name("web-1");
        assert_ne!(a, b);
        let suffix = a.strip_prefix("byoh-host-web-1-").expect("prefix");
        assert_eq!(suffix.len(), 32, "{a}");
        assert!(
            suffix
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{a}"
        );
        // The longest host name still gives a valid object name (a DNS subdomain, ≤ 253).
        let long = csr_name(&"a".repeat(253));
        assert!(long.len() <= 253, "{}", long.len());
    }
}
