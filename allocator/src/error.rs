//! The error type of the allocator crate.
//!
//! Every message says what failed, with which value, and what the user can do about it.

use std::fmt;

/// Result alias used throughout the allocator crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

use crate::resource::PoolUsage;

/// Every failure the allocator crate can report.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device allocation could not be satisfied.
    #[error(
        "out of memory on device {device}: {resource} could not allocate {} ({requested} bytes); \
         device has {} free of {}{}",
        fmt_bytes(*.requested), fmt_bytes(*.free), fmt_bytes(*.total),
        fmt_pool(.pool.as_deref(), *.requested)
    )]
    OutOfMemory {
        /// Bytes requested.
        requested: usize,
        /// Device ordinal.
        device: u32,
        /// Free device memory at the time of the failure.
        free: usize,
        /// Total device memory.
        total: usize,
        /// The resource that failed (e.g. `CudaMemoryResource`).
        resource: &'static str,
        /// Pool figures when the failing resource is a pool (boxed: they are many, and the
        /// error travels in every allocation's `Result`).
        pool: Option<Box<PoolUsage>>,
    },

    /// A host allocation (pinned or pageable) could not be satisfied.
    #[error(
        "out of host memory: {resource} could not allocate {} ({requested} bytes). {}",
        fmt_bytes(*.requested),
        host_advice(resource)
    )]
    HostOutOfMemory {
        /// Bytes requested.
        requested: usize,
        /// The resource that failed.
        resource: &'static str,
    },

    /// A CUDA driver call returned an error.
    #[error("CUDA driver call {call} failed on device {device}: {name} ({code}): {description}")]
    Driver {
        /// The driver entry point, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// Device ordinal the call was made for.
        device: u32,
        /// The CUDA error name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The numeric CUresult.
        code: u32,
        /// The driver's description of the error.
        description: String,
    },

    /// The CUDA driver library could not be loaded or initialized.
    #[error(
        "no CUDA driver found: {detail}. Install the NVIDIA driver (libcuda.so.1 must be \
         loadable), or run on the simulated device with RMM_BACKEND=sim"
    )]
    NoDriver {
        /// What was tried and what went wrong.
        detail: String,
    },

    /// A device ordinal that does not exist was named.
    #[error(
        "device {requested} does not exist: the {backend} backend has {count} device(s) \
         (ordinals 0..{count})"
    )]
    NoSuchDevice {
        /// The ordinal asked for.
        requested: u32,
        /// How many devices the backend has.
        count: u32,
        /// The backend's name.
        backend: &'static str,
    },

    /// An argument was out of its valid range.
    #[error("invalid argument {what} = {value}: expected {expected}")]
    InvalidArgument {
        /// The argument's name.
        what: &'static str,
        /// The value given.
        value: String,
        /// What would have been accepted.
        expected: String,
    },

    /// A pointer handed back to a resource or the device was not one it knows.
    #[error(
        "invalid pointer {ptr:#x} ({bytes} bytes) given to {resource}: it was not allocated \
         there or was already freed"
    )]
    InvalidPointer {
        /// The pointer.
        ptr: u64,
        /// The size given with it.
        bytes: usize,
        /// Who rejected it.
        resource: &'static str,
    },

    /// `RMM_BACKEND` (or a configured backend name) is not one of the known ones.
    #[error(
        "unknown backend {value:?} (from {source_name}): expected \"cuda\", \"sim\" or \"auto\""
    )]
    UnknownBackend {
        /// The value given.
        value: String,
        /// Where it came from (e.g. `RMM_BACKEND`).
        source_name: &'static str,
    },

    /// The backend cannot do what was asked (e.g. managed memory on a device without it).
    #[error("{what} is not supported by the {backend} backend{}", if .hint.is_empty() { String::new() } else { format!(": {}", .hint) })]
    Unsupported {
        /// What was asked.
        what: &'static str,
        /// Backend name.
        backend: &'static str,
        /// What to do instead.
        hint: String,
    },

    /// A failure injected on purpose by the simulated device's fault injection.
    #[error(
        "simulated fault: {what} on device {device} (fault injection is configured on this simulated device)"
    )]
    InjectedFault {
        /// What failed.
        what: &'static str,
        /// Device ordinal.
        device: u32,
    },

    /// An element index was outside a container (e.g. `DeviceUVector::element`).
    #[error(
        "index {index} is out of range for a {container}<{element_type}> of {len} element(s) \
         (valid indices are 0..{len}); check the index against len(), or resize the container first"
    )]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The container's length at the time.
        len: usize,
        /// The container, e.g. `DeviceUVector`.
        container: &'static str,
        /// The element type, e.g. `u32`.
        element_type: &'static str,
    },

    /// A limiting adaptor refused an allocation that would take the bytes in use past its
    /// limit (an out-of-memory condition: [`Error::is_out_of_memory`] is true).
    #[error(
        "out of memory on device {device}: {resource} refused {} ({requested} bytes): {} in use \
         + this request would exceed its limit of {} ({limit_source}). Raise the limit, free or \
         spill live buffers, or enable spilling",
        fmt_bytes(*.requested), fmt_bytes(*.in_use), fmt_bytes(*.limit)
    )]
    LimitExceeded {
        /// Bytes requested (before rounding to the allocation alignment).
        requested: usize,
        /// Device ordinal.
        device: u32,
        /// Bytes in use through the adaptor when the request came (rounded sizes).
        in_use: usize,
        /// The limit in bytes.
        limit: usize,
        /// How the limit was given, e.g. `"50.0% of 80.00 GiB"` or `"2147483648 bytes"`.
        limit_source: String,
        /// The adaptor that refused, e.g. `LimitingResourceAdaptor`.
        resource: &'static str,
    },

    /// A spill file under `spill.disk_directory` could not be created, written or read.
    #[error(
        "spill file {path}: {operation} failed: {problem}. Check that spill.disk_directory \
         exists, is writable and has free space, or set it to \"none\" to spill to host memory only"
    )]
    SpillFile {
        /// The file.
        path: String,
        /// What was done: `create`, `write`, `read`.
        operation: &'static str,
        /// The operating system's message.
        problem: String,
    },

    /// A spillable buffer's data was lost: a copy of it could not be waited for after a driver
    /// error, so its host memory had to be abandoned to the copy.
    #[error(
        "the data of spillable buffer {id} ({bytes} bytes) was lost: {detail}. The CUDA \
         context is likely unusable; restart the process"
    )]
    DataLost {
        /// The buffer's id.
        id: u64,
        /// Its size.
        bytes: usize,
        /// The failure that lost it.
        detail: String,
    },

    /// A memory event log (RMM's CSV format) could not be read, parsed or written.
    #[error(
        "memory event log {path}{}: {problem}. {hint}",
        match .line { Some(l) => format!(" line {l}"), None => String::new() }
    )]
    EventLog {
        /// The log file (or a description of the source, e.g. `<memory>`).
        path: String,
        /// 1-based line number, when the problem is on one line.
        line: Option<usize>,
        /// What was wrong: what was found and what was expected.
        problem: String,
        /// What the user can do.
        hint: String,
    },
}

/// What to do about an [`Error::HostOutOfMemory`] of `resource`: a full pinned host pool
/// needs more room, anything else (pinning or allocating host memory failed) less.
fn host_advice(resource: &str) -> &'static str {
    if resource == "PinnedHostPool" {
        "The pinned host pool is full: make it larger (spill.host_pool_size, or \"none\" to \
         pin as needed), add a disk tier behind it (spill.disk_directory), or drop spilled \
         buffers"
    } else {
        "The host has no more memory to give: lower the host pool size or free pinned buffers"
    }
}

impl Error {
    /// True for [`Error::OutOfMemory`], [`Error::HostOutOfMemory`] and [`Error::LimitExceeded`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Error::OutOfMemory { .. } | Error::HostOutOfMemory { .. } | Error::LimitExceeded { .. }
        )
    }

    /// True when the error is a driver error carrying `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_driver_out_of_memory(&self) -> bool {
        matches!(self, Error::Driver { name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY")
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid_argument(
        what: &'static str,
        value: impl fmt::Display,
        expected: impl Into<String>,
    ) -> Self {
        Error::InvalidArgument {
            what,
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

/// Formats a byte count for people: `1.50 GiB (1610612736 B)` style, without the raw count.
pub fn fmt_bytes(bytes: usize) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// The pool's figures and what to try, or the general advice when no pool failed.
fn fmt_pool(pool: Option<&PoolUsage>, requested: usize) -> String {
    match pool {
        None => ". Free or spill live buffers, lower the pool size, or use a limit/spilling \
                 adaptor"
            .to_string(),
        Some(p) => format!("{}; or use a limit/spilling adaptor", p.explain(requested)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_formatted_for_people() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(255), "255 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(1 << 30), "1.00 GiB");
    }

    #[test]
    fn out_of_memory_message_names_the_values() {
        let e = Error::OutOfMemory {
            requested: 3 << 30,
            device: 1,
            free: 1 << 30,
            total: 2 << 30,
            resource: "CudaMemoryResource",
            pool: None,
        };
        let s = e.to_string();
        assert!(s.contains("device 1"), "{s}");
        assert!(s.contains("3.00 GiB (3221225472 bytes)"), "{s}");
        assert!(s.contains("1.00 GiB free of 2.00 GiB"), "{s}");
        assert!(e.is_out_of_memory());
    }
}
