//! Tests of the allocator benchmark, on the simulated device.

use super::*;
use crate::bench::traces::GIB;
use rmm::allocator::backend::{SimBackend, SimConfig, SimMemoryMode};

fn sim() -> &'static dyn Backend {
    match SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 80 * GIB,
        mode: SimMemoryMode::Unbacked,
    }) {
        Ok(b) => b,
        Err(e) => panic!("simulated backend: {e}"),
    }
}

fn tiny() -> AllocatorBenchOptions {
    AllocatorBenchOptions {
        scale: 0.001,
        ..AllocatorBenchOptions::default()
    }
}

#[test]
fn a_tiny_run_fills_every_cell_it_should() {
    let report = run(sim(), &tiny()).unwrap();
    assert!(report.simulated);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.rows.len(), 4);
    for row in &report.rows {
        for shape in Shape::ALL {
            let cell = row.ns_per_op[&shape];
            let expected =
                row.resource.runs_every_shape() || matches!(shape, Shape::Churn | Shape::Random);
            assert_eq!(cell.is_some(), expected, "{} {shape}", row.resource);
            assert!(cell.is_none_or(|x| x.is_finite() && x > 0.0));
        }
    }
    let bases: Vec<_> = report.speedups.iter().map(|s| s.baseline).collect();
    assert_eq!(bases, [Resource::Async, Resource::Cuda]);
    assert!(report.speedups.iter().all(|s| s.rows.len() == 3));
    let text = report.to_string();
    assert!(
        text.starts_with("ns per operation (rmm-rs simulated GPU; lower is better)\n"),
        "{text}"
    );
    let header = text.lines().find(|l| l.starts_with("| resource ")).unwrap();
    let heads: Vec<&str> = header
        .split('|')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    assert_eq!(
        heads,
        [
            "resource",
            "churn",
            "random",
            "small",
            "mt8",
            "mt16",
            "mt8-shared",
            "mt16-shared"
        ]
    );
    // Numbers are right-aligned in markdown.
    assert!(
        text.lines()
            .any(|l| l.starts_with("| ---") && l.ends_with(": |")),
        "{text}"
    );
    assert!(text.contains("| binning(pool) "));
    let cuda = text.lines().find(|l| l.starts_with("| cuda ")).unwrap();
    assert_eq!(
        cuda.matches(crate::table::NONE).count(),
        Shape::ALL.len() - 2,
        "{cuda}"
    );
    // The same tables as aligned text.
    let aligned = report.render(crate::table::TableFormat::Text);
    assert!(
        !aligned.contains('|') && aligned.contains("binning(pool)"),
        "{aligned}"
    );
    assert!(text.contains("speed-up over async (its ns/op ÷ resource's ns/op, same run)"));
    assert!(text.contains("speed-up over cuda"));
    assert!(text.contains('×'));
}

#[test]
fn a_selection_runs_only_its_rows_and_columns() {
    let options = AllocatorBenchOptions {
        resources: vec![Resource::Binning, Resource::Pool, Resource::Pool],
        shapes: vec![Shape::Small, Shape::Mt8],
        rounds: 2,
        ..tiny()
    };
    let report = run(sim(), &options).unwrap();
    let names: Vec<_> = report.rows.iter().map(|r| r.resource).collect();
    assert_eq!(names, [Resource::Binning, Resource::Pool]);
    assert!(report.speedups.is_empty());
    for row in &report.rows {
        assert_eq!(row.ns_per_op.len(), 2);
        assert!(row.ns_per_op.values().all(Option::is_some));
    }
    let text = report.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let cells = |l: &str| -> Vec<String> {
        l.split('|')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect()
    };
    assert_eq!(cells(lines[1]), ["resource", "small", "mt8"], "{text}");
    assert!(
        lines[2].starts_with("| ---") && lines[2].ends_with("-: |"),
        "{text}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["rows"][0]["resource"], "binning(pool)");
    assert!(json["rows"][1]["ns_per_op"]["mt8"].is_f64());
    let back: AllocatorReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
}

#[test]
fn a_pool_that_does_not_fit_is_a_failure_not_an_error() {
    let options = AllocatorBenchOptions {
        resources: vec![Resource::Pool, Resource::Binning],
        shapes: vec![Shape::Churn],
        cap: 40 * GIB,
        ..tiny()
    };
    let report = run(sim(), &options).unwrap();
    assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
    assert!(report.failures.iter().all(|f| f.shape.is_none()));
    assert!(report.failures[1].error.contains("its pool"));
    assert!(
        report.to_string().contains("| pool          |     — |"),
        "{report}"
    );
}

#[test]
fn bad_options_are_errors() {
    for options in [
        AllocatorBenchOptions {
            scale: 0.0,
            ..tiny()
        },
        AllocatorBenchOptions {
            rounds: 0,
            ..tiny()
        },
        AllocatorBenchOptions {
            shapes: vec![],
            ..tiny()
        },
    ] {
        assert!(matches!(
            run(sim(), &options),
            Err(BenchError::InvalidOption { .. })
        ));
    }
    let options = AllocatorBenchOptions {
        device: 3,
        ..tiny()
    };
    assert!(matches!(
        run(sim(), &options),
        Err(BenchError::Allocator(_))
    ));
}

#[test]
fn caps_fit_small_devices_and_leave_large_ones_alone() {
    let o = AllocatorBenchOptions::default();
    assert_eq!(o.clone().fitted_to(80 * GIB), o);
    assert_eq!(o.clone().fitted_to(24 * GIB), o);
    let small = o.fitted_to(12 * GIB);
    assert_eq!((small.cap, small.small_cap), (2 * GIB, GIB));
}

#[test]
fn names_parse() {
    for r in Resource::ALL {
        assert_eq!(r.name().parse::<Resource>().unwrap(), r);
    }
    assert_eq!("binning".parse::<Resource>().unwrap(), Resource::Binning);
    for s in Shape::ALL {
        assert_eq!(s.name().parse::<Shape>().unwrap(), s);
    }
    assert_eq!("TINY".parse::<Scale>().unwrap(), Scale::Tiny);
    assert!("huge".parse::<Scale>().is_err());
    assert!("arena".parse::<Resource>().is_err());
    assert!("mt4".parse::<Shape>().is_err());
}
