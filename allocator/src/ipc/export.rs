//! The sending side: a per-device arena of exportable memory, lent in slots.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::descriptor::IpcDescriptor;
use crate::backend::{DevicePtr, IpcHandle};
use crate::device::Device;
use crate::error::{Error, Result};

/// Alignment of every slot (as device allocations).
const ALIGNMENT: usize = 256;
/// A device's arena size: room for what three peers ask a worker for at once (Dask asks for 1 GB
/// per message, plus one value past that); a send that finds it full goes a slower way.
pub const DEFAULT_ARENA_BYTES: usize = 4 << 30;

/// Exportable device memory of one device, mapped once by each peer, lent as [`ExportSlot`]s.
#[derive(Debug)]
pub struct ExportArena {
    device: Device,
    base: DevicePtr,
    handle: IpcHandle,
    len: usize,
    uuid: String,
    /// Free stretches: offset → length, adjacent ones merged.
    free: Mutex<BTreeMap<usize, usize>>,
}

impl ExportArena {
    /// `bytes` (rounded up to the slot alignment) of exportable memory on `device`.
    ///
    /// # Errors
    /// As [`Backend::ipc_alloc`](crate::backend::Backend::ipc_alloc) or [`Device::properties`].
    pub fn new(device: Device, bytes: usize) -> Result<Arc<ExportArena>> {
        let len = bytes.max(1).next_multiple_of(ALIGNMENT);
        let uuid = device.properties()?.uuid;
        let (base, handle) = device.backend().ipc_alloc(device.ordinal(), len)?;
        tracing::debug!(
            device = device.ordinal(),
            bytes = len,
            "exportable device memory made"
        );
        Ok(Arc::new(ExportArena {
            device,
            base,
            handle,
            len,
            uuid,
            free: Mutex::new(BTreeMap::from([(0, len)])),
        }))
    }

    /// The handle that names the arena for other processes.
    pub fn handle(&self) -> IpcHandle {
        self.handle
    }

    /// Where the arena starts in this process's device memory.
    pub fn base(&self) -> DevicePtr {
        self.base
    }

    /// The arena's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an arena has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes not handed out now.
    pub fn available(&self) -> usize {
        self.free.lock().values().sum()
    }

    /// A slot of `bytes`, or `None` while no free stretch fits (the caller sends another way).
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Option<ExportSlot> {
        let len = bytes.max(1).next_multiple_of(ALIGNMENT);
        let offset = crate::free_ranges::take_first_fit(&mut self.free.lock(), len)?;
        Some(ExportSlot {
            arena: Arc::clone(self),
            offset,
            len,
        })
    }
}

impl Drop for ExportArena {
    fn drop(&mut self) {
        let device = self.device.ordinal();
        if let Err(e) = self.device.backend().ipc_free(device, self.base) {
            tracing::warn!(device, "freeing exportable memory failed: {e}");
        }
    }
}

/// A stretch of an [`ExportArena`] held for one send, given back on drop (once the peer copied it).
#[derive(Debug)]
pub struct ExportSlot {
    arena: Arc<ExportArena>,
    offset: usize,
    len: usize,
}

impl ExportSlot {
    /// Where the slot starts in this process's device memory (to stage bytes into).
    pub fn ptr(&self) -> DevicePtr {
        self.arena.base.offset(self.offset)
    }

    /// The slot's length (the bytes asked for, rounded up to 256).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a slot has at least 256 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the slot is on.
    pub fn device(&self) -> Device {
        self.arena.device
    }

    /// What names `len` bytes at `start` into the slot for a peer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the stretch runs past the slot's end.
    pub fn descriptor(&self, start: usize, len: usize) -> Result<IpcDescriptor> {
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::invalid_argument(
                "a stretch of an export slot",
                format!("{len} bytes at {start}"),
                format!("a stretch within the slot's {} bytes", self.len),
            ));
        }
        Ok(IpcDescriptor {
            pid: std::process::id(),
            handle: self.arena.handle,
            offset: (self.offset + start) as u64,
            len: len as u64,
            device_uuid: self.arena.uuid.clone(),
        })
    }
}

impl Drop for ExportSlot {
    fn drop(&mut self) {
        crate::free_ranges::give_back(&mut self.arena.free.lock(), self.offset, self.len);
    }
}

/// A device's arena: unmade, made, or refused (and when the device's free memory was last read).
#[derive(Debug)]
enum ArenaState {
    Unmade,
    Made(Arc<ExportArena>),
    Refused(Error, Instant),
}

/// How often a refused arena's device is checked; the arena is retried once its bytes are free.
const RETRY_REFUSED: Duration = Duration::from_secs(1);

/// This process's arenas, one per device, each made on first use.
fn arenas(backend_devices: u32) -> &'static [Mutex<ArenaState>] {
    static ARENAS: OnceLock<Vec<Mutex<ArenaState>>> = OnceLock::new();
    ARENAS.get_or_init(|| {
        (0..backend_devices)
            .map(|_| Mutex::new(ArenaState::Unmade))
            .collect()
    })
}

/// The process's arena on `device`, made on first use: [`DEFAULT_ARENA_BYTES`], at most 1/8 of it.
///
/// # Errors
/// As [`ExportArena::new`] or [`Device::new`]; a refusal for lack of memory lasts until the arena's
/// bytes are free (checked at most once a second), any other for good.
pub fn export_arena(device: u32) -> Result<Arc<ExportArena>> {
    let d = Device::new(device)?;
    let mut state = arenas(d.backend().device_count())
        .get(device as usize)
        .ok_or_else(|| Error::invalid_argument("device", device, "a device of this process"))?
        .lock();
    let was_refused = match &mut *state {
        ArenaState::Made(a) => return Ok(Arc::clone(a)),
        ArenaState::Refused(e, looked) => {
            // Only a lack of memory passes; a driver that cannot export never will.
            if !for_lack_of_memory(e) || looked.elapsed() < RETRY_REFUSED {
                return Err(e.clone());
            }
            *looked = Instant::now();
            let room = d.mem_info().map(|m| m.free >= arena_bytes_for(m.total));
            if !matches!(room, Ok(true)) {
                return Err(e.clone());
            }
            true
        }
        ArenaState::Unmade => false,
    };
    let made = d
        .mem_info()
        .and_then(|m| ExportArena::new(d, arena_bytes_for(m.total)));
    match made {
        Ok(arena) => {
            if was_refused {
                tracing::info!(
                    device,
                    "exportable device memory made after an earlier refusal"
                );
            }
            *state = ArenaState::Made(Arc::clone(&arena));
            Ok(arena)
        }
        Err(e) => {
            if !was_refused {
                let room = for_lack_of_memory(&e).then_some(" until the device has room");
                let until = room.unwrap_or_default();
                tracing::warn!(
                    device,
                    "no exportable device memory: values go to peers of this host through \
                     the connection{until} ({e})"
                );
            }
            *state = ArenaState::Refused(e.clone(), Instant::now());
            Err(e)
        }
    }
}

/// True when `e` refused an arena for lack of device memory (which may come back).
fn for_lack_of_memory(e: &Error) -> bool {
    e.is_out_of_memory() || e.is_driver_out_of_memory()
}

/// The arena's size on a device of `total` bytes.
fn arena_bytes_for(total: usize) -> usize {
    DEFAULT_ARENA_BYTES.min(total / 8)
}

/// Bytes of the process's arena on `device` (outside every pool and limit); 0 if not made.
///
/// # Errors
/// [`Device::new`]'s for an unknown device.
pub fn arena_bytes(device: u32) -> Result<usize> {
    made_arena_figure(device, ExportArena::len)
}

/// `figure` of the process's arena on `device` (under its state's lock); 0 if not made.
fn made_arena_figure(device: u32, figure: impl FnOnce(&ExportArena) -> usize) -> Result<usize> {
    let d = Device::new(device)?;
    Ok(arenas(d.backend().device_count())
        .get(device as usize)
        .map_or(0, |a| match &*a.lock() {
            ArenaState::Made(a) => figure(a),
            _ => 0,
        }))
}

/// This process's arena, on whichever device, whose handle is `handle`.
pub(crate) fn own_arena(handle: IpcHandle) -> Option<Arc<ExportArena>> {
    let devices = crate::backend::global().ok()?.device_count();
    arenas(devices).iter().find_map(|a| match &*a.lock() {
        ArenaState::Made(a) if a.handle == handle => Some(Arc::clone(a)),
        _ => None,
    })
}

/// Bytes of the process's arena on `device` held in slots now; 0 before the arena is made.
///
/// # Errors
/// [`Device::new`]'s for an unknown device.
pub fn exported_bytes(device: u32) -> Result<usize> {
    made_arena_figure(device, |a| a.len() - a.available())
}
