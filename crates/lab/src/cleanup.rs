//! Leaving nothing behind. A run's hosts live in PID, mount and network namespaces that the
//! kernel removes with their last process, so after any exit (also `kill -9` of the run: every
//! host's `unshare` dies with it through `PR_SET_PDEATHSIG`, and its init with `unshare`) no
//! process, mount or interface is left. What outlives processes are cgroup folders (the
//! kubelet's and runc's, all under `/bootsman-lab/<run>/` in each hierarchy) and the run's
//! folder; [`remove_cgroup_tree`] removes the former, [`down`] finds both for runs that are gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The cgroup hierarchies mounted under `/sys/fs/cgroup`.
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// Kills whatever still runs in cgroup `rel` (relative to each hierarchy, e.g.
/// `/bootsman-lab/<run>/<host>`) and removes it with every cgroup below it.
pub fn remove_cgroup_tree(rel: &str) {
    for h in hierarchies() {
        let top = h.join(rel.trim_start_matches('/'));
        if top.is_dir() {
            remove_cgroup(&top);
        }
    }
}

fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes the disks of the hosts under `hosts` (one folder each): their overlay layers and data
/// folders, keeping their logs.
pub fn remove_host_disks(hosts: &Path) {
    let Ok(entries) = std::fs::read_dir(hosts) else {
        return;
    };
    for h in entries.flatten() {
        for d in ["upper", "work", "data"] {
            let _ = std::fs::remove_dir_all(h.path().join(d));
        }
        let _ = std::fs::remove_file(h.path().join("byoh-agent.deb"));
    }
}

/// What [`down`] found and removed.
#[derive(Debug, Default)]
pub struct Report {
    /// Runs still alive (left alone).
    pub alive: Vec<String>,
    /// Runs whose leftovers were removed.
    pub removed: Vec<String>,
}

/// Removes the folders and cgroups of runs under `root` whose process is gone, and cgroups of
/// runs that have no folder any more.
pub fn down(root: &Path) -> Report {
    let mut report = Report::default();
    let mut runs: Vec<String> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for h in hierarchies() {
        if let Ok(d) = std::fs::read_dir(h.join("bootsman-lab")) {
            runs.extend(
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned()),
            );
        }
    }
    runs.sort();
    runs.dedup();
    for run in runs {
        if run_alive(&run) {
            report.alive.push(run);
            continue;
        }
        remove_cgroup_tree(&format!("/bootsman-lab/{run}"));
        let dir = root.join(&run);
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        report.removed.push(run);
    }
    remove_empty_cgroup_root();
    report
}

/// Removes `/bootsman-lab` from every hierarchy when no run uses it any more.
pub fn remove_empty_cgroup_root() {
    for h in hierarchies() {
        let _ = std::fs::remove_dir(h.join("bootsman-lab"));
    }
}

/// A run is named `<pid>-<suffix>`; it is alive while that process runs, identified by its start
/// time (kept in the run folder's `owner` file), so a reused PID does not count.
pub fn run_alive(run: &str) -> bool {
    let Some(pid) = run.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    let owner = std::fs::read_to_string(crate::runs_root().join(run).join(OWNER)).unwrap_or_default();
    match start_time(pid) {
        Some(t) => owner.trim().is_empty() || owner.trim() == t,
        None => false,
    }
}

/// File in a run folder holding the start time of the run's process.
pub const OWNER: &str = "owner";

/// The start time of a process (field 22 of `/proc/<pid>/stat`, in clock ticks since boot).
pub fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; fields after the last ')' are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(String::from)
}
