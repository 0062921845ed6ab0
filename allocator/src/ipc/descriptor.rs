//! What names a stretch of another process's exported device memory.

use crate::backend::IpcHandle;
use crate::error::{Error, Result};

/// A stretch of `len` bytes at `offset` into process `pid`'s exported arena `handle`, on device
/// `device_uuid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcDescriptor {
    /// The exporting process.
    pub pid: u32,
    /// The exported arena.
    pub handle: IpcHandle,
    /// Where the stretch starts in the arena.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The exporter's device, `GPU-…`.
    pub device_uuid: String,
}

/// Bytes of the fixed part: pid, handle, offset, len, the UUID's length.
const FIXED: usize = 4 + 64 + 8 + 8 + 2;

impl IpcDescriptor {
    /// The descriptor as bytes for a message, read back by [`from_bytes`](Self::from_bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let uuid = self.device_uuid.as_bytes();
        let mut out = Vec::with_capacity(FIXED + uuid.len());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.handle.0);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&(uuid.len() as u16).to_le_bytes());
        out.extend_from_slice(uuid);
        out
    }

    /// Reads what [`to_bytes`](Self::to_bytes) wrote.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bytes of another length or shape (a message cut or garbled).
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcDescriptor> {
        let bad = |why: &str| {
            Error::invalid_argument(
                "an exported memory descriptor",
                format!("{} bytes", bytes.len()),
                format!("the bytes IpcDescriptor::to_bytes wrote ({why})"),
            )
        };
        if bytes.len() < FIXED {
            return Err(bad("too short"));
        }
        let u64_at =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let pid = u32::from_le_bytes(bytes[..4].try_into().unwrap_or_default());
        let handle = bytes[4..68].try_into().map_err(|_| bad("too short"))?;
        let uuid_len = usize::from(u16::from_le_bytes([bytes[84], bytes[85]]));
        if bytes.len() != FIXED + uuid_len {
            return Err(bad("a length that does not match the device UUID's"));
        }
        let device_uuid = std::str::from_utf8(&bytes[FIXED..])
            .map_err(|_| bad("a device UUID that is not text"))?
            .to_owned();
        Ok(IpcDescriptor {
            pid,
            handle: IpcHandle(handle),
            offset: u64_at(68),
            len: u64_at(76),
            device_uuid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_reads_back_what_it_wrote_and_refuses_cut_bytes() {
        let mut handle = [0u8; 64];
        handle[..5].copy_from_slice(b"hello");
        let d = IpcDescriptor {
            pid: 4242,
            handle: IpcHandle(handle),
            offset: 1 << 33,
            len: 128 << 20,
            device_uuid: "GPU-3614aa3d-ce43-9a34-c6e3-3d48578070d3".into(),
        };
        let bytes = d.to_bytes();
        assert_eq!(IpcDescriptor::from_bytes(&bytes).unwrap(), d);
        assert!(IpcDescriptor::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(IpcDescriptor::from_bytes(&bytes[..10]).is_err());
    }
}
