//! What `rmm replay` prints: its figures as a two-column table (binary units), or as JSON
//! (bytes and seconds).

use rmm_cli::plural::count;
use rmm_cli::replay::{ReplayOrder, ReplayReport};
use rmm_cli::table::{Align, Table};
use rmm_cli::units::bytes;
use serde_json::{Value, json};

/// The figures of a replay, one per row.
pub fn table(report: &ReplayReport, pool: Option<&str>) -> Table {
    let mut t = Table::new([("figure", Align::Left), ("value", Align::Left)]);
    t.row(["log", report.source.as_str()]);
    t.row([
        "resource".to_string(),
        format!("{} (device {})", report.resource, report.device),
    ]);
    t.row([
        "events".to_string(),
        format!(
            "{}: {} and {} replayed",
            report.events,
            count(report.allocations as u64, "allocation", "allocations"),
            count(report.frees as u64, "free", "frees")
        ),
    ]);
    // Logged threads that shared replay threads are said (in logged order one thread
    // replays them all, which the order says).
    let shared = match report.order {
        ReplayOrder::Concurrent if report.logged_threads != report.threads => {
            format!(" for {} logged threads", report.logged_threads)
        }
        _ => String::new(),
    };
    t.row([
        "threads".to_string(),
        format!(
            "{}{shared}, {}, {} order",
            count(report.threads as u64, "thread", "threads"),
            count(report.streams as u64, "stream", "streams"),
            report.order
        ),
    ]);
    if report.skipped_frees + report.logged_failures + report.unfreed > 0 {
        t.row([
            "skipped".to_string(),
            format!(
                "{} of pointers never allocated in the log, {}; {} never freed in the log",
                count(report.skipped_frees as u64, "free", "frees"),
                count(
                    report.logged_failures as u64,
                    "logged allocation failure",
                    "logged allocation failures"
                ),
                count(report.unfreed as u64, "allocation", "allocations")
            ),
        ]);
    }
    t.row([
        "time".to_string(),
        format!("{:.3} ms", report.elapsed.as_secs_f64() * 1e3),
    ]);
    t.row([
        "peak".to_string(),
        format!(
            "{} in {}; the log's peak is {}",
            bytes(report.peak_bytes),
            count(
                report.peak_allocations,
                "live allocation",
                "live allocations"
            ),
            bytes(report.logged_peak_bytes)
        ),
    ]);
    if let Some(r) = report.reserved_bytes {
        t.row([
            "reserved".to_string(),
            format!("{} held by the pool at its peak", bytes(r)),
        ]);
    }
    if let Some(p) = pool {
        t.row(["pool", p]);
    }
    t.row([
        "fit".to_string(),
        match &report.failure {
            None => "yes".to_string(),
            Some(x) => format!(
                "NO: {} of {} at line {} (thread {}) failed with {} live: {}",
                x.action,
                bytes(x.bytes as u64),
                x.line,
                x.thread,
                bytes(x.live_bytes),
                x.error
            ),
        },
    ]);
    t
}

/// The figures as JSON: sizes in bytes, the time in seconds.
pub fn json(report: &ReplayReport, total_memory: u64, backend: &str) -> Value {
    json!({
        "backend": backend,
        "log": report.source,
        "resource": report.resource,
        "device": report.device,
        "total_memory": total_memory,
        "order": report.order.to_string(),
        "events": report.events,
        "allocations": report.allocations,
        "frees": report.frees,
        "threads": report.threads,
        "logged_threads": report.logged_threads,
        "streams": report.streams,
        "seconds": report.elapsed.as_secs_f64(),
        "peak_bytes": report.peak_bytes,
        "peak_allocations": report.peak_allocations,
        "logged_peak_bytes": report.logged_peak_bytes,
        "reserved_bytes": report.reserved_bytes,
        "skipped_frees": report.skipped_frees,
        "logged_failures": report.logged_failures,
        "unfreed": report.unfreed,
        "fit": report.failure.is_none(),
        "failure": report.failure.as_ref().map(|f| json!({
            "line": f.line,
            "thread": f.thread,
            "action": f.action.to_string(),
            "bytes": f.bytes,
            "live_bytes": f.live_bytes,
            "error": f.error,
        })),
    })
}
