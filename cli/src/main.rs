//! The `rmm` command: `rmm info` shows the backend, the devices and their memory; `rmm replay`
//! plays a memory event log against a resource.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(&args);
    cli::handle_signals();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of standard output went away (`rmm info | head -1`): nothing to say.
        Err(e) if cli::is_broken_pipe(&*e) => ExitCode::SUCCESS,
        Err(e) => {
            cli::errln!("rmm: {e}");
            ExitCode::FAILURE
        }
    }
}
