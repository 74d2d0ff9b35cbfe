//! The `systemctl` of a lab host: a client of the host's init ([`crate::init`]) that speaks
//! just enough of systemctl for kubeadm (`status`, `is-active`, `is-enabled`, `start`,
//! `restart`, `stop`, `daemon-reload`) and for an operator installing the agent
//! (`enable --now byoh-agent`). It is installed as `/usr/bin/systemctl` in each host's `/usr`
//! overlay, so the machine's own systemctl is never called from inside a host.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

use crate::init::SOCKET;

/// One `systemctl` call.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The verb (`start`, `enable`, ...).
    pub verb: String,
    /// The units named.
    pub units: Vec<String>,
    /// `--now` (with enable/disable).
    pub now: bool,
}

/// The answer: exit code and what systemctl prints.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Exit code.
    pub code: i32,
    /// Output.
    pub out: String,
}

impl Reply {
    /// Success with output.
    pub fn ok(out: String) -> Self {
        Self { code: 0, out }
    }
    /// Failure with a code and message.
    pub fn fail(code: i32, out: String) -> Self {
        Self { code, out }
    }
}

/// Parses systemctl's command line (options anywhere, then the verb and units).
pub fn parse(args: &[String]) -> Result<Request, String> {
    let mut now = false;
    let mut words = Vec::new();
    for a in args {
        match a.as_str() {
            "--now" => now = true,
            "-q" | "--quiet" | "--no-pager" | "--system" | "--no-block" | "--no-legend" | "-l" | "--full" => {
            }
            s if s.starts_with("--") => {}
            s => words.push(s.to_string()),
        }
    }
    let (verb, units) = words.split_first().ok_or("systemctl: missing verb")?;
    Ok(Request {
        verb: verb.clone(),
        units: units.to_vec(),
        now,
    })
}

/// Runs `systemctl ARGS` against the host's init; returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let req = match parse(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    match call(&req) {
        Ok(r) => {
            let quiet = args.iter().any(|a| a == "-q" || a == "--quiet");
            if !quiet {
                print!("{}", r.out);
            }
            r.code
        }
        Err(e) => {
            eprintln!("System has not been booted with the lab's init ({SOCKET}: {e}). Can't operate.");
            1
        }
    }
}

fn call(req: &Request) -> std::io::Result<Reply> {
    let mut s = UnixStream::connect(SOCKET)?;
    let mut line = serde_json::to_string(req).map_err(std::io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_may_stand_anywhere() {
        let r = parse(&args("enable --now byoh-agent")).unwrap();
        assert_eq!(
            (r.verb.as_str(), r.units, r.now),
            ("enable", vec!["byoh-agent".to_string()], true)
        );
        let r = parse(&args("-q is-active kubelet")).unwrap();
        assert_eq!((r.verb.as_str(), r.now), ("is-active", false));
        assert!(parse(&args("--quiet")).is_err());
    }
}
