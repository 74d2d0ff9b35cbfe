//! # bootsman-controlplane
//!
//! A Kubernetes control plane run as local processes: etcd, kube-apiserver (client-certificate
//! authentication, `Node,RBAC` authorization, bootstrap tokens), kube-controller-manager (garbage
//! collection, namespace deletion, CSR signing by the client CA, the bootstrap-token signer and
//! cleaner) and, on request, the Cluster API managers (core, kubeadm bootstrap, kubeadm control
//! plane) with their webhooks served on loopback, the Cluster API CRDs labelled and inventoried
//! as `clusterctl init` leaves them.
//!
//! It serves twice:
//! - as the **bootstrap control plane** `<site>-control-plane` of `bootsmanctl install`: its
//!   folder is the site's state (`~/.local/share/bootsman/<site>/bootstrap/`), its PKI
//!   ([`pki::Pki`]) and etcd data are kept, etcd syncs to disk, and a second start from the same
//!   folder is the same cluster with the same CA, ports and objects;
//! - as the test harness's control plane (`bootsman-testenv`), in a fresh folder per run.
//!
//! Everything it runs comes from a [`bundle::Bundle`]. Components are children of the calling
//! process and die with it ([`process`]); [`ControlPlane::start`] on the same folder brings them
//! back.
//!
//! Folder layout: `etcd/` (data), `logs/<component>.log`, `apiserver/`, `capi-webhook-certs/`,
//! `admin.kubeconfig`, `ports.json` (the ports chosen on the first start, reused after).

pub mod bundle;
pub mod capi;
pub mod error;
pub mod manifests;
pub mod pki;
pub mod process;

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use bundle::Bundle;
pub use error::{Error, Result};
pub use pki::{CertPair, PkiFiles};
pub use process::{Component, Isolation, tail};

/// Field manager of everything the control plane applies itself.
pub const FIELD_MANAGER: &str = "bootsman-controlplane";

/// The Service network of every control plane run here.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The `kubernetes` Service's address in it: how Pods reach the API server, so its serving
/// certificate names it.
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

/// How long a component may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// What to start, and where.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The control plane's name: etcd's member name and the kubeconfig's cluster name.
    pub name: String,
    /// Its folder (see the crate header).
    pub dir: PathBuf,
    /// Where the programs and manifests come from.
    pub bundle: Bundle,
    /// Its certificates and keys.
    pub pki: PkiFiles,
    /// Serve the API on this address instead of loopback (its certificate must name it): how
    /// hosts reach it. Every client, local ones too, then uses it.
    pub address: Option<IpAddr>,
    /// The API server's port; a free one, kept in `ports.json`, when `None`.
    pub port: Option<u16>,
    /// Also run the Cluster API managers, with their admission and conversion webhooks.
    pub capi: bool,
    /// CRDs to install besides Cluster API's (Bootsman's own).
    pub crds: Vec<CustomResourceDefinition>,
    /// Lifetime of the client certificates kube-controller-manager signs
    /// (`--cluster-signing-duration`; one year when `None`).
    pub signing_duration: Option<Duration>,
    /// etcd syncs every write to disk. Off only where the data is thrown away after the run.
    pub durable: bool,
    /// How each component is set apart from the machine (see [`Isolation`]).
    pub isolation: Isolation,
}

/// The ports of one control plane, chosen on its first start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ports {
    /// kube-apiserver.
    pub api: u16,
    /// etcd's client URL.
    pub etcd_client: u16,
    /// etcd's peer URL.
    pub etcd_peer: u16,
    /// The Cluster API managers.
    pub capi: capi::Ports,
}

impl Ports {
    fn allocate(api: Option<u16>) -> Result<Self> {
        Ok(Self {
            api: match api {
                Some(p) => p,
                None => free_port()?,
            },
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            capi: capi::Ports {
                webhook: [free_port()?, free_port()?, free_port()?],
                health: [free_port()?, free_port()?, free_port()?],
            },
        })
    }

    /// The ports saved in `dir`, else new ones (then saved); `api` overrides the saved API port.
    fn load_or_allocate(dir: &Path, api: Option<u16>) -> Result<Self> {
        let path = dir.join("ports.json");
        let mut ports = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Invalid {
                what: path.display().to_string(),
                detail: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::allocate(api)?,
            Err(e) => return Err(error::io("read", &path)(e)),
        };
        if let Some(api) = api {
            ports.api = api;
        }
        let text = serde_json::to_vec_pretty(&ports).unwrap_or_default();
        std::fs::write(&path, text).map_err(error::io("write", &path))?;
        Ok(ports)
    }
}

/// A running control plane. Dropping it stops every component, in reverse start order.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    api_url: String,
    kubeconfig: PathBuf,
    ports: Ports,
    components: Vec<Component>,
}

impl ControlPlane {
    /// Starts (or restarts, from what `spec.dir` holds) the control plane and returns once the
    /// API server is ready, every CRD is established, kube-controller-manager runs and, with
    /// [`Spec::capi`], the Cluster API managers are ready and their webhooks registered.
    pub async fn start(spec: &Spec) -> Result<Self> {
        let logs = spec.dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(error::io("create log directory", &logs))?;
        let ports = Ports::load_or_allocate(&spec.dir, spec.port)?;
        // On its address when it has one (another service of the machine may hold the same port
        // on another address), else on loopback.
        let host = spec.address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let mut cp = Self {
            api_url: format!("https://{}", std::net::SocketAddr::new(host, ports.api)),
            kubeconfig: spec.dir.join("admin.kubeconfig"),
            dir: spec.dir.clone(),
            ports,
            components: Vec::new(),
        };
        cp.start_etcd_and_apiserver(spec)?;
        let client = wait_for_readyz(&cp.kubeconfig, &cp.components, "kube-apiserver").await?;

        let mut crds = spec.crds.clone();
        let ca = std::fs::read(&spec.pki.server_ca.cert)
            .map_err(error::io("read server CA", &spec.pki.server_ca.cert))?;
        let serve = capi::Serve::Loopback(cp.ports.capi);
        crds.extend(capi::crds(&spec.bundle, spec.capi.then_some(&serve), &ca)?);
        manifests::install(&client, &crds).await?;
        // Cluster API as `clusterctl init` leaves it: labelled CRDs and the provider inventory.
        capi::write_inventory(&client, &spec.bundle.capi_version()?).await?;

        // The garbage collector discovers resources at start and then only every 30 s, so it
        // starts after the CRDs are served.
        cp.start_controller_manager(spec)?;
        cp.wait_for_controller_manager(&client).await?;

        if spec.capi {
            let setup = capi::Setup {
                bundle: &spec.bundle,
                dir: &spec.dir,
                logs: &logs,
                kubeconfig: &cp.kubeconfig,
                webhook: &spec.pki.webhook,
                server_ca: &spec.pki.server_ca.cert,
                ports: &cp.ports.capi,
                isolation: spec.isolation,
            };
            let managers = capi::start(&setup, &client).await?;
            cp.components.extend(managers);
        }
        Ok(cp)
    }

    fn start_etcd_and_apiserver(&mut self, spec: &Spec) -> Result<()> {
        let (mut etcd_args, etcd_url) = etcd_flags(
            &spec.name,
            &spec.dir.join("etcd"),
            self.ports.etcd_client,
            self.ports.etcd_peer,
        );
        if !spec.durable {
            etcd_args.push("--unsafe-no-fsync=true".into());
        }
        let etcd = self.spawn(spec, "etcd", "etcd", etcd_args)?;
        self.components.push(etcd);

        let advertise = spec.address.map(|a| a.to_string());
        let args = ApiserverFlags {
            etcd_url: &etcd_url,
            address: advertise.as_deref().unwrap_or("127.0.0.1"),
            port: self.ports.api,
            serving: &spec.pki.apiserver,
            client_ca: &spec.pki.client_ca.cert,
            cert_dir: spec.dir.join("apiserver"),
            service_cidr: SERVICE_CIDR,
            service_account_pub: &spec.pki.service_account_pub,
            service_account_key: &spec.pki.service_account_key,
        }
        .args();
        let apiserver = self.spawn(spec, "kube-apiserver", "kube-apiserver", args)?;
        self.components.push(apiserver);
        write_kubeconfig(
            &self.kubeconfig,
            &spec.name,
            &self.api_url,
            &spec.pki.server_ca.cert,
            &spec.pki.admin,
        )
    }

    fn start_controller_manager(&mut self, spec: &Spec) -> Result<()> {
        let pki = &spec.pki;
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            // The default set plus the two bootstrap-token controllers, which are off by default.
            "--controllers=*,bootstrapsigner,tokencleaner".into(),
            "--use-service-account-credentials=true".into(),
            format!(
                "--service-account-private-key-file={}",
                pki.service_account_key.display()
            ),
            format!("--root-ca-file={}", pki.server_ca.cert.display()),
            format!("--cluster-signing-cert-file={}", pki.client_ca.cert.display()),
            format!("--cluster-signing-key-file={}", pki.client_ca.key.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        ];
        if let Some(d) = spec.signing_duration {
            args.push(format!("--cluster-signing-duration={}s", d.as_secs()));
        }
        let kcm = self.spawn(spec, "kube-controller-manager", "kube-controller-manager", args)?;
        self.components.push(kcm);
        Ok(())
    }

    fn spawn(&self, spec: &Spec, name: &str, binary: &str, args: Vec<String>) -> Result<Component> {
        Component::spawn_with(
            name,
            &spec.bundle.require(binary)?,
            &args,
            &[],
            self.log_dir().join(format!("{name}.log")),
            spec.isolation,
        )
    }

    /// The service-account controller creates `default/default` once kube-controller-manager runs.
    async fn wait_for_controller_manager(&self, client: &kube::Client) -> Result<()> {
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = self.component("kube-controller-manager") {
                c.check_running()?;
            }
            if sa.get_opt("default").await.ok().flatten().is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.component("kube-controller-manager").map_or(
                    Error::Timeout {
                        what: "kube-controller-manager".into(),
                        secs: START_TIMEOUT.as_secs(),
                    },
                    |c| c.failed("did not create the default ServiceAccount"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The running component called `name`.
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name() == name)
    }

    /// Every component, in start order.
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    /// Adds a process (a controller started next to the control plane) to be watched by
    /// [`Self::check_running`] and stopped before the control plane.
    pub fn adopt(&mut self, c: Component) {
        self.components.push(c);
    }

    /// Stops the component called `name` and forgets it (a controller that must not run any
    /// more while the control plane goes on serving). Returns whether one ran under that name.
    pub fn stop_component(&mut self, name: &str) -> bool {
        let Some(i) = self.components.iter().position(|c| c.name() == name) else {
            return false;
        };
        self.components.remove(i).stop();
        true
    }

    /// An admin client (`system:masters`).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig).await
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://<address>:<port>` of the API server (`127.0.0.1` without [`Spec::address`]).
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The ports in use.
    pub fn ports(&self) -> &Ports {
        &self.ports
    }

    /// Folder of the component logs.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// The control plane's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fails with the log tail of the first component that has stopped.
    pub fn check_running(&self) -> Result<()> {
        self.components.iter().try_for_each(Component::check_running)
    }

    /// Stops every component, the last started first.
    pub fn stop(&self) {
        for c in self.components.iter().rev() {
            c.stop();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Flags of a single-member etcd named `name` with its data in `data_dir`, on two loopback
/// ports, and its client URL.
pub fn etcd_flags(name: &str, data_dir: &Path, client_port: u16, peer_port: u16) -> (Vec<String>, String) {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let args = vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={name}={peer_url}"),
    ];
    (args, client_url)
}

/// What differs between the kube-apiservers run here (a control plane, the test harness's
/// stand-in child control plane); everything else is the same.
#[derive(Debug)]
pub struct ApiserverFlags<'a> {
    /// etcd's client URL.
    pub etcd_url: &'a str,
    /// Bind and advertise address.
    pub address: &'a str,
    /// Secure port.
    pub port: u16,
    /// Serving certificate.
    pub serving: &'a CertPair,
    /// CA of the client certificates it accepts.
    pub client_ca: &'a Path,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
    /// The Service network.
    pub service_cidr: &'a str,
    /// Verifies service-account tokens.
    pub service_account_pub: &'a Path,
    /// Signs service-account tokens.
    pub service_account_key: &'a Path,
}

impl ApiserverFlags<'_> {
    /// The command line.
    pub fn args(&self) -> Vec<String> {
        vec![
            format!("--etcd-servers={}", self.etcd_url),
            format!("--bind-address={}", self.address),
            format!("--advertise-address={}", self.address),
            format!("--secure-port={}", self.port),
            format!("--tls-cert-file={}", self.serving.cert.display()),
            format!("--tls-private-key-file={}", self.serving.key.display()),
            format!("--cert-dir={}", self.cert_dir.display()),
            format!("--client-ca-file={}", self.client_ca.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-bootstrap-token-auth=true".into(),
            format!("--service-cluster-ip-range={}", self.service_cidr),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!(
                "--service-account-key-file={}",
                self.service_account_pub.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                self.service_account_key.display()
            ),
            "--allow-privileged=true".into(),
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
        ]
    }
}

/// Polls `/readyz` through `kubeconfig` until it answers `ok`; fails with the log tail of the
/// first of `components` that stops, or of `apiserver` after the start timeout.
pub async fn wait_for_readyz(
    kubeconfig: &Path,
    components: &[Component],
    apiserver: &str,
) -> Result<kube::Client> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        components.iter().try_for_each(Component::check_running)?;
        if let Ok(client) = client_from(kubeconfig).await
            && let Ok(req) = http::Request::get("/readyz").body(Vec::new())
            && client
                .request_text(req)
                .await
                .is_ok_and(|body| body.trim() == "ok")
        {
            return Ok(client);
        }
        if Instant::now() > deadline {
            return Err(components.iter().find(|c| c.name() == apiserver).map_or(
                Error::Timeout {
                    what: format!("{apiserver} /readyz"),
                    secs: START_TIMEOUT.as_secs(),
                },
                |c| c.failed("did not become ready"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(path).map_err(|e| Error::Invalid {
        what: path.display().to_string(),
        detail: e.to_string(),
    })?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Invalid {
            what: path.display().to_string(),
            detail: e.to_string(),
        })?;
    kube::Client::try_from(cfg).map_err(error::kube(format!("client from {}", path.display())))
}

/// Writes a kubeconfig for cluster `name` at `server`, trusting `ca`, authenticating with `user`.
pub fn write_kubeconfig(path: &Path, name: &str, server: &str, ca: &Path, user: &CertPair) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\nusers:\n- name: user\n  user:\n    client-certificate: {}\n    client-key: {}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: user\ncurrent-context: {name}\n",
        ca.display(),
        user.cert.display(),
        user.key.display()
    );
    std::fs::write(path, text).map_err(error::io("write kubeconfig", path))
}

/// A free TCP port on 127.0.0.1, for a component to listen on.
///
/// Chosen below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`): a port from that
/// range (what binding port 0 gives) can be taken by any outgoing connection between this check
/// and the component's own bind, and the component then fails with "address already in use".
/// Below it only listeners take ports, and this checks that none holds it. Each process starts at
/// its own place in the range and never hands out a port twice.
pub fn free_port() -> Result<u16> {
    const FLOOR: u32 = 15000;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: OnceLock<u64> = OnceLock::new();
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    if ephemeral_low > FLOOR + 1000 {
        let span = u64::from(ephemeral_low - FLOOR);
        let start = *START.get_or_init(|| u64::from_str_radix(&unique_suffix(), 16).unwrap_or(0));
        for _ in 0..span {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = FLOOR as u64 + (start + n * 7919) % span;
            let Ok(port) = u16::try_from(port) else { continue };
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").map_err(error::io("bind a loopback port", "127.0.0.1:0"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(error::io("read a loopback port", "127.0.0.1:0"))
}

/// Six hex digits that differ between calls, processes and runs.
pub fn unique_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mixed = (t as u64) ^ (u64::from(std::process::id()) << 24) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("{:06x}", mixed.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 40)
}
