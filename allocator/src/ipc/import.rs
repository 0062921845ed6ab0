//! The receiving side: other processes' arenas, each mapped once per device and kept while its
//! process lives; a gone peer's arenas are unmapped, once unused, when a new one is mapped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::descriptor::IpcDescriptor;
use crate::backend::{DevicePtr, IpcHandle};
use crate::device::Device;
use crate::error::{Error, Result};

/// A peer's arena mapped on one device.
#[derive(Debug)]
struct Mapping {
    base: DevicePtr,
    len: usize,
    /// The exporting process, with its start time to tell it from a later one with the same ID.
    peer: Peer,
    /// Copies using the mapping now ([`Located`] values alive).
    users: AtomicUsize,
}

/// The peers' arenas this process has mapped, by device and handle.
#[derive(Debug, Default)]
pub struct Imports {
    mapped: Mutex<HashMap<(u32, IpcHandle), Arc<Mapping>>>,
}

/// Where a stretch of a peer's memory is here; keeps its mapping, so drop it once copies are done.
#[derive(Debug)]
pub struct Located {
    ptr: DevicePtr,
    /// None for this process's own arena (nothing is mapped).
    mapping: Option<Arc<Mapping>>,
}

impl Located {
    /// The stretch's first byte in this process's address space.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for Located {
    fn drop(&mut self) {
        if let Some(m) = &self.mapping {
            m.users.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Imports {
    /// The process's mappings.
    pub fn global() -> &'static Imports {
        static IMPORTS: OnceLock<Imports> = OnceLock::new();
        IMPORTS.get_or_init(Imports::default)
    }

    /// Where the stretch `desc` names is on `device`, mapping the peer's arena on first use.
    ///
    /// # Errors
    /// As [`Backend::ipc_open`](crate::backend::Backend::ipc_open).
    pub fn locate(&self, device: Device, desc: &IpcDescriptor) -> Result<Located> {
        if desc.pid == std::process::id() {
            return Ok(Located {
                ptr: own(device, desc)?,
                mapping: None,
            });
        }
        let mut mapped = self.mapped.lock();
        let key = (device.ordinal(), desc.handle);
        // The same handle from another process (the first gone): the old mapping is not its memory.
        if let Some(m) = mapped.get(&key)
            && m.peer.pid != desc.pid
        {
            if m.users.load(Ordering::Acquire) > 0 {
                return Err(Error::invalid_argument(
                    "a peer's exported memory",
                    format!("process {}'s handle", desc.pid),
                    format!(
                        "memory not still mapped for process {}, whose copies from the same \
                         handle are running: send the value again",
                        m.peer.pid
                    ),
                ));
            }
            if let Some(old) = mapped.remove(&key)
                && let Err(e) = unmap(key.0, &old)
            {
                tracing::warn!(
                    "unmapping the exported memory of process {}, whose handle process {} \
                     now uses: {e}",
                    old.peer.pid,
                    desc.pid
                );
            }
        }
        let mapping = match mapped.get(&key) {
            Some(m) => Arc::clone(m),
            None => {
                forget_gone(&mut mapped);
                let (base, len) = device.backend().ipc_open(device.ordinal(), &desc.handle)?;
                tracing::debug!(
                    device = device.ordinal(),
                    peer = desc.pid,
                    "a peer's exported device memory mapped"
                );
                let m = Arc::new(Mapping {
                    base,
                    len,
                    peer: Peer::of(desc.pid),
                    users: AtomicUsize::new(0),
                });
                mapped.insert(key, Arc::clone(&m));
                m
            }
        };
        // A stretch past the peer's arena would fault this process's context: refused.
        if desc.offset.saturating_add(desc.len) > mapping.len as u64 {
            return Err(Error::invalid_argument(
                "a peer's exported memory descriptor",
                format!("{} bytes at {}", desc.len, desc.offset),
                format!(
                    "a stretch within process {}'s {} bytes of exported memory (a garbled \
                     message, or a peer of another rmm-rs version)",
                    desc.pid, mapping.len
                ),
            ));
        }
        // Under the lock: a sweep sees either no user and the mapping, or this user.
        mapping.users.fetch_add(1, Ordering::Acquire);
        Ok(Located {
            ptr: DevicePtr(mapping.base.addr() + desc.offset),
            mapping: Some(mapping),
        })
    }

    /// Unmaps unused arenas of gone peers (also done on every new mapping); returns how many.
    pub fn forget_gone_peers(&self) -> usize {
        forget_gone(&mut self.mapped.lock())
    }

    /// Arenas mapped now (on every device).
    pub fn mapped(&self) -> usize {
        self.mapped.lock().len()
    }

    /// Copies `out.len()` bytes at `offset` of the stretch `desc` names into host memory `out`.
    ///
    /// # Errors
    /// As [`locate`](Self::locate); [`Error::InvalidArgument`] past the stretch; the copy's error.
    pub fn copy_to_host(
        &self,
        device: Device,
        desc: &IpcDescriptor,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        check_range(desc, offset, out.len())?;
        let src = self.locate(device, desc)?;
        device.copy_to_host(out, src.ptr().offset(offset))
    }

    /// Copies the whole stretch `desc` names to `dst` on `device`.
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
        device.copy_device_to_device(dst, src.ptr(), desc.len as usize)
    }

    /// Unmaps every arena no copy uses; later copies map again.
    ///
    /// # Errors
    /// The first failure to unmap; the others are still unmapped.
    pub fn close_all(&self) -> Result<()> {
        let unmapped = unmap_idle(&mut self.mapped.lock(), |_| true);
        unmapped
            .into_iter()
            .find_map(|(_, r)| r.err())
            .map_or(Ok(()), Err)
    }
}

/// Unmaps unused arenas of gone peers in `mapped`; returns how many (failures warn, still drop).
fn forget_gone(mapped: &mut HashMap<(u32, IpcHandle), Arc<Mapping>>) -> usize {
    let mut unmapped = 0;
    for ((device, peer), result) in unmap_idle(mapped, |m| !m.peer.is_alive()) {
        match result {
            Ok(()) => {
                unmapped += 1;
                tracing::debug!(
                    device,
                    peer,
                    "a gone peer's exported device memory unmapped"
                );
            }
            Err(e) => tracing::warn!(
                "unmapping the exported memory of process {peer}, which is gone, on device \
                 {device}: {e}"
            ),
        }
    }
    unmapped
}

/// Removes and unmaps the unused mappings `pick` chooses: each one's device, peer and outcome.
fn unmap_idle(
    mapped: &mut HashMap<(u32, IpcHandle), Arc<Mapping>>,
    pick: impl Fn(&Mapping) -> bool,
) -> Vec<((u32, u32), Result<()>)> {
    let idle: Vec<_> = mapped
        .iter()
        .filter(|(_, m)| m.users.load(Ordering::Acquire) == 0 && pick(m))
        .map(|(k, _)| *k)
        .collect();
    let unmap_one = |key: (u32, IpcHandle)| {
        let m = mapped.remove(&key)?;
        Some(((key.0, m.peer.pid), unmap(key.0, &m)))
    };
    idle.into_iter().filter_map(unmap_one).collect()
}

fn unmap(device: u32, m: &Mapping) -> Result<()> {
    Device::new(device).and_then(|d| d.backend().ipc_close(device, m.base))
}

/// A process of this host (same PID namespace), told from a later one with its ID by start time.
#[derive(Debug, Clone, Copy)]
struct Peer {
    pid: u32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat`), where readable.
    started: Option<u64>,
}

impl Peer {
    fn of(pid: u32) -> Peer {
        Peer {
            pid,
            started: start_time(pid),
        }
    }

    /// True while the process runs (or cannot be told gone: no `/proc`).
    fn is_alive(&self) -> bool {
        match (self.started, start_time(self.pid)) {
            (Some(then), Some(now)) => then == now,
            (Some(_), None) => false,
            (None, _) => {
                std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
                    || !std::path::Path::new("/proc/self").exists()
            }
        }
    }
}

/// The start time (field 22 of `/proc/PID/stat`); None when gone or a zombie (field 3 `Z`/`X`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
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

/// The stretch here of this process's own arena that `desc` names (on whichever device).
fn own(device: Device, desc: &IpcDescriptor) -> Result<DevicePtr> {
    let arena = super::export::own_arena(desc.handle).ok_or_else(|| {
        let expected = format!(
            "the handle of one of this process's arenas (device {} reads it)",
            device.ordinal()
        );
        let what = "an exported memory descriptor of this process";
        Error::invalid_argument(what, format!("{:?}", desc.handle), expected)
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
