//! `cargo xtask`: the project's tasks, so that a fresh machine with only a Rust toolchain
//! runs everything with one command.
//!
//! * `cargo xtask test [ARGS…]`: installs cargo-nextest when it is missing, then runs every
//!   test of the workspace (`cargo nextest run --workspace ARGS…`).
//! * `cargo xtask lint`: `cargo fmt --check` and `cargo clippy --all-targets -D warnings`.
//! * `cargo xtask ci`: `lint`, then `test` (what `.ci/run` runs).

use std::process::{Command, ExitCode};

/// The cargo that runs this task (so a toolchain override applies to every step).
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs `cmd`, naming it; an error when it cannot start or exits non-zero.
fn run(mut cmd: Command, what: &str) -> Result<(), String> {
    eprintln!("xtask: {what}");
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: could not start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what}: failed ({status})"))
    }
}

/// True when `cargo nextest` answers.
fn has_nextest() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs cargo-nextest when it is missing.
fn ensure_nextest() -> Result<(), String> {
    if has_nextest() {
        return Ok(());
    }
    let mut install = cargo();
    install.args(["install", "--locked", "cargo-nextest"]);
    run(install, "installing cargo-nextest (not found)")?;
    if has_nextest() {
        Ok(())
    } else {
        Err(
            "cargo-nextest was installed but `cargo nextest` still does not run: is \
             ~/.cargo/bin on PATH?"
                .into(),
        )
    }
}

fn test(args: &[String]) -> Result<(), String> {
    ensure_nextest()?;
    let mut cmd = cargo();
    cmd.args(["nextest", "run", "--workspace"]).args(args);
    run(cmd, "cargo nextest run --workspace")
}

fn lint() -> Result<(), String> {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    run(fmt, "cargo fmt --check")?;
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    run(clippy, "cargo clippy -D warnings")
}

const USAGE: &str = "usage: cargo xtask <test [ARGS…] | lint | ci>
  test   install cargo-nextest if missing, run every test (ARGS go to cargo nextest run)
  lint   cargo fmt --check and cargo clippy --all-targets -D warnings
  ci     lint, then test";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("lint") => lint(),
        Some("ci") => lint().and_then(|()| test(&args[1..])),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task {other:?}\n{USAGE}")),
        None => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
