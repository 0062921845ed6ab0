//! The result of a run: rows, same-run speed-ups, failures, and the markdown tables its
//! `Display` writes.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{AllocatorBenchOptions, Resource, Shape};

/// One row of the table: a resource's ns per operation on every shape of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceRow {
    /// The resource.
    pub resource: Resource,
    /// ns per operation by shape; `None` where the shape was not run or failed.
    pub ns_per_op: BTreeMap<Shape, Option<f64>>,
}

/// Same-run speed-ups over one baseline resource: its ns/op ÷ each other resource's ns/op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Speedups {
    /// The resource every other one is compared with.
    pub baseline: Resource,
    /// One row per other resource, in table order.
    pub rows: Vec<SpeedupRow>,
}

/// One resource's speed-ups over a baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedupRow {
    /// The resource.
    pub resource: Resource,
    /// Baseline ns/op ÷ this resource's ns/op by shape; `None` where either is missing.
    pub ratio: BTreeMap<Shape, Option<f64>>,
}

/// A measurement (or a resource's construction) that failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The resource.
    pub resource: Resource,
    /// The shape; `None` when the resource itself could not be created.
    pub shape: Option<Shape>,
    /// What went wrong.
    pub error: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.shape {
            Some(s) => write!(f, "{} on {s}: {}", self.resource, self.error),
            None => write!(f, "{}: {}", self.resource, self.error),
        }
    }
}

/// The result of [`run`](super::run): ns per operation per resource × shape and the same-run ratios.
///
/// `Display` writes the markdown tables (ns per operation, then the speed-ups over `async` and
/// over `cuda` where those ran); `serde` gives the same as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorReport {
    /// The backend, as [`Backend::describe`](rmm::allocator::backend::Backend::describe) says it.
    pub backend: String,
    /// Whether the device is simulated (figures then measure bookkeeping only).
    pub simulated: bool,
    /// Device ordinal.
    pub device: u32,
    /// Device name.
    pub device_name: String,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// The options the run used.
    pub options: AllocatorBenchOptions,
    /// One row per resource, in the order of the options.
    pub rows: Vec<ResourceRow>,
    /// Speed-ups over `async`, then over `cuda`, for those that ran.
    pub speedups: Vec<Speedups>,
    /// What failed (such cells are `None`).
    pub failures: Vec<Failure>,
}

impl AllocatorReport {
    /// The row of `resource`, if it ran.
    pub fn row(&self, resource: Resource) -> Option<&ResourceRow> {
        self.rows.iter().find(|r| r.resource == resource)
    }

    fn write_table<'a>(
        &self,
        f: &mut fmt::Formatter<'_>,
        rows: impl Iterator<Item = (Resource, &'a BTreeMap<Shape, Option<f64>>)>,
        cell: impl Fn(f64) -> String,
    ) -> fmt::Result {
        let shapes = &self.options.shapes;
        let heads: Vec<&str> = shapes.iter().map(|s| s.name()).collect();
        writeln!(f, "| resource | {} |", heads.join(" | "))?;
        writeln!(f, "|---|{}", "---|".repeat(shapes.len()))?;
        for (resource, cells) in rows {
            let cells: Vec<String> = shapes
                .iter()
                .map(|s| {
                    cells
                        .get(s)
                        .copied()
                        .flatten()
                        .map_or_else(|| "–".to_string(), &cell)
                })
                .collect();
            writeln!(f, "| {resource} | {} |", cells.join(" | "))?;
        }
        Ok(())
    }
}

impl fmt::Display for AllocatorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ns per operation ({}; lower is better)",
            self.device_name
        )?;
        self.write_table(
            f,
            self.rows.iter().map(|r| (r.resource, &r.ns_per_op)),
            |x| format!("{x:.0}"),
        )?;
        for s in &self.speedups {
            writeln!(f)?;
            writeln!(
                f,
                "speed-up over {} (its ns/op ÷ resource's ns/op, same run)",
                s.baseline
            )?;
            self.write_table(f, s.rows.iter().map(|r| (r.resource, &r.ratio)), |x| {
                format!("{x:.1}×")
            })?;
        }
        Ok(())
    }
}

pub(super) fn speedups(rows: &[ResourceRow], baseline: Resource) -> Option<Speedups> {
    let base = rows.iter().find(|r| r.resource == baseline)?;
    let rows = rows
        .iter()
        .filter(|r| r.resource != baseline)
        .map(|r| SpeedupRow {
            resource: r.resource,
            ratio: base
                .ns_per_op
                .iter()
                .map(|(&shape, &x)| {
                    let y = r.ns_per_op.get(&shape).copied().flatten();
                    let ratio = match (x, y) {
                        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
                        _ => None,
                    };
                    (shape, ratio)
                })
                .collect(),
        })
        .collect();
    Some(Speedups { baseline, rows })
}
