//! `bootsmanctl`: see the crate documentation and the README.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = bootsmanctl::cli::Cli::parse();
    match bootsmanctl::cli::run(args, &mut std::io::stdout()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
