//! `rmm bench` on the simulated device: the table has a row per resource and the speed-up
//! tables; `--json` gives the same as JSON; selections and bad arguments behave.

mod common;

use std::process::Output;

fn rmm(args: &[&str]) -> Output {
    common::rmm_command()
        .args(args)
        .env_remove("RMM_CONFIG")
        .env_remove("RMM_SIM_MODE")
        .env_remove("RMM_SIM_MEMORY")
        .env_remove("RMM_SIM_DEVICES")
        .env("RMM_BACKEND", "sim")
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const RESOURCES: [&str; 4] = ["cuda", "async", "pool", "binning(pool)"];
const SHAPES: [&str; 7] = [
    "churn",
    "random",
    "small",
    "mt8",
    "mt16",
    "mt8-shared",
    "mt16-shared",
];

/// The cells of a markdown table row, trimmed.
fn cells(line: &str) -> Vec<&str> {
    line.trim_matches('|').split('|').map(str::trim).collect()
}

#[test]
fn bench_tiny_prints_a_row_per_resource_and_the_ratios() {
    let out = rmm(&["bench", "--scale", "tiny", "--format", "markdown"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("backend: sim"), "{stdout}");
    assert!(stdout.contains("bookkeeping only"), "{stdout}");
    assert!(
        stdout.contains("ns per operation (rmm-rs simulated GPU; lower is better)"),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("| resource "))
        .unwrap();
    let mut expected = vec!["resource"];
    expected.extend(SHAPES);
    assert_eq!(cells(lines[header]), expected, "{stdout}");
    // Numbers right-aligned.
    assert!(
        cells(lines[header + 1])[1..]
            .iter()
            .all(|c| c.ends_with(':')),
        "{stdout}"
    );
    let rows = |name: &str| {
        lines
            .iter()
            .filter(|l| l.starts_with('|') && cells(l)[0] == name)
            .count()
    };
    for name in RESOURCES {
        // Once in the ns/op table, and in each speed-up table it is not the baseline of.
        let expected = if name == "cuda" || name == "async" {
            2
        } else {
            3
        };
        assert_eq!(rows(name), expected, "{name}: {stdout}");
    }
    // cuda runs churn and random only; the pool every shape; nothing else is "—".
    let cuda = lines.iter().find(|l| l.starts_with("| cuda ")).unwrap();
    assert_eq!(
        cells(cuda).iter().filter(|c| **c == "—").count(),
        5,
        "{cuda}"
    );
    let pool = lines.iter().find(|l| l.starts_with("| pool ")).unwrap();
    assert!(!pool.contains('—'), "{pool}");
    for base in ["async", "cuda"] {
        assert!(
            stdout.contains(&format!(
                "speed-up over {base} (its ns/op ÷ resource's ns/op, same run)"
            )),
            "{stdout}"
        );
    }
    assert!(stdout.contains('×'), "{stdout}");
}

#[test]
fn bench_prints_aligned_tables_by_default_and_nothing_with_quiet() {
    let args = [
        "bench",
        "--scale",
        "tiny",
        "--resources",
        "pool",
        "--shapes",
        "churn,small",
    ];
    let out = rmm(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let header = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("resource "))
        .unwrap();
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("pool"))
        .unwrap();
    assert!(!stdout.contains('|'), "{stdout}");
    // The numbers end under the end of their column titles.
    assert_eq!(header.trim_end().len(), row.trim_end().len(), "{stdout}");
    assert!(stderr.contains("measured pool (1/1)"), "{stderr}");

    let out = rmm(&[&args[..], &["--quiet"]].concat());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!stderr.contains("measured"), "{stderr}");

    // --json with --quiet or --format is a usage error.
    for extra in [["--quiet", "--json"], ["--format", "markdown"]] {
        let mut a = args.to_vec();
        a.extend(extra);
        if extra[0] == "--format" {
            a.push("--json");
        }
        let out = rmm(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}: {}", text(&out).1);
    }
}

#[test]
fn bench_tiny_json_has_the_expected_fields() {
    let out = rmm(&["bench", "--scale", "tiny", "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON value");
    assert!(v["backend"].as_str().unwrap().starts_with("sim"), "{v}");
    assert_eq!(v["simulated"], true);
    assert_eq!(v["device"], 0);
    assert!(v["device_name"].is_string() && v["total_memory"].is_u64());
    assert_eq!(v["options"]["scale"], 0.01);
    assert_eq!(v["options"]["rounds"], 1);
    assert_eq!(v["options"]["shapes"], serde_json::json!(SHAPES));
    assert_eq!(v["failures"], serde_json::json!([]));
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["resource"].as_str().unwrap())
        .collect();
    assert_eq!(names, RESOURCES);
    for row in rows {
        let cells = row["ns_per_op"].as_object().unwrap();
        assert_eq!(cells.len(), SHAPES.len(), "{row}");
        let measured = cells
            .values()
            .filter(|c| c.as_f64().is_some_and(|x| x > 0.0));
        let expected = if row["resource"] == "cuda" {
            2
        } else {
            SHAPES.len()
        };
        assert_eq!(measured.count(), expected, "{row}");
    }
    let speedups = v["speedups"].as_array().unwrap();
    let bases: Vec<&str> = speedups
        .iter()
        .map(|s| s["baseline"].as_str().unwrap())
        .collect();
    assert_eq!(bases, ["async", "cuda"]);
    for s in speedups {
        let rows = s["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "{s}");
        assert!(
            rows.iter().all(|r| r["ratio"]["churn"].as_f64().is_some()),
            "{s}"
        );
    }
}

#[test]
fn bench_runs_only_the_selected_resources_and_shapes() {
    let out = rmm(&[
        "bench",
        "--scale",
        "tiny",
        "--resources",
        "pool,binning",
        "--shapes",
        "small,mt8",
        "--rounds",
        "2",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let header = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("resource "))
        .unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["resource", "small", "mt8"],
        "{stdout}"
    );
    assert!(
        names.contains(&"pool") && names.contains(&"binning(pool)"),
        "{stdout}"
    );
    assert!(
        !names.contains(&"cuda") && !stdout.contains("speed-up"),
        "{stdout}"
    );
}

#[test]
fn bench_rejects_unknown_names() {
    for args in [
        ["bench", "--scale", "huge"],
        ["bench", "--resources", "arena"],
        ["bench", "--shapes", "mt4"],
        ["bench", "--rounds", "0"],
    ] {
        let out = rmm(&args);
        assert!(!out.status.success(), "{args:?}");
        assert!(text(&out).1.contains("invalid value"), "{}", text(&out).1);
    }
    let out = rmm(&["bench", "--scale", "tiny", "--device", "7"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains('7'), "{}", text(&out).1);
}
