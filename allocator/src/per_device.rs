//! The current resource of each device of the process-wide backend, as RMM's
//! `get/set_per_device_resource`, with lock-free reads (`arc-swap`) for containers. Each device
//! starts with a [`CudaMemoryResource`].

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;

use crate::backend;
use crate::device::{Device, current_device};
use crate::error::{Error, Result};
use crate::resource::CudaMemoryResource;
use crate::resource::SharedResource;

// `ArcSwap` needs a sized payload, hence the inner Arc.
static TABLE: OnceLock<Vec<ArcSwapOption<SharedResource>>> = OnceLock::new();

fn slot(device_id: u32) -> Result<&'static ArcSwapOption<SharedResource>> {
    let table = match TABLE.get() {
        Some(t) => t,
        None => {
            let count = backend::global()?.device_count();
            TABLE.get_or_init(|| (0..count).map(|_| ArcSwapOption::empty()).collect())
        }
    };
    table.get(device_id as usize).ok_or_else(|| {
        let b = backend::global()
            .map(|b| b.kind().name())
            .unwrap_or("unknown");
        Error::no_such_device(device_id, table.len() as u32, b)
    })
}

fn initial(device_id: u32) -> Result<SharedResource> {
    Ok(Arc::new(CudaMemoryResource::new(Device::new(device_id)?)))
}

/// The resource of device `device_id` (its initial [`CudaMemoryResource`] until one is set).
///
/// # Errors
/// [`Error::NoSuchDevice`] for an unknown device; the process-wide backend's error.
pub fn get_per_device_resource(device_id: u32) -> Result<SharedResource> {
    with_per_device_resource(device_id, Arc::clone)
}

/// Runs `f` with device `device_id`'s resource (as [`get_per_device_resource`]) without touching
/// its reference count.
///
/// # Errors
/// As [`get_per_device_resource`].
pub fn with_per_device_resource<R>(
    device_id: u32,
    f: impl FnOnce(&SharedResource) -> R,
) -> Result<R> {
    let slot = slot(device_id)?;
    if let Some(r) = slot.load().as_deref() {
        return Ok(f(r));
    }
    let fresh = Arc::new(initial(device_id)?);
    let prev = slot.compare_and_swap(&None::<Arc<SharedResource>>, Some(Arc::clone(&fresh)));
    Ok(f(prev.as_deref().unwrap_or(&fresh)))
}

/// Makes `resource`, which must allocate on device `device_id`, that device's resource; returns the
/// previous one, which the caller keeps alive while memory allocated from it is in use.
///
/// # Errors
/// [`Error::NoSuchDevice`] for an unknown device; [`Error::InvalidArgument`] when `resource` is not
/// on device `device_id` of the process-wide backend.
pub fn set_per_device_resource(device_id: u32, resource: SharedResource) -> Result<SharedResource> {
    let slot = slot(device_id)?;
    let on = resource.device();
    if on.ordinal() != device_id || !std::ptr::addr_eq(on.backend(), backend::global()?) {
        return Err(Error::invalid_argument(
            "resource",
            format!("{} on {on}", resource.name()),
            format!("a resource of device {device_id} of the process-wide backend"),
        ));
    }
    let previous = get_per_device_resource(device_id)?;
    let old = slot.swap(Some(Arc::new(resource)));
    Ok(old.as_deref().cloned().unwrap_or(previous))
}

/// Puts device `device_id` back on a fresh [`CudaMemoryResource`]; returns the previous one.
///
/// # Errors
/// As [`get_per_device_resource`].
pub fn reset_per_device_resource(device_id: u32) -> Result<SharedResource> {
    set_per_device_resource(device_id, initial(device_id)?)
}

/// The resource of the calling thread's current device.
///
/// # Errors
/// As [`get_per_device_resource`].
pub fn get_current_device_resource() -> Result<SharedResource> {
    get_per_device_resource(current_device())
}

/// Sets the resource of the calling thread's current device; returns the previous one.
///
/// # Errors
/// As [`set_per_device_resource`].
pub fn set_current_device_resource(resource: SharedResource) -> Result<SharedResource> {
    set_per_device_resource(current_device(), resource)
}
