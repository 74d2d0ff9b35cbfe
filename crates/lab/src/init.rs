//! The first process of a lab host (`bootsman-lab host-init SPEC`): what the kernel's init and
//! systemd do on a server, inside the host's own PID, mount, UTS, IPC and network namespaces.
//!
//! 1. **File system**: a fresh sysfs (so `/sys/class/net` shows the host's own interfaces) with
//!    the cgroup hierarchies mounted again beneath it (runc finds no cgroups otherwise); overlays
//!    over `/etc`, `/usr`, `/var` and `/opt` whose upper layers live in the host's folder, so a
//!    package install or kubeadm writes there and never into the machine's own files; the
//!    host's own `/run`, `/tmp` and `/var/lib/etcd` (tmpfs), `/root`, `/var/lib/containerd`,
//!    `/var/lib/kubelet` and `/var/log/pods` (folders of the host, not on overlayfs, which the
//!    overlay snapshotter cannot nest on); files holding the values the kubelet wants bound over
//!    the machine-wide sysctls it would otherwise write (`vm.overcommit_memory`, `kernel.panic`,
//!    ...), so the machine's values never change.
//! 2. **Network**: waits for `eth0` (the lab moves one end of a veth pair in), gives it the
//!    host's address and default route, enables forwarding in this namespace only.
//! 3. **Services**: a small service manager. The units named in the spec (containerd, kubelet,
//!    byoh-agent) run from their unit files ([`crate::unit`]) when enabled (a
//!    `multi-user.target.wants` link, as `systemctl enable` leaves), restart as their unit says,
//!    log to `<host dir>/logs/<unit>.log` (the host's journal), and are controlled by the
//!    `systemctl` stand-in ([`crate::systemctl`]) through a socket in `/run/bootsman-lab`, as
//!    kubeadm and an operator's `systemctl enable --now byoh-agent` expect.
//! 4. **Reaping and shutdown**: reaps every orphan (it is PID 1); on SIGTERM stops the units
//!    (SIGTERM, then SIGKILL after `TimeoutStopSec`) and exits, which ends every process left
//!    in the host's PID namespace.
//!
//! Once running it writes `/run/bootsman-lab/ready`; the lab reads it through
//! `/proc/<pid>/root`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::stat::{Mode, umask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::systemctl::{Reply, Request};
use crate::unit::{self, Restart, Service};

/// Folder of the init's socket and ready marker, inside the host.
pub const RUN_DIR: &str = "/run/bootsman-lab";
/// The `systemctl` stand-in's socket.
pub const SOCKET: &str = "/run/bootsman-lab/systemctl.sock";
/// Written once the host is up.
pub const READY: &str = "/run/bootsman-lab/ready";
/// Where `systemctl enable` links units.
const WANTS: &str = "/etc/systemd/system/multi-user.target.wants";

/// What the lab tells a host's init (JSON in the file named on the command line).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct HostSpec {
    /// Host name (UTS), also the ByoHost name.
    pub name: String,
    /// The host's folder on the machine (overlay upper layers, data folders, logs).
    pub dir: PathBuf,
    /// Address of `eth0` with prefix, e.g. `172.31.77.101/24`.
    pub address: String,
    /// Default gateway.
    pub gateway: String,
    /// The units this host may run (others are not started even when enabled).
    pub units: Vec<String>,
    /// cgroup (relative to each hierarchy) created for the kubelet's `--cgroup-root`.
    pub cgroup_root: String,
    /// Folders of the machine made visible inside the host under `/run/bootsman-lab/<name>`
    /// (the lab's programs), bound before anything else covers their paths.
    pub exports: Vec<(PathBuf, String)>,
}

/// Where the host's own folder ([`HostSpec::dir`]) is seen from inside the host.
pub const HOST_DIR: &str = "/run/bootsman-lab/host";

impl HostSpec {
    /// Upper layer of the overlay over `/<dir>` (`etc`, `usr`, `var`, `opt`, `root`), as the
    /// lab sees it from outside (to write files before the host boots).
    pub fn upper(&self, dir: &str) -> PathBuf {
        self.dir.join("upper").join(dir)
    }
    /// The host's journal, as the lab sees it: one log per unit.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
}

/// The folders over which overlays are mounted.
pub const OVERLAYS: [&str; 5] = ["etc", "usr", "var", "opt", "root"];

/// Folders of the host that live in its own folder on the machine's file system (not on
/// overlayfs), bind-mounted.
const DATA: [(&str, &str); 4] = [
    ("containerd", "/var/lib/containerd"),
    ("kubelet", "/var/lib/kubelet"),
    ("pods", "/var/log/pods"),
    ("cni", "/var/lib/cni"),
];

/// Sysctls the kubelet sets machine-wide, with the values it wants.
const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Runs the host. Returns when it was told to stop; errors before the services run are fatal.
pub fn run(spec_path: &Path) -> Result<(), String> {
    let spec: HostSpec = serde_json::from_slice(
        &std::fs::read(spec_path).map_err(|e| format!("read {}: {e}", spec_path.display()))?,
    )
    .map_err(|e| format!("parse {}: {e}", spec_path.display()))?;
    if std::process::id() != 1 {
        return Err("host-init must be the first process of a new PID namespace".into());
    }
    let cgroups = cgroup_mounts()?;
    mount_file_systems(&spec, &cgroups)?;
    nix::unistd::sethostname(&spec.name).map_err(|e| format!("set host name: {e}"))?;
    configure_network(&spec)?;
    create_cgroup_root(&spec, &cgroups)?;

    let (tx, rx) = mpsc::channel();
    listen_for_signals(tx.clone())?;
    listen_for_systemctl(tx)?;
    let mut init = Init::new(&spec);
    init.boot();
    std::fs::write(READY, b"ok\n").map_err(|e| format!("write {READY}: {e}"))?;
    init.serve(&rx);
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// File system.

/// A cgroup hierarchy as the machine mounts it: mount point, file system type, options.
type CgroupMount = (PathBuf, String, String);

/// The cgroup hierarchies under `/sys/fs/cgroup`, read before `/sys` is mounted again.
fn cgroup_mounts() -> Result<Vec<CgroupMount>, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read mountinfo: {e}"))?;
    let mut out = Vec::new();
    for line in info.lines() {
        // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mp = left.split(' ').nth(4).unwrap_or_default();
        let r: Vec<&str> = right.split(' ').collect();
        if r.len() < 3 || !mp.starts_with("/sys/fs/cgroup/") || !matches!(r[0], "cgroup" | "cgroup2") {
            continue;
        }
        let opts: Vec<&str> = r[2].split(',').filter(|o| *o != "rw" && *o != "ro").collect();
        out.push((PathBuf::from(mp), r[0].to_string(), opts.join(",")));
    }
    if out.is_empty() {
        return Err("no cgroup hierarchy is mounted under /sys/fs/cgroup".into());
    }
    Ok(out)
}

fn mnt(
    source: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), String> {
    mount(Some(source), target, fstype, flags, data).map_err(|e| {
        format!(
            "mount {source} on {} ({}{}): {e}",
            target.display(),
            fstype.unwrap_or("bind"),
            data.map(|d| format!(", {d}")).unwrap_or_default()
        )
    })
}

fn mkdirs(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("create {}: {e}", p.display()))
}

fn mount_file_systems(spec: &HostSpec, cgroups: &[CgroupMount]) -> Result<(), String> {
    let none = MsFlags::empty();
    // sysfs of this network namespace, with the cgroup hierarchies beneath it again.
    mnt(
        "sysfs",
        Path::new("/sys"),
        Some("sysfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    mnt(
        "tmpfs",
        Path::new("/sys/fs/cgroup"),
        Some("tmpfs"),
        none,
        Some("mode=755"),
    )?;
    for (mp, fstype, opts) in cgroups {
        mkdirs(mp)?;
        mnt(
            "cgroup",
            mp,
            Some(fstype),
            none,
            (!opts.is_empty()).then_some(opts.as_str()),
        )?;
    }

    // The host's own /run first, with the host's folder and the lab's programs bound into it
    // while their paths (under /tmp or /root, say) are still the machine's.
    mnt("tmpfs", Path::new("/run"), Some("tmpfs"), none, Some("mode=755"))?;
    let inside = Path::new(HOST_DIR);
    mkdirs(inside)?;
    mnt(&spec.dir.to_string_lossy(), inside, None, MsFlags::MS_BIND, None)?;
    for (from, name) in &spec.exports {
        let to = Path::new(RUN_DIR).join(name);
        mkdirs(&to)?;
        mnt(
            &from.to_string_lossy(),
            &to,
            None,
            MsFlags::MS_BIND | MsFlags::MS_RDONLY,
            None,
        )?;
    }

    // The machine's /etc, /usr, /var, /opt, /root seen through overlays with per-host upper
    // layers.
    for d in OVERLAYS {
        let (upper, work) = (inside.join("upper").join(d), inside.join("work").join(d));
        mkdirs(&upper)?;
        mkdirs(&work)?;
        let target = PathBuf::from("/").join(d);
        mkdirs(&target)?;
        let data = format!(
            "lowerdir=/{d},upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        mnt("overlay", &target, Some("overlay"), none, Some(&data))?;
    }
    for (name, target) in DATA {
        let src = inside.join("data").join(name);
        mkdirs(&src)?;
        mkdirs(Path::new(target))?;
        mnt(
            &src.to_string_lossy(),
            Path::new(target),
            None,
            MsFlags::MS_BIND,
            None,
        )?;
    }
    for (target, mode) in [("/tmp", "1777"), ("/var/lib/etcd", "700")] {
        mkdirs(Path::new(target))?;
        mnt(
            "tmpfs",
            Path::new(target),
            Some("tmpfs"),
            none,
            Some(&format!("mode={mode}")),
        )?;
    }
    mkdirs(Path::new("/run/lock"))?;

    // Machine-wide sysctls the kubelet writes: files with the values it wants, bound over them.
    let sysctl_dir = inside.join("sysctl");
    mkdirs(&sysctl_dir)?;
    for (key, want) in KUBELET_SYSCTLS {
        let target = Path::new("/proc/sys").join(key);
        let now = std::fs::read_to_string(&target).unwrap_or_default();
        if !target.exists() || now.trim() == want {
            continue;
        }
        let file = sysctl_dir.join(key.replace('/', "."));
        std::fs::write(&file, format!("{want}\n")).map_err(|e| format!("write {}: {e}", file.display()))?;
        mnt(&file.to_string_lossy(), &target, None, MsFlags::MS_BIND, None)?;
    }
    Ok(())
}

/// Creates the kubelet's `--cgroup-root` in every hierarchy (the kubelet refuses a missing one),
/// with cpuset's cpus and mems copied from the parent as cgroup v1 requires.
fn create_cgroup_root(spec: &HostSpec, cgroups: &[CgroupMount]) -> Result<(), String> {
    for (mp, _, opts) in cgroups {
        let mut dir = mp.clone();
        for part in spec.cgroup_root.trim_matches('/').split('/') {
            let parent = dir.clone();
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).map_err(|e| format!("create cgroup {}: {e}", dir.display()))?;
            }
            if opts.split(',').any(|o| o == "cpuset") {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let mine = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
                    if mine.trim().is_empty() {
                        let theirs = std::fs::read_to_string(parent.join(f)).unwrap_or_default();
                        std::fs::write(dir.join(f), theirs.trim())
                            .map_err(|e| format!("write {}/{f}: {e}", dir.display()))?;
                    }
                }
            }
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// Network.

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn configure_network(spec: &HostSpec) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Path::new("/sys/class/net/eth0").exists() {
        if Instant::now() > deadline {
            return Err("eth0 did not appear within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ip(&["link", "set", "lo", "up"])?;
    ip(&["addr", "add", &spec.address, "dev", "eth0"])?;
    ip(&["link", "set", "eth0", "up"])?;
    ip(&["route", "add", "default", "via", &spec.gateway])?;
    // Per network namespace: the machine's own setting stays as it is.
    std::fs::write("/proc/sys/net/ipv4/ip_forward", b"1").map_err(|e| format!("enable forwarding: {e}"))?;
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// Events.

/// What wakes the init's loop.
enum Event {
    Signal(i32),
    Systemctl(Request, UnixStream),
}

fn listen_for_signals(tx: mpsc::Sender<Event>) -> Result<(), String> {
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGCHLD, SIGTERM, SIGINT])
        .map_err(|e| format!("signals: {e}"))?;
    std::thread::spawn(move || {
        for s in signals.forever() {
            if tx.send(Event::Signal(s)).is_err() {
                return;
            }
        }
    });
    Ok(())
}

fn listen_for_systemctl(tx: mpsc::Sender<Event>) -> Result<(), String> {
    let _ = std::fs::remove_file(SOCKET);
    let listener = UnixListener::bind(SOCKET).map_err(|e| format!("listen on {SOCKET}: {e}"))?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let Ok(clone) = stream.try_clone() else { continue };
            if BufReader::new(clone).read_line(&mut line).is_err() {
                continue;
            }
            match serde_json::from_str::<Request>(&line) {
                Ok(req) => {
                    if tx.send(Event::Systemctl(req, stream)).is_err() {
                        return;
                    }
                }
                Err(e) => reply(stream, &Reply::fail(1, format!("bad request: {e}"))),
            }
        }
    });
    Ok(())
}

fn reply(mut stream: UnixStream, r: &Reply) {
    if let Ok(mut s) = serde_json::to_string(r) {
        s.push('\n');
        let _ = stream.write_all(s.as_bytes());
    }
}

// ----------------------------------------------------------------------------------------------
// Services.

/// One unit the host may run.
struct UnitState {
    /// Whether it should be running (started and not stopped since).
    wanted: bool,
    /// Main process while it runs.
    pid: Option<Pid>,
    /// When a restart is due.
    restart_at: Option<Instant>,
    /// When a stop escalates to SIGKILL.
    kill_at: Option<Instant>,
    /// Exit status of the last run, for `systemctl status`.
    last_exit: Option<String>,
    /// When the current run started.
    since: Option<Instant>,
}

struct Init {
    units: BTreeMap<String, UnitState>,
    stopping: bool,
}

impl Init {
    fn new(spec: &HostSpec) -> Self {
        let units = spec
            .units
            .iter()
            .map(|u| {
                (
                    unit::unit_name(u),
                    UnitState {
                        wanted: false,
                        pid: None,
                        restart_at: None,
                        kill_at: None,
                        last_exit: None,
                        since: None,
                    },
                )
            })
            .collect();
        Self {
            units,
            stopping: false,
        }
    }

    fn log(&self, msg: &str) {
        let path = Path::new(HOST_DIR).join("logs/init.log");
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{} {msg}", timestamp());
        }
    }

    fn enabled(name: &str) -> bool {
        Path::new(WANTS).join(name).exists()
    }

    /// Starts every enabled unit, as a boot does.
    fn boot(&mut self) {
        let names: Vec<String> = self.units.keys().cloned().collect();
        for name in names {
            if Self::enabled(&name)
                && let Err(e) = self.start(&name)
            {
                self.log(&format!("{name}: {e}"));
            }
        }
    }

    fn serve(&mut self, rx: &mpsc::Receiver<Event>) {
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Event::Signal(s)) if s == signal_hook::consts::SIGCHLD => self.reap(),
                Ok(Event::Signal(_)) => self.begin_shutdown(),
                Ok(Event::Systemctl(req, stream)) => {
                    let r = self.systemctl(&req);
                    reply(stream, &r);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.reap(),
                Err(mpsc::RecvTimeoutError::Disconnected) => self.begin_shutdown(),
            }
            self.timers();
            if self.stopping && self.units.values().all(|u| u.pid.is_none()) {
                self.log("all units stopped; shutting down");
                return;
            }
        }
    }

    fn begin_shutdown(&mut self) {
        if self.stopping {
            return;
        }
        self.log("shutdown requested");
        self.stopping = true;
        let names: Vec<String> = self.units.keys().cloned().collect();
        for n in names {
            self.stop(&n);
        }
    }

    /// Reaps every exited child; a unit's main process exiting may schedule its restart.
    fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(status) => {
                    let Some(pid) = status.pid() else { continue };
                    self.exited(pid, &status);
                }
                Err(Errno::EINTR) => continue,
                Err(_) => return,
            }
        }
    }

    fn exited(&mut self, pid: Pid, status: &WaitStatus) {
        let Some(name) = self
            .units
            .iter()
            .find(|(_, u)| u.pid == Some(pid))
            .map(|(n, _)| n.clone())
        else {
            return;
        };
        let (code, text) = match status {
            WaitStatus::Exited(_, c) => (Some(*c), format!("exited with status {c}")),
            WaitStatus::Signaled(_, s, _) => (None, format!("killed by {s}")),
            other => (None, format!("{other:?}")),
        };
        let restart_policy = unit::load(Path::new("/"), &name).map(|s| (s.restart, s.restart_sec));
        let Some(u) = self.units.get_mut(&name) else {
            return;
        };
        u.pid = None;
        u.kill_at = None;
        u.last_exit = Some(text.clone());
        let restart = match restart_policy {
            Ok((Restart::Always, sec)) => Some(sec),
            Ok((Restart::OnFailure, sec)) if code != Some(0) => Some(sec),
            _ => None,
        };
        let msg = match (u.wanted && !self.stopping, restart) {
            (true, Some(sec)) => {
                u.restart_at = Some(Instant::now() + sec);
                format!("{name}: {text}; restarting in {:.1}s", sec.as_secs_f64())
            }
            _ => {
                u.wanted = false;
                format!("{name}: {text}")
            }
        };
        self.log(&msg);
    }

    fn timers(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .units
            .iter()
            .filter(|(_, u)| u.restart_at.is_some_and(|t| t <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            if let Some(u) = self.units.get_mut(&name) {
                u.restart_at = None;
            }
            if !self.stopping
                && let Err(e) = self.spawn(&name)
            {
                self.log(&format!("{name}: restart failed: {e}"));
            }
        }
        for u in self.units.values_mut() {
            if let (Some(pid), Some(t)) = (u.pid, u.kill_at)
                && t <= now
            {
                let _ = killpg(pid, Signal::SIGKILL);
                let _ = kill(pid, Signal::SIGKILL);
                u.kill_at = None;
            }
        }
    }

    fn start(&mut self, name: &str) -> Result<(), String> {
        let u = self
            .units
            .get_mut(name)
            .ok_or_else(|| format!("Unit {name} could not be found."))?;
        u.wanted = true;
        u.restart_at = None;
        if u.pid.is_some() {
            return Ok(());
        }
        self.spawn(name)
    }

    fn stop(&mut self, name: &str) {
        let timeout = unit::load(Path::new("/"), name)
            .map(|s| s.timeout_stop)
            .unwrap_or(Duration::from_secs(90))
            .min(Duration::from_secs(30));
        if let Some(u) = self.units.get_mut(name) {
            u.wanted = false;
            u.restart_at = None;
            if let Some(pid) = u.pid {
                let _ = kill(pid, Signal::SIGTERM);
                u.kill_at = Some(Instant::now() + timeout);
            }
        }
    }

    /// Stops the unit and returns once its main process has gone, as `systemctl stop` does:
    /// SIGTERM, then SIGKILL when its stop timeout (at most 30 s) has passed. `kubeadm reset`
    /// stops the kubelet and then removes the containers: were the stop not waited for, a kubelet
    /// still shutting down could start a container after that removal.
    fn stop_and_wait(&mut self, name: &str) {
        self.stop(name);
        let give_up = Instant::now() + Duration::from_secs(45);
        loop {
            self.reap();
            if self.units.get(name).and_then(|u| u.pid).is_none() {
                return;
            }
            if Instant::now() > give_up {
                self.log(&format!(
                    "{name}: still running 45 s after the stop; giving up waiting"
                ));
                return;
            }
            // SIGKILL once the stop timeout passes (and other units' timers keep running).
            self.timers();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the unit's main process from its unit file.
    fn spawn(&mut self, name: &str) -> Result<(), String> {
        let svc = unit::load(Path::new("/"), name).map_err(|e| e.to_string())?;
        let env = environment(&svc)?;
        let argv = unit::expand_exec(&svc.exec_start, &env);
        let Some((prog, args)) = argv.split_first() else {
            return Err(format!("{name}: ExecStart is empty after expansion"));
        };
        let log_path = Path::new(HOST_DIR)
            .join("logs")
            .join(format!("{}.log", name.trim_end_matches(".service")));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .current_dir(
                svc.working_directory
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/")),
            )
            .process_group(0);
        // The child inherits the umask at fork; the init's own is restored right after.
        let old = svc.umask.map(|m| umask(Mode::from_bits_truncate(m)));
        let child = cmd.spawn();
        if let Some(old) = old {
            umask(old);
        }
        let child = child.map_err(|e| format!("{name}: start {prog}: {e}"))?;
        let pid = Pid::from_raw(i32::try_from(child.id()).map_err(|e| e.to_string())?);
        self.log(&format!("{name}: started {} (pid {pid})", argv.join(" ")));
        if let Some(u) = self.units.get_mut(name) {
            u.pid = Some(pid);
            u.since = Some(Instant::now());
        }
        Ok(())
    }

    fn systemctl(&mut self, req: &Request) -> Reply {
        let names: Vec<String> = req.units.iter().map(|u| unit::unit_name(u)).collect();
        let known = |n: &str| unit::find(Path::new("/"), n).is_some();
        match req.verb.as_str() {
            "daemon-reload" | "reset-failed" => Reply::ok(String::new()),
            "enable" | "disable" => {
                let mut out = String::new();
                for n in &names {
                    let Some(file) = unit::find(Path::new("/"), n) else {
                        return Reply::fail(
                            1,
                            format!("Failed to {} unit: Unit file {n} does not exist.", req.verb),
                        );
                    };
                    let link = Path::new(WANTS).join(n);
                    if req.verb == "enable" {
                        let _ = std::fs::create_dir_all(WANTS);
                        if !link.exists() {
                            if let Err(e) = symlink(&file, &link) {
                                return Reply::fail(1, format!("enable {n}: {e}"));
                            }
                            out.push_str(&format!(
                                "Created symlink {} → {}.\n",
                                link.display(),
                                file.display()
                            ));
                        }
                    } else if link.exists() {
                        let _ = std::fs::remove_file(&link);
                        out.push_str(&format!("Removed {}.\n", link.display()));
                    }
                    if req.now {
                        let r = if req.verb == "enable" {
                            self.start(n).err()
                        } else {
                            self.stop_and_wait(n);
                            None
                        };
                        if let Some(e) = r {
                            return Reply::fail(1, e);
                        }
                    }
                }
                Reply::ok(out)
            }
            "start" | "restart" | "try-restart" | "reload-or-restart" => {
                for n in &names {
                    if !self.units.contains_key(n) {
                        return Reply::fail(5, format!("Failed to start {n}: Unit {n} not found."));
                    }
                    if req.verb != "start" {
                        // A restart waits for the old process to go, as systemd does.
                        self.stop_and_wait(n);
                    }
                    if let Err(e) = self.start(n) {
                        return Reply::fail(1, format!("Failed to start {n}: {e}"));
                    }
                }
                Reply::ok(String::new())
            }
            "stop" => {
                for n in &names {
                    self.stop_and_wait(n);
                }
                Reply::ok(String::new())
            }
            "is-active" => {
                let active = names
                    .iter()
                    .all(|n| self.units.get(n).is_some_and(|u| u.pid.is_some()));
                let text: String = names
                    .iter()
                    .map(|n| {
                        if self.units.get(n).is_some_and(|u| u.pid.is_some()) {
                            "active\n"
                        } else {
                            "inactive\n"
                        }
                    })
                    .collect();
                if active {
                    Reply::ok(text)
                } else {
                    Reply::fail(3, text)
                }
            }
            "is-enabled" => {
                let all = names.iter().all(|n| Self::enabled(n));
                let text: String = names
                    .iter()
                    .map(|n| {
                        if Self::enabled(n) {
                            "enabled\n"
                        } else if known(n) {
                            "disabled\n"
                        } else {
                            "not-found\n"
                        }
                    })
                    .collect();
                if all {
                    Reply::ok(text)
                } else {
                    Reply::fail(1, text)
                }
            }
            "status" => {
                let mut out = String::new();
                let mut code = 0;
                for n in &names {
                    let Some(file) = unit::find(Path::new("/"), n) else {
                        out.push_str(&format!("Unit {n} could not be found.\n"));
                        code = 4;
                        continue;
                    };
                    let en = if Self::enabled(n) { "enabled" } else { "disabled" };
                    let u = self.units.get(n);
                    let active = match u.and_then(|u| u.pid.zip(u.since)) {
                        Some((pid, since)) => {
                            format!(
                                "active (running) for {}s; Main PID: {pid}",
                                since.elapsed().as_secs()
                            )
                        }
                        None => {
                            code = 3;
                            match u.and_then(|u| u.last_exit.clone()) {
                                Some(e) if u.is_some_and(|u| u.restart_at.is_some()) => {
                                    format!("activating (auto-restart) (Result: {e})")
                                }
                                Some(e) => format!("inactive (dead) ({e})"),
                                None => "inactive (dead)".into(),
                            }
                        }
                    };
                    out.push_str(&format!(
                        "● {n}\n     Loaded: loaded ({}; {en})\n     Active: {active}\n",
                        file.display()
                    ));
                }
                Reply { code, out }
            }
            other => Reply::fail(
                1,
                format!(
                    "Unknown command verb {other} (the lab's systemctl knows start, stop, restart, enable, disable, status, is-active, is-enabled, daemon-reload)."
                ),
            ),
        }
    }
}

/// The environment of a unit's process: a default `PATH`, `Environment=`, then
/// `EnvironmentFile=` (later wins), and `STATE_DIRECTORY` after creating it.
fn environment(svc: &Service) -> Result<BTreeMap<String, String>, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    env.insert("HOME".into(), "/root".into());
    env.insert("LANG".into(), "C.UTF-8".into());
    env.extend(svc.environment.iter().cloned());
    for (path, optional) in &svc.environment_files {
        match std::fs::read_to_string(path) {
            Ok(text) => env.extend(unit::parse_env_file(&text)),
            Err(_) if *optional => {}
            Err(e) => return Err(format!("{}: EnvironmentFile {}: {e}", svc.name, path.display())),
        }
    }
    let mut dirs = Vec::new();
    for d in &svc.state_directories {
        let p = Path::new("/var/lib").join(d);
        std::fs::create_dir_all(&p).map_err(|e| format!("create {}: {e}", p.display()))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(svc.state_directory_mode))
            .map_err(|e| format!("chmod {}: {e}", p.display()))?;
        dirs.push(p.display().to_string());
    }
    if !dirs.is_empty() {
        env.insert("STATE_DIRECTORY".into(), dirs.join(":"));
    }
    Ok(env)
}

/// Seconds since the epoch with milliseconds, for the init's log.
fn timestamp() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:03}", t.as_secs(), t.subsec_millis())
}
