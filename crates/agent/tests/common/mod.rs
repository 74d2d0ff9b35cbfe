//! A pool namespace of the real control plane and real `byoh-agent` processes serving hosts in
//! it, each confined to its own `--root` and `--state-dir` under a temporary directory.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // shared by several test binaries

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bootsman_api::v1beta1::ByoHost;
use bootsman_runtime::conditions;
use bootsman_testenv::TestEnv;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// How long "eventually" waits.
pub const WAIT: Duration = Duration::from_secs(60);

/// A namespace where hosts (group `byoh:hosts`) may register, heartbeat, post Events and read
/// Secrets, as the platform's host role allows.
pub struct Pool {
    /// The control plane.
    pub env: &'static TestEnv,
    /// The pool namespace.
    pub ns: String,
    /// An administrator client.
    pub admin: kube::Client,
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> serde_json::Value {
    json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
}

/// Grants `rules` in `ns` to `subject` (`{"kind": "User"|"Group", "name": ...}`) with a Role and
/// a RoleBinding both named `name`.
pub async fn grant(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    rules: Vec<serde_json::Value>,
    subject: serde_json::Value,
) {
    let pp = PatchParams::apply("agent-test").force();
    let mut subject = subject;
    subject["apiGroup"] = "rbac.authorization.k8s.io".into();
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": ns},
        "rules": rules,
    });
    Api::<Role>::namespaced(admin.clone(), ns)
        .patch(name, &pp, &Patch::Apply(role))
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [subject],
    });
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .patch(name, &pp, &Patch::Apply(binding))
        .await
        .unwrap();
}

impl Pool {
    /// A fresh pool namespace in `env`.
    pub async fn new_in(env: &'static TestEnv, prefix: &str) -> Self {
        let ns = env.create_namespace(prefix).await;
        let admin = env.client().await;
        let rw = ["get", "list", "watch", "create", "update", "patch"];
        let rules = vec![
            rule(
                "infrastructure.cluster.x-k8s.io",
                &["byohosts", "byohosts/status"],
                &rw,
            ),
            rule(
                "coordination.k8s.io",
                &["leases"],
                &["get", "create", "update", "patch"],
            ),
            rule("", &["events"], &["create", "patch"]),
            rule("events.k8s.io", &["events"], &["create", "patch"]),
        ];
        grant(
            &admin,
            &ns,
            "agent-hosts",
            rules,
            json!({"kind": "Group", "name": "byoh:hosts"}),
        )
        .await;
        Self { env, ns, admin }
    }

    /// Sets label `key=value` on ByoHost `host` as an admin does (placement labels are the
    /// admin's; a host sets only its own, under `host.bootsman.io/`).
    pub async fn label(&self, host: &str, key: &str, value: &str) {
        Api::<ByoHost>::namespaced(self.admin.clone(), &self.ns)
            .patch(
                host,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
            )
            .await
            .unwrap();
    }

    /// Applies `config/rbac` (the host roles and the host policy) and waits until the policy
    /// refuses a host's placement label, so that what follows runs under it.
    pub async fn with_host_policy(&self) {
        let dir = bootsman_testenv::repo_root().join("config/rbac");
        self.env.apply_kustomization(&dir).unwrap();
        let probe = self
            .env
            .client_for("byoh:host:policy-probe", &["byoh:hosts"])
            .await;
        let hosts: Api<ByoHost> = Api::namespaced(probe, &self.ns);
        let admin_hosts: Api<ByoHost> = Api::namespaced(self.admin.clone(), &self.ns);
        let body = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "ByoHost",
            "metadata": {"name": "policy-probe", "labels": {"role": "control-plane"}}, "spec": {},
        });
        eventually("the host policy refuses placement labels", || async {
            match hosts
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(body.clone()).unwrap(),
                )
                .await
            {
                Err(kube::Error::Api(s)) if s.message.contains("host.bootsman.io/") => Some(()),
                Ok(_) => {
                    let _ = admin_hosts.delete("policy-probe", &Default::default()).await;
                    None
                }
                Err(_) => None,
            }
        })
        .await;
    }

    /// A fresh pool namespace in the shared control plane.
    pub async fn new(prefix: &str) -> Self {
        Self::new_in(TestEnv::shared().await, prefix).await
    }

    /// The ByoHosts of the pool, as an administrator sees them.
    pub fn hosts(&self) -> Api<ByoHost> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// A host directory with `root/` (a fake /etc), `state/` and its identity in `state/`.
    pub fn host(&self, name: &str) -> Host {
        let dir = std::env::temp_dir().join(format!(
            "byoh-agent-test-{}-{name}-{}",
            self.ns,
            std::process::id()
        ));
        let root = dir.join("root");
        let state = dir.join("state");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(
            root.join("etc/os-release"),
            "NAME=\"Testix\"\nPRETTY_NAME=\"Testix 1.0 (agent test)\"\nID=testix\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/machine-id"), "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nkube:x:1234:2345::/home/kube:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nkubeops:x:3456:\n").unwrap();
        // The test CA's serial file is not safe for concurrent signing: one certificate at a time.
        static SIGNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let kc = {
            let _one = SIGNING.lock().unwrap_or_else(|e| e.into_inner());
            self.env
                .kubeconfig_for(&format!("byoh:host:{name}"), &["byoh:hosts"])
                .unwrap()
        };
        let kubeconfig = state.join("kubeconfig");
        std::fs::copy(kc, &kubeconfig).unwrap();
        Host {
            name: name.into(),
            ns: self.ns.clone(),
            root,
            state,
            kubeconfig,
            bin: agent_bin(),
            metrics_bind_address: "127.0.0.1:0".into(),
            command_timeout: "30s".into(),
            bootstrap_kubeconfig: None,
            child: None,
        }
    }
}

/// One server of the pool and its agent process.
pub struct Host {
    /// Host name.
    pub name: String,
    /// Pool namespace.
    pub ns: String,
    /// `--root`.
    pub root: PathBuf,
    /// `--state-dir`.
    pub state: PathBuf,
    /// `--kubeconfig`.
    pub kubeconfig: PathBuf,
    /// The agent binary to run.
    pub bin: String,
    /// `--metrics-bind-address` (any free loopback port unless a test picks one).
    pub metrics_bind_address: String,
    /// `--command-timeout`.
    pub command_timeout: String,
    /// `--bootstrap-kubeconfig`: the agent enrols with it when `--kubeconfig` does not exist.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    child: Option<Child>,
}

/// The agent binary cargo built for the tests (empty in programs that name their own).
pub fn agent_bin() -> String {
    option_env!("CARGO_BIN_EXE_byoh-agent")
        .unwrap_or_default()
        .to_string()
}

impl Host {
    /// The agent's command line for this host, heartbeating every second.
    pub fn command(&self, labels: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--namespace")
            .arg(&self.ns)
            .arg("--name")
            .arg(&self.name)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--heartbeat-interval")
            .arg("1s")
            .arg("--command-timeout")
            .arg(&self.command_timeout)
            .arg("--metrics-bind-address")
            .arg(&self.metrics_bind_address)
            .arg("--log-format")
            .arg("text");
        for l in labels {
            c.arg("--label").arg(l);
        }
        if let Some(b) = &self.bootstrap_kubeconfig {
            c.arg("--bootstrap-kubeconfig").arg(b);
        }
        c.env_remove("BYOH_LABELS").env("RUST_LOG", "info,kube=warn");
        c
    }

    /// Starts the agent with `labels`; its log goes to `state/agent.log`.
    pub fn start(&mut self, labels: &[&str]) {
        let cmd = self.command(labels);
        self.spawn(cmd);
    }

    /// Starts the agent as its systemd unit does, with `UMask=0077`.
    pub fn start_with_unit_umask(&mut self, labels: &[&str]) {
        let agent = self.command(labels);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("umask 0077 && exec \"$0\" \"$@\"")
            .arg(agent.get_program())
            .args(agent.get_args());
        for (k, v) in agent.get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        self.spawn(cmd);
    }

    fn spawn(&mut self, mut cmd: Command) {
        assert!(self.child.is_none(), "agent already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state.join("agent.log"))
            .unwrap();
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn().unwrap();
        self.child = Some(child);
    }

    /// The running agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("agent running").id()
    }

    /// Whether the agent started last is still running (it has not exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().is_ok_and(|s| s.is_none()))
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("agent running");
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        for _ in 0..300 {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = c.kill();
        panic!("agent did not stop within 30s of SIGTERM; log:\n{}", self.log());
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.join("agent.log")).unwrap_or_default()
    }

    /// A path inside the root.
    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// Installs an executable script at `p` inside the root.
    pub fn script(&self, p: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until the host's ByoHost has condition `type_` with `status`, then returns it.
pub async fn wait_condition(api: &Api<ByoHost>, host: &Host, type_: &str, status: &str) -> ByoHost {
    let what = format!("{}/{} {type_}={status}", host.ns, host.name);
    let name = host.name.clone();
    let type_ = type_.to_string();
    let status = status.to_string();
    let got = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(Some(h)) = api.get_opt(&name).await {
                let conds = h
                    .status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
                if conditions::get(&conds, &type_).is_some_and(|c| c.status == status) {
                    return h;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    match got {
        Ok(h) => h,
        Err(_) => panic!("timed out waiting for {what}; agent log:\n{}", host.log()),
    }
}

/// The message of condition `type_`.
pub fn message(h: &ByoHost, type_: &str) -> String {
    let conds = h
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions::get(&conds, type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Reads a file, or panics naming it.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Polls `check` until it yields a value, or panics naming `what` after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A TCP relay in front of the API server that can be cut, as a host's network can: while cut,
/// every connection through it is closed and new ones are closed as soon as they are accepted.
pub struct Relay {
    /// `127.0.0.1:<port>` the relay listens on.
    pub addr: std::net::SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    /// Relays `127.0.0.1:<any port>` to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let upstream = upstream.to_string();
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                if c.load(Ordering::SeqCst) {
                    let _ = inbound.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(outbound) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let (Ok(in2), Ok(out2)) = (inbound.try_clone(), outbound.try_clone()) else {
                    continue;
                };
                {
                    let mut open = o.lock().unwrap_or_else(|e| e.into_inner());
                    open.extend([inbound.try_clone(), outbound.try_clone()].into_iter().flatten());
                }
                for (mut from, mut to) in [(inbound, outbound), (out2, in2)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, cut, open }
    }

    /// Cuts (`true`) or restores (`false`) the connection to the API server.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for s in self.open.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
