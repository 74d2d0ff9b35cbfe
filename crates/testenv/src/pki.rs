//! Certificates and keys for one test control plane, made with the `openssl` command line tool
//! (client identities with several groups, which `rcgen` cannot write, and certificates signed
//! by Cluster API's RSA CAs):
//! a server CA (serving certificates of the API server and of webhooks), a client CA (client
//! identities; kube-controller-manager signs approved CSRs with it, so they authenticate), the admin
//! identity, and the service-account signing key. All keys are ECDSA P-256.

use std::path::{Path, PathBuf};
use std::process::Command;

use bootsman_controlplane::{CertPair, PkiFiles};

use crate::error::{Error, Result, io};

/// The PKI of one control plane.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    /// Signs serving certificates; the trust anchor of every client.
    pub server_ca: CertPair,
    /// Signs client certificates; the API server's `--client-ca-file`.
    pub client_ca: CertPair,
    /// The API server's serving certificate (127.0.0.1, localhost and the in-cluster names).
    pub apiserver: CertPair,
    /// `CN=admin, O=system:masters`.
    pub admin: CertPair,
    /// Service-account token signing key.
    pub service_account_key: PathBuf,
    /// Its public half, which verifies service-account tokens.
    pub service_account_pub: PathBuf,
}

impl Pki {
    /// Creates a fresh PKI in `dir`.
    pub fn create(dir: &Path) -> Result<Self> {
        Self::create_with_ips(dir, &[])
    }

    /// Creates a fresh PKI in `dir` whose API server certificate also names `extra_ips` (the
    /// address a lab network reaches the API server at).
    pub fn create_with_ips(dir: &Path, extra_ips: &[std::net::IpAddr]) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io("create PKI directory", dir))?;
        let server_ca = self_signed_ca(dir, "server-ca", "bootsman-testenv-server-ca")?;
        let client_ca = self_signed_ca(dir, "client-ca", "bootsman-testenv-client-ca")?;
        let mut pki = Self {
            dir: dir.to_path_buf(),
            apiserver: server_ca.clone(),
            admin: client_ca.clone(),
            service_account_key: dir.join("sa.key"),
            service_account_pub: dir.join("sa.pub"),
            server_ca,
            client_ca,
        };
        let mut sans: Vec<String> = [
            "IP:127.0.0.1",
            "DNS:localhost",
            "IP:10.0.0.1",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        sans.extend(extra_ips.iter().map(|ip| format!("IP:{ip}")));
        let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
        pki.apiserver = pki.serving("apiserver", &sans)?;
        pki.admin = pki.client("admin", "admin", &["system:masters"])?;
        key_pair(&pki.service_account_key, &pki.service_account_pub)?;
        Ok(pki)
    }

    /// The files a control plane is started with, `webhook` serving its webhooks.
    pub fn files(&self, webhook: CertPair) -> PkiFiles {
        PkiFiles {
            server_ca: self.server_ca.clone(),
            client_ca: self.client_ca.clone(),
            apiserver: self.apiserver.clone(),
            admin: self.admin.clone(),
            webhook,
            service_account_key: self.service_account_key.clone(),
            service_account_pub: self.service_account_pub.clone(),
        }
    }

    /// Issues a serving certificate for the given `subjectAltName` entries (`IP:…`, `DNS:…`),
    /// signed by the server CA.
    pub fn serving(&self, file: &str, sans: &[&str]) -> Result<CertPair> {
        let ext = format!("subjectAltName={}\nextendedKeyUsage=serverAuth\n", sans.join(","));
        self.issue(file, &format!("/CN={file}"), &ext, &self.server_ca)
    }

    /// Issues a client certificate with common name `cn` and one organization per group,
    /// signed by the client CA: the API server then authenticates it as user `cn` in `groups`.
    pub fn client(&self, file: &str, cn: &str, groups: &[&str]) -> Result<CertPair> {
        let mut subject = String::new();
        for g in groups {
            subject.push_str(&format!("/O={}", escape(g)));
        }
        subject.push_str(&format!("/CN={}", escape(cn)));
        self.issue(file, &subject, "extendedKeyUsage=clientAuth\n", &self.client_ca)
    }

    fn issue(&self, file: &str, subject: &str, ext: &str, ca: &CertPair) -> Result<CertPair> {
        issue(&self.dir, file, subject, ext, ca)
    }
}

/// Issues `<dir>/<file>.crt` and `.key` for `subject` (openssl `-subj` form) with the extensions
/// `ext` (openssl extension-file lines), signed by `ca`.
pub(crate) fn issue(dir: &Path, file: &str, subject: &str, ext: &str, ca: &CertPair) -> Result<CertPair> {
    let pair = CertPair {
        cert: dir.join(format!("{file}.crt")),
        key: dir.join(format!("{file}.key")),
    };
    let csr = dir.join(format!("{file}.csr"));
    let extfile = dir.join(format!("{file}.ext"));
    new_key(&pair.key)?;
    std::fs::write(&extfile, ext).map_err(io("write openssl extension file", &extfile))?;
    openssl(&[
        "req",
        "-new",
        "-key",
        p(&pair.key),
        "-subj",
        subject,
        "-out",
        p(&csr),
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        p(&csr),
        "-CA",
        p(&ca.cert),
        "-CAkey",
        p(&ca.key),
        // A serial of our own instead of `-CAcreateserial`: the shared `.srl` file is
        // read and rewritten by each call, so concurrent issues corrupted it.
        "-set_serial",
        &next_serial(),
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        p(&extfile),
        "-out",
        p(&pair.cert),
    ])?;
    Ok(pair)
}

/// A new P-256 key at `key` and its public half at `public`.
pub(crate) fn key_pair(key: &Path, public: &Path) -> Result<()> {
    new_key(key)?;
    openssl(&["pkey", "-in", p(key), "-pubout", "-out", p(public)])
}

fn self_signed_ca(dir: &Path, file: &str, cn: &str) -> Result<CertPair> {
    let pair = CertPair {
        cert: dir.join(format!("{file}.crt")),
        key: dir.join(format!("{file}.key")),
    };
    new_key(&pair.key)?;
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        p(&pair.key),
        "-subj",
        &format!("/CN={cn}"),
        "-days",
        "3650",
        "-sha256",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        p(&pair.cert),
    ])?;
    Ok(pair)
}

fn new_key(path: &Path) -> Result<()> {
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        p(path),
    ])
}

/// `openssl -subj` treats `/` and `=` specially inside values.
/// A certificate serial unique within this process and, with the time in it, across runs.
fn next_serial() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    format!("0x{:x}{:04x}{:08x}", nanos, n & 0xffff, std::process::id())
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('/', "\\/")
        .replace('=', "\\=")
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

fn openssl(args: &[&str]) -> Result<()> {
    let what = format!("openssl {}", args.first().copied().unwrap_or_default());
    let out = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|e| Error::Command {
            what: what.clone(),
            detail: format!("cannot run openssl (install the Debian package `openssl`): {e}"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            what,
            detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr)),
        })
    }
}
