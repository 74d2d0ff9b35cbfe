//! Measures the agent as an operator sizes it: time from process start to `Registered=True`
//! against a real control plane, idle resident memory once registered (and how much of it is
//! heap and stacks, how much the binary's and libraries' pages), and the size of the
//! stripped binary the packages ship (the `agent` profile). Prints the numbers and writes
//! `target/bench/agent.json`.
//!
//! ```text
//! cargo build --profile agent -p byoh-agent     # the build the packages ship
//! cargo run --release -p byoh-agent --example bench-agent
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark program

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bootsman_api::condition::types;
use bootsman_fixtures::agent::{Pool, wait_condition};

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `RssAnon`, `RssFile`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
}

#[tokio::main]
async fn main() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace.join("target"));
    // The binary the .deb and .rpm carry (hack/package builds it with the same profile).
    let bin = target.join("agent/byoh-agent");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --profile agent -p byoh-agent` first",
        bin.display()
    );

    let stripped = target.join("bench/byoh-agent.stripped");
    std::fs::create_dir_all(stripped.parent().unwrap()).unwrap();
    std::fs::copy(&bin, &stripped).unwrap();
    let ok = std::process::Command::new("strip")
        .arg(&stripped)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "strip failed on {}", stripped.display());
    let unstripped_bytes = std::fs::metadata(&bin).unwrap().len();
    let stripped_bytes = std::fs::metadata(&stripped).unwrap().len();

    let pool = Pool::new("agent-bench").await;
    let runs = 5;
    let mut to_registered = Vec::new();
    let mut rss = Vec::new();
    // Of the RSS: heap and stacks, and pages of the binary and libraries read in.
    let (mut anon, mut file) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let mut host = pool.host(&format!("bench-{i}"));
        let t = Instant::now();
        host.bin = bin.to_string_lossy().into_owned();
        host.start(&["bench=true"]);
        wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
        to_registered.push(t.elapsed().as_secs_f64() * 1000.0);
        // Idle: a few heartbeats after registration.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pid = host.pid();
        rss.push(status_kib(pid, "VmRSS"));
        anon.push(status_kib(pid, "RssAnon"));
        file.push(status_kib(pid, "RssFile"));
        host.terminate();
    }
    to_registered.sort_by(f64::total_cmp);
    rss.sort();
    anon.sort();
    file.sort();
    let report = serde_json::json!({
        "runs": runs,
        "start_to_registered_ms": {"min": to_registered[0], "median": to_registered[runs / 2], "max": to_registered[runs - 1]},
        "idle_rss_kib": {"min": rss[0], "median": rss[runs / 2], "max": rss[runs - 1]},
        "idle_rss_anon_kib_median": anon[runs / 2],
        "idle_rss_file_kib_median": file[runs / 2],
        "binary_bytes": {"built": unstripped_bytes, "stripped": stripped_bytes},
    });
    let out = target.join("bench/agent.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    println!("written to {}", out.display());
}
