//! systemd unit files, read the way systemd reads them, so a lab host runs the units the
//! packages installed (containerd's, the agent's from our `.deb`, kubelet's with kubeadm's
//! drop-in) with their own `ExecStart` and environment.
//!
//! What is honoured: the unit file from `/etc/systemd/system`, `/run/systemd/system` or
//! `/usr/lib/systemd/system` (first found), its drop-ins (`<unit>.d/*.conf` of the same folders,
//! in name order; an empty `ExecStart=` resets the list as in systemd), `ExecStart` with quoting
//! and `$VAR`/`${VAR}` expansion, `Environment`, `EnvironmentFile` (`-` = optional),
//! `Restart`, `RestartSec`, `UMask`, `StateDirectory`/`StateDirectoryMode`, `WorkingDirectory`
//! and `TimeoutStopSec`. Sandboxing directives (`ProtectHome`, ...) are not emulated; the
//! lab says so in its README.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Folders searched for unit files and drop-ins, highest priority first (relative to `/`).
pub const UNIT_DIRS: [&str; 3] = [
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
];

/// A unit's `[Service]` settings after drop-ins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Service {
    /// Unit name, e.g. `kubelet.service`.
    pub name: String,
    /// The `ExecStart` command line, unexpanded.
    pub exec_start: String,
    /// `Environment=` assignments in order.
    pub environment: Vec<(String, String)>,
    /// `EnvironmentFile=` entries: (path, optional).
    pub environment_files: Vec<(PathBuf, bool)>,
    /// Whether the service restarts when it exits (`Restart=always`/`on-failure`).
    pub restart: Restart,
    /// `RestartSec` (100 ms when not set, as systemd).
    pub restart_sec: Duration,
    /// `UMask` (octal), when set.
    pub umask: Option<u32>,
    /// `StateDirectory` entries (below `/var/lib`) and their mode.
    pub state_directories: Vec<String>,
    /// `StateDirectoryMode` (0755 when not set).
    pub state_directory_mode: u32,
    /// `WorkingDirectory`, when set.
    pub working_directory: Option<PathBuf>,
    /// `TimeoutStopSec` (90 s when not set).
    pub timeout_stop: Duration,
}

/// `Restart=` values the lab distinguishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Restart {
    /// `no` (the default).
    #[default]
    No,
    /// `on-failure` (and the other partial modes): restart after a non-zero exit or a signal.
    OnFailure,
    /// `always`.
    Always,
}

/// Why a unit cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    /// No unit file with that name.
    #[error("Unit {0} could not be found.")]
    NotFound(String),
    /// The unit has no `ExecStart`.
    #[error("{0}: no ExecStart=")]
    NoExecStart(String),
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A setting could not be parsed.
    #[error("{unit}: {key}={value}: {why}")]
    Invalid {
        /// The unit.
        unit: String,
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
}

/// Adds `.service` when the name has no unit suffix, as `systemctl` does.
pub fn unit_name(name: &str) -> String {
    if name.contains('.') {
        name.to_string()
    } else {
        format!("{name}.service")
    }
}

/// The unit file of `name` under `root` (the first of [`UNIT_DIRS`] holding it).
pub fn find(root: &Path, name: &str) -> Option<PathBuf> {
    UNIT_DIRS
        .iter()
        .map(|d| root.join(d).join(name))
        .find(|p| p.is_file())
}

/// Reads unit `name` (e.g. `kubelet.service`) with its drop-ins, from the file system at `root`.
pub fn load(root: &Path, name: &str) -> Result<Service, UnitError> {
    let main = find(root, name).ok_or_else(|| UnitError::NotFound(name.into()))?;
    let mut texts = vec![read(&main)?];
    let mut dropins: BTreeMap<String, PathBuf> = BTreeMap::new();
    for d in UNIT_DIRS.iter().rev() {
        let dir = root.join(d).join(format!("{name}.d"));
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let file = e.file_name().to_string_lossy().to_string();
                if file.ends_with(".conf") {
                    // A drop-in of a higher-priority folder replaces one of the same name.
                    dropins.insert(file, e.path());
                }
            }
        }
    }
    for p in dropins.values() {
        texts.push(read(p)?);
    }
    parse(name, &texts)
}

fn read(path: &Path) -> Result<String, UnitError> {
    std::fs::read_to_string(path).map_err(|source| UnitError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses the `[Service]` sections of a unit file and its drop-ins, in order.
pub fn parse(name: &str, texts: &[String]) -> Result<Service, UnitError> {
    let mut s = Service {
        name: name.into(),
        restart_sec: Duration::from_millis(100),
        state_directory_mode: 0o755,
        timeout_stop: Duration::from_secs(90),
        ..Service::default()
    };
    let mut exec_start: Vec<String> = Vec::new();
    let invalid = |key: &str, value: &str, why: &str| UnitError::Invalid {
        unit: name.into(),
        key: key.into(),
        value: value.into(),
        why: why.into(),
    };
    for text in texts {
        let mut section = String::new();
        for line in logical_lines(text) {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line.starts_with('[') && line.ends_with(']') {
                section = line[1..line.len() - 1].to_string();
                continue;
            }
            if section != "Service" {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "ExecStart" if value.is_empty() => exec_start.clear(),
                "ExecStart" => exec_start.push(value.to_string()),
                "Environment" => {
                    for word in split_words(value) {
                        if let Some((k, v)) = word.split_once('=') {
                            s.environment.push((k.to_string(), v.to_string()));
                        }
                    }
                }
                "EnvironmentFile" if value.is_empty() => s.environment_files.clear(),
                "EnvironmentFile" => {
                    let (path, optional) = match value.strip_prefix('-') {
                        Some(p) => (p, true),
                        None => (value, false),
                    };
                    s.environment_files.push((PathBuf::from(path), optional));
                }
                "Restart" => {
                    s.restart = match value {
                        "always" => Restart::Always,
                        "no" => Restart::No,
                        _ => Restart::OnFailure,
                    }
                }
                "RestartSec" => {
                    s.restart_sec =
                        parse_seconds(value).ok_or_else(|| invalid(key, value, "not a time span"))?;
                }
                "TimeoutStopSec" => {
                    s.timeout_stop =
                        parse_seconds(value).ok_or_else(|| invalid(key, value, "not a time span"))?;
                }
                "UMask" => {
                    s.umask = Some(
                        u32::from_str_radix(value, 8)
                            .map_err(|_| invalid(key, value, "not an octal mode"))?,
                    );
                }
                "StateDirectory" => s
                    .state_directories
                    .extend(value.split_whitespace().map(String::from)),
                "StateDirectoryMode" => {
                    s.state_directory_mode = u32::from_str_radix(value, 8)
                        .map_err(|_| invalid(key, value, "not an octal mode"))?;
                }
                "WorkingDirectory" => {
                    s.working_directory = Some(PathBuf::from(value.trim_start_matches('-')));
                }
                _ => {}
            }
        }
    }
    // A simple service runs one command: the last ExecStart (systemd refuses more than one).
    s.exec_start = exec_start
        .pop()
        .ok_or_else(|| UnitError::NoExecStart(name.into()))?;
    Ok(s)
}

/// Lines with backslash continuations joined.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        if let Some(stripped) = line.strip_suffix('\\') {
            cur.push_str(stripped);
            cur.push(' ');
        } else {
            cur.push_str(line);
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `10`, `10s`, `500ms`, `2min` (systemd time spans; plain numbers are seconds).
fn parse_seconds(v: &str) -> Option<Duration> {
    let v = v.trim();
    let split = v
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => n,
        "ms" | "msec" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" | "hr" => n * 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

/// Splits a command line or an `Environment=` value into words: double and single quotes group,
/// a backslash escapes the next character.
pub fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// Reads an environment file: `KEY=VALUE` lines, `#` and `;` comments, values optionally quoted.
pub fn parse_env_file(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in logical_lines(text) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let value = match split_words(v).as_slice() {
            [] => String::new(),
            [one] if v.starts_with('"') || v.starts_with('\'') => one.clone(),
            _ => v.to_string(),
        };
        out.push((k.trim().to_string(), value));
    }
    out
}

/// Expands `ExecStart` with `env` the way systemd does: `${VAR}` becomes one word (its value),
/// a whole-word `$VAR` is split into words on whitespace (none when empty). Returns the argv.
pub fn expand_exec(exec: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let exec = exec.trim_start_matches(['-', '@', '+', '!']);
    let mut argv = Vec::new();
    for word in split_words(exec) {
        if let Some(var) = word.strip_prefix('$').filter(|v| is_var_name(v)) {
            argv.extend(
                env.get(var)
                    .map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            continue;
        }
        argv.push(expand_braced(&word, env));
    }
    argv
}

fn is_var_name(v: &str) -> bool {
    !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Replaces every `${VAR}` inside a word.
fn expand_braced(word: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find('}') {
            Some(j) => {
                out.push_str(env.get(&after[..j]).map(String::as_str).unwrap_or(""));
                rest = &after[j + 1..];
            }
            None => {
                out.push_str(&rest[i..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KUBELET: &str = "[Unit]\nDescription=kubelet\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\nStartLimitInterval=0\nRestartSec=10\n";
    const KUBEADM_DROPIN: &str = r#"[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"#;

    #[test]
    fn a_dropin_replaces_exec_start_and_adds_environment() {
        let s = parse("kubelet.service", &[KUBELET.into(), KUBEADM_DROPIN.into()]).unwrap();
        assert!(s.exec_start.contains("$KUBELET_KUBEADM_ARGS"));
        assert_eq!(s.restart, Restart::Always);
        assert_eq!(s.restart_sec, Duration::from_secs(10));
        assert_eq!(s.environment.len(), 2);
        assert_eq!(
            s.environment_files[1],
            (PathBuf::from("/etc/default/kubelet"), true)
        );

        let mut env: BTreeMap<String, String> = s.environment.iter().cloned().collect();
        env.extend(parse_env_file(
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=r/pause:3.10\"\n",
        ));
        let argv = expand_exec(&s.exec_start, &env);
        assert_eq!(
            argv,
            [
                "/usr/bin/kubelet",
                "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--config=/var/lib/kubelet/config.yaml",
                "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
                "--pod-infra-container-image=r/pause:3.10",
            ]
        );
    }

    #[test]
    fn the_agent_unit_reads_its_flags_file() {
        let unit = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../packaging/byoh-agent/byoh-agent.service"
        ))
        .unwrap();
        let s = parse("byoh-agent.service", &[unit]).unwrap();
        assert_eq!(s.umask, Some(0o077));
        assert_eq!(s.state_directories, ["byoh-agent"]);
        assert_eq!(s.state_directory_mode, 0o700);
        let env: BTreeMap<String, String> =
            parse_env_file("# comment\nBYOH_AGENT_ARGS=\"--namespace pool-a --label role=worker\"\n")
                .into_iter()
                .collect();
        assert_eq!(
            expand_exec(&s.exec_start, &env),
            [
                "/usr/bin/byoh-agent",
                "--namespace",
                "pool-a",
                "--label",
                "role=worker"
            ]
        );
    }

    #[test]
    fn braced_variables_stay_one_word_and_missing_ones_vanish() {
        let env: BTreeMap<String, String> = [("A".to_string(), "x y".to_string())].into_iter().collect();
        assert_eq!(
            expand_exec("/bin/p ${A} $A $B --f=${B}", &env),
            ["/bin/p", "x y", "x", "y", "--f="]
        );
        assert_eq!(split_words(r#"a "b c" 'd e' f\ g"#), ["a", "b c", "d e", "f g"]);
    }

    #[test]
    fn a_bad_setting_names_the_unit_and_key() {
        let err = parse("x.service", &["[Service]\nExecStart=/x\nUMask=9z\n".into()]).unwrap_err();
        assert_eq!(err.to_string(), "x.service: UMask=9z: not an octal mode");
        let err = parse("x.service", &["[Service]\nRestart=always\n".into()]).unwrap_err();
        assert_eq!(err.to_string(), "x.service: no ExecStart=");
    }
}
