//! rmm-rs allocator: backends, memory resources, adaptors and containers.
//!
//! The layers, bottom to top: [`backend`] (a real GPU through the CUDA driver API, or a
//! simulated device), [`resource`] (the [`DeviceMemoryResource`] and [`HostMemoryResource`]
//! traits and their implementations) and the per-device current resource
//! ([`per_device`]), as RAPIDS RMM has them, and the [`adaptor`]s that stack on any resource
//! (statistics, limits, tracking, event logs and replay, memory hooks, failure callbacks).

pub mod adaptor;
pub mod backend;
pub mod container;
pub mod device;
pub mod error;
pub mod per_device;
pub mod resource;
pub mod spill;
pub mod stream;
mod sync;

pub use backend::{Backend, BackendKind, DevicePtr};
pub use container::{DeviceBuffer, DeviceScalar, DeviceUVector};
pub use device::Device;
pub use error::{Error, Result};
pub use resource::{DeviceMemoryResource, HostMemoryResource};
pub use stream::{Event, Stream, StreamView};

/// Every device allocation is aligned to at least this many bytes (RMM's guarantee).
pub const ALLOCATION_ALIGNMENT: usize = 256;
