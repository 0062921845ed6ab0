//! `cargo xtask`: the project's tasks, so that a fresh machine with only a Rust toolchain
//! runs everything with one command.
//!
//! * `cargo xtask test [ARGS…]`: installs cargo-nextest when it is missing, runs every Rust
//!   test of the workspace (`cargo nextest run --workspace ARGS…`) and the doctests (`cargo
//!   test --workspace --doc`) and every example (`examples/*.rs`, each must exit 0), then the
//!   Python package's:
//!   a virtual environment under `target/xtask-venv` with maturin, pytest, distributed and
//!   mypy from the package index, mypy over `python/rmm_rs` and `python/tests` (any error
//!   fails), the `rmm_rs` wheel built and installed there, RAPIDS RMM's wheels and the
//!   librmm bridge (`python/librmm_bridge`, built against them) where the package index has
//!   them (else the bridge's tests skip, saying why), and pytest on `python/tests` (no tests
//!   collected is a failure). The PyTorch shim (`python/torch_bridge`) is type-checked but
//!   not built: PyTorch is not installed there, so its tests skip, saying why
//!   (`scripts/gpu_bridge.sh run` builds and tests it). `--rust-only` skips the Python part.
//! * `cargo xtask lint`: the `unsafe` fence, one public path to each name (`cargo xtask
//!   paths`, see `paths.rs`), no import cycle between the library crates' files
//!   (`scripts/import_cycles.py`), `cargo fmt --check`, `cargo clippy --all-targets -D warnings`
//!   and `cargo doc --workspace --no-deps` with `RUSTDOCFLAGS=-D warnings` (broken intra-doc
//!   links, links to private items, bad code blocks fail).
//! * `cargo xtask ci`: `lint`, then `test` (what `.ci/run` runs).

mod paths;

use std::path::{Path, PathBuf};
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

/// The backend the tests run on: `RMM_BACKEND` as set, else the simulated device, asked for
/// by name (rmm-rs never falls back to it silently: without a GPU, a program that asks for
/// nothing gets an error).
fn test_backend() -> String {
    std::env::var("RMM_BACKEND").unwrap_or_else(|_| "sim".into())
}

fn test(args: &[String]) -> Result<(), String> {
    let rust_only = args.iter().any(|a| a == "--rust-only");
    let nextest_args: Vec<&String> = args.iter().filter(|a| *a != "--rust-only").collect();
    let backend = test_backend();
    eprintln!(
        "xtask: the tests run with RMM_BACKEND={backend} (set RMM_BACKEND=cuda to run them on \
         a GPU)"
    );
    ensure_nextest()?;
    let mut cmd = cargo();
    cmd.args(["nextest", "run", "--workspace"])
        .args(nextest_args)
        .env("RMM_BACKEND", &backend);
    run(cmd, "cargo nextest run --workspace")?;
    // nextest runs no doctests: the examples in the documentation (the `rmm` crate page's
    // quick start among them) run here.
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc"])
        .env("RMM_BACKEND", &backend);
    run(doc, "cargo test --workspace --doc")?;
    examples(&backend)?;
    if rust_only {
        return Ok(());
    }
    python_tests(&backend)
}

/// Builds and runs every example of the facade (`examples/*.rs`): each must exit 0. They are
/// the README's and the docs' programs; a change that breaks one fails here, not on a user.
fn examples(backend: &str) -> Result<(), String> {
    let root = root();
    let mut build = cargo();
    build.args(["build", "--quiet", "--examples"]);
    run(build, "cargo build --examples")?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let mut names: Vec<String> = std::fs::read_dir(root.join("examples"))
        .map_err(|e| format!("reading examples/: {e}"))?
        .filter_map(|e| {
            let path = e.ok()?.path();
            (path.extension()? == "rs").then(|| path.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    names.sort();
    for name in names {
        eprintln!("xtask: example {name}");
        let out = Command::new(target.join("debug/examples").join(&name))
            .env("RMM_BACKEND", backend)
            .output()
            .map_err(|e| format!("example {name}: could not start: {e}"))?;
        if !out.status.success() {
            // What it printed before failing says which step failed; quiet when it passes.
            let stdout = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = stdout.lines().collect();
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("  | {line}");
            }
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            return Err(format!("example {name}: failed ({})", out.status));
        }
    }
    Ok(())
}

/// The workspace root (xtask's parent directory).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Builds the wheel into a fresh virtual environment's reach and runs pytest.
fn python_tests(backend: &str) -> Result<(), String> {
    let root = root();
    let venv = root.join("target/xtask-venv");
    let bin = venv.join("bin");
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    if !bin.join("python").exists() {
        let mut mk = Command::new(&python);
        mk.arg("-m").arg("venv").arg(&venv);
        run(
            mk,
            "creating the Python virtual environment target/xtask-venv",
        )?;
    }
    let mut pip = Command::new(bin.join("python"));
    pip.args(["-m", "pip", "install", "--quiet", "--upgrade"])
        // CuPy imports and takes an allocator without a GPU: the README's Dask plugin
        // snippet, which names it, runs as written.
        .args([
            "pip",
            "maturin",
            "pytest",
            "distributed",
            "mypy",
            "cupy-cuda13x",
        ]);
    run(
        pip,
        "pip install maturin pytest distributed mypy cupy-cuda13x",
    )?;
    type_check(&root, &bin)?;
    let wheels = root.join("target/xtask-wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    let mut build = Command::new(bin.join("maturin"));
    build
        // No --release: the `wheel` profile named in python/pyproject.toml (release with
        // whole-program optimization); --release would override it.
        .args(["build", "--quiet", "-m"])
        .arg(root.join("python/Cargo.toml"))
        .arg("-o")
        .arg(&wheels);
    run(build, "maturin build (the rmm_rs wheel)")?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| format!("reading {}: {e}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin built no wheel into {}", wheels.display()))?;
    let mut install = Command::new(bin.join("python"));
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(&wheel);
    run(install, "pip install the rmm_rs wheel")?;
    let bridge = librmm_bridge(&root, &bin)?;
    let mut pytest = Command::new(bin.join("python"));
    if bridge {
        // Built: its tests must find it (a bridge that does not import fails them). Not an
        // RMM_ name: rmm-rs reads those as settings.
        pytest.env("LIBRMM_BRIDGE_REQUIRED", "1");
    }
    pytest
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .arg(root.join("python/tests"))
        // The package's source directory must not shadow the installed wheel.
        .current_dir(root.join("target"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("RMM_BACKEND", backend);
    // pytest exits 5 when it collects no tests: a failure like any other non-zero status.
    run(pytest, "pytest python/tests")
}

/// RAPIDS RMM's wheels (CUDA 13: `rmm-cu13`, with `librmm-cu13`), CUDA's runtime headers
/// (`nvidia-cuda-runtime`, `nvidia-cuda-crt`) and Cython from the package index, then the
/// librmm bridge (`python/librmm_bridge`) built against them. True when the bridge is
/// installed; false, saying so, when RMM's wheels cannot be installed here (the bridge's
/// tests then skip); an error when they install but the bridge does not build.
fn librmm_bridge(root: &Path, bin: &Path) -> Result<bool, String> {
    let mut rmm = Command::new(bin.join("python"));
    rmm.args(["-m", "pip", "install", "--quiet", "--upgrade"])
        .args([
            "rmm-cu13",
            "nvidia-cuda-runtime",
            "nvidia-cuda-crt",
            "cython>=3.1",
            // The bridge's pyproject.toml states its licence as an SPDX expression.
            "setuptools>=77",
            "wheel",
        ]);
    if let Err(e) = run(rmm, "pip install rmm-cu13 and CUDA's runtime headers") {
        eprintln!(
            "xtask: RAPIDS RMM's wheels could not be installed ({e}): the librmm bridge is \
             not built, and its tests skip"
        );
        return Ok(false);
    }
    let mut build = Command::new(bin.join("python"));
    build
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--force-reinstall",
            "--no-deps",
            "--no-build-isolation",
        ])
        .arg(root.join("python/librmm_bridge"));
    run(
        build,
        "pip install python/librmm_bridge (the librmm bridge)",
    )?;
    Ok(true)
}

/// mypy over the package, its tests and the optional packages' Python (the extensions
/// through their stubs, `python/rmm_rs/_rmm_rs.pyi` and the bridges' `.pyi`): untyped
/// functions' bodies are checked too, and an error fails the task; then the package alone
/// under `--strict`. Its caches live under `target/`.
fn type_check(root: &Path, bin: &Path) -> Result<(), String> {
    let mut mypy = Command::new(bin.join("python"));
    mypy.args([
        "-m",
        "mypy",
        "--ignore-missing-imports",
        "--check-untyped-defs",
    ])
    .args(["--warn-unused-ignores", "--cache-dir"])
    .arg(root.join("target/mypy-cache"))
    .args([
        "rmm_rs",
        "tests",
        "librmm_bridge/rmm_rs_librmm",
        "torch_bridge/rmm_rs_torch",
    ])
    .current_dir(root.join("python"));
    run(
        mypy,
        "mypy python/rmm_rs python/tests python/librmm_bridge/rmm_rs_librmm \
         python/torch_bridge/rmm_rs_torch",
    )?;
    // The package itself as a user's `mypy --strict` sees it: every function typed (the
    // exceptions for untyped Dask, Distributed and Numba are in python/pyproject.toml).
    let mut strict = Command::new(bin.join("python"));
    strict
        .args([
            "-m",
            "mypy",
            "--strict",
            "--ignore-missing-imports",
            "--cache-dir",
        ])
        .arg(root.join("target/mypy-cache-strict"))
        .arg("rmm_rs")
        .current_dir(root.join("python"));
    run(strict, "mypy --strict python/rmm_rs")
}

/// Where library code may use `unsafe`: the backend (driver calls, pinned memory), the
/// containers (raw views of device memory), and the exported C entry points of the Python
/// package (`#[unsafe(no_mangle)]`: Rust 2024 spells exporting a symbol `unsafe`, as its name
/// is global). Tests and benches are not library code.
const UNSAFE_ALLOWED: [&str; 2] = ["allocator/src/backend/", "allocator/src/container/"];

/// Fails when `unsafe` appears in library code outside [`UNSAFE_ALLOWED`] (comments aside).
fn unsafe_fence(root: &Path) -> Result<(), String> {
    eprintln!("xtask: unsafe only in allocator/src/backend/ and allocator/src/container/");
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = ["allocator", "config", "runtime", "src", "cli", "python"]
        .iter()
        .map(|c| root.join(c))
        .collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            if path.is_dir() {
                let name = entry.file_name();
                if !matches!(
                    name.to_str(),
                    Some("tests" | "benches" | "target" | "examples")
                ) {
                    stack.push(path);
                }
                continue;
            }
            if !rel.ends_with(".rs") || UNSAFE_ALLOWED.iter().any(|a| rel.starts_with(a)) {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {rel}: {e}"))?;
            let mut in_tests = false;
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                // Unit tests at the end of a file (`#[cfg(test)] mod tests`) are test code.
                if line.trim_start().starts_with("#[cfg(test)]") {
                    in_tests = true;
                }
                let export = code.trim_start().starts_with("#[unsafe(no_mangle)]")
                    && rel == "python/src/allocators.rs";
                if !in_tests && !export && code.contains("unsafe") {
                    found.push(format!("{rel}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "`unsafe` outside allocator/src/backend/ and allocator/src/container/ (wrap the \
             operation in a safe type there):\n  {}",
            found.join("\n  ")
        ))
    }
}

fn lint() -> Result<(), String> {
    unsafe_fence(&root())?;
    paths::one_path(&root())?;
    let mut cycles = Command::new("python3");
    cycles
        .arg("scripts/import_cycles.py")
        .args(["allocator/src", "config/src", "runtime/src"])
        .current_dir(root());
    run(
        cycles,
        "no import cycle between the library crates' files (scripts/import_cycles.py)",
    )?;
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
    run(clippy, "cargo clippy -D warnings")?;
    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings");
    run(
        doc,
        "cargo doc --workspace --no-deps (RUSTDOCFLAGS=-D warnings)",
    )
}

const USAGE: &str = "usage: cargo xtask <test [--rust-only] [ARGS…] | lint | paths | ci>
  test   install cargo-nextest if missing, run every Rust test (ARGS go to cargo nextest
         run) and the doctests, then mypy python/rmm_rs python/tests, build the Python wheel in
         target/xtask-venv, build the librmm bridge where RMM's wheels install, and run pytest
         python/tests
  lint   the unsafe fence, one public path to each name (as `paths`), no import cycle
         between the library crates' files (scripts/import_cycles.py), cargo fmt --check,
         cargo clippy --all-targets -D warnings and cargo doc --workspace --no-deps with
         RUSTDOCFLAGS=-D warnings
  paths  one public path to each name in allocator, config, runtime and the rmm facade: no
         `pub use` of an item whose module is public too, none of another crate's items
         (the facade's crate modules and prelude aside)
  ci     lint, then test";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("lint") => lint(),
        Some("paths") => paths::one_path(&root()),
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
