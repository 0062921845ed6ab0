//! Shared by the CLI tests: where the `rmm` binary is.
#![allow(dead_code)]

use std::process::Command;

/// A command running the `rmm` binary: where the test runner says at run time (a nextest
/// archive moves binaries to another machine), else where cargo built it.
pub fn rmm_command() -> Command {
    let exe = std::env::var("NEXTEST_BIN_EXE_rmm")
        .or_else(|_| std::env::var("CARGO_BIN_EXE_rmm"))
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_rmm").to_string());
    Command::new(exe)
}
