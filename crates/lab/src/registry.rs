//! The lab registry: distribution v3 serving the images `hack/labbin` put into its storage (the
//! Kubernetes images kubeadm pulls, CoreDNS, pause, kube-router, busybox), on the lab gateway,
//! over plain HTTP, as an air-gapped site's mirror. Images built from this workspace (the
//! provider and the operator) are pushed into it at run time with `hack/image`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bootsman_testenv::process::Component;

use crate::error::{Error, Result, io};
use crate::{Lab, net, run};

/// A running lab registry.
#[derive(Debug)]
pub struct Registry {
    process: Component,
}

impl Registry {
    /// Serves the lab's image storage at [`net::registry`].
    pub fn start(lab: &Lab) -> Result<Registry> {
        let config = lab.dir().join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp: {{addr: \"{}\"}}\n",
                lab.labbin().registry.display(),
                net::registry()
            ),
        )
        .map_err(io("write", &config))?;
        let process = Component::spawn(
            "registry",
            &lab.labbin().program("registry"),
            &["serve".into(), config.display().to_string()],
            &[],
            lab.dir().join("registry.log"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !answers(&net::registry()) {
            process.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("the lab registry at {}", net::registry()),
                    secs: 30,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Registry { process })
    }

    /// Builds the image of a program of ours (one layer: the program and the shared libraries
    /// it loads) and pushes it as `<registry>/<reference>`; returns the full reference.
    pub fn push_program(
        &self,
        lab: &Lab,
        reference: &str,
        program: &Path,
        user: Option<u32>,
    ) -> Result<String> {
        self.process.check_running()?;
        let full = format!("{}/{reference}", net::registry());
        let script = bootsman_testenv::repo_root().join("hack/image");
        let mut cmd = Command::new(&script);
        cmd.arg("--crane")
            .arg(lab.labbin().program("crane"))
            .arg(&full)
            .arg("--file")
            .arg(format!(
                "{}=/usr/local/bin/{}",
                program.display(),
                file_name(program)
            ))
            .arg("--entrypoint")
            .arg(format!("/usr/local/bin/{}", file_name(program)));
        if let Some(u) = user {
            cmd.arg("--user").arg(u.to_string());
        }
        run(&mut cmd, &format!("hack/image {full}"))?;
        Ok(full)
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether an OCI registry answers `GET /v2/` at `addr` (200 or 401).
fn answers(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET /v2/ HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 32];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.") && (head.contains(" 200") || head.contains(" 401"))
}
