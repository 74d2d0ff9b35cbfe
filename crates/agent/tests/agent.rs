//! The real `byoh-agent` binary against the real control plane: registration with inventory and
//! labels, the heartbeat Lease, bootstrap data run under `--root`, resume after a kill, a
//! bootstrap that outlasts a lost connection to the API server, reset on release, and the errors
//! of bad flags.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use bootsman_api::condition::types;
use bootsman_testenv::wait_for;
use common::{Pool, message, read, wait_condition};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

async fn renew_time(leases: &Api<Lease>, name: &str) -> Option<String> {
    let l = leases.get_opt(name).await.ok()??;
    l.spec?.renew_time.map(|t| t.0.to_string())
}

/// Hands `cloud_config` to the host as the provider would: a Secret the host may read, then
/// spec.machineRef and spec.bootstrapSecret.
async fn hand_over(pool: &Pool, host: &str, machine_uid: &str, cloud_config: &str) {
    let secret = format!("{host}-bootstrap");
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(secret.clone()),
            namespace: Some(pool.ns.clone()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "value".to_string(),
            ByteString(cloud_config.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    let secrets = Api::<Secret>::namespaced(pool.admin.clone(), &pool.ns);
    let _ = secrets.delete(&secret, &Default::default()).await;
    secrets.create(&PostParams::default(), &s).await.unwrap();
    common::grant(
        &pool.admin,
        &pool.ns,
        &secret,
        vec![
            json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]}),
        ],
        json!({"kind": "User", "name": format!("byoh:host:{host}")}),
    )
    .await;
    pool.hosts()
        .patch(
            host,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "machineRef": {"namespace": pool.ns, "name": format!("m-{machine_uid}"), "uid": machine_uid},
                "bootstrapSecret": {"name": secret, "namespace": pool.ns},
            }})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn registers_with_inventory_heartbeats_and_syncs_labels() {
    let pool = Pool::new("agent-reg").await;
    pool.with_host_policy().await;
    let mut host = pool.host("node-a");
    // What an agent from before host-owned labels left: `role`, applied by its field manager.
    let old_agent = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoHost",
        "metadata": {"name": "node-a", "labels": {"role": "worker"}}, "spec": {},
    });
    pool.hosts()
        .patch(
            "node-a",
            &PatchParams::apply("byoh-agent"),
            &Patch::Apply(&old_agent),
        )
        .await
        .unwrap();
    host.start(&["role=worker", "rack=r1"]);
    let h = wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    let status = h.status.clone().unwrap();
    let info = status.host_info.clone().expect("hostInfo");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(info.hostname.as_deref(), Some(kernel.trim()));
    assert_eq!(
        info.machine_id.as_deref(),
        Some("0123456789abcdef0123456789abcdef")
    );
    assert_eq!(info.os_image.as_deref(), Some("Testix 1.0 (agent test)"));
    assert!(info.cpus.unwrap_or(0) >= 1, "cpus: {info:?}");
    assert!(info.memory_bytes.unwrap_or(0) > 0, "memory: {info:?}");
    assert!(info.kernel_version.as_deref().is_some_and(|k| !k.is_empty()));
    assert!(info.architecture.is_some());
    assert!(status.agent_version.is_some());
    assert!(!status.network.is_empty(), "network: {:?}", status.network);
    let registered = bootsman_runtime::conditions::get(&status.conditions, types::REGISTERED).unwrap();
    assert_eq!(registered.observed_generation, h.metadata.generation);
    // The host's own labels go under host.bootsman.io/; the older agent's `role` stays, now the
    // admin's (the new agent applies labels under a field manager of their own and never
    // removes one outside its prefix, which the host policy would refuse).
    let labels = h.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("host.bootsman.io/role").map(String::as_str),
        Some("worker")
    );
    assert_eq!(
        labels.get("host.bootsman.io/rack").map(String::as_str),
        Some("r1")
    );
    assert_eq!(
        labels.get("role").map(String::as_str),
        Some("worker"),
        "{labels:?}"
    );

    // The Lease renews: its renewTime advances.
    let leases: Api<Lease> = Api::namespaced(pool.admin.clone(), &pool.ns);
    let first = renew_time(&leases, "node-a")
        .await
        .expect("a Lease named after the host");
    let lease = leases.get("node-a").await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(lease.lease_duration_seconds, Some(4));
    common::eventually("renewTime advances", || async {
        renew_time(&leases, "node-a").await.filter(|t| *t != first)
    })
    .await;

    // SIGTERM drains cleanly.
    let exit = host.terminate();
    assert!(exit.success(), "SIGTERM exit: {exit:?}\n{}", host.log());

    // Restarted with a changed and a removed label; a label someone else set stays.
    pool.hosts()
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "ops"}}})),
        )
        .await
        .unwrap();
    host.start(&["role=control-plane"]);
    common::eventually("labels synced after restart", || async {
        let h = pool.hosts().get("node-a").await.ok()?;
        let l = h.metadata.labels.unwrap_or_default();
        (l.get("host.bootsman.io/role").map(String::as_str) == Some("control-plane")
            && !l.contains_key("host.bootsman.io/rack"))
        .then_some(l)
    })
    .await;
    let l = pool
        .hosts()
        .get("node-a")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(l.get("team").map(String::as_str), Some("ops"), "labels: {l:?}");
    assert_eq!(l.get("role").map(String::as_str), Some("worker"), "labels: {l:?}");

    // SIGKILL: the Lease stops renewing; a restart brings it back.
    common::eventually("renewing again", || async {
        renew_time(&leases, "node-a").await.filter(|t| *t != first)
    })
    .await;
    host.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let frozen = renew_time(&leases, "node-a").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        renew_time(&leases, "node-a").await.unwrap(),
        frozen,
        "a killed agent renewed"
    );
    host.start(&["role=control-plane"]);
    common::eventually("renewing after restart", || async {
        renew_time(&leases, "node-a").await.filter(|t| *t != frozen)
    })
    .await;
}

const ALL_FILES: &str = r#"#cloud-config
write_files:
  - path: /etc/kubeadm/deep/nested/plain.conf
    content: |
      plain text
    permissions: "0640"
    owner: kube:kubeops
  - path: /etc/b64.txt
    encoding: b64
    content: aGVsbG8gYjY0Cg==
  - path: /etc/base64.txt
    encoding: base64
    content: aGVsbG8gYmFzZTY0Cg==
    owner: "1234:3456"
  - path: /etc/gz.txt
    encoding: gz+b64
    content: H4sIAAAAAAAAA8tIzcnJV0iv4gIAGJpUaQkAAAA=
  - path: /etc/gzip.txt
    encoding: gzip+base64
    content: H4sIAAAAAAAAA8tIzcnJV0iv4gIAGJpUaQkAAAA=
  - path: /etc/appended.txt
    content: "one\n"
  - path: /etc/appended.txt
    content: "two\n"
    append: true
  - path: /etc/hosts
    content: "10.0.0.10 cp.example.internal\n"
    append: true
  - path: /etc/containerd/config.toml
    content: "version = 3\n"
  - path: /usr/local/bin/suid-tool
    content: "echo suid\n"
    permissions: "4755"
    owner: "1234:3456"
  - path: /etc/resolv.conf
    content: "nameserver 10.0.0.53\n"
runcmd:
  - echo "$BYOH_ROOT" > run/root.txt
  - [ sh, -c, "pwd > run/cwd.txt; echo started >> run/count.txt" ]
  - kubeadm init --config /etc/kubeadm/deep/nested/plain.conf
  - umask > run/umask.txt
"#;

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_writes_files_runs_commands_and_release_resets() {
    let pool = Pool::new("agent-boot").await;
    let mut host = pool.host("node-b");
    std::fs::create_dir_all(host.path("run")).unwrap();
    host.script(
        "/usr/local/bin/kubeadm",
        "echo \"$@\" >> \"$BYOH_ROOT/run/kubeadm.log\"",
    );
    // Files of the host that the bootstrap appends to and overwrites.
    std::fs::write(host.path("/etc/hosts"), "127.0.0.1 localhost\n").unwrap();
    std::fs::create_dir_all(host.path("/etc/containerd")).unwrap();
    let config = host.path("/etc/containerd/config.toml");
    std::fs::write(&config, "version = 2 # the site's own\n").unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&config, Some(1234), Some(3456)).unwrap();
    // /etc/resolv.conf is a link, as systemd-resolved makes it.
    std::fs::create_dir_all(host.path("/run/systemd")).unwrap();
    std::fs::write(host.path("/run/systemd/resolv.conf"), "nameserver 127.0.0.53\n").unwrap();
    std::os::unix::fs::symlink("../run/systemd/resolv.conf", host.path("/etc/resolv.conf")).unwrap();
    // As the unit runs it: UMask=0077 for the agent's own files.
    host.start_with_unit_umask(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    hand_over(&pool, "node-b", "uid-b1", ALL_FILES).await;
    let h = wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "True").await;

    assert_eq!(
        read(&host.path("/etc/kubeadm/deep/nested/plain.conf")),
        "plain text\n"
    );
    let meta = std::fs::metadata(host.path("/etc/kubeadm/deep/nested/plain.conf")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    // The directories it created are 0755, as cloud-init makes them, not the agent's umask 0077.
    for d in ["/etc/kubeadm", "/etc/kubeadm/deep", "/etc/kubeadm/deep/nested"] {
        let mode = std::fs::metadata(host.path(d)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "{d} has mode {mode:o}");
    }
    assert_eq!((meta.uid(), meta.gid()), (1234, 3456));
    let meta = std::fs::metadata(host.path("/etc/base64.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 3456));
    assert_eq!(read(&host.path("/etc/b64.txt")), "hello b64\n");
    assert_eq!(read(&host.path("/etc/base64.txt")), "hello base64\n");
    assert_eq!(read(&host.path("/etc/gz.txt")), "hello gz\n");
    assert_eq!(read(&host.path("/etc/gzip.txt")), "hello gz\n");
    assert_eq!(read(&host.path("/etc/appended.txt")), "one\ntwo\n");
    assert_eq!(
        read(&host.path("/etc/hosts")),
        "127.0.0.1 localhost\n10.0.0.10 cp.example.internal\n"
    );
    assert_eq!(read(&config), "version = 3\n");
    // The owner is set before the mode, so the setuid bit survives the chown.
    let meta = std::fs::metadata(host.path("/usr/local/bin/suid-tool")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o4755);
    assert_eq!((meta.uid(), meta.gid()), (1234, 3456));
    // Written through the link, which stays a link.
    assert!(
        std::fs::symlink_metadata(host.path("/etc/resolv.conf"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        read(&host.path("/run/systemd/resolv.conf")),
        "nameserver 10.0.0.53\n"
    );
    let root = std::fs::canonicalize(&host.root).unwrap();
    assert_eq!(read(&host.path("run/root.txt")).trim(), root.to_str().unwrap());
    assert_eq!(read(&host.path("run/cwd.txt")).trim(), root.to_str().unwrap());
    assert_eq!(
        read(&host.path("run/kubeadm.log")),
        "init --config /etc/kubeadm/deep/nested/plain.conf\n"
    );
    // Bootstrap commands run with an ordinary system's umask, not the agent's 0077.
    assert_eq!(read(&host.path("run/umask.txt")).trim(), "0022");
    let cond =
        bootsman_runtime::conditions::get(&h.status.as_ref().unwrap().conditions, types::BOOTSTRAP_SUCCEEDED)
            .unwrap()
            .clone();
    assert_eq!(cond.observed_generation, h.metadata.generation);

    // A restart does not run a finished bootstrap again.
    host.terminate();
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(read(&host.path("run/count.txt")), "started\n");

    // Release: kubeadm reset (without the etcd member removal Cluster API does itself), every
    // written file removed, CleanupSucceeded=True.
    pool.hosts()
        .patch(
            "node-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": {
                "machineUID": "uid-b1",
                "requestedAt": k8s_openapi::jiff::Timestamp::now().to_string(),
            }}})),
        )
        .await
        .unwrap();
    wait_condition(&pool.hosts(), &host, types::CLEANUP_SUCCEEDED, "True").await;
    assert!(read(&host.path("run/kubeadm.log")).ends_with("reset -f --skip-phases=remove-etcd-member\n"));
    for f in [
        "/etc/kubeadm/deep/nested/plain.conf",
        "/etc/b64.txt",
        "/etc/base64.txt",
        "/etc/gz.txt",
        "/etc/gzip.txt",
        "/etc/appended.txt",
    ] {
        assert!(!host.path(f).exists(), "{f} survived the reset");
    }
    // What was there before is put back: the appended line cut off, the overwritten file
    // restored with its mode and owner.
    assert_eq!(read(&host.path("/etc/hosts")), "127.0.0.1 localhost\n");
    assert_eq!(read(&config), "version = 2 # the site's own\n");
    assert!(
        !host.path("/usr/local/bin/suid-tool").exists(),
        "suid-tool survived the reset"
    );
    assert!(
        std::fs::symlink_metadata(host.path("/etc/resolv.conf"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(read(&host.path("/etc/resolv.conf")), "nameserver 127.0.0.53\n");
    let meta = std::fs::metadata(&config).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (1234, 3456));
    assert!(
        host.path("/etc/os-release").exists(),
        "reset removed a file bootstrap did not write"
    );
}

/// Starts an agent for `name`, hands it `data` and returns the host and the message of its
/// failed bootstrap.
async fn failed_bootstrap(pool: &Pool, name: &str, uid: &str, data: &str) -> (common::Host, String) {
    let mut host = pool.host(name);
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    hand_over(pool, name, uid, data).await;
    let h = wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "False").await;
    let msg = message(&h, types::BOOTSTRAP_SUCCEEDED);
    (host, msg)
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_are_reported_with_the_output_tail() {
    let pool = Pool::new("agent-fail").await;
    let (host, msg) = failed_bootstrap(
        &pool,
        "node-c",
        "uid-c1",
        "#cloud-config\nruncmd:\n  - echo first-line; echo the-reason-it-broke >&2; exit 3\n  - touch never\n",
    )
    .await;
    assert!(msg.contains("the-reason-it-broke"), "message: {msg}");
    assert!(msg.contains('3'), "message names the exit status: {msg}");
    assert!(!host.path("never").exists());

    // Bootstrap data with a directive the agent does not run is refused before any step runs.
    let (other, msg) = failed_bootstrap(
        &pool,
        "node-d",
        "uid-d1",
        "#cloud-config\npackages:\n  - kubelet\nruncmd:\n  - touch never\n",
    )
    .await;
    assert!(msg.contains("packages"), "message names the directive: {msg}");
    assert!(!other.path("never").exists());

    // A symlink inside the root that leads out of it is not followed.
    let outside = std::env::temp_dir().join(format!("byoh-agent-outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    let prepared = pool.host("node-f");
    std::os::unix::fs::symlink(&outside, prepared.path("/etc/evil")).unwrap();
    drop(prepared);
    let (_escaped, msg) = failed_bootstrap(
        &pool,
        "node-f",
        "uid-f1",
        "#cloud-config\nwrite_files:\n  - path: /etc/evil/pwned\n    content: x\n",
    )
    .await;
    assert!(msg.contains("/etc/evil/pwned"), "message names the path: {msg}");
    assert!(!outside.join("pwned").exists(), "bootstrap wrote outside --root");
}

/// Interrupts a bootstrap in its second (sleeping) step with `interrupt`, restarts the agent and
/// checks it resumes: the finished first step is not repeated, the interrupted one runs again.
async fn resumes_after(prefix: &str, interrupt: fn(&mut common::Host)) {
    let pool = Pool::new(prefix).await;
    let mut host = pool.host("node-e");
    std::fs::create_dir_all(host.path("run")).unwrap();
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    let data = "#cloud-config\nruncmd:\n  - echo x >> run/first.txt\n  - \"echo x >> run/second.txt; if [ ! -e run/go ]; then sleep 300; fi\"\n  - echo x >> run/third.txt\n";
    hand_over(&pool, "node-e", "uid-e1", data).await;
    let second = host.path("run/second.txt");
    common::eventually("the second step runs", || async { second.exists().then_some(()) }).await;
    interrupt(&mut host);
    assert!(!host.path("run/third.txt").exists());
    std::fs::write(host.path("run/go"), "").unwrap();
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "True").await;
    assert_eq!(
        read(&host.path("run/first.txt")),
        "x\n",
        "a finished step ran again"
    );
    assert_eq!(read(&host.path("run/second.txt")), "x\nx\n");
    assert_eq!(read(&host.path("run/third.txt")), "x\n");
}

/// The fault of a host cut from the API server for 60 s while a bootstrap command runs, far
/// longer than its Lease lasts (4 s): the agent keeps running, the command is neither killed nor
/// run again, it finishes during the outage, and the result is reported once the API server is
/// reachable again.
#[tokio::test(flavor = "multi_thread")]
async fn a_bootstrap_outlasts_a_60s_cut_from_the_api_server() {
    let pool = Pool::new("agent-outage").await;
    let mut host = pool.host("node-o");
    let api = pool.env.api_url().to_string();
    let relay = common::Relay::start(api.trim_start_matches("https://"));
    let kubeconfig = read(&host.kubeconfig).replace(&api, &format!("https://{}", relay.addr));
    assert!(kubeconfig.contains(&relay.addr.to_string()), "{kubeconfig}");
    std::fs::write(&host.kubeconfig, kubeconfig).unwrap();
    std::fs::create_dir_all(host.path("run")).unwrap();
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    let pid = host.pid();
    let data = "#cloud-config\nruncmd:\n  - \"echo x >> run/started.txt; while [ ! -e run/go ]; do sleep 0.2; done; echo x >> run/done.txt\"\n  - echo x >> run/after.txt\n";
    hand_over(&pool, "node-o", "uid-o1", data).await;
    let started = host.path("run/started.txt");
    common::eventually("the command starts", || async { started.exists().then_some(()) }).await;

    // The command ends after 20 s (within the agent's 30 s command timeout), the cut after 60.
    relay.set_cut(true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        host.is_running(),
        "the agent exited while cut off:\n{}",
        host.log()
    );
    std::fs::write(host.path("run/go"), "").unwrap();
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert!(
        host.is_running(),
        "the agent exited while cut off:\n{}",
        host.log()
    );
    assert_eq!(
        read(&host.path("run/done.txt")),
        "x\n",
        "the command did not finish while cut off"
    );
    relay.set_cut(false);

    let h = wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "True").await;
    assert_eq!(host.pid(), pid, "the agent was restarted");
    assert_eq!(
        read(&started),
        "x\n",
        "the command ran twice: {}",
        message(&h, types::BOOTSTRAP_SUCCEEDED)
    );
    assert_eq!(read(&host.path("run/after.txt")), "x\n");
    let log = host.log();
    assert!(log.contains("heartbeat lost"), "the loss is not reported:\n{log}");
    common::eventually("the agent reports its heartbeat restored", || async {
        host.log().contains("heartbeat restored").then_some(())
    })
    .await;
    let exit = host.terminate();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_bootstrap_resumes_without_repeating_finished_steps() {
    resumes_after("agent-resume", |h| h.kill()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_bootstrap_exits_zero_and_keeps_progress() {
    resumes_after("agent-drain", |h| {
        let exit = h.terminate();
        assert!(exit.success(), "SIGTERM mid-command: {exit:?}\n{}", h.log());
    })
    .await;
}

/// `GET path` on a loopback HTTP server; the status line and body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_livez_and_metrics() {
    let pool = Pool::new("agent-metrics").await;
    let mut host = pool.host("node-m");
    let port = bootsman_testenv::free_port().unwrap();
    host.metrics_bind_address = format!("127.0.0.1:{port}");
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    let addr = host.metrics_bind_address.clone();
    assert!(http_get(&addr, "/livez").starts_with("HTTP/1.1 200"));
    let metrics = common::eventually("a renewal counted", || async {
        let m = http_get(&addr, "/metrics");
        m.lines()
            .any(|l| {
                l.starts_with("bootsman_agent_heartbeat_renewals_total")
                    || l.starts_with("agent_heartbeat_renewals_total")
            })
            .then_some(m)
    })
    .await;
    for name in [
        "heartbeat_failures_total",
        "heartbeat_last_success_timestamp_seconds",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    let exit = host.terminate();
    assert!(exit.success(), "{exit:?}");
}

fn run_agent(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_byoh-agent"))
        .args(args)
        .env_remove("BYOH_NAMESPACE")
        .env_remove("BYOH_NAME")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_name_the_flag_and_rule() {
    let dir = std::env::temp_dir().join(format!("byoh-agent-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.to_str().unwrap();
    let base = ["--namespace", "pool", "--state-dir", state];
    let cases: &[(&[&str], &[&str])] = &[
        (&["--name", "Not_A_Host"], &["--name", "RFC 1123"]),
        (
            &["--name", "h", "--heartbeat-interval", "soon"],
            &["--heartbeat-interval"],
        ),
        (
            &["--name", "h", "--command-timeout", "0s"],
            &["--command-timeout", "more than zero"],
        ),
        (&["--name", "h", "--label", "novalue"], &["--label", "key=value"]),
        (
            &["--name", "h", "--label", "bad key=v"],
            &["--label", "label key"],
        ),
        (
            &["--name", "h", "--label", "node-role.kubernetes.io/control-plane="],
            &["--label", "host.bootsman.io/", "rule: host-owned-labels"],
        ),
        (
            &["--name", "h", "--label", "topology.kubernetes.io/zone=a"],
            &["--label", "rule: host-owned-labels"],
        ),
        (
            &["--name", "h", "--label", "host.bootsman.io/bad key=v"],
            &["--label", "label key"],
        ),
        (&["--name", "h", "--root", "/nonexistent/root"], &["--root"]),
        (
            &["--name", "h", "--kubeconfig", "/nonexistent/kubeconfig"],
            &["bootstrap kubeconfig"],
        ),
    ];
    for (extra, want) in cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let (ok, err) = run_agent(&args);
        assert!(!ok, "{args:?} was accepted");
        for w in *want {
            assert!(err.contains(w), "{args:?}: the error does not say {w:?}:\n{err}");
        }
    }
    let (ok, err) = run_agent(&["--name", "h"]);
    assert!(!ok);
    assert!(err.contains("--namespace"), "{err}");
    // A pool is a namespace: a host name's dots are not allowed in it.
    let (ok, err) = run_agent(&["--name", "h", "--namespace", "pool.a", "--state-dir", state]);
    assert!(!ok, "--namespace pool.a was accepted");
    assert!(
        err.contains("--namespace") && err.contains("RFC 1123 label"),
        "{err}"
    );
}

/// A host claimed for a new machine while it still holds another machine's bootstrap (a
/// quarantine lifted by an admin skips the release) is reset before the new bootstrap runs:
/// `kubeadm reset`, the old machine's files gone, then the new machine's `kubeadm join`.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_claimed_again_without_release_is_reset_before_its_next_bootstrap() {
    let pool = Pool::new("agent-reclaim").await;
    let mut host = pool.host("node-r");
    std::fs::create_dir_all(host.path("run")).unwrap();
    host.script(
        "/usr/local/bin/kubeadm",
        "echo \"$@\" >> \"$BYOH_ROOT/run/kubeadm.log\"",
    );
    host.start(&[]);
    wait_condition(&pool.hosts(), &host, types::REGISTERED, "True").await;
    let first = "#cloud-config\nwrite_files:\n  - path: /etc/first.conf\n    content: one\nruncmd:\n  - kubeadm init\n";
    hand_over(&pool, "node-r", "uid-r1", first).await;
    wait_condition(&pool.hosts(), &host, types::BOOTSTRAP_SUCCEEDED, "True").await;
    assert!(host.path("/etc/first.conf").exists());

    // The claim goes without a release (as when an admin lifts a quarantine), then a new one.
    pool.hosts()
        .patch(
            "node-r",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"machineRef": null, "bootstrapSecret": null}})),
        )
        .await
        .unwrap();
    let second = "#cloud-config\nruncmd:\n  - kubeadm join\n";
    hand_over(&pool, "node-r", "uid-r2", second).await;
    wait_for("the second bootstrap", Duration::from_secs(60), || async {
        let log = std::fs::read_to_string(host.path("run/kubeadm.log")).unwrap_or_default();
        if log.ends_with("join\n") {
            Ok(log)
        } else {
            Err(log)
        }
    })
    .await;
    assert_eq!(
        read(&host.path("run/kubeadm.log")),
        "init\nreset -f --skip-phases=remove-etcd-member\njoin\n",
        "reset between the two machines' bootstraps"
    );
    assert!(
        !host.path("/etc/first.conf").exists(),
        "the first machine's file is gone"
    );
}
