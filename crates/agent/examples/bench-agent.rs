//! Measures the agent as an operator sizes it: time from process start to `Registered=True`
//! against a real control plane, idle resident memory once registered, and the size of the
//! stripped release binary. Prints the numbers and writes `target/bench/agent.json`.
//!
//! ```text
//! cargo build --release -p byoh-agent
//! cargo run --release -p byoh-agent --example bench-agent
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark program

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bootsman_api::condition::types;
use bootsman_fixtures::agent::{Pool, wait_condition};

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

#[tokio::main]
async fn main() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace.join("target"));
    let bin = target.join("release/byoh-agent");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p byoh-agent` first",
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
    for i in 0..runs {
        let mut host = pool.host(&format!("bench-{i}"));
        let t = Instant::now();
        host.bin = bin.to_string_lossy().into_owned();
        host.start(&["bench=true"]);
        wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
        to_registered.push(t.elapsed().as_secs_f64() * 1000.0);
        // Idle: a few heartbeats after registration.
        tokio::time::sleep(Duration::from_secs(3)).await;
        rss.push(vm_rss_kib(host.pid()));
        host.terminate();
    }
    to_registered.sort_by(f64::total_cmp);
    rss.sort();
    let report = serde_json::json!({
        "runs": runs,
        "start_to_registered_ms": {"min": to_registered[0], "median": to_registered[runs / 2], "max": to_registered[runs - 1]},
        "idle_rss_kib": {"min": rss[0], "median": rss[runs / 2], "max": rss[runs - 1]},
        "binary_bytes": {"release": unstripped_bytes, "stripped": stripped_bytes},
    });
    let out = target.join("bench/agent.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    println!("written to {}", out.display());
}
