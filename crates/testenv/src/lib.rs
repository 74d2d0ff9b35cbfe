//! # bootsman-testenv
//!
//! A real Kubernetes control plane for tests, run as local processes on loopback: etcd,
//! kube-apiserver (client-certificate authentication, `Node,RBAC` authorization, bootstrap tokens,
//! ValidatingAdmissionPolicy), kube-controller-manager (garbage collection, namespace deletion,
//! CSR signing by the cluster's client CA, bootstrap-token signer and cleaner) and, on request, the
//! Cluster API managers (core, kubeadm bootstrap, kubeadm control plane) with their webhooks served
//! on loopback. Our CRDs from `config/crd/` and the Cluster API CRDs are installed and established
//! before the first test runs, as `clusterctl init` leaves them: the Cluster API CRDs labelled for
//! clusterctl and the provider inventory (`providers.clusterctl.cluster.x-k8s.io`) filled in, so
//! the real `clusterctl` (built by `hack/testbin` too) works against it.
//!
//! ```no_run
//! # async fn t() {
//! let env = bootsman_testenv::TestEnv::shared().await; // one control plane per test binary
//! let ns = env.create_namespace("claim").await;        // a fresh namespace per test
//! let admin = env.client().await;
//! let host = env.client_for("byoh:host:h1", &["byoh:hosts"]).await; // any identity, for RBAC tests
//! # }
//! ```
//!
//! The binaries come from `hack/testbin` (built from Go modules into a cache outside the
//! repository; run automatically when missing). A test that needs the control plane fails loudly
//! when it cannot start one. Each component logs into the environment's folder; when a test
//! panics, the end of every log is printed. Components never outlive the test process: they are
//! killed on drop and, should the process die first, by the kernel (`setpriv --pdeathsig`).

mod capi;
mod crds;
mod error;
mod pki;
pub mod process;
mod testbin;
pub mod workload;

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use error::{Error, Result};
pub use pki::{CertPair, Pki};
pub use process::tail;
pub use testbin::{Testbin, repo_root};
pub use workload::Workload;

/// What to run besides etcd, kube-apiserver and kube-controller-manager.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Also run the Cluster API core, kubeadm bootstrap and kubeadm control-plane managers, with
    /// their admission and conversion webhooks registered by URL.
    pub capi: bool,
    /// Lifetime of the client certificates kube-controller-manager signs
    /// (`--cluster-signing-duration`; one year when `None`). Short values let a test watch
    /// certificate renewal happen.
    pub signing_duration: Option<Duration>,
    /// Also serve the API on this address (the API server binds every address of its network
    /// namespace and its certificate names this one): how lab hosts on a lab network reach it.
    /// Only loopback when `None`.
    pub advertise_address: Option<std::net::IpAddr>,
}

/// A running control plane. Dropping it stops every component.
#[derive(Debug)]
pub struct TestEnv {
    dir: PathBuf,
    pki: Pki,
    api_url: String,
    kubeconfig: PathBuf,
    testbin: Testbin,
    /// In start order; stopped in reverse.
    components: Vec<process::Component>,
    options: Options,
    /// Kustomizations applied so far (see [`TestEnv::apply_kustomization`]).
    applied: std::sync::Mutex<Vec<PathBuf>>,
}

const START_TIMEOUT: Duration = Duration::from_secs(120);

impl TestEnv {
    /// The control plane shared by all tests of this test binary (without Cluster API), started
    /// on first use. Panics with the reason when it cannot start.
    pub async fn shared() -> &'static TestEnv {
        static ENV: OnceLock<Result<TestEnv, String>> = OnceLock::new();
        shared_in(&ENV, Options::default()).await
    }

    /// The shared control plane with the Cluster API managers running.
    pub async fn shared_with_capi() -> &'static TestEnv {
        static ENV: OnceLock<Result<TestEnv, String>> = OnceLock::new();
        shared_in(
            &ENV,
            Options {
                capi: true,
                ..Options::default()
            },
        )
        .await
    }

    /// Starts a control plane of its own (for tests that must not share one, and for
    /// `hack/testenv up`).
    pub async fn start(options: Options) -> Result<TestEnv> {
        install_panic_hook();
        let testbin = Testbin::locate()?;
        let dir = new_env_dir()?;
        let started = Instant::now();
        let pki = Pki::create_with_ips(&dir.join("pki"), options.advertise_address.as_slice())?;
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(error::io("create log directory", &logs))?;

        let mut env = TestEnv {
            api_url: String::new(),
            kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            pki,
            testbin,
            components: Vec::new(),
            options,
            applied: std::sync::Mutex::new(Vec::new()),
        };
        env.start_etcd_and_apiserver()?;
        let client = env.wait_for_apiserver().await?;

        let mut all_crds = crds::read_dir(&repo_root().join("config/crd"))?;
        let capi_ports = capi::Ports::allocate()?;
        let mut capi_crds = crds::read_dir(&env.testbin.capi_crds())?;
        if options.capi {
            capi::route_conversion_to_managers(&mut capi_crds, &capi_ports, &env.pki)?;
        } else {
            capi::serve_storage_version_only(&mut capi_crds);
        }
        capi::label_contract_versions(&mut capi_crds);
        capi::label_for_clusterctl(&mut capi_crds);
        all_crds.extend(capi_crds);
        all_crds.extend(crds::read_dir(&env.testbin.clusterctl_crds())?);
        crds::install(&client, &all_crds).await?;
        // Cluster API as `clusterctl init` leaves it: labelled CRDs and the provider inventory.
        capi::write_inventory(&client, &env.testbin.capi_version()?).await?;

        // The garbage collector discovers resources at start and then only every 30 s, so it
        // starts after the CRDs are served.
        env.start_controller_manager()?;
        env.wait_for_controller_manager(&client).await?;

        if options.capi {
            let managers = capi::start(&env, &capi_ports, &client).await?;
            env.components.extend(managers);
        }
        register_logs(&env);
        eprintln!(
            "testenv: control plane up at {} in {:.1}s (logs in {})",
            env.api_url,
            started.elapsed().as_secs_f64(),
            env.log_dir().display()
        );
        Ok(env)
    }

    fn start_etcd_and_apiserver(&mut self) -> Result<()> {
        let (etcd_args, etcd_url) = etcd_flags("testenv", &self.dir.join("etcd"))?;
        let etcd = self.spawn("etcd", "etcd", etcd_args)?;
        self.components.push(etcd);

        let port = free_port()?;
        self.api_url = format!("https://127.0.0.1:{port}");
        let pki = &self.pki;
        let advertise = self.options.advertise_address.map(|a| a.to_string());
        let mut args = ApiserverFlags {
            etcd_url: &etcd_url,
            address: advertise.as_deref().unwrap_or("127.0.0.1"),
            port,
            serving: &pki.apiserver,
            client_ca: &pki.client_ca.cert,
            cert_dir: self.dir.join("apiserver"),
            service_cidr: "10.0.0.0/24",
            service_account_pub: &pki.service_account_pub,
            service_account_key: &pki.service_account_key,
        }
        .args();
        if advertise.is_some() {
            // Loopback for the harness and the local controllers, the advertised address for the
            // lab network.
            args.retain(|a| !a.starts_with("--bind-address="));
            args.push("--bind-address=0.0.0.0".into());
        }
        let apiserver = self.spawn("kube-apiserver", "kube-apiserver", args)?;
        self.components.push(apiserver);
        write_kubeconfig(
            &self.kubeconfig,
            &self.api_url,
            &self.pki.server_ca.cert,
            &self.pki.admin,
        )?;
        Ok(())
    }

    fn start_controller_manager(&mut self) -> Result<()> {
        let pki = &self.pki;
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
            "--service-cluster-ip-range=10.0.0.0/24".into(),
        ];
        if let Some(d) = self.options.signing_duration {
            args.push(format!("--cluster-signing-duration={}s", d.as_secs()));
        }
        let kcm = self.spawn("kube-controller-manager", "kube-controller-manager", args)?;
        self.components.push(kcm);
        Ok(())
    }

    fn spawn(&self, name: &str, binary: &str, args: Vec<String>) -> Result<process::Component> {
        process::Component::spawn(
            name,
            &self.testbin.bin(binary),
            &args,
            &[],
            self.log_dir().join(format!("{name}.log")),
        )
    }

    async fn wait_for_apiserver(&self) -> Result<kube::Client> {
        wait_for_readyz(&self.kubeconfig, &self.components, "kube-apiserver").await
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
                        secs: 120,
                    },
                    |c| c.failed("did not create the default ServiceAccount"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn component(&self, name: &str) -> Option<&process::Component> {
        self.components.iter().find(|c| c.name() == name)
    }

    /// An admin client (`system:masters`), bound to the calling test's runtime.
    pub async fn client(&self) -> kube::Client {
        client_from(&self.kubeconfig)
            .await
            .unwrap_or_else(|e| panic!("testenv admin client: {e}"))
    }

    /// A client that authenticates with a client certificate for user `cn` in `groups`, signed by
    /// the cluster's client CA: it has exactly the permissions RBAC grants that identity.
    pub async fn client_for(&self, cn: &str, groups: &[&str]) -> kube::Client {
        let path = self
            .kubeconfig_for(cn, groups)
            .unwrap_or_else(|e| panic!("testenv identity {cn}: {e}"));
        client_from(&path)
            .await
            .unwrap_or_else(|e| panic!("testenv client for {cn}: {e}"))
    }

    /// Writes a kubeconfig for user `cn` in `groups` (see [`Self::client_for`]) and returns its path.
    pub fn kubeconfig_for(&self, cn: &str, groups: &[&str]) -> Result<PathBuf> {
        let file = format!("user-{}", unique_suffix());
        let pair = self.pki.client(&file, cn, groups)?;
        self.kubeconfig_with_cert(&pair)
    }

    /// Writes a kubeconfig that authenticates with the given client certificate (for example one
    /// issued through a CertificateSigningRequest) and returns its path.
    pub fn kubeconfig_with_cert(&self, pair: &CertPair) -> Result<PathBuf> {
        let path = self.dir.join(format!("cert-{}.kubeconfig", unique_suffix()));
        write_kubeconfig(&path, &self.api_url, &self.pki.server_ca.cert, pair)?;
        Ok(path)
    }

    /// A client that authenticates with the given client certificate.
    pub async fn client_with_cert(&self, pair: &CertPair) -> kube::Client {
        let path = self
            .kubeconfig_with_cert(pair)
            .unwrap_or_else(|e| panic!("testenv kubeconfig: {e}"));
        client_from(&path)
            .await
            .unwrap_or_else(|e| panic!("testenv client with {}: {e}", pair.cert.display()))
    }

    /// Creates a namespace named `<prefix>-<random>` and returns its name.
    pub async fn create_namespace(&self, prefix: &str) -> String {
        let prefix: String = prefix.chars().take(50).collect();
        let name = format!("{}-{}", prefix.trim_end_matches('-'), unique_suffix());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client().await)
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("testenv: create namespace {name}: {e}"));
        name
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>` of the API server.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// `https://<advertise address>:<port>` when [`Options::advertise_address`] is set (how lab
    /// hosts reach the API server), else [`Self::api_url`].
    pub fn advertised_url(&self) -> String {
        match self.options.advertise_address {
            Some(a) => self.api_url.replace("127.0.0.1", &a.to_string()),
            None => self.api_url.clone(),
        }
    }

    /// Certificates and keys of this control plane.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The binaries this environment runs (also `kubectl` and `helm`).
    pub fn testbin(&self) -> &Testbin {
        &self.testbin
    }

    /// Folder of the component logs.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Folder of this environment (PKI, kubeconfigs, etcd data, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the Cluster API managers run.
    pub fn has_capi(&self) -> bool {
        self.options.capi
    }

    /// Fails with the log tail of the first component that has stopped.
    pub fn check_running(&self) -> Result<()> {
        self.components
            .iter()
            .try_for_each(process::Component::check_running)
    }

    /// Applies the kustomization in `dir` (`kubectl apply -k`) once per control plane, as an
    /// installation does. Tests of one binary share the control plane and run in parallel; two
    /// concurrent client-side applies would both try to create and one would fail with
    /// AlreadyExists, so applies are serialized and a directory already applied is skipped.
    pub fn apply_kustomization(&self, dir: &Path) -> Result<()> {
        let mut applied = self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if applied.iter().any(|d| d == dir) {
            return Ok(());
        }
        let out = self
            .kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-k"])
            .arg(dir)
            .output()
            .map_err(error::io("run kubectl", dir))?;
        if !out.status.success() {
            return Err(Error::Command {
                what: format!("kubectl apply -k {}", dir.display()),
                detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr)),
            });
        }
        applied.push(dir.to_path_buf());
        Ok(())
    }

    /// `kubectl` from the test binaries, pointed at this control plane.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.testbin.bin("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        for c in self.components.iter().rev() {
            c.stop();
        }
        unregister_logs(self);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

async fn shared_in(cell: &'static OnceLock<Result<TestEnv, String>>, options: Options) -> &'static TestEnv {
    // Started on a thread of its own with a runtime of its own, so nothing of the environment is
    // tied to the runtime of the test that happened to come first.
    let env = tokio::task::spawn_blocking(move || {
        cell.get_or_init(|| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(TestEnv::start(options)).map_err(|e| e.to_string())
            })
            .join()
            .unwrap_or_else(|_| Err("the start-up thread panicked".into()))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("testenv start-up task: {e}"));
    match env {
        Ok(env) => env,
        Err(e) => panic!("testenv: the test control plane could not start:\n{e}"),
    }
}

/// Polls `check` every 200 ms until it returns `Some`, or panics after `timeout` saying what it was
/// waiting for and what it last saw.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if Instant::now() > deadline {
            panic!(
                "timed out after {}s waiting for {what}; last seen: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Flags of a single-member etcd named `name` with its data in `data_dir`, on two free loopback
/// ports, and its client URL.
fn etcd_flags(name: &str, data_dir: &Path) -> Result<(Vec<String>, String)> {
    let client_url = format!("http://127.0.0.1:{}", free_port()?);
    let peer_url = format!("http://127.0.0.1:{}", free_port()?);
    let args = vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={name}={peer_url}"),
        "--unsafe-no-fsync=true".into(),
    ];
    Ok((args, client_url))
}

/// What differs between the kube-apiservers the harness runs (the test control plane and the
/// stand-in child control plane); everything else is the same.
struct ApiserverFlags<'a> {
    etcd_url: &'a str,
    /// Bind and advertise address.
    address: &'a str,
    port: u16,
    serving: &'a CertPair,
    client_ca: &'a Path,
    cert_dir: PathBuf,
    service_cidr: &'a str,
    service_account_pub: &'a Path,
    service_account_key: &'a Path,
}

impl ApiserverFlags<'_> {
    fn args(&self) -> Vec<String> {
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
async fn wait_for_readyz(
    kubeconfig: &Path,
    components: &[process::Component],
    apiserver: &str,
) -> Result<kube::Client> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        components
            .iter()
            .try_for_each(process::Component::check_running)?;
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

async fn client_from(path: &Path) -> Result<kube::Client> {
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

fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &CertPair) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\nusers:\n- name: user\n  user:\n    client-certificate: {}\n    client-key: {}\n\
         contexts:\n- name: testenv\n  context:\n    cluster: testenv\n    user: user\ncurrent-context: testenv\n",
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
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
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
fn unique_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mixed = (t as u64) ^ (u64::from(std::process::id()) << 24) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("{:06x}", mixed.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 40)
}

/// `$TMPDIR/bootsman-testenv/<pid>-<suffix>`; folders of earlier runs whose process is gone are
/// removed first (their components died with them).
fn new_env_dir() -> Result<PathBuf> {
    let root = std::env::temp_dir().join("bootsman-testenv");
    std::fs::create_dir_all(&root).map_err(error::io("create", &root))?;
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = root.join(format!("{}-{}", std::process::id(), unique_suffix()));
    std::fs::create_dir_all(&dir).map_err(error::io("create", &dir))?;
    Ok(dir)
}

/// The folder of one live environment and the (component, log file) pairs in it.
type EnvLogs = (PathBuf, Vec<(String, PathBuf)>);

/// Logs of the environments alive in this process, printed when a test panics.
static LOGS: Mutex<Vec<EnvLogs>> = Mutex::new(Vec::new());

fn register_logs(env: &TestEnv) {
    let logs = env
        .components
        .iter()
        .map(|c| (c.name().to_string(), c.log().to_path_buf()))
        .collect();
    if let Ok(mut all) = LOGS.lock() {
        all.push((env.dir.clone(), logs));
    }
}

fn unregister_logs(env: &TestEnv) {
    if let Ok(mut all) = LOGS.lock() {
        all.retain(|(dir, _)| dir != &env.dir);
    }
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            static PRINTED: AtomicU64 = AtomicU64::new(0);
            let Ok(all) = LOGS.lock() else { return };
            for (dir, logs) in all.iter() {
                if PRINTED.fetch_add(1, Ordering::Relaxed) == 0 {
                    for (name, log) in logs {
                        eprintln!(
                            "---- testenv: last lines of {name} ({}) ----\n{}",
                            log.display(),
                            tail(log, 15)
                        );
                    }
                } else {
                    eprintln!(
                        "---- testenv: component logs in {} ----",
                        dir.join("logs").display()
                    );
                }
            }
        }));
    });
}
