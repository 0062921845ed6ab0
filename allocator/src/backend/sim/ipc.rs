//! Interprocess memory on the simulated device: an anonymous memory file (`memfd_create`) the
//! exporter keeps open, which another process maps through the `/proc/<pid>/fd/<fd>` its handle
//! names. It goes with the exporter's free or process, counts as device memory in use, fails with
//! `cuMemAlloc`'s injected faults, and needs backed mode.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::memory::{AllocKind, Backing};
use super::{SimBackend, SimMemoryMode, at_least_one_byte};
use crate::backend::{DevicePtr, IpcHandle};
use crate::error::{Error, Result};

/// The prefix of every simulated handle, followed by "<pid>:<fd>:<inode>" (the inode tells the
/// exporter's file from a later one at the same number).
const PREFIX: &str = "rmm-rs-sim:";

fn driver_error(call: &'static str, dev: u32, description: String) -> Error {
    Error::Driver {
        call,
        device: dev,
        name: "CUDA_ERROR_INVALID_VALUE".into(),
        code: 1,
        description,
    }
}

/// The path through which another process opens the memory file `handle` names, and its inode.
fn path_of(handle: &IpcHandle) -> Option<(String, u64)> {
    let end = handle
        .0
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(handle.0.len());
    let text = std::str::from_utf8(&handle.0[..end]).ok()?;
    let mut parts = text.strip_prefix(PREFIX)?.split(':');
    let pid = parts.next()?.parse::<u32>().ok()?;
    let fd = parts.next()?.parse::<i32>().ok()?;
    let inode = parts.next()?.parse::<u64>().ok()?;
    Some((format!("/proc/{pid}/fd/{fd}"), inode))
}

/// A new anonymous memory file of `len` bytes.
fn memory_file(len: usize) -> std::io::Result<File> {
    // SAFETY: a NUL-terminated name; no flags beyond close-on-exec.
    let fd = unsafe { libc::memfd_create(c"rmm-rs-sim-ipc".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len as u64)?;
    Ok(file)
}

/// Maps all `len` bytes of `file` shared, read and write.
fn map(file: &File, len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of an open file of at least `len` bytes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

impl SimBackend {
    pub(super) fn sim_ipc_alloc(&self, dev: u32, bytes: usize) -> Result<(DevicePtr, IpcHandle)> {
        const CALL: &str = "cuIpcGetMemHandle";
        let d = self.device(dev)?;
        at_least_one_byte(bytes)?;
        if self.config.mode != SimMemoryMode::Backed {
            return Err(driver_error(
                CALL,
                dev,
                "the simulated device shares memory with other processes only in backed mode \
                 (RMM_SIM_MODE=backed)"
                    .into(),
            ));
        }
        let len = self.charge(dev, bytes, "cuMemAlloc_v2")?;
        let made = (|| {
            let file = memory_file(len)?;
            let ptr = map(&file, len)?;
            let inode = file.metadata()?.ino();
            let text = format!(
                "{PREFIX}{}:{}:{inode}",
                std::process::id(),
                file.as_raw_fd()
            );
            let mut handle = [0u8; 64];
            handle[..text.len()].copy_from_slice(text.as_bytes());
            // SAFETY: `ptr` is a fresh shared mapping of exactly `len` bytes, owned from now on.
            Ok::<_, std::io::Error>((
                unsafe { Backing::shared(ptr, len, Some(file)) },
                IpcHandle(handle),
            ))
        })();
        let (backing, handle) = match made {
            Ok(x) => x,
            Err(e) => {
                d.used.fetch_sub(len, Ordering::SeqCst);
                return Err(driver_error(
                    CALL,
                    dev,
                    format!("the simulated device could not make a memory file for it: {e}"),
                ));
            }
        };
        let addr = backing.addr();
        self.table
            .lock()
            .add(addr, dev, len, AllocKind::Exported, Some(Arc::new(backing)));
        Ok((DevicePtr(addr), handle))
    }

    pub(super) fn sim_ipc_free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        let d = self.device(dev)?;
        let mut table = self.table.lock();
        let exported = |kind| kind == AllocKind::Exported;
        let a = table.take(ptr, dev, exported, "the simulated device's exported memory")?;
        d.used.fetch_sub(a.len, Ordering::SeqCst);
        Ok(())
    }

    pub(super) fn sim_ipc_open(&self, dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)> {
        const CALL: &str = "cuIpcOpenMemHandle";
        self.device(dev)?;
        let (path, inode) = path_of(handle).ok_or_else(|| {
            driver_error(
                CALL,
                dev,
                format!("{handle:?} is not a simulated device's handle"),
            )
        })?;
        let opened = (|| {
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            if file.metadata()?.ino() != inode {
                return Err(std::io::Error::other(
                    "another file is there now: its exporter is gone",
                ));
            }
            let len = usize::try_from(file.metadata()?.len()).unwrap_or(0);
            if len == 0 {
                return Err(std::io::Error::other("the memory file is empty"));
            }
            let ptr = map(&file, len)?;
            // SAFETY: `ptr` is a fresh shared mapping of exactly `len` bytes, owned from now on.
            Ok(unsafe { Backing::shared(ptr, len, None) })
        })();
        let backing = opened.map_err(|e| {
            driver_error(
                CALL,
                dev,
                format!(
                    "the simulated device could not map {path} (its exporter gone, or the memory \
                     freed?): {e}"
                ),
            )
        })?;
        let (addr, len) = (backing.addr(), backing.len());
        self.table
            .lock()
            .add(addr, dev, len, AllocKind::Imported, Some(Arc::new(backing)));
        Ok((DevicePtr(addr), len))
    }

    pub(super) fn sim_ipc_close(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.device(dev)?;
        let imported = |kind| kind == AllocKind::Imported;
        let resource = "memory the simulated device mapped from another process";
        self.table.lock().take(ptr, dev, imported, resource)?;
        Ok(())
    }
}
