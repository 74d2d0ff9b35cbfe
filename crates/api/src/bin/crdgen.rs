//! `crdgen`: writes every Bootsman CRD to `config/crd/<plural>.<group>.yaml` (one file per CRD).
//!
//! Usage: `cargo run -p bootsman-api --bin crdgen [-- OUT_DIR]`; the default directory is the
//! workspace's `config/crd/`. The output is deterministic, and a unit test fails when the
//! committed files differ from what this writes.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(bootsman_api::crdgen::default_dir, PathBuf::from);
    match bootsman_api::crdgen::write_all(&dir) {
        Ok(files) => {
            for f in files {
                println!("wrote {}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: {e}");
            ExitCode::FAILURE
        }
    }
}
