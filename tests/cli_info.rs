//! `rmm info`: prints the backend, the devices and every configuration value with its
//! source; a bad configuration makes it exit non-zero with that one error.

mod common;

use std::process::Command;

fn rmm() -> Command {
    let mut c = common::rmm_command();
    // Run from an empty directory so no ./rmm.toml is picked up unless a test names one.
    let dir = std::env::temp_dir().join(format!("rmm-cli-info-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    c.current_dir(dir).env_remove("RMM_CONFIG");
    for (k, _) in std::env::vars() {
        if k.starts_with("RMM_POOL") || k.starts_with("RMM_SPILL") {
            c.env_remove(k);
        }
    }
    c
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
    assert!(stdout.contains("[0] "), "{stdout}");
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
}

#[test]
fn a_bad_configuration_exits_non_zero_with_one_error() {
    let dir = std::env::temp_dir().join(format!("rmm-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rmm.toml");
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
