//! `crdgen`: writes every Bootsman CRD to `config/crd/<plural>.<group>.yaml` (one file per CRD)
//! and the same files to the chart's `charts/bootsman/crds/`.
//!
//! Usage: `cargo run -p bootsman-api --bin crdgen [-- OUT_DIR]`; with `OUT_DIR` only that
//! directory is written. The output is deterministic, and a unit test fails when the
//! committed files differ from what this writes.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dirs = match std::env::args_os().nth(1) {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec![
            bootsman_api::crdgen::default_dir(),
            bootsman_api::crdgen::chart_dir(),
        ],
    };
    for dir in dirs {
        match bootsman_api::crdgen::write_all(&dir) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
            }
            Err(e) => {
                eprintln!("crdgen: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
