//! `bootsmanctl init` and the preflight of `bootsmanctl install`: a sound Site passes against
//! this machine (its bootstrap address and port on the loopback, a registry that answers), and
//! a Site with too few hosts, an unsupported version, an address conflict, a port in use or a
//! registry that does not answer is refused with the field and the rule, with nothing started
//! and nothing written.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use bootsmanctl::cli::{Cli, run};
use clap::Parser;

async fn bootsmanctl(args: &[&str]) -> (anyhow::Result<()>, String) {
    let mut argv = vec!["bootsmanctl"];
    argv.extend_from_slice(args);
    let mut out = Vec::new();
    let r = match Cli::try_parse_from(argv) {
        Ok(cli) => run(cli, &mut out).await,
        Err(e) => Err(anyhow::anyhow!("{e}")),
    };
    (r, String::from_utf8(out).expect("utf-8"))
}

/// A folder of this test's own, and a Site in it whose bootstrap side is this machine's
/// loopback on `port`, with `registry` as its registry; `edit` changes the YAML text.
struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bootsmanctl-install-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test folder");
        Case { dir }
    }

    fn site(&self, port: u16, registry: &str, edit: impl Fn(String) -> String) -> PathBuf {
        let text = bootsmanctl::site::EXAMPLE
            .replace(
                "address: 10.0.0.5\n    port: 6443",
                &format!("address: 127.0.0.1\n    port: {port}"),
            )
            .replace(
                "# stateDir: /var/lib/bootsman/dc1   # default: ~/.local/share/bootsman/<name>",
                &format!("stateDir: {}", self.state().display()),
            )
            .replace("registry: 10.0.0.5:5000", &format!("registry: {registry}"));
        let path = self.dir.join("site.yaml");
        std::fs::write(&path, edit(text)).expect("write site");
        path
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[tokio::test]
async fn init_prints_a_site_that_passes_the_file_checks() {
    let (r, out) = bootsmanctl(&["init"]).await;
    r.expect("init");
    let site: bootsmanctl::site::Site = serde_saphyr::from_str(&out).expect("init prints a Site");
    assert_eq!(bootsmanctl::site::check(&site), []);
    assert!(
        out.lines().filter(|l| l.trim_start().starts_with('#')).count() > 10,
        "commented:\n{out}"
    );
}

#[tokio::test]
async fn a_sound_site_passes_preflight_and_dry_run_prints_the_plan() {
    let case = Case::new("sound");
    let registry = TcpListener::bind("127.0.0.1:0").expect("registry stand-in");
    let reg = registry.local_addr().expect("addr").to_string();
    let file = case.site(free_port(), &reg, |t| t);

    let (r, out) = bootsmanctl(&["install", "-f", path(&file), "--validate"]).await;
    r.expect("preflight passes");
    assert!(out.starts_with("preflight passed for site dc1"), "{out}");

    let (r, out) = bootsmanctl(&["install", "-f", path(&file), "--dry-run"]).await;
    r.expect("dry run");
    let steps: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap_or_default())
        .collect();
    assert_eq!(steps[0], "next", "{out}");
    assert_eq!(out.lines().count(), 8, "{out}");
    assert!(out.contains("dc1-control-plane at https://127.0.0.1:"), "{out}");

    // A saved state moves the plan on; nothing else was written by the dry run.
    std::fs::create_dir_all(case.state()).expect("state dir");
    std::fs::write(
        case.state().join("state.json"),
        r#"{"done": ["preflight", "bootstrap"]}"#,
    )
    .expect("state");
    let (r, out) = bootsmanctl(&["install", "-f", path(&file), "--dry-run", "-o", "json"]).await;
    r.expect("dry run");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(doc["plan"][1]["done"], true);
    assert_eq!(doc["plan"][2]["name"], "enrol");
    assert_eq!(doc["plan"][2]["done"], false);
    assert_eq!(std::fs::read_dir(case.state()).expect("state").count(), 1);

    // The executing install needs a bundle to run from, and says which flag is wrong.
    let chart = bootsman_testenv::repo_root().join("charts/bootsman");
    let (r, _) = bootsmanctl(&[
        "install",
        "-f",
        path(&file),
        "--bundle",
        "/nonexistent/bundle",
        "--chart",
        path(&chart),
    ])
    .await;
    let e = format!("{:#}", r.expect_err("no bundle there"));
    assert!(e.contains("--bundle") && e.contains("etcd is missing"), "{e}");
}

#[tokio::test]
async fn preflight_refuses_with_field_and_rule_and_starts_nothing() {
    let case = Case::new("refused");
    let registry = TcpListener::bind("127.0.0.1:0").expect("registry stand-in");
    let reg = registry.local_addr().expect("addr").to_string();
    type Edit = Box<dyn Fn(String) -> String>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "too few hosts",
            Box::new(|t: String| {
                t.replace(
                    "    - name: srv-03\n      address: 10.0.0.13\n      labels: {bootsman.io/infrastructure: \"true\"}\n",
                    "",
                )
            }),
            "spec.hosts: too few hosts: the infrastructure cluster needs 3 control-plane hosts labelled \
             bootsman.io/infrastructure=true, and the site lists 2 (srv-01, srv-02) (rule: enough-infrastructure-hosts)",
        ),
        (
            "a bad version",
            Box::new(|t: String| t.replace("kubernetesVersion: v1.36.3", "kubernetesVersion: v1.29.0")),
            "spec.infrastructure.kubernetesVersion: v1.29.0 is not supported",
        ),
        (
            "an address conflict",
            Box::new(|t: String| t.replace("host: 10.0.0.10", "host: 10.0.0.13")),
            "spec.infrastructure.controlPlane.endpoint.host: 10.0.0.13 is also spec.hosts[2].address: each address \
             has one holder (rule: address-conflict)",
        ),
        (
            "a typo",
            Box::new(|t: String| t.replace("hostLabels:", "hostLabel:")),
            "hostLabel",
        ),
    ];
    for (what, edit, expected) in cases {
        let file = case.site(free_port(), &reg, edit);
        let (r, out) = bootsmanctl(&["install", "-f", path(&file), "--dry-run"]).await;
        let e = format!("{:#}", r.expect_err(what));
        assert!(
            out.contains(expected) || e.contains(expected),
            "{what}: {out}\n{e}"
        );
        assert!(!out.contains(" next "), "{what}: no plan on a refusal: {out}");
        assert!(!case.state().exists(), "{what}: nothing written");
    }

    // The install itself refuses the same way before it starts anything; with `-o json` the
    // findings are one JSON line.
    let bundle = bootsman_testenv::Testbin::locate()
        .expect("control-plane binaries (hack/testbin)")
        .dir
        .clone();
    let chart = bootsman_testenv::repo_root().join("charts/bootsman");
    let file = case.site(free_port(), &reg, |t| {
        t.replace("kubernetesVersion: v1.36.3", "kubernetesVersion: v1.29.0")
    });
    let (r, out) = bootsmanctl(&[
        "install",
        "-f",
        path(&file),
        "--bundle",
        path(&bundle),
        "--chart",
        path(&chart),
        "-o",
        "json",
    ])
    .await;
    let e = format!("{:#}", r.expect_err("a bad version"));
    assert!(e.contains("nothing was started"), "{e}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    assert_eq!(doc["step"], "preflight");
    assert_eq!(
        doc["findings"][0]["field"], "spec.infrastructure.kubernetesVersion",
        "{doc}"
    );
    assert!(!case.state().exists(), "a refused install writes nothing");

    // This machine and the network: the port in use, an address not this machine's, a registry
    // that does not answer.
    let busy = TcpListener::bind("127.0.0.1:0").expect("busy port");
    let port = busy.local_addr().expect("addr").port();
    let file = case.site(port, &reg, |t| t);
    let (r, out) = bootsmanctl(&["install", "-f", path(&file), "--validate"]).await;
    assert!(r.is_err());
    assert!(
        out.contains(&format!("spec.bootstrap: port {port} of 127.0.0.1 is in use")),
        "{out}"
    );
    assert!(out.contains("(rule: bootstrap-port-free)"), "{out}");

    let file = case.site(free_port(), &reg, |t| {
        t.replace("address: 127.0.0.1", "address: 192.0.2.1")
    });
    let (_, out) = bootsmanctl(&["install", "-f", path(&file), "--validate"]).await;
    assert!(
        out.contains("192.0.2.1 is not an address of this machine"),
        "{out}"
    );

    let closed = free_port();
    let file = case.site(free_port(), &format!("127.0.0.1:{closed}"), |t| t);
    let (r, out) = bootsmanctl(&["install", "-f", path(&file), "--validate", "-o", "json"]).await;
    assert!(r.is_err());
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(doc["findings"][0]["field"], "spec.registry", "{doc}");
    assert!(
        doc["findings"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .ends_with("(rule: registry-reachable)")
    );
    assert!(!case.state().exists(), "nothing written");
    drop(busy);
}

/// Waits until `log` contains `text`; fails with the log when `child` exits first or after
/// `secs` seconds.
fn wait_for_log(child: &mut std::process::Child, log: &Path, text: &str, secs: u64) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let now = std::fs::read_to_string(log).unwrap_or_default();
        if now.contains(text) {
            return now;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("bootsmanctl install exited ({status}) before printing {text:?}:\n{now}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {text:?} from bootsmanctl install within {secs}s:\n{now}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A running `bootsmanctl install`, killed when the test ends however it ends.
struct Install(std::process::Child);

impl Drop for Install {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_install(file: &Path, bundle: &Path, log: &Path) -> Install {
    let out = std::fs::File::create(log).expect("log");
    let err = out.try_clone().expect("log");
    std::process::Command::new(env!("CARGO_BIN_EXE_bootsmanctl"))
        .args(["install", "-f", path(file), "--bundle", path(bundle), "--chart"])
        .arg(bootsman_testenv::repo_root().join("charts/bootsman"))
        .env_remove("KUBECONFIG")
        .stdout(out)
        .stderr(err)
        .spawn()
        .map(Install)
        .expect("start bootsmanctl install")
}

fn api_answers(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The install for real: the bootstrap control plane comes up with Bootsman's controllers,
/// prints a pinned token per host, labels the hosts that enrol with them (real `byoh-agent`
/// processes), records its steps and creates the infrastructure cluster's BootsmanCluster. A second install of the site is refused while the first
/// runs. After `kill -9` nothing of it is left running; the next install continues from the
/// saved state (the same CA, the same objects, the enrolled hosts), and SIGTERM stops it cleanly.
#[tokio::test]
async fn install_brings_up_the_bootstrap_side_enrols_hosts_and_continues_after_kill_9() {
    let case = Case::new("run");
    let registry = TcpListener::bind("127.0.0.1:0").expect("registry stand-in");
    let reg = registry.local_addr().expect("addr").to_string();
    let port = bootsman_testenv::free_port().expect("a free port");
    let file = case.site(port, &reg, |t| t);
    let bundle = bootsman_testenv::Testbin::locate()
        .expect("control-plane binaries (hack/testbin)")
        .dir
        .clone();

    let log1 = case.dir.join("install-1.log");
    let mut first = spawn_install(&file, &bundle, &log1);
    let out = wait_for_log(&mut first.0, &log1, "waiting for 3 infrastructure hosts", 300);
    assert!(
        out.contains("started: dc1-control-plane at https://127.0.0.1:"),
        "{out}"
    );
    assert!(
        out.contains("bootsman-provider and bootsman-operator running"),
        "{out}"
    );
    for h in ["srv-01", "srv-02", "srv-03", "srv-04"] {
        assert!(
            out.contains(&format!("{h}: install -m 0600 ")),
            "no command for {h}:\n{out}"
        );
    }

    // One install per site at a time.
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_bootsmanctl"))
        .args(["install", "-f", path(&file), "--bundle", path(&bundle), "--chart"])
        .arg(bootsman_testenv::repo_root().join("charts/bootsman"))
        .output()
        .expect("second install");
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("another bootsmanctl install of site dc1 runs"),
        "{err}"
    );

    // Three servers enrol with the tokens the install printed.
    let pool = "bootsman-hosts";
    let mut agents = Vec::new();
    for name in ["srv-01", "srv-02", "srv-03"] {
        let mut host = bootsman_fixtures::agent::Host::at(case.dir.join(name), name, pool);
        host.bootstrap_kubeconfig = Some(case.state().join(format!("enrol/{name}.kubeconfig")));
        host.start(&[]);
        agents.push(host);
    }
    let out = wait_for_log(
        &mut first.0,
        &log1,
        "3 of 3 infrastructure hosts enrolled and labelled",
        180,
    );
    assert!(
        out.contains("host srv-01 enrolled; labelled bootsman.io/infrastructure=true"),
        "{out}"
    );
    let kubeconfig = case.state().join("bootstrap/admin.kubeconfig");
    let client = bootsman_controlplane::client_from(&kubeconfig)
        .await
        .expect("admin client");
    let hosts: kube::Api<bootsman_api::v1beta1::ByoHost> = kube::Api::namespaced(client.clone(), pool);
    let labelled = hosts
        .list(&kube::api::ListParams::default().labels("bootsman.io/infrastructure=true"))
        .await
        .expect("ByoHosts");
    assert_eq!(labelled.items.len(), 3);
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(case.state().join("state.json")).expect("state.json"))
            .expect("json");
    assert_eq!(
        state["done"],
        serde_json::json!(["preflight", "bootstrap", "enrol"])
    );
    // A spent token's kubeconfig is removed; srv-04 has not enrolled and keeps its own.
    assert!(!case.state().join("enrol/srv-01.kubeconfig").exists());
    assert!(case.state().join("enrol/srv-04.kubeconfig").exists());
    let ca = std::fs::read(case.state().join("bootstrap/pki/server-ca.crt")).expect("CA");

    // Then the infrastructure cluster: a schedulable 3-host BootsmanCluster on the labelled
    // hosts, accepted by admission and taken up by the operator (these hosts run no kubeadm, so
    // it never becomes Ready here: the lab's end-to-end install test builds it on real nodes).
    let out = wait_for_log(
        &mut first.0,
        &log1,
        "BootsmanCluster bootsman-hosts/dc1-infra applied",
        60,
    );
    assert!(out.contains("3 schedulable control-plane hosts"), "{out}");
    let clusters: kube::Api<bootsman_api::v1alpha1::BootsmanCluster> = kube::Api::namespaced(client, pool);
    let infra = clusters
        .get("dc1-infra")
        .await
        .expect("the infrastructure BootsmanCluster");
    assert!(infra.spec.control_plane.schedulable);
    assert_eq!(infra.spec.control_plane.replicas, 3);
    assert_eq!(infra.spec.image_repository.as_deref(), Some(reg.as_str()));
    wait_for_log(&mut first.0, &log1, "control plane 0/3 ready", 60);

    // kill -9: the control plane and the controllers die with it.
    first.0.kill().expect("kill -9");
    first.0.wait().expect("reaped");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while api_answers(port) {
        assert!(
            std::time::Instant::now() < deadline,
            "the bootstrap API server outlived a kill -9 of install"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // The next install continues: same CA, same objects, the enrolled hosts are known.
    let log2 = case.dir.join("install-2.log");
    let mut again = spawn_install(&file, &bundle, &log2);
    let out = wait_for_log(
        &mut again.0,
        &log2,
        "BootsmanCluster bootsman-hosts/dc1-infra applied",
        300,
    );
    assert!(
        out.contains("restarted from its saved state: dc1-control-plane"),
        "{out}"
    );
    assert!(
        out.contains("3 of 3 infrastructure hosts enrolled and labelled"),
        "{out}"
    );
    assert!(
        out.contains("srv-04: install -m 0600") && out.contains("(token issued by an earlier run)"),
        "{out}"
    );
    assert!(!out.contains("srv-01: install"), "{out}");
    assert_eq!(
        std::fs::read(case.state().join("bootstrap/pki/server-ca.crt")).expect("CA"),
        ca,
        "the bootstrap CA changed across runs"
    );
    for a in &mut agents {
        assert!(a.is_running(), "agent {} stopped:\n{}", a.name, a.log());
    }

    // SIGTERM: a clean stop, nothing left listening.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &again.0.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = again.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "install did not stop on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(status.success(), "install exited with {status} on SIGTERM");
    let out = std::fs::read_to_string(&log2).expect("log");
    assert!(
        out.contains("SIGTERM: everything this install started has stopped"),
        "{out}"
    );
    if api_answers(port) {
        let who = std::process::Command::new("ss")
            .args(["-ltnp", &format!("sport = :{port}")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!("the API server outlived the install; listening on {port}:\n{who}");
    }
    drop(agents);
}
