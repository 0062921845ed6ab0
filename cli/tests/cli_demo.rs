//! `rmm demo` as a process on the simulated device: it passes its own checks, spills,
//! reinitializes twice, writes its timeline picture and PyTorch snapshot; a bad rmm.toml is
//! one clear line and a non-zero exit.

mod common;

use std::path::Path;
use std::process::Output;

fn rmm(args: &[&str], config: &Path) -> Output {
    common::rmm_command()
        .args(args)
        .env("RMM_CONFIG", config)
        .env("RMM_BACKEND", "sim")
        .env_remove("RMM_SIM_MEMORY")
        .env_remove("RMM_DEVICES")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_demo_asked_for_no_backend_runs_without_a_gpu_and_says_it_is_simulated() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "").unwrap();
    let out = common::rmm_command()
        .args(["demo", "--size", "tiny"])
        .env("RMM_CONFIG", &config)
        .env_remove("RMM_BACKEND")
        .env_remove("RMM_SIM_MEMORY")
        .env_remove("RMM_DEVICES")
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if String::from_utf8_lossy(&out.stdout).contains("backend: cuda") {
        // A machine with a GPU: no note.
        assert!(!stderr.contains("simulated device"), "{stderr}");
    } else {
        assert!(
            stderr.contains("no GPU (")
                && stderr.contains("running on the simulated device instead"),
            "the demo says it falls back, and why: {stderr}"
        );
        assert!(
            stderr.contains("RMM_BACKEND=cuda makes this an error"),
            "{stderr}"
        );
    }
}

#[test]
fn a_tiny_demo_on_two_simulated_devices_checks_itself_and_reports_spilling() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0, 1]\nworkers_per_device = 2\n").unwrap();
    let svg = dir.path().join("timeline.svg");
    let snapshot = dir.path().join("snapshot.pickle");
    let out = rmm(
        &[
            "demo",
            "--size",
            "tiny",
            "--json",
            "--plot",
            svg.to_str().unwrap(),
            "--torch-snapshot",
            snapshot.to_str().unwrap(),
        ],
        &config,
    );
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["devices"], serde_json::json!([0, 1]));
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(
        phases
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["pooled", "plain", "pooled again"]
    );
    for d in phases[0]["devices"].as_array().unwrap() {
        assert!(d["tasks"].as_u64().unwrap() > 0, "{d}");
        assert!(
            d["spilled_bytes"].as_u64().unwrap() > 0,
            "spilling happened: {d}"
        );
    }
    for d in phases[2]["devices"].as_array().unwrap() {
        assert!(
            d["unspilled_bytes"].as_u64().unwrap() > 0,
            "data came back: {d}"
        );
    }
    let reinit = report["reinitializes"].as_array().unwrap();
    assert_eq!(reinit.len(), 2);
    assert!(reinit[0]["spilled_bytes"].as_u64().unwrap() > 0);
    // Durations in seconds, as the phases' (no field in milliseconds beside them).
    for r in reinit {
        let (total, spill) = (
            r["seconds"].as_f64().unwrap(),
            r["spill_seconds"].as_f64().unwrap(),
        );
        assert!(total > 0.0 && spill >= 0.0 && spill <= total, "{r}");
        assert!(r.get("total_ms").is_none(), "{r}");
    }
    assert!(report["phases"][0]["seconds"].as_f64().unwrap() > 0.0);
    assert!(report["checked"].as_u64().unwrap() > 0);
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
    let pickle = std::fs::read(&snapshot).unwrap();
    let value: serde_pickle::Value =
        serde_pickle::value_from_slice(&pickle, serde_pickle::DeOptions::new()).unwrap();
    let text = format!("{value:?}");
    assert!(text.contains("device_traces") && text.contains("segment_alloc"));
}

#[test]
fn the_tables_name_every_phase_and_reinitialize() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0]\n").unwrap();
    let out = rmm(&["demo", "--size", "tiny", "--format", "markdown"], &config);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let cells = |l: &str| -> Vec<String> {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(cells)
        .collect();
    for phase in ["pooled", "plain", "pooled again"] {
        assert!(
            rows.iter().any(|r| r[0] == "0" && r[1] == phase),
            "{phase:?} missing in:\n{stdout}"
        );
    }
    for transition in ["pooled → plain", "plain → pooled"] {
        assert!(
            rows.iter().any(|r| r[0] == transition),
            "{transition:?}:\n{stdout}"
        );
    }
    // Nothing moved is "—", not "0 B (0.0 GB/s)"; rates in GiB/s (binary, as the sizes).
    assert!(
        !stdout.contains("0 B") && !stdout.contains("GB/s"),
        "{stdout}"
    );
    assert!(
        stdout.contains(" GiB/s") && stdout.contains("—"),
        "{stdout}"
    );
    assert!(stdout.contains("units:   binary"), "{stdout}");
    assert!(stdout.contains("every byte as expected"), "{stdout}");
    // Progress counts tasks, on standard error.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pooled: ") && stderr.contains(" tasks"),
        "{stderr}"
    );
}

#[test]
fn quiet_prints_nothing_and_a_png_plot_is_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0]\n").unwrap();
    let png = dir.path().join("timeline.png");
    let out = rmm(
        &[
            "demo",
            "--size",
            "tiny",
            "--quiet",
            "--plot",
            png.to_str().unwrap(),
        ],
        &config,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", text(&out));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");

    // Another extension: refused at once, before any work.
    let gif = dir.path().join("timeline.gif");
    let out = rmm(
        &["demo", "--size", "tiny", "--plot", gif.to_str().unwrap()],
        &config,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot write a .gif picture"), "{stderr}");
    assert!(!stderr.contains("pooled"), "the demo ran: {stderr}");
    assert!(!gif.exists());

    // --json excludes --quiet and --format (usage errors).
    for extra in [["--json", "--quiet"], ["--json", "--format=markdown"]] {
        let out = rmm(
            &[&["demo", "--size", "tiny"][..], &extra[..]].concat(),
            &config,
        );
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
    }
}

#[test]
fn a_bad_rmm_toml_is_one_line_and_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "[pool]\ninitial_size = \"lots\"\n").unwrap();
    let out = rmm(&["demo", "--size", "tiny"], &config);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("rmm: ")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("pool.initial_size"), "{stderr}");
}

/// An rmm.toml in `dir` whose host tier is tiny, so that the demo spills to `dir/spill`.
fn disk_spilling_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("rmm.toml");
    std::fs::write(
        &config,
        format!(
            "devices = [0]\n[spill]\nhost_pool_size = \"1MiB\"\ndisk_directory = \"{}\"\n",
            dir.join("spill").display()
        ),
    )
    .unwrap();
    config
}

/// The names of the spill files in `dir`.
fn spill_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("rmm-spill-"))
                .collect()
        })
        .unwrap_or_default()
}

/// How many spill files process `pid` holds open in `dir` (they have no name: found through
/// `/proc/<pid>/fd`, whose links point into `dir`).
fn open_spill_files(pid: u32, dir: &Path) -> usize {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.parent() == Some(&*dir)))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn sigint_or_sigterm_while_spilling_to_disk_leaves_no_spill_file() {
    for (signal, number) in [("TERM", 15), ("INT", 2)] {
        let dir = tempfile::tempdir().unwrap();
        let config = disk_spilling_config(dir.path());
        let spill = dir.path().join("spill");
        let mut child = common::rmm_command()
            .args(["demo", "--size", "small", "--quiet"])
            .env("RMM_CONFIG", &config)
            .env("RMM_BACKEND", "sim")
            .env_remove("RMM_SIM_MEMORY")
            .env_remove("RMM_DEVICES")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while open_spill_files(child.id(), &spill) == 0 {
            assert!(
                std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(),
                "the demo spilled nothing to {}",
                spill.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let sent = std::process::Command::new("kill")
            .args(["-s", signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(128 + number),
            "SIG{signal}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("stopped by SIG{signal}")),
            "{stderr}"
        );
        assert_eq!(spill_files(&spill), Vec::<String>::new(), "SIG{signal}");
    }
}

#[test]
fn a_file_size_limit_makes_a_spill_write_an_error_not_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let config = disk_spilling_config(dir.path());
    // Standard output and error are pipes, which the limit does not cover.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -f 256 && exec \"$0\" \"$@\"")
        .arg(common::rmm_command().get_program())
        .args(["demo", "--size", "small", "--quiet"])
        .env("RMM_CONFIG", &config)
        .env("RMM_BACKEND", "sim")
        .env_remove("RMM_SIM_MEMORY")
        .env_remove("RMM_DEVICES")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Not killed by SIGXFSZ: the write failed with EFBIG, which was reported.
    assert!(out.status.code().is_some(), "{:?}", out.status);
    assert!(stderr.contains("File too large"), "{stderr}");
    assert_eq!(spill_files(&dir.path().join("spill")), Vec::<String>::new());
}

#[test]
fn output_paths_that_cannot_be_written_fail_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0]\n").unwrap();
    let cases = [
        ("--plot", "/nonexistent/x.svg".to_string()),
        ("--torch-snapshot", dir.path().display().to_string()),
    ];
    for (option, path) in cases {
        // A size whose run takes far longer than this test allows, were it started.
        let started = std::time::Instant::now();
        let out = rmm(&["demo", "--size", "large", option, &path], &config);
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(all.contains(&format!("{option} {path}")), "{all}");
        assert!(all.contains("writable directory"), "{all}");
        assert!(!all.contains("phase "), "the run started: {all}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }
    // A good path that the run never writes (a failed run) is not left behind.
    let svg = dir.path().join("t.svg");
    let out = rmm(
        &["demo", "--size", "tiny", "--plot", svg.to_str().unwrap()],
        &dir.path().join("missing.toml"),
    );
    assert!(!out.status.success());
    assert!(!svg.exists(), "{}", text(&out));
}

#[test]
fn too_many_workers_is_one_clear_error_and_threads_that_cannot_start_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0]\n").unwrap();
    let out = common::rmm_command()
        .args(["demo", "--size", "tiny", "--quiet"])
        .env("RMM_CONFIG", &config)
        .env("RMM_BACKEND", "sim")
        .env("RMM_WORKERS_PER_DEVICE", "100000")
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains(
            "environment RMM_WORKERS_PER_DEVICE = \"100000\": expected a whole number from 1 \
             to 256"
        ),
        "{all}"
    );
    assert!(!all.contains("panicked"), "{all}");
    // 256 workers of 256 MiB stacks do not fit in 3 GB of address space: the threads that
    // cannot start are an error, with no panic on the way.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 3000000 && exec \"$0\" \"$@\"")
        .arg(common::rmm_command().get_program())
        .args(["demo", "--size", "tiny", "--quiet"])
        .env("RMM_CONFIG", &config)
        .env("RMM_BACKEND", "sim")
        .env("RMM_WORKERS_PER_DEVICE", "256")
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("could not start") || all.contains("worker thread"),
        "{all}"
    );
    assert!(!all.contains("panicked"), "{all}");
}

#[test]
fn an_unbacked_device_and_too_many_workers_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0]\n").unwrap();
    let demo = |size: &str, vars: &[(&str, &str)]| {
        let mut c = common::rmm_command();
        c.args(["demo", "--size", size, "--quiet"])
            .env("RMM_CONFIG", &config)
            .env("RMM_BACKEND", "sim")
            .env_remove("RMM_SIM_MEMORY")
            .env_remove("RMM_SIM_MODE");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = demo("tiny", &[("RMM_SIM_MODE", "unbacked")]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("the simulated device is unbacked"), "{all}");
    assert!(all.contains("RMM_SIM_MODE=backed"), "{all}");
    assert!(!all.contains("does not hold"), "reads as corruption: {all}");
    // Tiny results (at most 2 MiB each) leave the pooled phase room on 256 MiB whatever the
    // timing of 16 workers (small ones, up to 8 MiB, could run the pool out first); the plain
    // phase's 16 MiB allocations then fit 13 times, not once per worker.
    let out = demo(
        "tiny",
        &[
            ("RMM_SIM_MEMORY", "256MiB"),
            ("RMM_WORKERS_PER_DEVICE", "16"),
        ],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("but each of its 16 workers needs one: lower workers_per_device to at most"),
        "{all}"
    );
}

#[test]
fn progress_away_from_a_terminal_counts_tasks_allocations_and_results() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rmm.toml");
    std::fs::write(&config, "devices = [0]\n").unwrap();
    let out = rmm(&["demo", "--size", "tiny"], &config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", text(&out));
    let line = |prefix: &str, unit: &str| {
        stderr.lines().any(|l| {
            l.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(unit))
                .is_some_and(|n| n.trim().parse::<u64>().is_ok_and(|n| n > 0))
        })
    };
    assert!(line("pooled: ", " tasks"), "{stderr}");
    assert!(line("plain: ", " allocations"), "{stderr}");
    assert!(line("pooled again: ", " tasks"), "{stderr}");
    assert!(line("checking: ", " results"), "{stderr}");
    assert!(!stderr.contains(" steps"), "{stderr}");
}
