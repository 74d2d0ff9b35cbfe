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

    // The executing install is not in this build: a mode must be chosen.
    let (r, _) = bootsmanctl(&["install", "-f", path(&file)]).await;
    let e = format!("{:#}", r.expect_err("a mode is required"));
    assert!(e.contains("--validate") && e.contains("--dry-run"), "{e}");
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
