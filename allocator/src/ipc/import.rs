//! The receiving side: other processes' arenas, each mapped once per device and kept for the
//! life of the process (a worker copies from the same few peers again and again).

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::descriptor::IpcDescriptor;
use crate::backend::{DevicePtr, IpcHandle};
use crate::device::Device;
use crate::error::{Error, Result};

/// The peers' arenas this process has mapped, by device and handle.
#[derive(Debug, Default)]
pub struct Imports {
    mapped: Mutex<HashMap<(u32, IpcHandle), DevicePtr>>,
}

impl Imports {
    /// The process's mappings.
    pub fn global() -> &'static Imports {
        static IMPORTS: OnceLock<Imports> = OnceLock::new();
        IMPORTS.get_or_init(Imports::default)
    }

    /// Where the stretch `desc` names is, in `device`'s address space: the peer's arena is
    /// mapped on first use. A descriptor of this process's own arena is its memory here.
    ///
    /// # Errors
    /// What [`Backend::ipc_open`](crate::backend::Backend::ipc_open) returns (another host,
    /// a GPU this process does not see, an arena already freed).
    pub fn locate(&self, device: Device, desc: &IpcDescriptor) -> Result<DevicePtr> {
        if desc.pid == std::process::id() {
            return own(device, desc);
        }
        let mut mapped = self.mapped.lock();
        let key = (device.ordinal(), desc.handle);
        let base = match mapped.get(&key) {
            Some(&p) => p,
            None => {
                let p = device.backend().ipc_open(device.ordinal(), &desc.handle)?;
                tracing::debug!(
                    device = device.ordinal(),
                    peer = desc.pid,
                    "a peer's exported device memory mapped"
                );
                mapped.insert(key, p);
                p
            }
        };
        Ok(DevicePtr(base.addr() + desc.offset))
    }

    /// Copies `out.len()` bytes at `offset` into the stretch `desc` names into host memory
    /// (pinned memory at the copy engine's rate).
    ///
    /// # Errors
    /// As [`locate`](Self::locate); [`Error::InvalidArgument`] when the range runs past the
    /// stretch; the copy's error.
    pub fn copy_to_host(
        &self,
        device: Device,
        desc: &IpcDescriptor,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        check_range(desc, offset, out.len())?;
        let src = self.locate(device, desc)?;
        device.copy_to_host(out, src.offset(offset))
    }

    /// Copies the whole stretch `desc` names to `dst`, memory on `device`.
    ///
    /// # Errors
    /// As [`copy_to_host`](Self::copy_to_host).
    pub fn copy_to_device(
        &self,
        device: Device,
        desc: &IpcDescriptor,
        dst: DevicePtr,
    ) -> Result<()> {
        let src = self.locate(device, desc)?;
        device.copy_device_to_device(dst, src, desc.len as usize)
    }

    /// Unmaps every mapped arena (at the end of the process's work); later copies map again.
    ///
    /// # Errors
    /// The first failure to unmap; the others are still unmapped.
    pub fn close_all(&self) -> Result<()> {
        let mapped = std::mem::take(&mut *self.mapped.lock());
        let mut first = None;
        for ((dev, _), ptr) in mapped {
            let closed = Device::new(dev).and_then(|d| d.backend().ipc_close(dev, ptr));
            if let Err(e) = closed {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn check_range(desc: &IpcDescriptor, offset: usize, len: usize) -> Result<()> {
    if (offset as u64)
        .checked_add(len as u64)
        .is_none_or(|end| end > desc.len)
    {
        return Err(Error::invalid_argument(
            "a range of a peer's exported bytes",
            format!("{len} bytes at {offset}"),
            format!("a range within the {} bytes sent", desc.len),
        ));
    }
    Ok(())
}

/// This process's own arena that `desc` names (on whichever device), its stretch here.
fn own(device: Device, desc: &IpcDescriptor) -> Result<DevicePtr> {
    let arena = super::export::own_arena(desc.handle).ok_or_else(|| {
        Error::invalid_argument(
            "an exported memory descriptor of this process",
            format!("{:?}", desc.handle),
            format!(
                "the handle of one of this process's arenas (device {} reads it)",
                device.ordinal()
            ),
        )
    })?;
    if desc.offset.saturating_add(desc.len) > arena.len() as u64 {
        return Err(Error::invalid_argument(
            "an exported memory descriptor",
            format!("{} bytes at {}", desc.len, desc.offset),
            format!("a stretch within the arena's {} bytes", arena.len()),
        ));
    }
    Ok(arena.base().offset(desc.offset as usize))
}
