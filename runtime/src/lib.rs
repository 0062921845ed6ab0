//! rmm-rs runtime: workers on every configured device, each with its device's resource stack
//! current; task submission; `reinitialize` between workloads; shutdown with leak reports.
//!
//! Programs use it through the `rmm` facade as `rmm::runtime` (quick start on its crate page,
//! everyday types in `rmm::prelude`); the paths below are the facade's.
//!
//! Data path: `rmm.toml` → [`rmm_config`] (`rmm::config`, resolved per device) → [`StackPlan`]
//! / [`DeviceStack`] (one device's resource) → [`Runtime`] (stacks installed, workers started)
//! → tasks allocate through their device's stack.
//!
//! ```no_run
//! # mod rmm {
//! #     pub use rmm_allocator as allocator;
//! #     pub use rmm_config as config;
//! #     pub use rmm_runtime as runtime;
//! # }
//! use rmm::runtime::Runtime;
//!
//! let runtime = Runtime::builder().set("pool.enabled", true).start()?;
//! let sums = runtime.run_on_all(|ctx| {
//!     // The worker's device is current; its stack is the current resource.
//!     let buf = rmm::allocator::DeviceBuffer::new(1 << 20, ctx.stream())?;
//!     Ok::<_, rmm::allocator::Error>(buf.size())
//! });
//! for handle in sums {
//!     handle.wait()??;
//! }
//! let phase_two = rmm::config::ConfigLoader::new().set("pool.enabled", false).load()?;
//! println!("{}", runtime.reinitialize(&phase_two)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod inventory;
mod report;
mod runtime;
mod spill;
mod stack;
mod streams;
mod worker_id;

pub use error::{Error, LiveMemory, Result, TaskError};
pub use inventory::{DeviceSummary, Inventory};
pub use report::{
    DeviceReport, PhaseStatistics, PoolFigures, ReinitReport, RuntimeReport, ShutdownReport,
    StartReport, WorkerReport,
};
pub use runtime::{
    DEFAULT_DRAIN_TIMEOUT, Runtime, RuntimeBuilder, RuntimeHandle, TaskContext, TaskHandle,
    device_facts, open_backend,
};
pub use spill::{
    ForeignData, ForeignOwner, OwnerAccess, PartFill, SpillManager, SpillStatistics,
    TierStatistics, TierUndo,
};
pub use stack::{DeviceStack, OomHandler, StackPlan, build_device_stack};
pub use worker_id::WorkerId;
