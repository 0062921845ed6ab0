//! rmm-rs runtime: workers on every configured device, each with its device's resource stack
//! current; task submission; `reinitialize` between workloads; shutdown with leak reports.
//!
//! The data path: `rmm.toml` → [`rmm_config`] (resolved per device) → [`StackPlan`] /
//! [`DeviceStack`] (one device's resource, built as configured) → [`Runtime`] (device stacks
//! installed, workers started) → tasks allocate through their device's stack.
//!
//! ```no_run
//! use rmm_runtime::Runtime;
//!
//! let runtime = Runtime::builder().set("pool.enabled", true).start()?;
//! let sums = runtime.run_on_all(|ctx| {
//!     // The worker's device is current; its stack is the current resource.
//!     let buf = rmm_allocator::DeviceBuffer::new(1 << 20, ctx.stream())?;
//!     Ok::<_, rmm_allocator::Error>(buf.size())
//! });
//! for handle in sums {
//!     handle.wait()??;
//! }
//! let phase_two = rmm_config::ConfigLoader::new().set("pool.enabled", false).load()?;
//! println!("{}", runtime.reinitialize(&phase_two)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod error;
pub mod inventory;
pub mod report;
pub mod runtime;
pub mod spill;
pub mod stack;
mod streams;
pub mod task;
pub mod worker;

pub use error::{Error, LiveMemory, Result, TaskError};
pub use inventory::{DeviceSummary, Inventory};
pub use report::{
    DeviceReport, PhaseStatistics, PoolFigures, ReinitReport, RuntimeReport, ShutdownReport,
    StartReport, WorkerReport,
};
pub use runtime::{
    DEFAULT_DRAIN_TIMEOUT, Runtime, RuntimeBuilder, RuntimeHandle, device_facts, open_backend,
};
pub use spill::{
    ForeignData, ForeignOwner, OwnerAccess, SpillManager, SpillStatistics, TierStatistics,
};
pub use stack::{DeviceStack, OomHandler, PoolPlan, StackPlan, UpstreamPlan, build_device_stack};
pub use task::{TaskContext, TaskHandle};
pub use worker::WorkerId;
