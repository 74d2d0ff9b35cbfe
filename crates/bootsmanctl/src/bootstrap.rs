//! The bootstrap control plane `<site>-control-plane` of `bootsmanctl install`: a
//! [`bootsman_controlplane::ControlPlane`] with the Cluster API managers, in the site's state
//! folder (`<state>/bootstrap/`), serving at the Site's `spec.bootstrap` address and port;
//! the Bootsman chart installed into it with Helm (its RBAC, the host roles and the host policy;
//! its Deployments wait for nodes this cluster never has); and `bootsman-provider` and
//! `bootsman-operator` as local processes next to it, each with a client certificate for its
//! chart ServiceAccount, so they hold exactly the chart's rights.
//!
//! Everything runs as children of `bootsmanctl`, as root each in a mount and a PID namespace of
//! its own, and dies with it (`setpriv --pdeathsig`): a
//! second `install` starts the same control plane again from the folder, with the same CA,
//! ports and objects, and the enrolled hosts reconnect. Once the pivot has begun, the Bootsman
//! controllers are never started here again (see [`crate::pivot`]): the objects they would act
//! on belong to the infrastructure cluster by then.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use bootsman_controlplane::pki::Pki;
use bootsman_controlplane::{Bundle, Component, ControlPlane, Isolation, Spec, free_port, write_kubeconfig};

use crate::site::Site;

/// Namespace of the chart and of the controllers' identities.
pub const NAMESPACE: &str = "bootsman-system";
/// The Helm release name.
pub const RELEASE: &str = "bootsman";
/// The controllers run next to the control plane.
pub const CONTROLLERS: [&str; 2] = ["bootsman-provider", "bootsman-operator"];

/// Where the programs and the chart come from.
#[derive(Clone, Debug)]
pub struct Sources {
    /// The bundle: control-plane programs, Cluster API, helm (see
    /// [`bootsman_controlplane::bundle`]).
    pub bundle: PathBuf,
    /// The Bootsman chart (a folder).
    pub chart: PathBuf,
}

/// The running bootstrap control plane and its controllers.
#[derive(Debug)]
pub struct Bootstrap {
    /// The control plane; the controllers are among its components.
    pub cp: ControlPlane,
    /// `https://<address>:<port>`, as hosts reach it.
    pub server: String,
    /// PEM of the CA hosts trust it by.
    pub ca_pem: Vec<u8>,
}

impl Bootstrap {
    /// The admin kubeconfig (naming the API server at its address).
    pub fn kubeconfig(&self) -> &Path {
        self.cp.kubeconfig()
    }
}

/// Starts (or starts again, from the saved folder) the bootstrap control plane of `site`,
/// installs or upgrades the chart, and, with `controllers`, starts Bootsman's controllers;
/// returns when they are ready.
pub async fn start(
    site: &Site,
    sources: &Sources,
    controllers: bool,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Bootstrap> {
    let dir = site.state_dir().join("bootstrap");
    let address: IpAddr = site
        .spec
        .bootstrap
        .address
        .parse()
        .context("spec.bootstrap.address")?;
    let bundle = Bundle::open(&sources.bundle).context("--bundle")?;
    bundle.require("helm").context("--bundle")?;
    let restart = dir.join("etcd").exists();
    let pki = Pki::open(&dir.join("pki"), &site.bootstrap_name(), &[address])?;
    let spec = Spec {
        name: site.bootstrap_name(),
        dir: dir.clone(),
        bundle: bundle.clone(),
        pki: pki.files().clone(),
        address: Some(address),
        port: Some(site.spec.bootstrap.port),
        capi: true,
        crds: bootsman_api::crdgen::all(),
        signing_duration: None,
        durable: true,
        isolation: isolation(),
    };
    let started = Instant::now();
    let mut cp = ControlPlane::start(&spec)
        .await
        .with_context(|| format!("start the bootstrap control plane {}", site.bootstrap_name()))?;
    let server = format!(
        "https://{}",
        std::net::SocketAddr::new(address, site.spec.bootstrap.port)
    );
    say(&format!(
        "{} {} at {server} in {:.0}s (etcd, kube-apiserver, kube-controller-manager, Cluster API {}; logs in {})",
        if restart {
            "restarted from its saved state:"
        } else {
            "started:"
        },
        site.bootstrap_name(),
        started.elapsed().as_secs_f64(),
        bundle.capi_version()?,
        cp.log_dir().display()
    ));

    helm_install(
        site,
        &bundle,
        &sources.chart,
        cp.kubeconfig(),
        &dir,
        &["provider.replicas=1", "operator.replicas=1"],
    )?;
    say(&format!(
        "chart {} installed as release {RELEASE} in {NAMESPACE} (RBAC, host roles and host policy)",
        sources.chart.display()
    ));

    let ca_pem = std::fs::read(&pki.files().server_ca.cert).context("read the bootstrap CA")?;
    if !controllers {
        say("bootsman-provider and bootsman-operator stay stopped here: the pivot has begun");
        return Ok(Bootstrap { cp, server, ca_pem });
    }
    let mut ready = Vec::new();
    for name in CONTROLLERS {
        let program = program(&bundle, name)?;
        ready.push(start_controller(&pki, &cp, &program, &dir, name)?);
    }
    for (c, port) in ready {
        c.wait_ready(port).await?;
        cp.adopt(c);
    }
    say(
        "bootsman-provider and bootsman-operator running next to it, with their chart ServiceAccounts' rights",
    );
    Ok(Bootstrap { cp, server, ca_pem })
}

/// `helm upgrade --install` of the chart into the cluster of `kubeconfig`, without its CRDs
/// (installed before), with images from the site's registry and the `--set` values `sets`.
/// Idempotent.
pub fn helm_install(
    site: &Site,
    bundle: &Bundle,
    chart: &Path,
    kubeconfig: &Path,
    dir: &Path,
    sets: &[&str],
) -> anyhow::Result<()> {
    let helm_home = dir.join("helm");
    let mut cmd = Command::new(bundle.bin("helm"));
    cmd.args(["upgrade", "--install", RELEASE])
        .arg(chart)
        .args(["--namespace", NAMESPACE, "--create-namespace", "--skip-crds"])
        .args([
            "--set",
            &format!("image.registry={}/bootsman-io", site.spec.registry),
        ]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", &helm_home)
        .env("HELM_CONFIG_HOME", &helm_home)
        .env("HELM_DATA_HOME", &helm_home)
        .output()
        .context("run helm")?;
    if !out.status.success() {
        anyhow::bail!(
            "helm upgrade --install {RELEASE} {} failed ({}): {}",
            chart.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A controller's program: from the bundle, else next to `bootsmanctl` itself (where a release
/// archive and `cargo build` put it).
pub fn program(bundle: &Bundle, name: &str) -> anyhow::Result<PathBuf> {
    let mut tried = vec![bundle.bin(name)];
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join(name));
    }
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        anyhow::anyhow!(
            "{name} not found (looked at {}); put it into the bundle's bin/",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// Starts one controller with a client certificate for its chart ServiceAccount (RBAC binds
/// the ServiceAccount by its user name), without leader election (one `install` runs at a time);
/// returns it and the loopback port of its `/readyz`.
fn start_controller(
    pki: &Pki,
    cp: &ControlPlane,
    program: &Path,
    dir: &Path,
    name: &str,
) -> anyhow::Result<(Component, u16)> {
    let user = format!("system:serviceaccount:{NAMESPACE}:{name}");
    let identity = pki.client(name, &user, &[&format!("system:serviceaccounts:{NAMESPACE}")])?;
    let kubeconfig = dir.join(format!("{name}.kubeconfig"));
    write_kubeconfig(
        &kubeconfig,
        name,
        cp.api_url(),
        &pki.files().server_ca.cert,
        &identity,
    )?;
    let port = free_port()?;
    let args = vec![
        "--leader-elect".to_string(),
        "false".into(),
        "--metrics-bind-address".into(),
        format!("127.0.0.1:{port}"),
    ];
    let kubeconfig = kubeconfig.display().to_string();
    let c = Component::spawn_with(
        name,
        program,
        &args,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", NAMESPACE),
            ("RUST_LOG", "info,kube=warn"),
        ],
        cp.log_dir().join(format!("{name}.log")),
        isolation(),
    )?;
    Ok((c, port))
}

/// As root, every process of the bootstrap side runs in a mount and a PID namespace of its own
/// (see [`Isolation::Namespaces`]); otherwise as a plain child process.
fn isolation() -> Isolation {
    if nix::unistd::geteuid().is_root() {
        Isolation::Namespaces
    } else {
        Isolation::Shared
    }
}
