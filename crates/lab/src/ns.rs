//! The run's own network namespace. A lab command (`bootsman-lab demo`, `bootsman-lab e2e`)
//! runs itself again under `unshare --net`, so the lab network, the infrastructure control
//! plane and everything that talks to the hosts live in a namespace the run created: the
//! machine's interfaces, routes and firewall never change, and the namespace disappears with
//! the run's last process, also after a crash.

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::error::Error;

/// Set in the environment of the run once it is inside its namespace.
pub const INSIDE: &str = "BOOTSMAN_LAB_NETNS";

/// Whether this process already runs in the lab's namespace.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Replaces this process with itself under `unshare --net` (same arguments). Returns only on
/// error. Needs root; the lab says so plainly when it is not.
pub fn reexec() -> Error {
    if !nix::unistd::geteuid().is_root() {
        return Error::Unsupported(
            "lab hosts need root (network, mount and PID namespaces, overlay mounts); run as root".into(),
        );
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return Error::Unsupported(format!("cannot find this program: {e}")),
    };
    let err = Command::new("unshare")
        .arg("--net")
        .arg("--")
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(INSIDE, "1")
        .exec();
    Error::Unsupported(format!("cannot run unshare --net (util-linux): {err}"))
}

/// What every lab program does first: runs itself again in the lab's namespace when it is not
/// there yet ([`reexec`]), then builds the async runtime. `None` after printing why either
/// failed, prefixed with `program`.
pub fn enter(program: &str) -> Option<tokio::runtime::Runtime> {
    if !inside() {
        eprintln!("{program}: {}", reexec());
        return None;
    }
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("{program}: {e}");
            None
        }
    }
}
