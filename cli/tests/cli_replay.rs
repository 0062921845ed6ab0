//! `rmm replay`: replays an RMM-format log on a simulated device of a given capacity, prints
//! the time, the peak and whether it fit; exits non-zero when it did not fit or the log is
//! malformed.

mod common;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Output;

const GIB: u64 = 1 << 30;

thread_local! {
    /// The test's own directory, removed when its thread (the test) ends.
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("rmm-cli-replay-")
        .tempdir()
        .unwrap();
}

fn dir() -> PathBuf {
    SCRATCH.with(|d| d.path().to_path_buf())
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
    common::rmm_command()
        .args(args)
        .env_remove("RMM_CONFIG")
        .output()
        .unwrap()
}

/// The value of the figure `name` in the replay's table (aligned text), or "" without one.
fn figure(stdout: &str, name: &str) -> String {
    stdout
        .lines()
        .map(str::trim_start)
        .find_map(|l| l.strip_prefix(name).filter(|rest| rest.starts_with("  ")))
        .map_or_else(String::new, |rest| rest.trim().to_string())
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
    // Logged order reproduces the logged peak exactly (concurrent, the default, may not).
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "40GiB",
        "--pool-initial",
        "0",
        "--pool-growth",
        "512MiB",
        "--order",
        "logged",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("sim (1 device × 40.00 GiB, unbacked)"),
        "{stdout}"
    );
    assert!(figure(&stdout, "time").ends_with(" ms"), "{stdout}");
    assert!(
        figure(&stdout, "peak").starts_with("30.00 GiB in 30 live allocations"),
        "{stdout}"
    );
    assert!(
        figure(&stdout, "threads").starts_with("1 thread, "),
        "{stdout}"
    );
    assert_eq!(figure(&stdout, "fit"), "yes", "{stdout}");
    assert!(stdout.contains("units:   binary"), "{stdout}");
    // The pool's figures after the replay: reserved against in use, and fragmentation. Grown
    // by each 1 GiB request's need (a whole number of 512 MiB steps), it holds the peak.
    let pool = figure(&stdout, "pool");
    assert!(
        pool.starts_with("reserved 30.00 GiB of maximum 40.00 GiB, in use 0 B")
            && pool.contains("fragmentation"),
        "{stdout}"
    );
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
            "--order",
            "logged",
        ]);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{resource}: {stdout}\n{stderr}");
        assert!(
            figure(&stdout, "fit").starts_with("NO: "),
            "{resource}: {stdout}"
        );
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

/// The sample log shipped with the allocator's tests, found at run time.
fn sample_log() -> PathBuf {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR at run time");
    PathBuf::from(root).join("tests/data/rmm_log_sample.csv")
}

fn pickle_dict(path: &std::path::Path) -> serde_pickle::Value {
    let bytes = std::fs::read(path).unwrap();
    serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap()
}

fn key<'a>(v: &'a serde_pickle::Value, k: &str) -> &'a serde_pickle::Value {
    match v {
        serde_pickle::Value::Dict(d) => d
            .get(&serde_pickle::HashableValue::String(k.into()))
            .unwrap_or_else(|| panic!("no {k:?} in {v:?}")),
        _ => panic!("not a dict: {v:?}"),
    }
}

fn items(v: &serde_pickle::Value) -> &[serde_pickle::Value] {
    match v {
        serde_pickle::Value::List(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn actions(snapshot: &serde_pickle::Value) -> Vec<String> {
    let traces = items(key(snapshot, "device_traces"));
    assert_eq!(traces.len(), 1, "one device");
    items(&traces[0])
        .iter()
        .map(|e| match key(e, "action") {
            serde_pickle::Value::String(s) => s.clone(),
            other => panic!("action {other:?}"),
        })
        .collect()
}

#[test]
fn plot_and_torch_snapshot_of_the_sample_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (svg, pickle) = (tmp.path().join("t.svg"), tmp.path().join("t.pickle"));
    let log = sample_log();
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "8GiB",
        "--plot",
        svg.to_str().unwrap(),
        "--torch-snapshot",
        pickle.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        figure(&stdout, "plot").starts_with(&format!("{} (on the log's clock", svg.display())),
        "{stdout}"
    );
    assert!(
        figure(&stdout, "snapshot").starts_with(&pickle.display().to_string()),
        "{stdout}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg"), "{plot}");
    assert!(plot.trim_end().ends_with("</svg>"));
    assert!(plot.contains("rmm_log_sample.csv") && plot.contains("device 0"));
    // The pool's events: its initial chunk, then the log's 4 allocations and 4 frees.
    let snapshot = pickle_dict(&pickle);
    let got = actions(&snapshot);
    assert_eq!(
        got.first().map(String::as_str),
        Some("segment_alloc"),
        "{got:?}"
    );
    assert_eq!(got.iter().filter(|a| *a == "alloc").count(), 4, "{got:?}");
    assert_eq!(got.iter().filter(|a| *a == "free_completed").count(), 4);
    let segments = items(key(&snapshot, "segments"));
    assert_eq!(segments.len(), 1, "the pool's chunk");
    assert_eq!(
        key(&segments[0], "total_size"),
        &serde_pickle::Value::I64(4 << 30),
        "half of the free memory"
    );

    // A resource without hooks: the log's own events, with its logged failure.
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "8GiB",
        "--resource",
        "cuda",
        "--torch-snapshot",
        pickle.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("from the log's events"), "{stdout}");
    let got = actions(&pickle_dict(&pickle));
    assert_eq!(got.iter().filter(|a| *a == "alloc").count(), 4, "{got:?}");
    assert_eq!(got.iter().filter(|a| *a == "oom").count(), 1, "{got:?}");
}

#[test]
fn a_torch_snapshot_keeps_the_last_trace_entries_it_is_told() {
    let tmp = tempfile::tempdir().unwrap();
    let log = write_log("entries.csv", 8);
    let snapshot = |entries: Option<&str>| {
        let pickle = tmp
            .path()
            .join(format!("{}.pickle", entries.unwrap_or("all")));
        let mut args = vec![
            "replay",
            log.to_str().unwrap(),
            "--simulate-capacity",
            "40GiB",
            "--order",
            "logged",
            "--json",
            "--torch-snapshot",
            pickle.to_str().unwrap(),
        ];
        if let Some(n) = entries {
            args.extend(["--torch-trace-entries", n]);
        }
        let out = rmm(&args);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let about = v["snapshot"]["about"].as_str().unwrap().to_string();
        (pickle_dict(&pickle), about)
    };
    // The pool's initial chunk, 8 allocations and 8 frees (two entries each): 25 entries.
    let (whole, about) = snapshot(None);
    let all = actions(&whole);
    assert_eq!(all.len(), 25, "{all:?}");
    assert!(!about.contains("the last"), "{about}");
    // The last 5 would split a free: the last 4 are kept.
    let (tail, about) = snapshot(Some("5"));
    let kept = actions(&tail);
    assert_eq!(kept[..], all[all.len() - 4..], "{kept:?}");
    assert!(
        about.contains("the last 4 of 25 trace entries: --torch-trace-entries keeps more"),
        "{about}"
    );
    assert_eq!(key(&tail, "segments"), key(&whole, "segments"));
    // At least one entry, and only with a snapshot.
    for (args, says) in [
        (
            &["--torch-snapshot", "x.pickle", "--torch-trace-entries", "0"][..],
            "at least 1",
        ),
        (&["--torch-trace-entries", "10"][..], "--torch-snapshot"),
    ] {
        let out = rmm(&[&["replay", log.to_str().unwrap()][..], args].concat());
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{stdout}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

#[test]
fn a_replay_that_does_not_fit_is_plotted_with_its_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("too_big.svg");
    let log = write_log("too_big_plot.csv", 50);
    // Logged order: the log's own peak, which does not fit (a concurrent replay's interleaving
    // may stay below it).
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "40GiB",
        "--order",
        "logged",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("did not fit"), "{stderr}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.contains("out of memory"), "{plot}");

    // A file that cannot be written is an error naming it, before the replay.
    let bad = tmp.path().join("no-such-dir").join("t.svg");
    let out = rmm(&[
        "replay",
        sample_log().to_str().unwrap(),
        "--simulate-capacity",
        "8GiB",
        "--plot",
        bad.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains(&format!("rmm: --plot {}: cannot be written", bad.display())),
        "{stderr}"
    );
    assert!(!stdout.contains("backend:"), "the replay ran: {stdout}");
}

#[test]
fn an_unwritable_plot_path_fails_before_the_replay() {
    let log = write_log("unwritable-plot.csv", 2);
    for option in ["--plot", "--torch-snapshot"] {
        let out = rmm(&[
            "replay",
            log.to_str().unwrap(),
            "--simulate-capacity",
            "40GiB",
            option,
            "/proc/rmm-replay.svg",
        ]);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{stdout}{stderr}");
        assert!(
            stderr.contains(&format!("{option} /proc/rmm-replay.svg: cannot be written")),
            "{stderr}"
        );
        // Nothing was replayed: the report's first line never came.
        assert!(!stdout.contains("backend:"), "{stdout}");
    }
}

#[test]
fn a_multi_thread_log_is_replayed_concurrently_by_default_as_it_is_read() {
    let log = write_log("default-order.csv", 8);
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "40GiB",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        figure(&stdout, "threads"),
        "2 threads, 0 streams, concurrent order",
        "{stdout}"
    );
    assert_eq!(figure(&stdout, "fit"), "yes", "{stdout}");
    // Logged order is one thread replaying the log as written.
    let out = rmm(&[
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "40GiB",
        "--order",
        "logged",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        figure(&stdout, "threads"),
        "1 thread, 0 streams, logged order",
        "{stdout}"
    );
    assert!(figure(&stdout, "peak").starts_with("8.00 GiB"), "{stdout}");
}

#[test]
fn json_quiet_markdown_and_a_png_on_the_logs_clock() {
    let tmp = tempfile::tempdir().unwrap();
    let log = write_log("outputs.csv", 4);
    // In logged order: the peak is the log's (in concurrent order a thread may free its
    // blocks before the other allocates its last one, and the peak depends on the timing).
    let base = [
        "replay",
        log.to_str().unwrap(),
        "--simulate-capacity",
        "40GiB",
        "--pool-initial",
        "32GiB",
        "--order",
        "logged",
    ];
    let run = |extra: &[&str]| rmm(&[&base[..], extra].concat());

    // JSON: raw bytes and seconds, and nothing else on standard output.
    let out = run(&["--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(v["peak_bytes"], serde_json::json!(4 * GIB));
    assert_eq!(v["total_memory"], serde_json::json!(40 * GIB));
    assert_eq!(v["fit"], serde_json::json!(true));
    assert!(v["seconds"].as_f64().unwrap() > 0.0);

    // Quiet: nothing on standard output, success in the exit status.
    let out = run(&["--quiet"]);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{:?}",
        text(&out)
    );

    // Markdown: the figures as a two-column table.
    let out = run(&["--format", "markdown"]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("| figure "), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("| fit ") && l.contains("yes")),
        "{stdout}"
    );

    // A PNG when the name says so; the plot is on the log's clock (it spans a second, where
    // the replay takes milliseconds) and the 4 GiB in use get their own axis beside the
    // 32 GiB pool.
    let png = tmp.path().join("replay.png");
    let out = run(&["--plot", png.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plot"]["path"], serde_json::json!(png), "{v}");
    assert!(
        v["plot"]["about"].as_str().unwrap().contains("log's clock"),
        "{v}"
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    let svg = tmp.path().join("replay.svg");
    let out = run(&["--plot", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{:?}", text(&out));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("in use (right axis)"), "no right axis");
    assert!(
        picture.contains("\n1.0\n"),
        "the x axis reaches the log's 1 s"
    );

    // Another extension is refused before the replay (nothing on standard output).
    let jpg = tmp.path().join("replay.jpg");
    let out = run(&["--plot", jpg.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("cannot write a .jpg picture; name the file .svg (vector) or .png"),
        "{stderr}"
    );
    assert!(!jpg.exists());
}

/// A log of `pairs` allocations and frees of 4 KiB on two threads, at most 16 live at once,
/// written as it is made (this process's memory stays small: see [`peak_rss_kib`]).
fn write_long_log(name: &str, pairs: u64) -> PathBuf {
    use std::io::Write as _;
    let path = dir().join(name);
    let mut s = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(s, "Thread,Time,Action,Pointer,Size,Stream").unwrap();
    for i in 0..pairs {
        let thread = 100 + i % 2;
        let (sec, us) = (i / 1_000_000, i % 1_000_000);
        let ptr = ((i % 16) + 1) << 20;
        writeln!(
            s,
            "{thread},10:00:{sec:02}.{us:06},allocate,{ptr:#x},4096,0x0"
        )
        .unwrap();
        writeln!(s, "{thread},10:00:{sec:02}.{us:06},free,{ptr:#x},4096,0x0").unwrap();
    }
    s.flush().unwrap();
    path
}

/// This process's own peak resident set so far, in KiB (`VmHWM`, where /proc has it: its
/// memory's, without what `getrusage` counts of the process that started it).
fn own_peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `rmm args` to its end and returns its peak resident set in KiB (its own, from
/// `wait4`) and its standard output; panics with its output if it fails.
///
/// Linux counts in a child's peak the peak of the memory it was started from (this
/// process's, until the child runs `rmm`): the figure is the child's only while this
/// process's own peak stays below it, which is checked.
fn peak_rss_kib(args: &[&str]) -> (u64, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (tmp.path().join("stdout"), tmp.path().join("stderr"));
    // Waited for by wait4 below, which gives its resource usage (`Child::wait` does not).
    #[expect(clippy::zombie_processes)]
    let child = common::rmm_command()
        .args(args)
        .env_remove("RMM_CONFIG")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: wait4 writes the status and a whole rusage into the pointers it is given; the
    // child is ours and nothing else waits for it.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
    assert_eq!(rc, pid, "wait4");
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "rmm {args:?}: {stdout}\n{stderr}"
    );
    // SAFETY: initialized by the successful call above.
    let kib = unsafe { usage.assume_init() }.ru_maxrss as u64;
    if let Some(own) = own_peak_rss_kib() {
        assert!(
            kib > own,
            "rmm {args:?} peaked at {kib} KiB, no more than this test process ({own} KiB): \
             the figure may be this process's, not the child's; keep the test's own memory \
             small"
        );
    }
    (kib, stdout)
}

#[test]
fn the_replay_commands_memory_does_not_grow_with_the_log() {
    // 25 000 and 200 000 pairs (about 2 and 17 MB of text): read whole, the long log alone
    // would take some 40 MB more than the short one (the issue measured 2.7× the file).
    let short = write_long_log("short.csv", 25_000);
    let long = write_long_log("long.csv", 200_000);
    let long_bytes = std::fs::metadata(&long).unwrap().len();
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("m.svg");
    let pickle = tmp.path().join("m.pickle");
    let base = ["--simulate-capacity", "1GiB", "--json"];
    // With the timeline: a plot (past its exact limit of events at either length) and a
    // snapshot keeping fewer trace entries than either log gives (75 000 and 600 000).
    let timeline = [
        "--plot",
        svg.to_str().unwrap(),
        "--torch-snapshot",
        pickle.to_str().unwrap(),
        "--torch-trace-entries",
        "20000",
    ];
    for (what, extra) in [
        ("plain", &[][..]),
        ("--plot and --torch-snapshot", &timeline[..]),
    ] {
        let run = |log: &PathBuf| {
            let args = [&["replay", log.to_str().unwrap()][..], &base, extra].concat();
            peak_rss_kib(&args)
        };
        let (after_short, _) = run(&short);
        let (after_long, stdout) = run(&long);
        let grew_kib = after_long.saturating_sub(after_short);
        eprintln!("{what}: peak {after_short} KiB (short log), {after_long} KiB (long log)");
        assert!(
            grew_kib * 1024 < long_bytes / 4,
            "{what}: replaying a {long_bytes}-byte log took {grew_kib} KiB more than a log an \
             eighth its length (peaks {after_short} and {after_long} KiB)"
        );
        if extra.is_empty() {
            continue;
        }
        // The long log's timeline: binned, and the trace's last entries.
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let about = |k: &str| v[k]["about"].as_str().unwrap_or_default().to_string();
        // The log's 400 000 events and the pool's initial chunk.
        assert!(about("plot").contains("400001 events drawn as"), "{v}");
        assert!(
            about("snapshot").contains("the last 20000 of 600001 trace entries"),
            "{v}"
        );
        assert_eq!(actions(&pickle_dict(&pickle)).len(), 20_000);
    }
}

/// `rmm args` run by `sh` after `limits` (shell commands such as `ulimit -v 1048576`), to its
/// end.
fn rmm_limited(limits: &str, args: &[&str]) -> Output {
    let rmm = common::rmm_command();
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{limits}; exec \"$0\" \"$@\""))
        .arg(rmm.get_program())
        .args(args)
        .env_remove("RMM_CONFIG")
        // Few malloc arenas: an address-space limit then bounds threads, not arenas.
        .env("MALLOC_ARENA_MAX", "2")
        .output()
        .unwrap()
}

#[test]
fn an_output_that_cannot_be_written_whole_leaves_the_old_file_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let log = write_log("full-disk.csv", 8);
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    for (option, name) in [("--torch-snapshot", "s.pickle"), ("--plot", "p.svg")] {
        let target = tmp.path().join(name);
        let args = [
            "replay",
            log.to_str().unwrap(),
            "--simulate-capacity",
            "40GiB",
            option,
            target.to_str().unwrap(),
        ];
        let out = rmm(&args);
        assert!(out.status.success(), "{:?}", text(&out));
        let whole = std::fs::read(&target).unwrap();
        assert!(whole.len() > 1024, "{option}: {} bytes", whole.len());
        // A disk that fills up after 512 bytes: a file size limit (the process ignoring
        // SIGXFSZ, its writes fail as on a full disk).
        let full = "trap '' XFSZ; ulimit -f 1";
        for existed in [true, false] {
            if !existed {
                std::fs::remove_file(&target).unwrap();
            }
            let out = rmm_limited(full, &args);
            let (stdout, stderr) = text(&out);
            assert!(!out.status.success(), "{option}: {stdout}\n{stderr}");
            assert!(
                stderr.contains(&format!(
                    "rmm: {option} {}: writing it failed (",
                    target.display()
                )) && stderr.contains("it was not replaced"),
                "{stderr}"
            );
            if existed {
                assert_eq!(std::fs::read(&target).unwrap(), whole, "{option}: changed");
                assert_eq!(names(), [name], "{option}: a file left beside it");
            } else {
                assert!(names().is_empty(), "{option}: {:?} left", names());
            }
        }
    }
}

#[test]
fn an_impossible_time_is_an_error_naming_the_line_and_the_value() {
    let path = dir().join("bad-time.csv");
    std::fs::write(
        &path,
        "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000001,allocate,0x100,256,0x0\n\
         1,99:99:99,free,0x100,256,0x0\n",
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
    assert!(
        stderr.contains("bad-time.csv line 3: found time `99:99:99`, expected a time of day"),
        "{stderr}"
    );
}

#[test]
fn an_endless_line_is_an_error_naming_the_limit_not_a_memory_blowup() {
    // Under a 1 GiB address space, a line read until its end would run out of memory.
    let out = rmm_limited(
        "ulimit -v 1048576",
        &["replay", "/dev/zero", "--simulate-capacity", "1GiB"],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("/dev/zero line 1: found a line longer than 4096 bytes")
            && stderr.contains("one event per line"),
        "{stderr}"
    );
}

#[test]
fn a_log_from_a_pipe_is_read_once_as_it_is_replayed() {
    use std::io::Write as _;
    let log = std::fs::read(write_log("piped.csv", 8)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let pickle = tmp.path().join("piped.pickle");
    for (input, name) in [("-", "standard input"), ("/dev/stdin", "/dev/stdin")] {
        let mut child = common::rmm_command()
            .args([
                "replay",
                input,
                "--simulate-capacity",
                "40GiB",
                "--order",
                "logged",
                "--torch-snapshot",
                pickle.to_str().unwrap(),
            ])
            .env_remove("RMM_CONFIG")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let log = log.clone();
        let writer = std::thread::spawn(move || stdin.write_all(&log));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{input}: {stdout}\n{stderr}");
        assert_eq!(figure(&stdout, "log"), name, "{stdout}");
        assert!(
            figure(&stdout, "events").starts_with("16: 8 allocations and 8 frees"),
            "{input}: {stdout}"
        );
        assert!(figure(&stdout, "peak").starts_with("8.00 GiB"), "{stdout}");
        // The snapshot came from the same reading: the pool's chunk, 8 allocations, 8 frees.
        let got = actions(&pickle_dict(&pickle));
        assert_eq!(got.iter().filter(|a| *a == "alloc").count(), 8, "{got:?}");
    }
}

#[test]
fn a_log_from_a_fifo_is_replayed_not_waited_for_again() {
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("log.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", fifo.display());
    let (out_path, err_path) = (tmp.path().join("stdout"), tmp.path().join("stderr"));
    let mut child = common::rmm_command()
        .args([
            "replay",
            fifo.to_str().unwrap(),
            "--simulate-capacity",
            "40GiB",
        ])
        .env_remove("RMM_CONFIG")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    // One writer, as a producer piping into a FIFO: it opens (waiting for the reader),
    // writes and closes. Not joined: with no reader it would wait forever.
    let log = std::fs::read(write_log("fifo.csv", 4)).unwrap();
    let to = fifo.clone();
    std::thread::spawn(move || std::fs::File::create(&to).and_then(|mut f| f.write_all(&log)));
    // Not a measure of time: a hang guard, far above the few milliseconds the replay takes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("rmm replay of a FIFO still runs after a minute: it waits to read it again");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(figure(&stdout, "events").starts_with("8: "), "{stdout}");
}

#[test]
fn a_log_of_50_000_threads_replays_on_a_bounded_number_of_threads() {
    // Each thread allocates 4 KiB and frees it. Under a 4 GiB address space, 50 000 threads
    // (2 MiB of stack each) cannot start; the replay's own threads can.
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("threads-50k.csv");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(f, "Thread,Time,Action,Pointer,Size,Stream").unwrap();
    for t in 0..50_000u64 {
        let p = (t + 1) << 20;
        writeln!(f, "{t},10:00:00.000000,allocate,{p:#x},4096,0x0").unwrap();
        writeln!(f, "{t},10:00:00.000001,free,{p:#x},4096,0x0").unwrap();
    }
    f.flush().unwrap();
    let out = rmm_limited(
        "ulimit -v 4194304",
        &[
            "replay",
            path.to_str().unwrap(),
            "--simulate-capacity",
            "40GiB",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        figure(&stdout, "events").starts_with("100000: 50000 allocations and 50000 frees"),
        "{stdout}"
    );
    let threads = figure(&stdout, "threads");
    let n: usize = threads
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    let limit = std::thread::available_parallelism().map_or(64, |p| p.get().max(64));
    assert!(
        n <= limit && threads.contains(" for 50000 logged threads, "),
        "{stdout}"
    );
    assert_eq!(figure(&stdout, "fit"), "yes", "{stdout}");
}
