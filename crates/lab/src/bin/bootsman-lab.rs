//! `bootsman-lab`: lab hosts on this machine.
//!
//! - `bootsman-lab demo [--keep] [--timeout SECS]`: the demo (`hack/demo.sh`): a site on six
//!   lab hosts and the sample BootsmanCluster until its child cluster has six Ready Nodes.
//! - `bootsman-lab up --hosts N`: a bare lab (the lab registry and N hosts running containerd
//!   and an idle kubelet), until Ctrl-C; for looking around a host (`nsenter -t <init> -a`).
//! - `bootsman-lab down`: removes what lab runs that are gone left behind (cgroups, folders).
//! - `bootsman-lab host-init SPEC`, `bootsman-lab systemctl ...`: run inside a host (its init
//!   and its `systemctl`); not for direct use.

use std::process::ExitCode;

use bootsman_lab::{Lab, LabHost, cleanup, init, ns, registry::Registry, runs_root, systemctl};

const USAGE: &str = "usage: bootsman-lab demo [--keep] [--timeout SECS] | up --hosts N | down
  demo           a site on 6 lab hosts and the sample BootsmanCluster, until 6 Nodes are Ready
                 (--keep: then until Ctrl-C; --timeout: longest wait, default 1200 s)
  up --hosts N   the lab registry and N hosts (containerd, kubelet), until Ctrl-C
  down           remove what finished or crashed lab runs left (cgroups, folders)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    if argv0 == "systemctl" {
        return code(systemctl::main(&args[1..]));
    }
    match args.get(1).map(String::as_str) {
        Some("systemctl") => code(systemctl::main(&args[2..])),
        Some("host-init") => match args.get(2) {
            Some(spec) => match init::run(std::path::Path::new(spec)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("host-init: {e}");
                    ExitCode::FAILURE
                }
            },
            None => usage(),
        },
        Some("down") => {
            let root = runs_root();
            let report = cleanup::down(&root);
            for r in &report.removed {
                println!("removed the leftovers of lab run {r}");
            }
            for r in &report.alive {
                println!(
                    "lab run {r} is still running (stop it with Ctrl-C or kill {})",
                    r.split('-').next().unwrap_or(r)
                );
            }
            if report.removed.is_empty() && report.alive.is_empty() {
                println!(
                    "nothing left behind under {} or /sys/fs/cgroup/*/bootsman-lab",
                    root.display()
                );
            }
            ExitCode::SUCCESS
        }
        Some("demo") => {
            let mut opts = bootsman_lab::demo::DemoOptions {
                keep: false,
                timeout: std::time::Duration::from_secs(1200),
            };
            let mut it = args[2..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--keep" => opts.keep = true,
                    "--timeout" => match it.next().and_then(|s| s.parse().ok()) {
                        Some(s) => opts.timeout = std::time::Duration::from_secs(s),
                        None => return usage(),
                    },
                    _ => return usage(),
                }
            }
            let Some(rt) = ns::enter("bootsman-lab") else {
                return ExitCode::FAILURE;
            };
            match rt.block_on(bootsman_lab::demo::run(opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("\nbootsman-lab demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("up") => {
            let n: u8 = match args.get(2).map(String::as_str) {
                Some("--hosts") => match args.get(3).and_then(|n| n.parse().ok()) {
                    Some(n) => n,
                    None => return usage(),
                },
                _ => return usage(),
            };
            if !ns::inside() {
                eprintln!("bootsman-lab: {}", ns::reexec());
                return ExitCode::FAILURE;
            }
            match up(n) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bootsman-lab: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => usage(),
    }
}

fn up(n: u8) -> bootsman_lab::Result<()> {
    let lab = Lab::create()?;
    println!("lab run {} in {}", lab.run_id(), lab.dir().display());
    let _registry = Registry::start(&lab)?;
    let mut hosts = Vec::new();
    for i in 1..=n {
        let h = LabHost::boot(&lab, i, &format!("host-{i}"))?;
        println!(
            "  {} at {} (init pid {}; nsenter -t {} -a)",
            h.name(),
            h.address(),
            h.init_pid(),
            h.init_pid()
        );
        hosts.push(h);
    }
    println!("Ctrl-C stops everything.");
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .map_err(|e| bootsman_lab::Error::Unsupported(e.to_string()))?;
    let _ = signals.forever().next();
    println!("stopping");
    drop(hosts);
    Ok(())
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c).unwrap_or(1))
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
