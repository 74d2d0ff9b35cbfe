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
//!
//! [`sign_with`] issues from a CA made elsewhere (a child cluster's CA that Cluster API wrote,
//! RSA with a PKCS #1 key), as the test harness's stand-in control plane needs.

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
    /// the API server's certificate names loopback, the `kubernetes` Service (its address and
    /// names, as Pods reach it), and `ips`.
    pub fn open(dir: &Path, name: &str, ips: &[IpAddr]) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io("create PKI directory", dir))?;
        let (server_ca, server) = ca(dir, "server-ca", &format!("{name}-server-ca"))?;
        let (client_ca, client) = ca(dir, "client-ca", &format!("{name}-client-ca"))?;
        let (sa_key, sa_pub) = (dir.join("sa.key"), dir.join("sa.pub"));
        if !sa_key.is_file() || !sa_pub.is_file() {
            key_pair(&sa_key, &sa_pub)?;
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
            crate::KUBERNETES_SERVICE_IP,
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
        pki.files.admin = pki.client("admin", "admin", &["system:masters"])?;
        Ok(pki)
    }

    /// The files, for [`crate::Spec::pki`].
    pub fn files(&self) -> &PkiFiles {
        &self.files
    }

    /// Issues (again) `<file>.crt`/`.key`: a serving certificate for `sans` (IP addresses and
    /// DNS names), signed by the server CA.
    pub fn serving(&self, file: &str, cn: &str, sans: &[String]) -> Result<CertPair> {
        let mut params = leaf(cn, &[], sans)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        issue(&self.dir, file, &params, &self.server)
    }

    /// `<file>.crt`/`.key`: a client identity, user `cn` in `groups` (at most two), signed by
    /// the client CA; made once and reused (a second call with the same file returns the first
    /// identity).
    pub fn client(&self, file: &str, cn: &str, groups: &[&str]) -> Result<CertPair> {
        let pair = pair(&self.dir, file);
        if pair.cert.is_file() && pair.key.is_file() {
            return Ok(pair);
        }
        let mut params = leaf(cn, groups, &[])?;
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

/// The parameters of a CA named `cn`.
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
        return Ok((pair.clone(), load_issuer(&pair)?));
    }
    let key = new_key()?;
    let mut params = ca_params(cn);
    validity(&mut params, CA_DAYS);
    let cert = params
        .self_signed(&key)
        .map_err(|e| rcgen_error(&format!("self-sign {cn}"), e))?;
    write_private(&pair.key, &key.serialize_pem())?;
    std::fs::write(&pair.cert, cert.pem()).map_err(io("write", &pair.cert))?;
    Ok((pair, Issuer::new(params, key)))
}

/// The CA of `pair` as an issuer: its subject read from the certificate, so what it signs chains
/// to it byte for byte. Keys in PKCS #8 (`PRIVATE KEY`, ECDSA or RSA) or PKCS #1 (`RSA PRIVATE
/// KEY`, as Cluster API and kubeadm write them).
fn load_issuer(pair: &CertPair) -> Result<Issuer<'static, KeyPair>> {
    let cert = std::fs::read_to_string(&pair.cert).map_err(io("read CA certificate", &pair.cert))?;
    let key_pem = std::fs::read_to_string(&pair.key).map_err(io("read CA key", &pair.key))?;
    let what = format!("CA key {}", pair.key.display());
    let block = pem_block(&key_pem).ok_or_else(|| Error::Invalid {
        what: what.clone(),
        detail: "no PEM block".into(),
    })?;
    let key = match block.0.as_str() {
        "RSA PRIVATE KEY" => KeyPair::try_from(rsa_pkcs1_to_pkcs8(&block.1)),
        _ => KeyPair::from_pem(&key_pem),
    }
    .map_err(|e| rcgen_error(&what, e))?;
    Issuer::from_ca_cert_pem(&cert, key).map_err(|e| rcgen_error(&format!("CA {}", pair.cert.display()), e))
}

/// The label and contents of the first PEM block of `text`.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    use base64::Engine as _;
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + 11..];
    let label_end = rest.find("-----")?;
    let label = rest[..label_end].to_string();
    let body_start = label_end + 5;
    let end = rest.find(&format!("-----END {label}-----"))?;
    let b64: String = rest[body_start..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some((label, der))
}

/// A PKCS #1 RSA private key wrapped as PKCS #8 (RFC 5208): `SEQUENCE { INTEGER 0, SEQUENCE {
/// rsaEncryption, NULL }, OCTET STRING pkcs1 }`.
fn rsa_pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = body.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(body);
        out
    }
    // OID 1.2.840.113549.1.1.1 and NULL.
    let algorithm = tlv(
        0x30,
        &[
            0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
        ],
    );
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend(algorithm);
    body.extend(tlv(0x04, pkcs1));
    tlv(0x30, &body)
}

/// Issues `<dir>/<file>.crt`/`.key` from the CA in `ca` (made elsewhere: see [`load_issuer`] for
/// the key formats): user `cn` in `groups` (at most two) for a client, or a server named by
/// `sans` (IP addresses and DNS names) when `sans` is not empty.
pub fn sign_with(
    ca: &CertPair,
    dir: &Path,
    file: &str,
    cn: &str,
    groups: &[&str],
    sans: &[String],
) -> Result<CertPair> {
    std::fs::create_dir_all(dir).map_err(io("create PKI directory", dir))?;
    let issuer = load_issuer(ca)?;
    let mut params = leaf(cn, groups, sans)?;
    params.extended_key_usages = vec![if sans.is_empty() {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    issue(dir, file, &params, &issuer)
}

/// A new P-256 key at `key` (mode 0600) and its public half at `public`: a service-account
/// signing key.
pub fn key_pair(key: &Path, public: &Path) -> Result<()> {
    let k = new_key()?;
    write_private(key, &k.serialize_pem())?;
    std::fs::write(public, k.public_key_pem()).map_err(io("write", public))
}

fn leaf(cn: &str, groups: &[&str], sans: &[String]) -> Result<CertificateParams> {
    let mut params =
        CertificateParams::new(sans.to_vec()).map_err(|e| rcgen_error(&format!("names of {cn}"), e))?;
    params.distinguished_name = DistinguishedName::new();
    // The API server takes each O as a group. rcgen keeps one value per attribute type, so the
    // second O is written under its OID as a type of its own: the same attribute on the wire.
    match groups {
        [] => {}
        [g] => params.distinguished_name.push(DnType::OrganizationName, *g),
        [g, h] => {
            params.distinguished_name.push(DnType::OrganizationName, *g);
            params
                .distinguished_name
                .push(DnType::CustomDnType(vec![2, 5, 4, 10]), *h);
        }
        _ => {
            return Err(Error::Invalid {
                what: format!("identity {cn}"),
                detail: format!(
                    "{} groups: a certificate made here carries at most two",
                    groups.len()
                ),
            });
        }
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
