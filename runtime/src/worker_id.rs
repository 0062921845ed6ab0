//! [`WorkerId`]: which worker, by device and index; named by errors and reports as well as
//! by the workers themselves.

use std::fmt;

use serde::Serialize;

/// A worker: device ordinal and index among that device's workers (`0.1` is device 0's
/// second worker).
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
