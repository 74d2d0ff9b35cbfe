//! # bootsman-testenv
//!
//! A real Kubernetes control plane for tests (a `bootsman-controlplane` in a fresh folder, with a
//! PKI that can issue any identity), run as local processes on loopback: etcd,
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

mod error;
mod testbin;
pub mod workload;

pub use bootsman_controlplane::process;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use bootsman_controlplane::{ControlPlane, Spec, client_from, unique_suffix, write_kubeconfig};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;

pub use bootsman_controlplane::pki::Pki;
pub use bootsman_controlplane::{CertPair, Error, Result, free_port, tail};
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
    /// Serve the API on this address instead of loopback (its certificate names it): how lab
    /// hosts on a lab network reach it, and every client of the harness uses it too.
    pub advertise_address: Option<std::net::IpAddr>,
}

/// A running control plane. Dropping it stops every component.
#[derive(Debug)]
pub struct TestEnv {
    dir: PathBuf,
    pki: Pki,
    testbin: Testbin,
    cp: ControlPlane,
    options: Options,
    /// Kustomizations applied so far (see [`TestEnv::apply_kustomization`]).
    applied: std::sync::Mutex<Vec<PathBuf>>,
}

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
        let pki = Pki::open(&dir.join("pki"), "testenv", options.advertise_address.as_slice())?;
        let spec = Spec {
            name: "testenv".into(),
            dir: dir.clone(),
            bundle: (*testbin).clone(),
            pki: pki.files().clone(),
            address: options.advertise_address,
            port: None,
            capi: options.capi,
            crds: bootsman_controlplane::manifests::read_dir(&repo_root().join("config/crd"))?,
            signing_duration: options.signing_duration,
            durable: false,
            isolation: bootsman_controlplane::Isolation::Shared,
        };
        let cp = ControlPlane::start(&spec).await?;
        let env = TestEnv {
            dir,
            pki,
            testbin,
            cp,
            options,
            applied: std::sync::Mutex::new(Vec::new()),
        };
        register_logs(&env);
        eprintln!(
            "testenv: control plane up at {} in {:.1}s (logs in {})",
            env.api_url(),
            started.elapsed().as_secs_f64(),
            env.log_dir().display()
        );
        Ok(env)
    }

    /// An admin client (`system:masters`), bound to the calling test's runtime.
    pub async fn client(&self) -> kube::Client {
        client_from(self.cp.kubeconfig())
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
        write_kubeconfig(
            &path,
            "testenv",
            self.api_url(),
            &self.pki.files().server_ca.cert,
            pair,
        )?;
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
        self.cp.kubeconfig()
    }

    /// `https://127.0.0.1:<port>` of the API server (its advertise address instead when
    /// [`Options::advertise_address`] is set).
    pub fn api_url(&self) -> &str {
        self.cp.api_url()
    }

    /// How lab hosts reach the API server: [`Self::api_url`].
    pub fn advertised_url(&self) -> String {
        self.api_url().to_string()
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
        self.cp.log_dir()
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
        self.cp.check_running()
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
        cmd.env("KUBECONFIG", self.cp.kubeconfig());
        cmd
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.cp.stop();
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
        .cp
        .components()
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
