//! Child processes of a control plane: started with their output in a log file, killed when the
//! control plane is dropped, and killed by the kernel when the process that started them dies for
//! any reason (a panic, a signal, `kill -9`), so no component is ever left behind: a control plane
//! that was not stopped is restarted from its folder, never found half-running.
//!
//! The kernel guarantee comes from `setpriv --pdeathsig KILL`: the child gets SIGKILL when the
//! thread that spawned it exits. Every child is therefore spawned from one spawner thread that
//! lives as long as the process.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result, io};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("controlplane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static, so this loop never ends before the process does.
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("controlplane: cannot start the spawner thread: {e}"));
        Mutex::new(tx)
    })
}

/// Whether `setpriv` is available to tie children to this process's lifetime.
fn setpriv() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        Command::new("setpriv")
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    })
}

/// How a component is set apart from the rest of the machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// A plain child process.
    #[default]
    Shared,
    /// In a mount and a PID namespace of its own (`unshare --mount --pid --fork --kill-child
    /// --mount-proc`; needs root): it sees only its own processes, no mount it makes reaches the
    /// machine, and it dies with its `unshare`. The network and the files stay the machine's: it
    /// serves on the machine's address and keeps its state in the control plane's folder.
    Namespaces,
}

/// One running component.
#[derive(Debug)]
pub struct Component {
    name: String,
    child: Mutex<Option<Child>>,
    log: PathBuf,
}

impl Component {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self> {
        Self::spawn_with(name, program, args, envs, log, Isolation::Shared)
    }

    /// [`Self::spawn`], set apart as `isolation` says. The process id is then the `unshare`
    /// holding the namespaces; killing it kills the component.
    pub fn spawn_with(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: PathBuf,
        isolation: Isolation,
    ) -> Result<Self> {
        let out = File::create(&log).map_err(io("create log file", &log))?;
        let err = out.try_clone().map_err(io("open log file", &log))?;
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if setpriv() {
            argv.extend(["setpriv", "--pdeathsig", "KILL", "--"].map(Into::into));
        }
        if isolation == Isolation::Namespaces {
            argv.extend(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount-proc",
                    "--",
                ]
                .map(Into::into),
            );
        }
        argv.push(program.as_os_str().to_owned());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| Error::Invalid {
                what: "spawner".into(),
                detail: "lock poisoned".into(),
            })?
            .send((cmd, reply_tx))
            .map_err(|_| Error::Invalid {
                what: "spawner".into(),
                detail: "thread is gone".into(),
            })?;
        let child = reply_rx
            .recv()
            .map_err(|_| Error::Invalid {
                what: "spawner".into(),
                detail: "no reply".into(),
            })?
            .map_err(io("start component", program))?;
        Ok(Self {
            name: name.into(),
            child: Mutex::new(Some(child)),
            log,
        })
    }

    /// Process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().ok()?.as_ref().map(Child::id)
    }

    /// Component name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path of the log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails with the log tail if the process has exited.
    pub fn check_running(&self) -> Result<()> {
        let mut guard = self.child.lock().map_err(|_| self.failed("lock poisoned"))?;
        match guard.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => Err(self.failed(&format!("exited with {status}"))),
            Some(Err(e)) => Err(self.failed(&format!("cannot be waited for: {e}"))),
            None => Err(self.failed("was stopped")),
        }
    }

    /// An error naming this component, with the end of its log.
    pub fn failed(&self, problem: &str) -> Error {
        Error::Component {
            component: self.name.clone(),
            problem: problem.into(),
            log: self.log.clone(),
            tail: tail(&self.log, 30),
        }
    }

    /// Waits until the component answers a plain-HTTP `GET /readyz` on loopback `port` with 200;
    /// fails with its log tail when it stops or after two minutes.
    pub async fn wait_ready(&self, port: u16) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            self.check_running()?;
            if http_ok(port, "/readyz").await {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(self.failed("did not become ready (/readyz)"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }

    /// Kills the process and reaps it; returns once its own children (the component itself,
    /// under [`Isolation::Namespaces`], which the kernel kills as `unshare` dies) are gone too, so
    /// its ports are free.
    pub fn stop(&self) {
        if let Ok(mut guard) = self.child.lock()
            && let Some(mut child) = guard.take()
        {
            let inner = children_of(child.id());
            let _ = child.kill();
            let _ = child.wait();
            // A killed process that is writing to a busy disk can take seconds to exit, and
            // its listening sockets accept connections until it has.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while inner.iter().any(|p| running(*p)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let left: Vec<u32> = inner.into_iter().filter(|p| running(*p)).collect();
            if !left.is_empty() {
                eprintln!(
                    "controlplane: {}: process(es) {left:?} still running 30 s after the kill",
                    self.name
                );
            }
        }
    }
}

/// The ids of the children of process `pid` (every thread's), from `/proc`: e.g. the process an
/// `unshare --fork` started.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file (at most 64 KiB are read).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let buf = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = buf.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A plain-HTTP GET on loopback that reports whether the status is 200.
async fn http_ok(port: u16, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = vec![0u8; 64];
    let n = s.read(&mut buf).await.unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")
}
