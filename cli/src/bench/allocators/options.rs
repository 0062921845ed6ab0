//! What a run measures, and how much: [`AllocatorBenchOptions`].

use serde::{Deserialize, Serialize};

use super::{Resource, Scale, Shape};
use crate::bench::BenchError;
use crate::bench::traces::{GIB, MIB};

/// What to measure, and how much.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorBenchOptions {
    /// Multiplier of the operation counts (1.0: a million steps per single-thread trace);
    /// every trace keeps at least 100 steps.
    pub scale: f64,
    /// Timed passes per cell after the warm-up pass; the best is reported (at least 1).
    pub rounds: usize,
    /// The resources (table rows), in order.
    pub resources: Vec<Resource>,
    /// The shapes (table columns), in order.
    pub shapes: Vec<Shape>,
    /// Device ordinal of the backend to run on.
    pub device: u32,
    /// Live-bytes cap of `random` and of `mt8` / `mt16` (shared by their threads); the pool
    /// is created with 3 × this.
    pub cap: usize,
    /// Live-bytes cap of `small`.
    pub small_cap: usize,
}

impl Default for AllocatorBenchOptions {
    /// Everything at full scale, one round, on device 0, caps 4 GiB and 1 GiB.
    fn default() -> Self {
        AllocatorBenchOptions {
            scale: 1.0,
            rounds: 1,
            resources: Resource::ALL.to_vec(),
            shapes: Shape::ALL.to_vec(),
            device: 0,
            cap: 4 * GIB,
            small_cap: GIB,
        }
    }
}

impl AllocatorBenchOptions {
    /// The defaults at a named scale.
    pub fn at_scale(scale: Scale) -> Self {
        AllocatorBenchOptions {
            scale: scale.factor(),
            ..Self::default()
        }
    }

    /// These options with the caps shrunk, where needed, so that the pool (3 × `cap`) takes
    /// at most half of a device of `total_memory` bytes: `cap` at most `total_memory / 6`,
    /// `small_cap` at most `cap`. The defaults fit a device of 24 GiB or more unchanged.
    pub fn fitted_to(mut self, total_memory: usize) -> Self {
        self.cap = self.cap.min((total_memory / 6).max(MIB));
        self.small_cap = self.small_cap.min(self.cap);
        self
    }

    pub(super) fn validate(&self) -> Result<(), BenchError> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(BenchError::invalid(
                "scale",
                format!("{} is not a positive number", self.scale),
            ));
        }
        if self.rounds == 0 {
            return Err(BenchError::invalid("rounds", "must be at least 1"));
        }
        if self.resources.is_empty() || self.shapes.is_empty() {
            return Err(BenchError::invalid(
                "resources/shapes",
                "nothing to measure: name at least one resource and one shape",
            ));
        }
        if self.cap == 0 || self.small_cap == 0 {
            return Err(BenchError::invalid("cap", "caps must be positive"));
        }
        Ok(())
    }

    /// `x` operations scaled, at least 100.
    pub(super) fn n(&self, x: usize) -> usize {
        ((x as f64 * self.scale) as usize).max(100)
    }
}
