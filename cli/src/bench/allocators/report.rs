//! The result of a run: rows, same-run speed-ups, failures, and their tables (aligned text or
//! markdown; `Display` writes markdown).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{AllocatorBenchOptions, Resource, Shape};
use crate::table::{Align, NONE, Table, TableFormat};

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
/// [`AllocatorReport::render`] writes the tables (ns per operation, then the speed-ups over
/// `async` and over `cuda` where those ran); `serde` gives the same as JSON.
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

    fn table<'a>(
        &self,
        rows: impl Iterator<Item = (Resource, &'a BTreeMap<Shape, Option<f64>>)>,
        cell: impl Fn(f64) -> String,
    ) -> Table {
        let shapes = &self.options.shapes;
        let mut t = Table::new(
            std::iter::once(("resource", Align::Left))
                .chain(shapes.iter().map(|s| (s.name(), Align::Right))),
        );
        for (resource, cells) in rows {
            t.row(
                std::iter::once(resource.to_string()).chain(shapes.iter().map(|s| {
                    cells
                        .get(s)
                        .copied()
                        .flatten()
                        .map_or_else(|| NONE.to_string(), &cell)
                })),
            );
        }
        t
    }

    /// The tables (ns per operation, then the speed-ups over `async` and over `cuda` where
    /// those ran) with their titles, in `format`; ends with a newline.
    pub fn render(&self, format: TableFormat) -> String {
        let mut out = format!(
            "ns per operation ({}; lower is better)\n{}\n",
            self.device_name,
            self.table(self.rows.iter().map(|r| (r.resource, &r.ns_per_op)), |x| {
                format!("{x:.0}")
            })
            .render(format)
        );
        for s in &self.speedups {
            out.push_str(&format!(
                "\nspeed-up over {} (its ns/op ÷ resource's ns/op, same run)\n{}\n",
                s.baseline,
                self.table(s.rows.iter().map(|r| (r.resource, &r.ratio)), |x| {
                    format!("{x:.1}×")
                })
                .render(format)
            ));
        }
        out
    }
}

impl fmt::Display for AllocatorReport {
    /// The tables as markdown ([`AllocatorReport::render`]), as `cargo bench` prints them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(TableFormat::Markdown))
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
