//! rmm-rs allocator: backends, memory resources, adaptors and containers.
//!
//! The layers, bottom to top, as in RAPIDS RMM: [`backend`] (a GPU through the CUDA driver API, or
//! a simulated device), [`resource`] (memory resource traits and implementations, RMM's `rmm::mr`),
//! the per-device current resource ([`per_device`]), and [`adaptor`]s stacking on any resource
//! (statistics, limits, tracking, event logs, memory hooks, failure callbacks).
//!
//! # Layout
//!
//! Each public name has one path: everyday types at the root, larger namespaces as modules:
//!
//! | path | holds |
//! |---|---|
//! | the root | [`Device`] and the thread's current device ([`current_device`], [`set_current_device`], [`with_device`], [`thread_device`]); [`Stream`], [`StreamView`], [`Event`], [`synchronize_stream`]; the containers [`DeviceBuffer`], [`DeviceUVector`], [`DeviceScalar`] and their [`ResourceHandle`]; [`Error`], [`Result`], [`fmt_bytes`]; [`ALLOCATION_ALIGNMENT`] |
//! | [`backend`] | the device seam: [`Backend`](backend::Backend), [`DevicePtr`](backend::DevicePtr), the CUDA and simulated backends |
//! | [`resource`] | memory resources (RMM's `rmm::mr`): the traits, the pool, async, managed, pinned host and the rest |
//! | [`per_device`] | the current resource of each device |
//! | [`adaptor`] | resource adaptors, and memory [`hooks`](adaptor::hooks) |
//! | [`spill`] | spillable data and its tiers |
//! | [`ipc`] | device memory shared with other processes of the host (a peer worker copies a value's bytes from it) |
//!
//! # Containers
//!
//! RAII device containers, as RMM's `device_buffer`, `device_uvector<T>` and `device_scalar<T>`:
//! [`DeviceBuffer`] (untyped, uninitialized bytes with a size and a capacity), [`DeviceUVector`]
//! (an uninitialized vector of [`bytemuck::Pod`] elements: `#[derive(Clone, Copy, bytemuck::Pod,
//! bytemuck::Zeroable)]`) and [`DeviceScalar`] (one such value).
//!
//! ## Semantics kept from RMM
//!
//! * Memory comes from a [`DeviceMemoryResource`](resource::DeviceMemoryResource), the current
//!   device's unless a `*_in` constructor names one, owned or borrowed ([`ResourceHandle`]).
//! * Contents are uninitialized. Every operation that allocates or copies takes a stream.
//! * Memory is given back on the stream last passed to [`DeviceBuffer::set_stream`] or a
//!   reallocating operation (`resize`, `reserve`, `shrink_to_fit`), with the construction's device
//!   current again.
//! * Growing past capacity allocates exactly the new size and copies on the given stream; shrinking
//!   the size never reallocates (`shrink_to_fit` does).
//!
//! ## What Rust adds
//!
//! * Device bytes are never exposed as host memory: reading copies them out (`to_vec`,
//!   `copy_to_host`, `element`, `value`).
//! * Operations that borrow host data return only when the device is done with it. The asynchronous
//!   setters (`set_element_async`, `set_value_async`) take the value and copy it through a
//!   page-locked slot the container owns, reused only after that copy completes.
//! * Reads, reallocations and zeroing are ordered after the container's earlier asynchronous sets,
//!   whatever their stream.
//! * Bad indices are [`Error::IndexOutOfRange`], overflowing sizes [`Error::InvalidArgument`];
//!   errors giving memory back in `Drop` are logged, never panicked on.
//! * Construction and drop add no heap allocation, driver call or log event to the resource's own;
//!   the staging slot is made on the first asynchronous set that needs it.

pub mod adaptor;
pub mod backend;
mod container;
mod device;
mod error;
pub mod event_log;
mod free_ranges;
pub mod ipc;
pub mod per_device;
mod pool_usage;
pub mod resource;
pub mod spill;
mod stream;
mod stream_view;
mod sync;

pub use container::{DeviceBuffer, DeviceScalar, DeviceUVector, ResourceHandle};
pub use device::{Device, current_device, set_current_device, thread_device, with_device};
pub use error::{Error, Result, fmt_bytes};
pub use stream::{Event, Stream, synchronize_stream};
pub use stream_view::StreamView;

/// Every device allocation is aligned to at least this many bytes (RMM's guarantee).
pub const ALLOCATION_ALIGNMENT: usize = 256;
