//! The cloud-config subset a host runs as its bootstrap data: `write_files` and `runcmd`.
//!
//! [`parse`] turns the text of the bootstrap Secret (key `value`) into an ordered list of
//! [`Step`]s: every `write_files` entry first, then every `runcmd` entry, the order cloud-init
//! uses. Contents are decoded while parsing, so a malformed entry fails the bootstrap before
//! anything is written. Any other top-level directive is refused with an error naming it: a
//! directive skipped silently would leave a host that looks bootstrapped and is not.
//!
//! The parser never panics, whatever the input (it is fuzzed: `crates/agent/fuzz`), and bounds
//! what it decodes ([`MAX_FILE_BYTES`] a file, [`MAX_TOTAL_BYTES`] in all).

use std::io::Read;

use base64::Engine;
use serde_json::Value;

/// Largest decoded content of one file, so a small compressed input cannot exhaust memory.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Largest decoded content of all files together: many files each under [`MAX_FILE_BYTES`]
/// must not add up to more memory than a host can spare.
pub const MAX_TOTAL_BYTES: u64 = 256 * 1024 * 1024;

/// Top-level directives this agent runs.
pub const SUPPORTED: &[&str] = &["write_files", "runcmd"];

/// Why bootstrap data was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// The text is not YAML.
    #[error("bootstrap data is not valid YAML: {0}")]
    Yaml(String),
    /// The document is not a mapping of directives.
    #[error("bootstrap data must be a cloud-config mapping of directives, found {0}")]
    NotAMapping(&'static str),
    /// A directive this agent does not run.
    #[error("unsupported cloud-config directive `{0}`: this agent runs only `write_files` and `runcmd`")]
    Unsupported(String),
    /// A field has the wrong shape or value.
    #[error("{field}: {rule}")]
    Invalid {
        /// Path of the field, e.g. `write_files[2].encoding`.
        field: String,
        /// The rule it breaks.
        rule: String,
    },
}

fn invalid(field: impl Into<String>, rule: impl Into<String>) -> ParseError {
    ParseError::Invalid {
        field: field.into(),
        rule: rule.into(),
    }
}

/// One file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFile {
    /// Absolute path on the host (confined to the agent's root when written).
    pub path: String,
    /// Decoded content.
    pub content: Vec<u8>,
    /// `user`, `user:group`, numeric ids allowed; `None` keeps the agent's own.
    pub owner: Option<String>,
    /// Mode bits (default 0644).
    pub mode: u32,
    /// Append to the file instead of replacing it.
    pub append: bool,
}

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A string entry, run with `sh -c`.
    Shell(String),
    /// A list entry, run as argv without a shell.
    Argv(Vec<String>),
}

impl Command {
    /// The command as one line for logs and messages.
    pub fn display(&self) -> String {
        match self {
            Command::Shell(s) => s.clone(),
            Command::Argv(v) => v.join(" "),
        }
    }
}

/// One step of a bootstrap, in the order it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A `write_files` entry.
    WriteFile(WriteFile),
    /// A `runcmd` entry.
    Run(Command),
}

impl Step {
    /// A short description for logs, journal and messages.
    pub fn describe(&self) -> String {
        match self {
            Step::WriteFile(f) => format!("write {}", f.path),
            Step::Run(c) => format!("run `{}`", c.display()),
        }
    }
}

/// Parses cloud-config text into the steps to run.
pub fn parse(text: &str) -> Result<Vec<Step>, ParseError> {
    let doc: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_saphyr::from_str(text).map_err(|e| ParseError::Yaml(first_line(&e.to_string())))?
    };
    let map = match doc {
        Value::Null => return Ok(Vec::new()),
        Value::Object(m) => m,
        other => return Err(ParseError::NotAMapping(kind(&other))),
    };
    for key in map.keys() {
        if !SUPPORTED.contains(&key.as_str()) {
            return Err(ParseError::Unsupported(key.clone()));
        }
    }
    let mut steps = Vec::new();
    match map.get("write_files") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let mut total: u64 = 0;
            for (i, item) in items.iter().enumerate() {
                let f = write_file(&format!("write_files[{i}]"), item)?;
                total = total.saturating_add(f.content.len() as u64);
                if total > MAX_TOTAL_BYTES {
                    return Err(invalid(
                        format!("write_files[{i}]"),
                        format!(
                            "the files decode to more than {MAX_TOTAL_BYTES} bytes in all \
                             (rule: bootstrap-data-total-size)"
                        ),
                    ));
                }
                steps.push(Step::WriteFile(f));
            }
        }
        Some(other) => {
            return Err(invalid(
                "write_files",
                format!("must be a list of files, found {}", kind(other)),
            ));
        }
    }
    match map.get("runcmd") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                steps.push(Step::Run(command(&format!("runcmd[{i}]"), item)?));
            }
        }
        Some(other) => {
            return Err(invalid(
                "runcmd",
                format!("must be a list of commands, found {}", kind(other)),
            ));
        }
    }
    Ok(steps)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().chars().take(300).collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A scalar as text (YAML turns `true`, `1` into non-strings; cloud-init reads them as text).
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

const FILE_FIELDS: &[&str] = &["path", "content", "encoding", "owner", "permissions", "append"];

fn write_file(at: &str, v: &Value) -> Result<WriteFile, ParseError> {
    let Value::Object(m) = v else {
        return Err(invalid(at, format!("must be a mapping, found {}", kind(v))));
    };
    for key in m.keys() {
        if !FILE_FIELDS.contains(&key.as_str()) {
            return Err(invalid(
                format!("{at}.{key}"),
                format!("unknown field; supported: {}", FILE_FIELDS.join(", ")),
            ));
        }
    }
    let path = match m.get("path") {
        Some(Value::String(p)) if p.starts_with('/') && !p.contains('\0') => p.clone(),
        Some(Value::String(_)) => {
            return Err(invalid(
                format!("{at}.path"),
                "must be an absolute path without NUL bytes",
            ));
        }
        Some(other) => {
            return Err(invalid(
                format!("{at}.path"),
                format!("must be a string, found {}", kind(other)),
            ));
        }
        None => return Err(invalid(format!("{at}.path"), "is required")),
    };
    let raw = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(v) => scalar(v).ok_or_else(|| {
            invalid(
                format!("{at}.content"),
                format!("must be a string, found {}", kind(v)),
            )
        })?,
    };
    let encoding = match m.get("encoding") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_ascii_lowercase(),
        Some(other) => {
            return Err(invalid(
                format!("{at}.encoding"),
                format!("must be a string, found {}", kind(other)),
            ));
        }
    };
    let content = decode(&format!("{at}.content"), &raw, &encoding).map_err(|e| match e {
        DecodeError::Encoding => invalid(
            format!("{at}.encoding"),
            format!(
                "unknown encoding {encoding:?}; supported: b64, base64, gz, gzip, gz+b64, \
                 gz+base64, gzip+b64, gzip+base64, text/plain"
            ),
        ),
        DecodeError::Content(rule) => invalid(format!("{at}.content"), rule),
    })?;
    let owner = match m.get("owner") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if valid_owner(s) => Some(s.clone()),
        Some(_) => {
            return Err(invalid(
                format!("{at}.owner"),
                "must be `user` or `user:group` (names or numeric ids)",
            ));
        }
    };
    let mode = match m.get("permissions") {
        None | Some(Value::Null) => 0o644,
        Some(Value::String(s)) => parse_mode(s).ok_or_else(|| {
            invalid(
                format!("{at}.permissions"),
                format!("{s:?} is not an octal mode such as '0644' (at most 07777)"),
            )
        })?,
        Some(other) => {
            return Err(invalid(
                format!("{at}.permissions"),
                format!(
                    "must be a quoted octal string such as '0644', found {}",
                    kind(other)
                ),
            ));
        }
    };
    let append = match m.get("append") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => true,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => false,
        Some(other) => {
            return Err(invalid(
                format!("{at}.append"),
                format!("must be true or false, found {}", kind(other)),
            ));
        }
    };
    Ok(WriteFile {
        path,
        content,
        owner,
        mode,
        append,
    })
}

fn valid_owner(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 64
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$'))
    };
    match s.split_once(':') {
        Some((u, g)) => ok(u) && ok(g),
        None => ok(s),
    }
}

/// Parses `0644`, `644`, `0o644`.
pub fn parse_mode(s: &str) -> Option<u32> {
    let t = s.trim();
    let t = t.strip_prefix("0o").unwrap_or(t);
    if t.is_empty() || t.len() > 5 {
        return None;
    }
    u32::from_str_radix(t, 8).ok().filter(|m| *m <= 0o7777)
}

enum DecodeError {
    Encoding,
    Content(String),
}

fn decode(_at: &str, raw: &str, encoding: &str) -> Result<Vec<u8>, DecodeError> {
    let b64 = |s: &str| {
        let compact: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact.as_bytes())
            .map_err(|e| DecodeError::Content(format!("is not valid base64: {e}")))
    };
    match encoding {
        "" | "text/plain" => Ok(raw.as_bytes().to_vec()),
        "b64" | "base64" => b64(raw),
        "gz" | "gzip" => gunzip(raw.as_bytes()),
        "gz+b64" | "gz+base64" | "gzip+b64" | "gzip+base64" => gunzip(&b64(raw)?),
        _ => Err(DecodeError::Encoding),
    }
}

fn gunzip(data: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let mut reader = flate2::read::GzDecoder::new(data).take(MAX_FILE_BYTES + 1);
    reader
        .read_to_end(&mut out)
        .map_err(|e| DecodeError::Content(format!("is not valid gzip data: {e}")))?;
    if out.len() as u64 > MAX_FILE_BYTES {
        return Err(DecodeError::Content(format!(
            "decompresses to more than {MAX_FILE_BYTES} bytes"
        )));
    }
    Ok(out)
}

fn command(at: &str, v: &Value) -> Result<Command, ParseError> {
    match v {
        Value::String(s) if s.trim().is_empty() => Err(invalid(at, "must not be empty")),
        Value::String(s) if s.contains('\0') => Err(invalid(at, "must not contain NUL bytes")),
        Value::String(s) => Ok(Command::Shell(s.clone())),
        Value::Array(items) => {
            let mut argv = Vec::with_capacity(items.len());
            for (j, item) in items.iter().enumerate() {
                let s = scalar(item).ok_or_else(|| {
                    invalid(
                        format!("{at}[{j}]"),
                        format!("must be a string, found {}", kind(item)),
                    )
                })?;
                if s.contains('\0') {
                    return Err(invalid(format!("{at}[{j}]"), "must not contain NUL bytes"));
                }
                argv.push(s);
            }
            if argv.first().is_none_or(|p| p.is_empty()) {
                return Err(invalid(at, "must name a program as its first item"));
            }
            Ok(Command::Argv(argv))
        }
        other => Err(invalid(
            at,
            format!(
                "must be a string (run with sh -c) or a list (argv), found {}",
                kind(other)
            ),
        )),
    }
}

/// The fuzzing entry: parses `text` and checks what came back is usable — every step
/// describes itself, every mode fits in the permission bits, and an error has a message. Panics
/// only when the parser broke one of those promises (or panicked itself).
pub fn check_input(text: &str) {
    match parse(text) {
        Ok(steps) => {
            for step in &steps {
                assert!(!step.describe().is_empty());
                if let Step::WriteFile(f) = step {
                    assert!(f.mode <= 0o7777, "mode {:o} out of range", f.mode);
                }
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_files_and_commands_in_cloud_init_order() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"zipped").unwrap();
        let gzb64 = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
        let text = format!(
            "## template: jinja\n#cloud-config\nruncmd:\n- echo hi\n- [kubeadm, init, 1]\nwrite_files:\n\
             - path: /etc/a\n  content: plain\n  permissions: '0600'\n  owner: root:root\n\
             - path: /etc/b\n  encoding: b64\n  content: aGVsbG8=\n  append: true\n\
             - path: /etc/c\n  encoding: gzip+base64\n  content: {gzb64}\n"
        );
        let steps = parse(&text).unwrap();
        assert_eq!(steps.len(), 5);
        let Step::WriteFile(a) = &steps[0] else { panic!() };
        assert_eq!((a.content.as_slice(), a.mode), (&b"plain"[..], 0o600));
        assert_eq!(a.owner.as_deref(), Some("root:root"));
        let Step::WriteFile(b) = &steps[1] else { panic!() };
        assert_eq!((b.content.as_slice(), b.append), (&b"hello"[..], true));
        let Step::WriteFile(c) = &steps[2] else { panic!() };
        assert_eq!(c.content, b"zipped");
        assert_eq!(steps[3], Step::Run(Command::Shell("echo hi".into())));
        assert_eq!(
            steps[4],
            Step::Run(Command::Argv(vec!["kubeadm".into(), "init".into(), "1".into()]))
        );
    }

    #[test]
    fn refuses_unknown_directives_by_name() {
        let e = parse("#cloud-config\npackages: [nginx]\nruncmd: [ls]\n").unwrap_err();
        assert_eq!(e, ParseError::Unsupported("packages".into()));
        assert!(e.to_string().contains("`packages`"));
    }

    #[test]
    fn names_the_field_and_rule() {
        let e = parse("write_files:\n- path: /x\n  permissions: '0999'\n").unwrap_err();
        assert!(e.to_string().starts_with("write_files[0].permissions:"), "{e}");
        let e = parse("write_files:\n- path: rel\n").unwrap_err();
        assert!(e.to_string().contains("write_files[0].path"), "{e}");
        let e = parse("write_files:\n- path: /x\n  encoding: rot13\n").unwrap_err();
        assert!(e.to_string().contains("write_files[0].encoding"), "{e}");
        let e = parse("runcmd:\n- {a: b}\n").unwrap_err();
        assert!(e.to_string().contains("runcmd[0]"), "{e}");
        assert!(matches!(parse("- a\n"), Err(ParseError::NotAMapping(_))));
        // Files each within the per-file cap, together over the total cap (gzip keeps the input
        // small: 40 MiB of zeros compress to about 40 KiB).
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &vec![0u8; 40 * 1024 * 1024]).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
        let files: String = (0..7)
            .map(|i| format!("  - path: /f{i}\n    encoding: gz+b64\n    content: {b64}\n"))
            .collect();
        let e = parse(&format!("write_files:\n{files}")).unwrap_err();
        assert_eq!(e.to_string().split(':').next(), Some("write_files[6]"), "{e}");
        assert!(e.to_string().contains("(rule: bootstrap-data-total-size)"), "{e}");
        assert_eq!(
            parse(&format!(
                "write_files:\n{}",
                files
                    .lines()
                    .take(18)
                    .map(|l| format!("{l}\n"))
                    .collect::<String>()
            ))
            .map(|s| s.len()),
            Ok(6)
        );
        assert!(matches!(parse("a: [\n"), Err(ParseError::Yaml(_))));
        assert_eq!(parse("").unwrap(), vec![]);
        assert_eq!(parse("#cloud-config\n").unwrap(), vec![]);
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0644"), Some(0o644));
        assert_eq!(parse_mode("755"), Some(0o755));
        assert_eq!(parse_mode("0o4755"), Some(0o4755));
        assert_eq!(parse_mode("8"), None);
        assert_eq!(parse_mode("017777"), None);
    }
}
