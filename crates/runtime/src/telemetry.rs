//! Structured logging for every Bootsman binary: `tracing` events filtered by `RUST_LOG` (or a
//! default the binary chooses), written to stderr as JSON lines when stderr is not a terminal (in
//! a pod) and as human-readable lines when it is (on a workstation).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON when stderr is not a terminal, human-readable when it is.
    Auto,
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

impl std::str::FromStr for Format {
    type Err = String;

    /// `auto`, `json` or `text`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "json" => Ok(Self::Json),
            "text" => Ok(Self::Text),
            _ => Err(format!("{s:?} is not a log format: use auto, json or text")),
        }
    }
}

/// Installs the global `tracing` subscriber in the [`Format::Auto`] format.
///
/// The filter comes from `RUST_LOG` when it is set and valid, else from `default_filter` (for
/// example `info,kube=warn`). Output goes to stderr: JSON when stderr is not a TTY, human-readable
/// otherwise. Calling it again (or after another subscriber was installed, as test harnesses do)
/// changes nothing.
pub fn init(default_filter: &str) {
    init_with(default_filter, Format::Auto);
}

/// [`init`] in the format `format`.
pub fn init_with(default_filter: &str, format: Format) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = match format {
        Format::Json => true,
        Format::Text => false,
        Format::Auto => !std::io::stderr().is_terminal(),
    };
    // A second call finds a subscriber installed already; that is the documented no-op.
    let _ = if !json {
        builder.try_init()
    } else {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn init_twice_is_harmless() {
        super::init("info,kube=warn");
        super::init("debug");
        tracing::info!(answer = 42, "telemetry works");
    }
}
