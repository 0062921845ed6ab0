//! Helpers for the container tests: a resource that records what containers ask of it, and
//! private simulated backends for sim-only behaviour (held streams, fault injection, pinned
//! memory accounting).
#![allow(dead_code)]

use std::any::Any;
use std::sync::Arc;

use parking_lot::Mutex;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::current_device;
use rmm_allocator::resource::CudaMemoryResource;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{Device, Error, Result, StreamView};

/// One call a container made on a [`Recording`] resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `allocate(bytes, stream)` returned `ptr`.
    Allocate {
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamView,
    },
    /// `deallocate(ptr, bytes, stream)` ran while `current_device` was the current device.
    Deallocate {
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamView,
        current_device: u32,
    },
}

/// A resource that forwards to a plain CUDA resource and records every call.
#[derive(Debug)]
pub struct Recording {
    inner: CudaMemoryResource,
    calls: Mutex<Vec<Call>>,
    fail_deallocate: bool,
}

impl Recording {
    /// A recording resource of `device`.
    pub fn new(device: Device) -> Arc<Recording> {
        Arc::new(Recording {
            inner: CudaMemoryResource::new(device),
            calls: Mutex::new(Vec::new()),
            fail_deallocate: false,
        })
    }

    /// A recording resource whose `deallocate` frees the memory and then reports an error.
    pub fn failing_deallocate(device: Device) -> Arc<Recording> {
        Arc::new(Recording {
            inner: CudaMemoryResource::new(device),
            calls: Mutex::new(Vec::new()),
            fail_deallocate: true,
        })
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// The allocations so far.
    pub fn allocations(&self) -> Vec<(DevicePtr, usize, StreamView)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Allocate { ptr, bytes, stream } => Some((ptr, bytes, stream)),
                _ => None,
            })
            .collect()
    }

    /// The deallocations so far: (ptr, bytes, stream, current device).
    pub fn deallocations(&self) -> Vec<(DevicePtr, usize, StreamView, u32)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Deallocate {
                    ptr,
                    bytes,
                    stream,
                    current_device,
                } => Some((ptr, bytes, stream, current_device)),
                _ => None,
            })
            .collect()
    }

    /// Forgets the calls so far.
    pub fn clear(&self) {
        self.calls.lock().clear();
    }

    /// This resource as the containers' shared handle.
    pub fn shared(self: &Arc<Self>) -> SharedResource {
        Arc::clone(self) as SharedResource
    }
}

impl DeviceMemoryResource for Recording {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        let ptr = self.inner.allocate(bytes, stream)?;
        self.calls
            .lock()
            .push(Call::Allocate { ptr, bytes, stream });
        Ok(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.calls.lock().push(Call::Deallocate {
            ptr,
            bytes,
            stream,
            current_device: current_device(),
        });
        self.inner.deallocate(ptr, bytes, stream)?;
        if self.fail_deallocate {
            return Err(Error::invalid_argument(
                "ptr",
                ptr,
                "(the test resource always fails deallocate)",
            ));
        }
        Ok(())
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn name(&self) -> &'static str {
        "Recording"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A private backed simulated backend with one device of 1 GiB, for sim-only behaviour.
pub fn private_sim() -> (&'static SimBackend, Device) {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        mode: SimMemoryMode::Backed,
    })
    .expect("a private simulated backend");
    (
        b,
        Device::on(b, 0).expect("device 0 of the private backend"),
    )
}

/// Opens `gate` from another thread after `ms` milliseconds.
pub fn open_later(
    gate: rmm_allocator::backend::StreamGate,
    ms: u64,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        gate.open();
    })
}

/// Fails unless `T` is `Send + Sync`.
pub fn assert_send_sync<T: Send + Sync>() {}
