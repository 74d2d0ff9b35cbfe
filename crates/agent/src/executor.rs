//! Runs a parsed bootstrap on the host and undoes it on release.
//!
//! Steps run in order under the [`Root`]; the [`Journal`] is saved after each completed step, so
//! an interrupted bootstrap resumes where it stopped. Commands run with umask 022 (whatever the
//! agent's own), the root as working directory, `BYOH_ROOT` set to it and `PATH` starting with
//! `<root>/usr/local/bin:<root>/usr/bin`;
//! their stdout and stderr go to one log file in the state directory whose tail ends up in the
//! condition message. A command that outlives its timeout is killed with its process group.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use crate::cloudinit::{Command, Step, WriteFile};
use crate::root::Root;
use crate::state::{Journal, Outcome, Preexisting, StateDir, StateError};

/// Bytes of a command's output kept for messages.
pub const TAIL_BYTES: usize = 4096;
/// Lines of a command's output kept for messages.
pub const TAIL_LINES: usize = 20;

/// Where and how steps run.
#[derive(Debug, Clone)]
pub struct Executor {
    /// Confines every path.
    pub root: Root,
    /// Journals and logs.
    pub state: StateDir,
    /// Longest a command may run.
    pub command_timeout: Duration,
}

/// A bootstrap or reset that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The agent is shutting down; progress so far is kept.
    #[error("interrupted by shutdown")]
    Interrupted,
    /// The journal could not be kept.
    #[error(transparent)]
    State(#[from] StateError),
}

/// How a released host is reset. The `remove-etcd-member` phase is skipped: Cluster API's
/// kubeadm control plane removes a machine's etcd member itself before it deletes the machine,
/// and when a whole cluster is deleted the last member has no quorum left to leave, so kubeadm
/// would retry for many minutes and the host would be quarantined instead of returning clean.
pub const KUBEADM_RESET: [&str; 4] = ["kubeadm", "reset", "-f", "--skip-phases=remove-etcd-member"];
/// After [`KUBEADM_RESET`], where `crictl` exists: every pod sandbox that is left, forcibly.
pub const CRI_REMOVE_PODS: [&str; 4] = ["crictl", "rmp", "--all", "--force"];
/// Then every container that is left.
pub const CRI_REMOVE_CONTAINERS: [&str; 4] = ["crictl", "rm", "--all", "--force"];
/// How the runtime is asked what is left: pod sandbox ids, then container ids (of any state).
pub const CRI_LIST: [[&str; 3]; 2] = [["crictl", "pods", "-q"], ["crictl", "ps", "-aq"]];
/// How long a reset waits for the runtime to let go of what kubeadm left before it fails.
pub const CRI_LEFTOVER_PATIENCE: Duration = Duration::from_secs(60);

/// What the container runtime still holds after a reset's removals.
#[derive(Debug, PartialEq)]
enum Leftovers {
    /// Nothing; `removed_after` is how many were still listed after kubeadm and then removed.
    None { removed_after: usize },
    /// These ids would not go.
    Some(Vec<String>),
}

/// The umask of every command the agent runs. The agent's own unit sets `UMask=0077` for its
/// keys and journals; bootstrap commands expect an ordinary system's 022 (a keyring `apt` must
/// read, a kubeconfig other users read, directories kubeadm creates).
pub const CHILD_UMASK: &str = "0022";

/// `program args…` started through `sh` with [`CHILD_UMASK`] (the umask is inherited across
/// `exec`; setting it in the child without a shell would need `pre_exec`, which is unsafe).
fn with_umask(program: &str, args: &[impl AsRef<std::ffi::OsStr>]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("umask {CHILD_UMASK} && exec \"$0\" \"$@\""))
        .arg(program)
        .args(args);
    cmd
}

/// Outcome of one command.
struct Ran {
    ok: bool,
    summary: String,
    tail: String,
}

impl Executor {
    /// Runs the steps of `uid`'s bootstrap from where its journal stopped. Returns the outcome
    /// (also saved in the journal); [`ExecError::Interrupted`] when `stop` fired mid-way.
    pub async fn bootstrap(
        &self,
        uid: &str,
        steps: &[Step],
        stop: &watch::Receiver<bool>,
    ) -> Result<Outcome, ExecError> {
        let mut j = self.state.journal(uid)?.unwrap_or_else(|| Journal {
            machine_uid: uid.into(),
            ..Default::default()
        });
        if let Some(o) = &j.outcome {
            return Ok(o.clone());
        }
        if j.steps_done > 0 {
            tracing::info!(
                machine_uid = uid,
                done = j.steps_done,
                total = steps.len(),
                "resuming bootstrap"
            );
        }
        let mut last_tail = String::new();
        while j.steps_done < steps.len() {
            if *stop.borrow() {
                return Err(ExecError::Interrupted);
            }
            let i = j.steps_done;
            let step = &steps[i];
            tracing::info!(machine_uid = uid, step = i, what = %step.describe(), "bootstrap step");
            let failure = match step {
                Step::WriteFile(f) => self.write_file(f, &mut j).err(),
                Step::Run(c) => {
                    let ran = self.run(c, &self.state.log_path(uid, i), stop).await?;
                    last_tail = ran.tail.clone();
                    (!ran.ok).then(|| {
                        if ran.tail.is_empty() {
                            ran.summary
                        } else {
                            format!("{}; output:\n{}", ran.summary, ran.tail)
                        }
                    })
                }
            };
            if let Some(why) = failure {
                let outcome = Outcome {
                    succeeded: false,
                    reason: "BootstrapFailed".into(),
                    message: format!(
                        "step {} of {} ({}) failed: {why}",
                        i + 1,
                        steps.len(),
                        step.describe()
                    ),
                };
                j.outcome = Some(outcome.clone());
                self.state.save(&j)?;
                return Ok(outcome);
            }
            j.steps_done += 1;
            j.done.push(step.describe());
            self.state.save(&j)?;
        }
        let mut message = format!("{} steps completed", steps.len());
        if !last_tail.is_empty() {
            message.push_str("; output of the last command:\n");
            message.push_str(&last_tail);
        }
        let outcome = Outcome {
            succeeded: true,
            reason: "BootstrapSucceeded".into(),
            message,
        };
        j.outcome = Some(outcome.clone());
        self.state.save(&j)?;
        Ok(outcome)
    }

    /// Writes one file, recording it (and the directories it creates) before touching the disk.
    fn write_file(&self, f: &WriteFile, j: &mut Journal) -> Result<(), String> {
        let path = self.root.resolve(&f.path).map_err(|e| e.to_string())?;
        // A file reached through a symlink (`/etc/resolv.conf`, say) is recorded, kept and put
        // back as the file it leads to (inside the root: `resolve` checked); the link stays.
        let path = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => path.canonicalize().unwrap_or(path),
            _ => path,
        };
        let (uid, gid) = match &f.owner {
            Some(o) => {
                let (u, g) = resolve_owner(self.root.dir(), o)?;
                (Some(u), Some(g))
            }
            None => (None, None),
        };
        // Directories that do not exist yet, outermost first.
        let mut missing = Vec::new();
        let mut p = path.parent();
        while let Some(d) = p {
            if d.exists() || !d.starts_with(self.root.dir()) {
                break;
            }
            missing.push(d.to_path_buf());
            p = d.parent();
        }
        missing.reverse();
        for d in &missing {
            if !j.dirs.contains(d) {
                j.dirs.push(d.clone());
            }
        }
        if !j.files.contains(&path) {
            // A file that is there already is copied first (content, mode, owner), so a reset
            // can put it back; a file this bootstrap created is simply removed.
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && meta.is_file()
            {
                let dir = self.state.backup_dir(&j.machine_uid);
                let backup = dir.join(j.preexisting.len().to_string());
                copy_with_owner(&path, &backup, &meta)
                    .map_err(|e| format!("keep a copy of {} before writing it: {e}", path.display()))?;
                j.preexisting.push(Preexisting {
                    path: path.clone(),
                    backup,
                    appended_only: f.append,
                });
            }
            j.files.push(path.clone());
        } else if !f.append
            && let Some(p) = j.preexisting.iter_mut().find(|p| p.path == path)
        {
            p.appended_only = false;
        }
        self.state.save(j).map_err(|e| e.to_string())?;
        // Opened beneath the root without following a symlink out of it, even one swapped in
        // since the check above; missing directories get 0755, as cloud-init makes them,
        // whatever the agent's own umask (the unit's 0077): a key under /etc/kubernetes/pki or
        // /etc/apt/keyrings must stay reachable by the non-root users that read it.
        let mut file = self
            .root
            .open_for_write(&f.path, f.append, f.mode)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        file.write_all(&f.content)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("write {}: {e}", path.display()))?;
        // Owner before mode: a chown clears the setuid and setgid bits that the mode may set.
        if uid.is_some() {
            std::os::unix::fs::fchown(&file, uid, gid).map_err(|e| {
                format!(
                    "set owner {} of {}: {e}",
                    f.owner.as_deref().unwrap_or_default(),
                    path.display()
                )
            })?;
        }
        file.set_permissions(std::fs::Permissions::from_mode(f.mode))
            .map_err(|e| format!("set mode of {}: {e}", path.display()))?;
        Ok(())
    }

    /// The environment and working directory every command gets.
    fn prepare(&self, cmd: &mut tokio::process::Command) {
        let root = self.root.dir();
        let inherited = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        let path = if self.root.is_host_root() {
            inherited
        } else {
            format!(
                "{}:{}:{inherited}",
                root.join("usr/local/bin").display(),
                root.join("usr/bin").display()
            )
        };
        cmd.current_dir(root)
            .env("BYOH_ROOT", root)
            .env("PATH", path)
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
    }

    async fn run(&self, c: &Command, log: &Path, stop: &watch::Receiver<bool>) -> Result<Ran, ExecError> {
        let mut cmd = match c {
            Command::Shell(s) => {
                let mut cmd = tokio::process::Command::new("sh");
                cmd.arg("-c").arg(format!("umask {CHILD_UMASK}\n{s}"));
                cmd
            }
            Command::Argv(argv) => with_umask(&argv[0], &argv[1..]),
        };
        self.prepare(&mut cmd);
        run_logged(cmd, log, self.command_timeout, stop).await
    }

    /// Runs `program args…` as a bootstrap command runs ([`Executor::run`]), logging to `log`
    /// in the state directory's `logs/`.
    async fn run_program(
        &self,
        program: &Path,
        args: &[&str],
        log: &str,
        stop: &watch::Receiver<bool>,
    ) -> Result<Ran, ExecError> {
        let argv = std::iter::once(program.display().to_string())
            .chain(args.iter().map(|a| (*a).to_string()))
            .collect();
        self.run(
            &Command::Argv(argv),
            &self.state.dir().join("logs").join(log),
            stop,
        )
        .await
    }

    /// Removes what `kubeadm reset` left in the container runtime until nothing is listed.
    ///
    /// kubeadm removes the pods it finds once the kubelet has stopped, but a container the
    /// kubelet was starting as it stopped stays in containerd's "starting" state, which refuses
    /// removal, until its start fails a moment later (seen on a loaded machine: about 2 s). So
    /// this removes every pod sandbox and container, forcibly, then lists both, and repeats
    /// once a second until the lists are empty or `patience` has passed.
    async fn remove_cri_leftovers(
        &self,
        crictl: &Path,
        patience: Duration,
        stop: &watch::Receiver<bool>,
    ) -> Result<Leftovers, Result<String, ExecError>> {
        let give_up = tokio::time::Instant::now() + patience;
        let mut removed_after = 0;
        loop {
            let left = self.cri_listed(crictl, stop).await?;
            if left.is_empty() {
                return Ok(Leftovers::None { removed_after });
            }
            if tokio::time::Instant::now() >= give_up {
                return Ok(Leftovers::Some(left));
            }
            if removed_after == 0 {
                removed_after = left.len();
            }
            for args in [CRI_REMOVE_PODS, CRI_REMOVE_CONTAINERS] {
                let ran = self
                    .run_program(crictl, &args[1..], "reset-cri.log", stop)
                    .await
                    .map_err(Err)?;
                if !ran.ok {
                    tracing::info!(command = %args.join(" "), summary = %ran.summary, output = %ran.tail, "removing what kubeadm reset left: not yet");
                }
            }
            let mut stop = stop.clone();
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return Err(Err(ExecError::Interrupted)),
            }
        }
    }

    /// The ids of every pod sandbox and container the runtime lists ([`CRI_LIST`]). A listing
    /// that fails is an error: a host is not called clean on a runtime it could not ask.
    async fn cri_listed(
        &self,
        crictl: &Path,
        stop: &watch::Receiver<bool>,
    ) -> Result<Vec<String>, Result<String, ExecError>> {
        let mut ids = Vec::new();
        for args in CRI_LIST {
            let ran = self
                .run_program(crictl, &args[1..], "reset-cri-list.log", stop)
                .await
                .map_err(Err)?;
            let out_path = self.state.dir().join("logs/reset-cri-list.log");
            if !ran.ok {
                return Err(Ok(format!(
                    "{}: {}; output:\n{}",
                    args.join(" "),
                    ran.summary,
                    ran.tail
                )));
            }
            let listed = std::fs::read_to_string(&out_path)
                .map_err(|e| Err(StateError::from_io("read", &out_path, e).into()))?;
            ids.extend(
                listed
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_hexdigit()))
                    .map(String::from),
            );
        }
        Ok(ids)
    }

    /// Finds `kubeadm` where the bootstrap's commands would: `<root>/usr/local/bin`,
    /// `<root>/usr/bin`, and on the host root also the rest of `PATH`.
    pub fn kubeadm(&self) -> Option<PathBuf> {
        self.program("kubeadm")
    }

    /// Finds program `name` where the bootstrap's commands would (see [`Executor::kubeadm`]).
    pub fn program(&self, name: &str) -> Option<PathBuf> {
        let root = self.root.dir();
        let mut dirs = vec![
            root.join("usr/local/bin"),
            root.join("usr/bin"),
            root.join("usr/sbin"),
        ];
        if self.root.is_host_root() {
            dirs.extend(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ));
        }
        dirs.into_iter().map(|d| d.join(name)).find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    }

    /// Undoes every bootstrap in the journals: [`KUBEADM_RESET`] when kubeadm exists, then every
    /// file and created directory removed, then the journals cleared. `Err` carries the message
    /// for `CleanupSucceeded=False`; nothing is forgotten before the reset succeeded.
    pub async fn reset(&self, stop: &watch::Receiver<bool>) -> Result<String, Result<String, ExecError>> {
        let mut notes = Vec::new();
        if let Some(kubeadm) = self.kubeadm() {
            let ran = self
                .run_program(&kubeadm, &KUBEADM_RESET[1..], "reset.log", stop)
                .await
                .map_err(Err)?;
            if !ran.ok {
                return Err(Ok(format!(
                    "{}: {}; output:\n{}",
                    KUBEADM_RESET.join(" "),
                    ran.summary,
                    ran.tail
                )));
            }
            notes.push(KUBEADM_RESET.join(" "));
            if let Some(crictl) = self.program("crictl") {
                match self
                    .remove_cri_leftovers(&crictl, CRI_LEFTOVER_PATIENCE, stop)
                    .await?
                {
                    Leftovers::None { removed_after } => notes.push(match removed_after {
                        0 => "no container or pod sandbox left".to_string(),
                        n => format!("{n} container(s) or pod sandbox(es) kubeadm left removed"),
                    }),
                    Leftovers::Some(ids) => {
                        return Err(Ok(format!(
                            "{}: containers or pod sandboxes are still there {}s after the reset: {}",
                            KUBEADM_RESET.join(" "),
                            CRI_LEFTOVER_PATIENCE.as_secs(),
                            ids.join(", ")
                        )));
                    }
                }
            }
        }
        let journals = self.state.journals().map_err(|e| Err(e.into()))?;
        let mut removed = 0;
        let mut errors = Vec::new();
        let mut restored = 0;
        for j in &journals {
            for f in &j.files {
                if let Some(p) = j.preexisting.iter().find(|p| p.path == *f) {
                    match restore(p) {
                        Ok(()) => restored += 1,
                        Err(e) => errors.push(format!("put back {}: {e}", f.display())),
                    }
                    continue;
                }
                match std::fs::remove_file(f) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => errors.push(format!("remove {}: {e}", f.display())),
                }
            }
            for d in j.dirs.iter().rev() {
                // Only directories the bootstrap created, and only when nothing else lives there.
                match std::fs::remove_dir(d) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound && d.exists() => {
                        tracing::info!(dir = %d.display(), error = %e, "keeping directory the bootstrap created: not empty");
                    }
                    _ => {}
                }
            }
        }
        if !errors.is_empty() {
            return Err(Ok(errors.join("; ")));
        }
        for j in &journals {
            self.state.remove(&j.machine_uid).map_err(|e| Err(e.into()))?;
        }
        notes.push(format!(
            "{removed} files removed, {restored} put back as they were"
        ));
        Ok(notes.join(", "))
    }
}

/// Copies `from` (whose metadata is `meta`) to `to` with its mode and owner, durably.
fn copy_with_owner(from: &Path, to: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if let Some(dir) = to.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    std::fs::copy(from, to)?;
    std::os::unix::fs::chown(to, Some(meta.uid()), Some(meta.gid()))?;
    std::fs::set_permissions(to, meta.permissions())?;
    std::fs::File::open(to)?.sync_all()
}

/// Puts a file the bootstrap changed back as it was: cut back to its old length when the
/// bootstrap only appended and the old content still begins it, else the whole copy with its
/// mode and owner. A file removed meanwhile comes back too.
fn restore(p: &Preexisting) -> std::io::Result<()> {
    let original = std::fs::read(&p.backup)?;
    let meta = std::fs::metadata(&p.backup)?;
    if p.appended_only
        && let Ok(now) = std::fs::read(&p.path)
        && now.starts_with(&original)
    {
        return std::fs::OpenOptions::new()
            .write(true)
            .open(&p.path)?
            .set_len(u64::try_from(original.len()).unwrap_or(u64::MAX));
    }
    let tmp = p.path.with_file_name(format!(
        ".{}.byoh-restore",
        p.path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    copy_with_owner(&p.backup, &tmp, &meta)?;
    std::fs::rename(&tmp, &p.path)
}

/// Runs `cmd` with stdout and stderr in `log`, under `timeout`, abandoning it when `stop` fires.
async fn run_logged(
    mut cmd: tokio::process::Command,
    log: &Path,
    timeout: Duration,
    stop: &watch::Receiver<bool>,
) -> Result<Ran, ExecError> {
    let out = std::fs::File::create(log).map_err(|e| StateError::from_io("create", log, e))?;
    let err = out.try_clone().map_err(|e| StateError::from_io("open", log, e))?;
    cmd.stdout(out).stderr(err);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Ok(Ran {
                ok: false,
                summary: format!("could not start: {e}"),
                tail: String::new(),
            });
        }
    };
    let pid = child.id();
    let mut stop = stop.clone();
    let stopped = tokio::select! {
        s = tokio::time::timeout(timeout, child.wait()) => Some(s),
        _ = stop.wait_for(|s| *s) => None,
    };
    let Some(status) = stopped else {
        kill_group(pid).await;
        return Err(ExecError::Interrupted);
    };
    let (ok, summary) = match status {
        Ok(Ok(s)) if s.success() => (true, "exited 0".to_string()),
        Ok(Ok(s)) => (
            false,
            match s.code() {
                Some(c) => format!("exited with status {c}"),
                None => format!("killed by {s}"),
            },
        ),
        Ok(Err(e)) => (false, format!("could not be waited for: {e}")),
        Err(_) => {
            kill_group(pid).await;
            let _ = child.wait().await;
            (
                false,
                format!("timed out after {}s and was killed", timeout.as_secs()),
            )
        }
    };
    Ok(Ran {
        ok,
        summary,
        tail: tail_of(log),
    })
}

/// Kills a command's whole process group (it was started as its own group leader).
async fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = tokio::process::Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{pid}")])
            .status()
            .await;
    }
}

/// The last [`TAIL_LINES`] lines (at most [`TAIL_BYTES`]) of a log file.
pub fn tail_of(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(TAIL_BYTES as u64);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_err() || f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    tail_text(&String::from_utf8_lossy(&buf), start > 0)
}

fn tail_text(text: &str, cut: bool) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let skip = lines.len().saturating_sub(TAIL_LINES);
    // A line cut by the byte limit is dropped when whole lines remain.
    let skip = if cut && skip == 0 && lines.len() > 1 {
        1
    } else {
        skip
    };
    lines[skip..].join("\n")
}

/// Resolves `user[:group]` against `<root>/etc/passwd` and `<root>/etc/group`; numeric ids pass.
pub fn resolve_owner(root: &Path, owner: &str) -> Result<(u32, u32), String> {
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap_or_default();
    let find = |table: &str, name: &str| -> Option<(u32, u32)> {
        table.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 3 && f[0] == name).then(|| {
                let id = f[2].parse().ok()?;
                let gid = f.get(3).and_then(|g| g.parse().ok()).unwrap_or(id);
                Some((id, gid))
            })?
        })
    };
    let (user, grp) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    let (uid, primary) = match user.parse::<u32>() {
        Ok(n) => (n, find(&passwd, user).map(|(_, g)| g).unwrap_or(n)),
        Err(_) => find(&passwd, user).ok_or_else(|| {
            format!(
                "owner {owner:?}: no user {user:?} in {}",
                root.join("etc/passwd").display()
            )
        })?,
    };
    let gid = match grp {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => find(&group, g).map(|(id, _)| id).ok_or_else(|| {
                format!(
                    "owner {owner:?}: no group {g:?} in {}",
                    root.join("etc/group").display()
                )
            })?,
        },
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let text: String = (0..50).map(|i| format!("line {i}\n")).collect();
        let t = tail_text(&text, false);
        assert_eq!(t.lines().count(), TAIL_LINES);
        assert!(t.ends_with("line 49"));
        assert_eq!(tail_text("abc\ndef", true), "def");
    }

    #[test]
    fn owners_resolve_against_the_root() {
        let tmp = std::env::temp_dir().join(format!("byoh-owner-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("etc")).unwrap();
        std::fs::write(
            tmp.join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nkube:x:1001:1002::/:/bin/false\n",
        )
        .unwrap();
        std::fs::write(tmp.join("etc/group"), "root:x:0:\nadm:x:4:\nkube:x:1002:\n").unwrap();
        assert_eq!(resolve_owner(&tmp, "kube").unwrap(), (1001, 1002));
        assert_eq!(resolve_owner(&tmp, "kube:adm").unwrap(), (1001, 4));
        assert_eq!(resolve_owner(&tmp, "1500:1600").unwrap(), (1500, 1600));
        assert_eq!(resolve_owner(&tmp, "0").unwrap(), (0, 0));
        assert!(
            resolve_owner(&tmp, "nobody")
                .unwrap_err()
                .contains("no user \"nobody\"")
        );
        assert!(
            resolve_owner(&tmp, "kube:nogroup")
                .unwrap_err()
                .contains("no group")
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// A runtime whose one container is "starting" (refuses removal) for the first
    /// `refusals` removals, as containerd is while a start the stopped kubelet asked for is
    /// still failing; a negative count never lets go.
    fn runtime_with_a_starting_container(refusals: i32) -> (Executor, PathBuf, std::path::PathBuf) {
        let tmp = std::env::temp_dir().join(format!(
            "byoh-cri-{}-{}",
            std::process::id(),
            refusals.unsigned_abs() + if refusals < 0 { 1000 } else { 0 }
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        let bin = tmp.join("root/usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let crictl = bin.join("crictl");
        let tries = tmp.join("tries");
        std::fs::write(
            &crictl,
            format!(
                "#!/bin/sh\nT={tries}\nn=$(cat $T 2>/dev/null || echo 0)\n\
                 case \"$1\" in\n\
                 pods) exit 0;;\n\
                 ps) [ -e $T.removed ] || echo d6b25ae8d9cf; exit 0;;\n\
                 rmp) exit 0;;\n\
                 rm) echo $((n+1)) > $T\n\
                 if [ {refusals} -ge 0 ] && [ $n -ge {refusals} ]; then touch $T.removed; exit 0; fi\n\
                 echo 'container is in starting state, cannot be removed' >&2; exit 1;;\n\
                 esac\nexit 2\n",
                tries = tries.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&crictl, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(tmp.join("state")).unwrap();
        let ex = Executor {
            root: Root::new(&tmp.join("root")).unwrap(),
            state: StateDir::open(&tmp.join("state")).unwrap(),
            command_timeout: Duration::from_secs(10),
        };
        (ex, crictl, tmp)
    }

    #[tokio::test]
    async fn a_container_that_is_still_starting_is_removed_once_it_lets_go() {
        let (ex, crictl, tmp) = runtime_with_a_starting_container(2);
        let (_tx, stop) = watch::channel(false);
        let left = ex
            .remove_cri_leftovers(&crictl, Duration::from_secs(20), &stop)
            .await
            .unwrap();
        assert_eq!(left, Leftovers::None { removed_after: 1 });
        // Removal was refused twice, then the third try took it.
        assert_eq!(std::fs::read_to_string(tmp.join("tries")).unwrap().trim(), "3");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[tokio::test]
    async fn a_container_that_never_lets_go_is_named_not_called_clean() {
        let (ex, crictl, tmp) = runtime_with_a_starting_container(-1);
        let (_tx, stop) = watch::channel(false);
        let left = ex
            .remove_cri_leftovers(&crictl, Duration::from_secs(2), &stop)
            .await
            .unwrap();
        assert_eq!(left, Leftovers::Some(vec!["d6b25ae8d9cf".to_string()]));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
