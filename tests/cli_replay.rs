//! `rmm replay`: replays an RMM-format log on a simulated device of a given capacity, prints
//! the time, the peak and whether it fit; exits non-zero when it did not fit or the log is
//! malformed.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output};

const GIB: u64 = 1 << 30;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("rmm-cli-replay-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A log of two threads whose live bytes climb to `peak_gib` GiB (1 GiB blocks, one thread
/// freeing the other's blocks), then go back to zero.
fn write_log(name: &str, peak_gib: u64) -> PathBuf {
    let mut s = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 0..peak_gib {
        let thread = 100 + i % 2;
        writeln!(
            s,
            "{thread},10:00:00.{i:06},allocate,{:#x},{GIB},0x0",
            (i + 1) << 32
        )
        .unwrap();
    }
    for i in 0..peak_gib {
        writeln!(s, "101,10:00:01.{i:06},free,{:#x},{GIB},0x0", (i + 1) << 32).unwrap();
    }
    let path = dir().join(name);
    std::fs::write(&path, s).unwrap();
    path
}

fn rmm(args: &[&str]) -> Output {
    // At run time where the runner says (nextest archives move binaries), else where cargo
    // built it.
    let exe = std::env::var("NEXTEST_BIN_EXE_rmm")
        .or_else(|_| std::env::var("CARGO_BIN_EXE_rmm"))
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_rmm").to_string());
    Command::new(exe)
        .args(args)
        .env_remove("RMM_CONFIG")
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_log_that_fits_prints_time_peak_and_fit() {
    let log = write_log("fits.csv", 30);
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "40GiB",
        "--pool-initial",
        "0",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("sim (1 device × 40.00 GiB, unbacked)"),
        "{stdout}"
    );
    assert!(stdout.contains("time:"), "{stdout}");
    assert!(
        stdout.contains("peak:       30.00 GiB (32212254720 bytes)"),
        "{stdout}"
    );
    assert!(stdout.contains("2 thread(s)"), "{stdout}");
    assert!(stdout.contains("fit:        yes"), "{stdout}");
}

#[test]
fn a_log_that_does_not_fit_exits_non_zero() {
    let log = write_log("too_big.csv", 50);
    for resource in ["pool", "cuda", "binning", "async"] {
        let out = rmm(&[
            "replay",
            log.to_str().unwrap(),
            "--simulate-capacity",
            "40GiB",
            "--resource",
            resource,
        ]);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{resource}: {stdout}\n{stderr}");
        assert!(stdout.contains("fit:        NO"), "{resource}: {stdout}");
        assert!(
            stderr.contains("did not fit on device 0 (40.00 GiB total)"),
            "{stderr}"
        );
        assert!(stderr.contains("too_big.csv"), "{stderr}");
    }
    // The same log fits with concurrent order on a larger device.
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "64GiB",
        "--order",
        "concurrent",
        "--pool-maximum",
        "60GiB",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
}

#[test]
fn a_malformed_log_names_the_file_and_line() {
    let path = dir().join("bad.csv");
    std::fs::write(
        &path,
        "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000001,allocate,0x100,256,0x0\n1,10:00:00.000002,allocate,0x200\n",
    )
    .unwrap();
    let out = rmm(&[
        "replay",
        path.to_str().unwrap(),
        "--simulate-capacity",
        "1GiB",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("bad.csv line 3"), "{stderr}");
    assert!(stderr.contains("found 4 field(s)"), "{stderr}");
    assert!(stderr.contains("expected 6"), "{stderr}");
    // A missing file, and a bad size, are errors too.
    let out = rmm(&["replay", "/nonexistent/rmm_log.dev0.csv"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("/nonexistent/rmm_log.dev0.csv"));
    let out = rmm(&[
        "replay",
        path.to_str().unwrap(),
        "--simulate-capacity",
        "50%",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("capacity in bytes"),
        "{}",
        text(&out).1
    );
}
