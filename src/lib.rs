//! rmm-rs: a memory runtime for multi-GPU worker processes, in the manner of RAPIDS RMM.
//!
//! This crate is the facade: it re-exports the member crates under short paths, and
//! [`prelude`] brings the everyday types into scope with one `use`.
//!
//! | path | crate | what it holds |
//! |---|---|---|
//! | [`allocator`] | `rmm-allocator` | backends (CUDA driver, simulated device), memory resources (pool, async, managed, pinned host), adaptors (statistics, limits, tracking, logging, hooks), containers ([`DeviceBuffer`](allocator::DeviceBuffer), [`DeviceUVector`](allocator::DeviceUVector), [`DeviceScalar`](allocator::DeviceScalar)), spillable data ([`allocator::spill`]) |
//! | [`config`] | `rmm-config` | `rmm.toml`, `RMM_*` environment variables and overrides in code ([`ConfigLoader`](config::ConfigLoader)), validated and resolved per device |
//! | [`runtime`] | `rmm-runtime` | workers on every configured device with its resource stack current ([`Runtime`](runtime::Runtime)), tasks, spill managers, [`reinitialize`](runtime::RuntimeHandle::reinitialize), reports |
//!
//! The `rmm` command (`rmm demo`, `rmm bench`, `rmm replay`, `rmm info`) is the `rmm-cli`
//! package of the same workspace; this crate has no command-line dependency.
//!
//! # Quick start
//!
//! A runtime on the devices present (without a GPU, or without its driver, it runs on a
//! simulated device), a task that moves data through a [`DeviceUVector`](allocator::DeviceUVector)
//! on its worker's device, spillable data that survives a switch of every device's memory
//! resource, and the runtime's report:
//!
//! ```
//! use rmm::prelude::*;
//!
//! // One worker per device, each device with a pool of its own, spilling on (into a pinned
//! // host pool of 16 MiB per device). The settings are those of `./rmm.toml` and `RMM_*`
//! // variables, with these overrides on top.
//! let runtime = Runtime::builder()
//!     .set("devices", "all")
//!     .set("pool.enabled", true)
//!     .set("pool.initial_size", "64MiB")
//!     .set("spill.enabled", true)
//!     .set("spill.host_pool_size", "16MiB")
//!     .start()?;
//!
//! // A task runs on a worker: its device is current, its device's pool the current resource.
//! let sum = runtime
//!     .submit(|ctx| {
//!         let v = DeviceUVector::from_host(&[1u64, 2, 3, 4], ctx.stream())?;
//!         let back = v.to_vec(ctx.stream())?;
//!         Ok::<_, rmm::allocator::Error>(back.iter().sum::<u64>())
//!     })
//!     .wait()??;
//! assert_eq!(sum, 10);
//!
//! // Spillable data: the device's spill manager moves it to host memory (or disk) when the
//! // device runs short, and brings it back on use.
//! let device = runtime.devices()[0];
//! let spill = runtime.spill_manager(device).ok_or("spilling is on")?;
//! let kept = spill.from_host(b"kept across a reinitialize", StreamView::DEFAULT)?;
//!
//! // Between two workloads: every device switches to plain allocations (no pool); the
//! // spillable data is moved out of the old pool first and stays valid.
//! let plain = ConfigLoader::new()
//!     .set("devices", "all")
//!     .set("spill.enabled", true)
//!     .set("spill.host_pool_size", "16MiB")
//!     .load()?;
//! let reinit = runtime.reinitialize(&plain)?;
//! println!("{reinit}");
//! assert_eq!(kept.to_vec()?, b"kept across a reinitialize");
//!
//! // Devices, stacks, workers, memory in use and spilling, as text.
//! println!("{}", runtime.report());
//! drop(kept);
//! runtime.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Without the runtime, the allocator stands alone as RAPIDS RMM's does: a
//! [`DeviceMemoryResource`](allocator::resource::DeviceMemoryResource) made current per device
//! ([`allocator::per_device`]), containers allocating from it on a
//! [`Stream`](allocator::Stream). The `examples/` of the repository show each layer.

pub use rmm_allocator as allocator;
pub use rmm_config as config;
pub use rmm_runtime as runtime;

/// The everyday types, for `use rmm::prelude::*;`: the runtime and its tasks, the
/// configuration loader, devices and streams, the containers and spillable data, and the
/// memory resource traits (so that their methods are in scope).
///
/// Errors are not in the prelude: each layer has its own ([`allocator::Error`],
/// [`config::Error`], [`runtime::Error`]), named by their paths.
pub mod prelude {
    pub use crate::allocator::resource::{DeviceMemoryResource, HostMemoryResource};
    pub use crate::allocator::spill::{SpillableBuffer, SpillableVector, Tier};
    pub use crate::allocator::{
        Device, DeviceBuffer, DeviceScalar, DeviceUVector, Stream, StreamView,
    };
    pub use crate::config::{Config, ConfigLoader};
    pub use crate::runtime::{
        Runtime, RuntimeBuilder, RuntimeHandle, SpillManager, TaskContext, TaskHandle,
    };
}
