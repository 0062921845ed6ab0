//! [`WorkerId`]: a worker, by device and index, as errors, reports and workers name it.

use std::fmt;

use serde::Serialize;

/// A worker: device ordinal and index among its workers (`0.1`: device 0's second worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct WorkerId {
    /// The device ordinal.
    pub device: u32,
    /// Index among the device's workers.
    pub index: u32,
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.device, self.index)
    }
}
