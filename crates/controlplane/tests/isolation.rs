//! A component started with [`Isolation::Namespaces`] runs in a PID and a mount namespace of its
//! own: it is process 1 there, sees none of the machine's processes, has a mount table of its
//! own, and nothing of it outlives [`Component::stop`]. Needs root (as `hack/test.sh` runs).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bootsman_controlplane::{Component, Isolation};

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bootsman-isolation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// Waits until `log` has a line starting with `done`; returns the whole log.
fn wait_for_report(log: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().any(|l| l.starts_with("done")) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no report from the isolated component; its log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn value<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        .trim()
}

/// Ids of the machine's processes whose command line is exactly `argv` and that have not exited
/// (zombies are left out).
fn processes_running(argv: &[&str]) -> Vec<String> {
    let want = argv.join("\0") + "\0";
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| {
                s.rsplit_once(") ")
                    .is_some_and(|(_, rest)| !rest.starts_with('Z'))
            })
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn an_isolated_component_sees_only_its_own_processes_and_nothing_of_it_outlives_stop() {
    assert!(
        is_root(),
        "isolation needs root (unshare --mount --pid): run the tests as root, as hack/test.sh does"
    );
    let dir = scratch();
    let log = dir.join("probe.log");
    // A sleep no other process on the machine runs, to find it again from outside.
    let marker = format!("{}", 900_000 + std::process::id());
    let script = format!(
        "echo pid=$$; echo seen=$(ls /proc | grep -c '^[0-9]'); echo mnt=$(readlink /proc/self/ns/mnt); \
         echo done; exec sleep {marker}"
    );
    let c = Component::spawn_with(
        "probe",
        Path::new("/bin/sh"),
        &["-c".into(), script],
        &[],
        log.clone(),
        Isolation::Namespaces,
    )
    .expect("spawn");
    let text = wait_for_report(&log);
    assert_eq!(
        value(&text, "pid="),
        "1",
        "the component is process 1 of its namespace:\n{text}"
    );
    let seen: usize = value(&text, "seen=").parse().expect("a count");
    assert!(seen <= 4, "it sees {seen} processes, not only its own:\n{text}");
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("our mount namespace");
    assert_ne!(
        value(&text, "mnt="),
        ours.to_string_lossy(),
        "the component shares the machine's mount namespace"
    );
    assert_eq!(
        processes_running(&["sleep", &marker]).len(),
        1,
        "the component's child runs"
    );

    c.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_running(&["sleep", &marker]).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a process of the stopped component still runs"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::remove_dir_all(&dir).expect("remove the scratch folder");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        == Some("0")
}
