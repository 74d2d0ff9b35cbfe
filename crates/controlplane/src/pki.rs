//! A control plane's certificates and keys, made with `rcgen` and kept in one folder so that a
//! restarted control plane keeps its identity: the hosts that enrolled against it trust its CA,
//! and every kubeconfig it wrote stays valid.
//!
//! - `server-ca`: signs the serving certificates (the API server's, the webhooks'); the trust
//!   anchor of every client;
//! - `client-ca`: signs client identities; the API server's `--client-ca-file`, and
//!   kube-controller-manager signs approved CSRs with it;
//! - `admin`: `O=system:masters`; `sa.key`/`sa.pub`: the service-account token signing key.
//!
//! The CAs, the admin identity and the service-account key are made once and reused; the
//! serving certificates are issued again on every start (their addresses may have changed; the
//! CA they chain to has not). All keys are ECDSA P-256; keys are written mode 0600.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};

use crate::error::{Error, Result, io};

/// A certificate and its key on disk.
#[derive(Clone, Debug)]
pub struct CertPair {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The files of a control plane's PKI, however they were made.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    /// Signs serving certificates; the trust anchor of every client.
    pub server_ca: CertPair,
    /// Signs client certificates; the API server's `--client-ca-file`.
    pub client_ca: CertPair,
    /// The API server's serving certificate.
    pub apiserver: CertPair,
    /// `O=system:masters`: the admin kubeconfig's identity.
    pub admin: CertPair,
    /// Serving certificate of the webhooks on loopback (the Cluster API managers').
    pub webhook: CertPair,
    /// Service-account token signing key.
    pub service_account_key: PathBuf,
    /// Its public half.
    pub service_account_pub: PathBuf,
}

/// Days a CA is valid.
const CA_DAYS: i64 = 3650;
/// Days a leaf certificate is valid.
const LEAF_DAYS: i64 = 365;

/// A persistent PKI in one folder.
pub struct Pki {
    dir: PathBuf,
    server: Issuer<'static, KeyPair>,
    client: Issuer<'static, KeyPair>,
    files: PkiFiles,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// Opens the PKI in `dir`, making what is missing. `name` goes into the CAs' common names;
    /// the API server's certificate names loopback, the in-cluster names, and `ips`.
    pub fn open(dir: &Path, name: &str, ips: &[IpAddr]) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io("create PKI directory", dir))?;
        let (server_ca, server) = ca(dir, "server-ca", &format!("{name}-server-ca"))?;
        let (client_ca, client) = ca(dir, "client-ca", &format!("{name}-client-ca"))?;
        let (sa_key, sa_pub) = (dir.join("sa.key"), dir.join("sa.pub"));
        if !sa_key.is_file() || !sa_pub.is_file() {
            let key = new_key()?;
            write_private(&sa_key, &key.serialize_pem())?;
            std::fs::write(&sa_pub, key.public_key_pem()).map_err(io("write", &sa_pub))?;
        }
        let placeholder = CertPair {
            cert: PathBuf::new(),
            key: PathBuf::new(),
        };
        let mut pki = Self {
            dir: dir.to_path_buf(),
            server,
            client,
            files: PkiFiles {
                server_ca,
                client_ca,
                apiserver: placeholder.clone(),
                admin: placeholder.clone(),
                webhook: placeholder,
                service_account_key: sa_key,
                service_account_pub: sa_pub,
            },
        };
        let mut sans: Vec<String> = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        sans.extend(ips.iter().map(IpAddr::to_string));
        pki.files.apiserver = pki.serving("apiserver", "kube-apiserver", &sans)?;
        pki.files.webhook = pki.serving("webhook", "webhook", &["127.0.0.1".into(), "localhost".into()])?;
        pki.files.admin = pki.client("admin", "admin", Some("system:masters"))?;
        Ok(pki)
    }

    /// The files, for [`crate::Spec::pki`].
    pub fn files(&self) -> &PkiFiles {
        &self.files
    }

    /// Issues (again) `<file>.crt`/`.key`: a serving certificate for `sans` (IP addresses and
    /// DNS names), signed by the server CA.
    pub fn serving(&self, file: &str, cn: &str, sans: &[String]) -> Result<CertPair> {
        let mut params = leaf(cn, None, sans)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        issue(&self.dir, file, &params, &self.server)
    }

    /// `<file>.crt`/`.key`: a client identity, user `cn` in group `group`, signed by the client
    /// CA; made once and reused (a second call with the same file returns the first identity).
    pub fn client(&self, file: &str, cn: &str, group: Option<&str>) -> Result<CertPair> {
        let pair = pair(&self.dir, file);
        if pair.cert.is_file() && pair.key.is_file() {
            return Ok(pair);
        }
        let mut params = leaf(cn, group, &[])?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        issue(&self.dir, file, &params, &self.client)
    }
}

fn pair(dir: &Path, file: &str) -> CertPair {
    CertPair {
        cert: dir.join(format!("{file}.crt")),
        key: dir.join(format!("{file}.key")),
    }
}

fn new_key() -> Result<KeyPair> {
    KeyPair::generate().map_err(|e| rcgen_error("generate a key", e))
}

fn rcgen_error(what: &str, e: rcgen::Error) -> Error {
    Error::Invalid {
        what: what.into(),
        detail: e.to_string(),
    }
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

/// The parameters of a CA named `cn`: the same on every call, so that an issuer rebuilt from
/// them and the saved key signs exactly as the original did.
fn ca_params(cn: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Loads the CA `<file>` from `dir`, or makes it.
fn ca(dir: &Path, file: &str, cn: &str) -> Result<(CertPair, Issuer<'static, KeyPair>)> {
    let pair = pair(dir, file);
    if pair.cert.is_file() && pair.key.is_file() {
        let pem = std::fs::read_to_string(&pair.key).map_err(io("read CA key", &pair.key))?;
        let key =
            KeyPair::from_pem(&pem).map_err(|e| rcgen_error(&format!("CA key {}", pair.key.display()), e))?;
        return Ok((pair, Issuer::new(ca_params(cn), key)));
    }
    let key = new_key()?;
    let mut params = ca_params(cn);
    validity(&mut params, CA_DAYS);
    let cert = params
        .self_signed(&key)
        .map_err(|e| rcgen_error(&format!("self-sign {cn}"), e))?;
    write_private(&pair.key, &key.serialize_pem())?;
    std::fs::write(&pair.cert, cert.pem()).map_err(io("write", &pair.cert))?;
    Ok((pair, Issuer::new(ca_params(cn), key)))
}

fn leaf(cn: &str, group: Option<&str>, sans: &[String]) -> Result<CertificateParams> {
    let mut params =
        CertificateParams::new(sans.to_vec()).map_err(|e| rcgen_error(&format!("names of {cn}"), e))?;
    params.distinguished_name = DistinguishedName::new();
    if let Some(g) = group {
        params.distinguished_name.push(DnType::OrganizationName, g);
    }
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    // Positive (Go refuses negative serials) and without a leading zero byte.
    let mut serial: [u8; 16] = rand::random();
    serial[0] = (serial[0] & 0x7f) | 0x10;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    validity(&mut params, LEAF_DAYS);
    Ok(params)
}

fn issue(
    dir: &Path,
    file: &str,
    params: &CertificateParams,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<CertPair> {
    let pair = pair(dir, file);
    let key = new_key()?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| rcgen_error(&format!("sign {file}"), e))?;
    write_private(&pair.key, &key.serialize_pem())?;
    std::fs::write(&pair.cert, cert.pem()).map_err(io("write", &pair.cert))?;
    Ok(pair)
}

/// Writes a private key readable by its owner only (created 0600, never briefly wider).
fn write_private(path: &Path, pem: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io("write key", path))?;
    f.write_all(pem.as_bytes()).map_err(io("write key", path))
}
