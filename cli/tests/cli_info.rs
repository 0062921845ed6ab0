//! `rmm info`: prints the backend, the devices and every configuration value with its
//! source; a bad configuration makes it exit non-zero with that one error.

mod common;

use std::process::Command;

thread_local! {
    /// The test's own empty directory, removed when its thread (the test) ends.
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("rmm-cli-info-")
        .tempdir()
        .unwrap();
}

fn rmm() -> Command {
    let mut c = common::rmm_command();
    // Run from an empty directory so no ./rmm.toml is picked up unless a test names one.
    let dir = SCRATCH.with(|d| d.path().to_path_buf());
    c.current_dir(dir).env_remove("RMM_CONFIG");
    for (k, _) in std::env::vars() {
        if k.starts_with("RMM_POOL") || k.starts_with("RMM_SPILL") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn info_as_json_markdown_and_quiet() {
    let out = rmm().args(["info", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(v["backend"].is_string(), "{v}");
    let d0 = &v["devices"][0];
    assert_eq!(d0["ordinal"], 0, "{v}");
    assert!(d0["total_memory"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["configuration"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["key"] == "pool.enabled" && c["source"] == "default"),
        "{v}"
    );
    assert!(
        v["selected"][0]["stack"]
            .as_str()
            .unwrap()
            .contains("MemoryResource"),
        "{v}"
    );

    let out = rmm()
        .args(["info", "--format", "markdown"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("| key ") && l.contains("| source ")),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("| pool.enabled ")),
        "{stdout}"
    );

    let out = rmm().args(["info", "--quiet"]).output().unwrap();
    assert!(out.status.success() && out.stdout.is_empty());
    // Quiet still fails on a bad configuration, with the error on standard error.
    let out = rmm()
        .args(["info", "--quiet"])
        .env("RMM_POOL__ENABLED", "perhaps")
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("RMM_POOL__ENABLED"));
}

#[test]
fn info_prints_devices_and_every_value_with_its_source() {
    let out = rmm()
        .arg("info")
        .env("RMM_POOL__ENABLED", "true")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("backend: "), "{stdout}");
    // The device table: a row for device 0 with its memory in binary units.
    let header = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("device "))
        .unwrap();
    assert!(
        header.contains("total") && header.contains("free"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("0 ") && l.contains(" GiB")),
        "{stdout}"
    );
    assert!(stdout.contains("pool.enabled"), "{stdout}");
    assert!(stdout.contains("environment RMM_POOL__ENABLED"), "{stdout}");
    assert!(
        stdout.contains("pool.initial_size") && stdout.contains("default"),
        "{stdout}"
    );
    assert!(
        stdout.contains("StatisticsResourceAdaptor > PoolMemoryResource(initial "),
        "{stdout}"
    );
    assert!(stdout.contains("> CudaMemoryResource"), "{stdout}");
    // Counts in the right number: "1 worker each", never "1 worker(s)".
    assert!(
        stdout.contains("selected devices (1 worker each):") || stdout.contains("workers each):"),
        "{stdout}"
    );
    assert!(!stdout.contains("(s)"), "{stdout}");
}

#[test]
fn a_bad_configuration_exits_non_zero_with_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rmm.toml");
    std::fs::write(&file, "[pool]\nintial_size = \"2GiB\"\n").unwrap();
    let out = rmm().arg("info").env("RMM_CONFIG", &file).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown key pool.intial_size; did you mean pool.initial_size?"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing printed before the error");
}

#[test]
fn asking_for_cuda_without_a_driver_is_a_clear_error() {
    let out = rmm()
        .arg("info")
        .env("RMM_BACKEND", "cuda")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // A machine with a GPU: the CUDA backend is what it reports.
        assert!(String::from_utf8_lossy(&out.stdout).contains("backend: cuda"));
    } else {
        assert!(stderr.contains("no CUDA driver found: "), "{stderr}");
    }
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    // The reading end is closed before `rmm` writes: every write fails with EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = rmm()
        .arg("info")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn log_lines_carry_no_colour_codes_when_standard_error_is_not_a_terminal() {
    let out = rmm()
        .args(["--log", "debug", "info"])
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        ["DEBUG", "INFO", "WARN"].iter().any(|l| stderr.contains(l)),
        "no log line: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a pipe: {stderr:?}"
    );
}

#[test]
fn asking_for_no_backend_without_a_gpu_is_an_error_that_names_the_simulated_device() {
    let out = rmm()
        .arg("info")
        .env_remove("RMM_BACKEND")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // A machine with a GPU: asking for nothing gives it, never the simulated device.
        assert!(stdout.contains("backend: cuda"), "{stdout}");
        return;
    }
    assert!(
        stderr.contains("no CUDA driver found") || stderr.contains("the CUDA driver sees no GPU"),
        "{stderr}"
    );
    assert!(
        stderr.contains("RMM_BACKEND=sim"),
        "the error says how to ask for the simulated device: {stderr}"
    );
    assert!(
        !stdout.contains("backend: sim"),
        "no silent fallback: {stdout}"
    );
}

/// A memory cgroup of its own with `limit` bytes, where this machine lets the test make one
/// (cgroup v1's memory hierarchy or v2's unified one, writable): its directory and the file
/// that takes a process. Removed on drop.
struct MemoryCgroup {
    dir: std::path::PathBuf,
    procs: std::path::PathBuf,
}

impl MemoryCgroup {
    fn make(limit: u64) -> Option<MemoryCgroup> {
        let name = format!("rmm-rs-test-{}", std::process::id());
        for (root, file) in [
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
            ("/sys/fs/cgroup", "memory.max"),
        ] {
            let dir = std::path::Path::new(root).join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if std::fs::write(dir.join(file), limit.to_string()).is_ok() {
                return Some(MemoryCgroup {
                    procs: dir.join("cgroup.procs"),
                    dir,
                });
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_host_pool_larger_than_the_cgroup_allows_is_refused_by_name() {
    let Some(cgroup) = MemoryCgroup::make(3 << 30) else {
        eprintln!(
            "SKIP a_host_pool_larger_than_the_cgroup_allows_is_refused_by_name: no memory \
             cgroup can be made here (needs a writable /sys/fs/cgroup)"
        );
        return;
    };
    // The shell moves itself into the cgroup, then runs `rmm info` there, in an empty
    // directory and with only the variables given here.
    let dir = tempfile::tempdir().unwrap();
    let info = |host_pool_size: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$1\" info")
            .arg(&cgroup.procs)
            .arg(common::rmm_command().get_program())
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RMM_BACKEND", "sim")
            .env("RMM_SPILL__ENABLED", "true")
            .env("RMM_SPILL__HOST_POOL_SIZE", host_pool_size)
            .output()
            .unwrap()
    };
    let out = info("4GiB");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    assert!(
        stderr.contains(
            "spill.host_pool_size = 4GiB (environment RMM_SPILL__HOST_POOL_SIZE) is larger than \
             the 3GiB of host memory this process may use"
        ),
        "{stderr}"
    );
    // Within the limit: fine.
    let out = info("1GiB");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_version_is_the_crates() {
    let out = rmm().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("rmm {}", env!("CARGO_PKG_VERSION"))
    );
}
