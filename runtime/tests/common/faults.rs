//! The operations the fault-injection tests fail on the simulated device, one at a time.

use rmm_allocator::backend::{SimBackend, SimCounts};

/// Which operation to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A device allocation.
    Allocation,
    /// A copy between host and device.
    Copy,
    /// Pinning host memory.
    Pin,
    /// A write to a spill file.
    FileWrite,
}

/// Every fault, in the order the sweeps inject them.
pub const FAULTS: [Fault; 4] = [Fault::Allocation, Fault::Copy, Fault::Pin, Fault::FileWrite];

impl Fault {
    /// How many of these operations `c` counted.
    pub fn count(self, c: &SimCounts) -> u64 {
        match self {
            Fault::Allocation => c.allocations,
            Fault::Copy => c.copies,
            Fault::Pin => c.pins,
            Fault::FileWrite => c.file_writes,
        }
    }

    /// Makes the `n`th such operation from now on `device` fail (pins are process-wide).
    pub fn inject(self, sim: &SimBackend, device: u32, n: u64) {
        match self {
            Fault::Allocation => sim.fail_nth_allocation(device, n).expect("inject"),
            Fault::Copy => sim.fail_nth_copy(device, n).expect("inject"),
            Fault::Pin => sim.fail_nth_pin(n),
            Fault::FileWrite => sim.fail_nth_file_write(device, n).expect("inject"),
        }
    }
}

/// The simulated backend, or a visible skip (fault injection needs it).
pub fn sim_or_skip(test: &str) -> Option<&'static SimBackend> {
    let s = super::sim();
    if s.is_none() {
        super::skip(
            test,
            "fault injection needs the simulated device (RMM_BACKEND=cuda)",
        );
    }
    s
}
