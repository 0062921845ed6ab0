//! rmm-rs allocator: backends, memory resources, adaptors and containers.
//!
//! The layers, bottom to top: [`backend`] (a real GPU through the CUDA driver API, or a
//! simulated device), [`resource`] (the [`DeviceMemoryResource`](resource::DeviceMemoryResource)
//! and [`HostMemoryResource`](resource::HostMemoryResource) traits and their implementations,
//! RMM's `rmm::mr`) and the per-device current resource ([`per_device`]), as RAPIDS RMM has
//! them, and the [`adaptor`]s that stack on any resource (statistics, limits, tracking, event
//! logs, memory hooks, failure callbacks).
//!
//! # Layout
//!
//! Each public name has one path. The everyday types live at the crate root; the namespaces
//! with many items are modules:
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
//! Elements of a [`DeviceUVector`] or [`DeviceScalar`] are [`bytemuck::Pod`]: derive it with
//! the `bytemuck` crate (`#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]`).
//!
//! # Containers
//!
//! RAII device containers, as RMM's `device_buffer`, `device_uvector<T>` and `device_scalar<T>`.
//!
//! * [`DeviceBuffer`]: untyped, uninitialized device bytes with a size and a capacity.
//! * [`DeviceUVector`]: an uninitialized vector of plain-old-data elements ([`bytemuck::Pod`]).
//! * [`DeviceScalar`]: one plain-old-data value in device memory.
//!
//! ## Semantics kept from RMM
//!
//! * Memory comes from a [`DeviceMemoryResource`](resource::DeviceMemoryResource), by default the
//!   current device's ([`get_current_device_resource`](per_device::get_current_device_resource));
//!   the `*_in` constructors take one explicitly. By default containers own a
//!   [`SharedResource`](resource::SharedResource), so the resource lives as long as
//!   they do; they can also borrow it (`&'a dyn DeviceMemoryResource`, like RMM's non-owning
//!   `device_async_resource_ref` but checked by the compiler): see [`ResourceHandle`].
//! * Contents are uninitialized. Every operation that allocates or copies takes a stream.
//! * Memory is given back on the stream most recently passed to [`DeviceBuffer::set_stream`]
//!   or to an operation that may reallocate (`resize`, `reserve`, `shrink_to_fit`), with the
//!   device that was current when the container was made made current again for the call
//!   (RMM records the current device at construction, and so do these).
//! * Growing beyond the capacity allocates exactly the new size and copies the old contents
//!   on the given stream; shrinking the size never reallocates (`shrink_to_fit` does).
//!
//! ## What Rust adds
//!
//! * Device bytes are never exposed as host memory: reading them copies them out
//!   (`to_vec`, `copy_to_host`, `element`, `value`).
//! * Operations that borrow host data return only when the device is done with it. The
//!   asynchronous setters (`set_element_async`, `set_value_async`) take the value by value and
//!   copy it through a small page-locked staging slot that the container owns; the slot is
//!   reused or freed only after the event recorded behind the copy has completed. The source
//!   of the value may therefore be dropped or changed as soon as the call returns.
//! * Reads, reallocations and zeroing through a container are ordered after its own earlier
//!   asynchronous sets, whatever stream those were on.
//! * An index out of range is an [`Error::IndexOutOfRange`], and
//!   a size that overflows is an [`Error::InvalidArgument`].
//! * Errors while giving memory back in `Drop` are logged with `tracing::error!`, never
//!   panicked on.
//!
//! ## Cost
//!
//! Construction and drop add no heap allocation, driver call or log event to the resource's
//! own `allocate`/`deallocate`: the staging slot and its event are made on the first
//! asynchronous set that needs them. A borrowed resource handle adds a few nanoseconds; the
//! owning default adds one reference-count increment and decrement (two atomic operations).
//! `cli/benches/containers.rs` measures both.

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
