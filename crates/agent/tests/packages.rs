//! Checks the .deb and .rpm that `hack/package` builds (hack/test.sh builds them before the tests
//! run): names, metadata, the minimum glibc, file lists with modes, the config file, and the
//! systemd unit. Also checks that the flags file shipped in the packages names only flags the
//! agent accepts.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn package_dir() -> PathBuf {
    repo().join("target/package")
}

fn package(name: &str) -> PathBuf {
    let path = package_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the packages with `hack/package` (hack/test.sh does this before the tests)",
        path.display()
    );
    path
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (install it: hack/tools does): {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn min_glibc() -> String {
    let path = package_dir().join("min-glibc");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (written by hack/package)", path.display()));
    let v = text.trim().to_string();
    assert!(
        v.split('.').all(|p| p.parse::<u32>().is_ok()) && v.starts_with("2."),
        "implausible glibc version {v:?}"
    );
    v
}

#[test]
fn deb_metadata_files_and_unit() {
    let deb = package(&format!("byoh-agent_{VERSION}_amd64.deb"));
    let deb = deb.to_str().unwrap();

    let field = |name: &str| run("dpkg-deb", &["-f", deb, name]).trim().to_string();
    assert_eq!(field("Package"), "byoh-agent");
    assert_eq!(field("Version"), VERSION);
    assert_eq!(field("Architecture"), "amd64");
    let depends = field("Depends");
    let glibc = min_glibc();
    assert!(
        depends.contains(&format!("libc6 (>= {glibc})")),
        "Depends {depends:?} does not state glibc >= {glibc}"
    );

    // File list with modes: `dpkg-deb -c` prints `mode owner/group size date time path`.
    let listing = run("dpkg-deb", &["-c", deb]);
    let mode_of = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(path))
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .unwrap_or_else(|| panic!("{path} not in the .deb:\n{listing}"))
    };
    assert_eq!(mode_of("./usr/bin/byoh-agent"), "-rwxr-xr-x");
    assert_eq!(mode_of("./etc/byoh-agent/byoh-agent.env"), "-rw-------");
    assert_eq!(
        mode_of("./usr/lib/systemd/system/byoh-agent.service"),
        "-rw-r--r--"
    );

    let conffiles = control_file(deb, "conffiles");
    assert_eq!(conffiles.trim(), "/etc/byoh-agent/byoh-agent.env");
    let postrm = control_file(deb, "postrm");
    assert!(
        postrm.contains("rm -rf /var/lib/byoh-agent"),
        "purge keeps the agent state:\n{postrm}"
    );

    let unit = data_file(deb, "./usr/lib/systemd/system/byoh-agent.service");
    check_unit(&unit);
}

#[test]
fn rpm_metadata_files_and_unit() {
    let rpm = package(&format!("byoh-agent-{VERSION}.x86_64.rpm"));
    let rpm = rpm.to_str().unwrap();

    let info = run(
        "rpm",
        &[
            "-qp",
            "--queryformat",
            "%{NAME} %{VERSION} %{ARCH} %{LICENSE}",
            rpm,
        ],
    );
    assert_eq!(info, format!("byoh-agent {VERSION} x86_64 Apache-2.0"));

    let requires = run("rpm", &["-qp", "--requires", rpm]);
    let glibc = min_glibc();
    assert!(
        requires.lines().any(|l| l.trim() == format!("glibc >= {glibc}")),
        "requires do not state glibc >= {glibc}:\n{requires}"
    );

    // `--dump` prints `path size mtime digest mode owner group isconfig isdoc ...`.
    let dump = run("rpm", &["-qp", "--dump", rpm]);
    let entry = |path: &str| -> Vec<String> {
        dump.lines()
            .find(|l| l.starts_with(&format!("{path} ")))
            .unwrap_or_else(|| panic!("{path} not in the .rpm:\n{dump}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let bin = entry("/usr/bin/byoh-agent");
    assert_eq!(&bin[4], "0100755");
    let env = entry("/etc/byoh-agent/byoh-agent.env");
    assert_eq!(&env[4], "0100600");
    assert_eq!(&env[7], "1", "the flags file is a config file");
    let unit = entry("/usr/lib/systemd/system/byoh-agent.service");
    assert_eq!(&unit[4], "0100644");

    let configfiles = run("rpm", &["-qp", "--configfiles", rpm]);
    assert_eq!(configfiles.trim(), "/etc/byoh-agent/byoh-agent.env");
    let scripts = run("rpm", &["-qp", "--scripts", rpm]);
    assert!(scripts.contains("systemctl daemon-reload"), "{scripts}");

    // The unit inside the rpm is the one in the repository.
    let digest = &unit[3];
    let ours = std::fs::read(repo().join("packaging/byoh-agent/byoh-agent.service")).unwrap();
    assert_eq!(digest, &sha256_hex(&ours), "the rpm carries a stale unit");
}

#[test]
fn repository_unit_is_production_ready() {
    let unit = std::fs::read_to_string(repo().join("packaging/byoh-agent/byoh-agent.service")).unwrap();
    check_unit(&unit);
}

#[test]
fn flags_file_names_only_flags_the_agent_accepts() {
    let help = run(env!("CARGO_BIN_EXE_byoh-agent"), &["--help"]);
    let env = std::fs::read_to_string(repo().join("packaging/byoh-agent/byoh-agent.env")).unwrap();
    let mut seen = 0;
    // The flags set (BYOH_AGENT_ARGS) and the flags documented in the comment table.
    let flag_lines = env.lines().filter(|l| {
        let l = l.trim_start_matches('#').trim();
        l.starts_with("BYOH_AGENT_ARGS=") || l.starts_with("--")
    });
    for word in flag_lines.flat_map(|l| l.split(|c: char| c.is_whitespace() || c == '"' || c == '=')) {
        if let Some(flag) = word.strip_prefix("--").filter(|f| !f.is_empty()) {
            seen += 1;
            assert!(
                help.contains(&format!("--{flag}")),
                "byoh-agent.env names --{flag}, which `byoh-agent --help` does not list:\n{help}"
            );
        }
    }
    assert!(seen >= 3, "the flags file documents the agent's flags");
}

fn check_unit(unit: &str) {
    let has = |line: &str| unit.lines().any(|l| l.trim() == line);
    for line in [
        "Restart=always",
        "EnvironmentFile=/etc/byoh-agent/byoh-agent.env",
        "ExecStart=/usr/bin/byoh-agent $BYOH_AGENT_ARGS",
        "StateDirectory=byoh-agent",
        "StateDirectoryMode=0700",
        "WantedBy=multi-user.target",
        "After=network-online.target",
    ] {
        assert!(has(line), "the unit lacks `{line}`:\n{unit}");
    }
    // kubeadm must still be able to load modules, set sysctls and write the root file system.
    for forbidden in [
        "ProtectKernelModules=yes",
        "ProtectKernelTunables=yes",
        "ProtectSystem=strict",
        "ProtectSystem=full",
        "PrivateDevices=yes",
        "NoNewPrivileges=yes",
        "User=",
    ] {
        assert!(
            !unit.lines().any(|l| l.trim().starts_with(forbidden)),
            "`{forbidden}` would stop the bootstrap data from running kubeadm"
        );
    }
}

fn control_file(deb: &str, name: &str) -> String {
    let dir = tempdir();
    run("dpkg-deb", &["-e", deb, dir.to_str().unwrap()]);
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

fn data_file(deb: &str, path: &str) -> String {
    let dir = tempdir();
    run("dpkg-deb", &["-x", deb, dir.to_str().unwrap()]);
    let text = std::fs::read_to_string(dir.join(path)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "byoh-agent-packages-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sha256_hex(data: &[u8]) -> String {
    let out = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(data)?;
            child.wait_with_output()
        })
        .expect("sha256sum");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
