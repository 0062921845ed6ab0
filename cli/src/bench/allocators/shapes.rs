//! The workload shapes (the table's columns) and the named scales of a run.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::bench::BenchError;

/// A workload shape (a column of the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Allocate 1 MiB, free it, repeated.
    Churn,
    /// Log-uniform 256 B – 16 MiB under the cap, one thread.
    Random,
    /// Log-uniform 8 B – 64 KiB under the small cap, one thread.
    Small,
    /// `random` on 8 threads, each with its own seed, stream and share of the cap.
    Mt8,
    /// `random` on 16 threads, each with its own seed, stream and share of the cap.
    Mt16,
    /// `mt8` with every thread on one shared stream (as Dask's threads on the default stream).
    #[serde(rename = "mt8-shared")]
    Mt8Shared,
    /// `mt16` with every thread on one shared stream.
    #[serde(rename = "mt16-shared")]
    Mt16Shared,
}

impl Shape {
    /// Every shape, in table order.
    pub const ALL: [Shape; 7] = [
        Shape::Churn,
        Shape::Random,
        Shape::Small,
        Shape::Mt8,
        Shape::Mt16,
        Shape::Mt8Shared,
        Shape::Mt16Shared,
    ];

    /// The column name: `churn`, `random`, `small`, `mt8`, `mt16`.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Churn => "churn",
            Shape::Random => "random",
            Shape::Small => "small",
            Shape::Mt8 => "mt8",
            Shape::Mt16 => "mt16",
            Shape::Mt8Shared => "mt8-shared",
            Shape::Mt16Shared => "mt16-shared",
        }
    }

    /// The number of threads of a multi-thread shape.
    pub fn threads(self) -> Option<usize> {
        match self {
            Shape::Mt8 | Shape::Mt8Shared => Some(8),
            Shape::Mt16 | Shape::Mt16Shared => Some(16),
            _ => None,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Shape {
    type Err = BenchError;

    /// Parses a [`Shape::name`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Shape::ALL
            .into_iter()
            .find(|x| x.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                BenchError::invalid(
                    "shape",
                    format!(
                        "{s:?} is none of churn, random, small, mt8, mt16, mt8-shared, mt16-shared"
                    ),
                )
            })
    }
}

/// Named sizes of a run, for the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// 1 % of the operations: a smoke test that takes seconds on a laptop without a GPU.
    Tiny,
    /// 10 % of the operations.
    Small,
    /// The full run (a million steps per single-thread trace), as `cargo bench` does.
    Full,
}

impl Scale {
    /// The multiplier of the operation counts: 0.01, 0.1 or 1.
    pub fn factor(self) -> f64 {
        match self {
            Scale::Tiny => 0.01,
            Scale::Small => 0.1,
            Scale::Full => 1.0,
        }
    }
}

impl FromStr for Scale {
    type Err = BenchError;

    /// Parses `tiny`, `small` or `full`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tiny" => Ok(Scale::Tiny),
            "small" => Ok(Scale::Small),
            "full" => Ok(Scale::Full),
            _ => Err(BenchError::invalid(
                "scale",
                format!("{s:?} is none of tiny, small, full"),
            )),
        }
    }
}
