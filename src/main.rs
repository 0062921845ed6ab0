//! The `rmm` command: `rmm info` shows the backend, the devices and their memory; `rmm replay`
//! plays a memory event log against a resource.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(&args);
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm: {e}");
            ExitCode::FAILURE
        }
    }
}
