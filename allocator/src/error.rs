//! The allocator's error type; every message says what failed, with which value, and what to do.

use std::fmt;

/// Result alias used throughout the allocator crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

use crate::pool_usage::PoolUsage;

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
        /// A failing pool's figures (boxed: every allocation's `Result` carries the error).
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

    /// Pinning refused: unpageable memory would exceed what the process may use (cgroup, free).
    #[error(
        "pinning {} of host memory ({requested} bytes) for {resource} would take more than \
         this process may use: {host}. Pin less (spill.host_pool_size, spill.pin_ahead), add \
         a disk tier (spill.disk_directory), or give the process more memory",
        fmt_bytes(*.requested)
    )]
    HostMemoryLimit {
        /// Bytes that were to be pinned.
        requested: usize,
        /// What was to pin them.
        resource: &'static str,
        /// The host's memory as read then (`HostMemory`'s description).
        host: String,
    },

    /// A CUDA driver call returned an error.
    #[error(
        "CUDA driver call {call} failed on device {device}: {name} ({code}): {description}. {}",
        driver_advice(name)
    )]
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
        "no CUDA driver found: {detail}. rmm-rs serves device memory from an NVIDIA GPU: \
         install the NVIDIA driver (libcuda.so.1 must be loadable; in a container, give it \
         the GPU, e.g. `docker run --gpus all`), or run on the simulated device (host memory \
         standing in for a GPU, for tests and machines without one) with RMM_BACKEND=sim"
    )]
    NoDriver {
        /// What was tried and what went wrong.
        detail: String,
    },

    /// The CUDA driver loaded but sees no GPU, and nothing asked for the simulated device.
    #[error(
        "the CUDA driver sees no GPU{}. Make a GPU visible to this process (check \
         `nvidia-smi` and CUDA_VISIBLE_DEVICES), or run on the simulated device with \
         RMM_BACKEND=sim",
        visible_devices.as_deref().map_or(String::new(), |v| format!(" (CUDA_VISIBLE_DEVICES={v:?})"))
    )]
    NoDevice {
        /// `CUDA_VISIBLE_DEVICES` as the process saw it, when set.
        visible_devices: Option<String>,
    },

    /// A device ordinal that does not exist was named.
    #[error("device {requested} does not exist: {}", no_such_device(*.count, backend))]
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
         there, was already freed, or runs past its allocation; pass only live memory of that \
         resource, and free each allocation once, with the size it was allocated with"
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
        "simulated fault: {what} on device {device}, injected on purpose by the simulated \
         device's fault injection (SimBackend::fail_nth_*, or the RMM_SIM_FAIL_* variables); \
         SimBackend::clear_faults stops it, or unset the variables"
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

    /// A limiting adaptor refused an allocation exceeding its limit (an out-of-memory error).
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

    /// A spillable buffer's data was lost: a copy could not be waited for after a driver error.
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

/// What to do about an [`Error::Driver`] with the error `name`.
fn driver_advice(name: &str) -> &'static str {
    match name {
        "CUDA_ERROR_OUT_OF_MEMORY" => {
            "The device (or the host, for pinned memory) has no memory to give: free or spill \
             live buffers, lower the pool size, or enable spilling"
        }
        "CUDA_ERROR_ILLEGAL_ADDRESS"
        | "CUDA_ERROR_LAUNCH_FAILED"
        | "CUDA_ERROR_MISALIGNED_ADDRESS"
        | "CUDA_ERROR_ILLEGAL_INSTRUCTION"
        | "CUDA_ERROR_HARDWARE_STACK_ERROR"
        | "CUDA_ERROR_INVALID_ADDRESS_SPACE"
        | "CUDA_ERROR_INVALID_PC"
        | "CUDA_ERROR_LAUNCH_TIMEOUT"
        | "CUDA_ERROR_ECC_UNCORRECTABLE" => {
            "This error is sticky: the CUDA context is unusable; restart the process (a kernel \
             at fault shows under compute-sanitizer)"
        }
        "CUDA_ERROR_NO_DEVICE" | "CUDA_ERROR_INVALID_DEVICE" => {
            "Check which GPUs this process sees (nvidia-smi, CUDA_VISIBLE_DEVICES), or run on the \
             simulated device with RMM_BACKEND=sim"
        }
        "CUDA_ERROR_NOT_SUPPORTED" => {
            "This device or driver cannot do it: update the driver, or configure a resource \
             that does not need it (e.g. pool.async = false, pool.vmm = false)"
        }
        "CUDA_ERROR_INVALID_VALUE" | "CUDA_ERROR_INVALID_HANDLE" | "CUDA_ERROR_INVALID_CONTEXT" => {
            "The driver refused an argument: check that the streams, events and pointers passed \
             are live and belong to this device; if they are, please report it with the call \
             above"
        }
        "CUDA_ERROR_DEINITIALIZED" | "CUDA_ERROR_NOT_INITIALIZED" => {
            "The driver is shutting down (the process is exiting): stop using device memory \
             before exit"
        }
        _ => {
            "Check the device's state with nvidia-smi; if the error repeats, restart the \
             process, or run on the simulated device with RMM_BACKEND=sim"
        }
    }
}

/// The devices a backend has and which to use, after "device N does not exist: ".
fn no_such_device(count: u32, backend: &str) -> String {
    match count {
        0 => format!(
            "the {backend} backend has no device; check the driver and CUDA_VISIBLE_DEVICES \
             (nvidia-smi lists the GPUs), or run on the simulated device with RMM_BACKEND=sim"
        ),
        n => format!(
            "the {backend} backend has {n} device(s), ordinals 0 to {}; use one of those \
             (CUDA_VISIBLE_DEVICES picks the GPUs the cuda backend sees, RMM_SIM_DEVICES how \
             many the simulated one has)",
            n - 1
        ),
    }
}

/// Advice for [`Error::HostOutOfMemory`]: a full pinned host pool needs more room, else use less.
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
    /// True for [`Error::OutOfMemory`], [`Error::HostOutOfMemory`], [`Error::HostMemoryLimit`] and
    /// [`Error::LimitExceeded`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Error::OutOfMemory { .. }
                | Error::HostOutOfMemory { .. }
                | Error::HostMemoryLimit { .. }
                | Error::LimitExceeded { .. }
        )
    }

    /// True for a driver error carrying `CUDA_ERROR_OUT_OF_MEMORY`.
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

    pub(crate) fn invalid_pointer(ptr: u64, bytes: usize, resource: &'static str) -> Self {
        Error::InvalidPointer {
            ptr,
            bytes,
            resource,
        }
    }

    pub(crate) fn host_out_of_memory(requested: usize, resource: &'static str) -> Self {
        Error::HostOutOfMemory {
            requested,
            resource,
        }
    }

    pub(crate) fn no_such_device(requested: u32, count: u32, backend: &'static str) -> Self {
        Error::NoSuchDevice {
            requested,
            count,
            backend,
        }
    }

    pub(crate) fn event_log(
        path: impl Into<String>,
        line: Option<usize>,
        problem: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Error::EventLog {
            path: path.into(),
            line,
            problem: problem.into(),
            hint: hint.into(),
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

    #[test]
    fn driver_errors_say_what_to_do() {
        let driver = |name: &str| Error::Driver {
            call: "cuMemAlloc_v2",
            device: 2,
            name: name.into(),
            code: 700,
            description: "an illegal memory access was encountered".into(),
        };
        let s = driver("CUDA_ERROR_ILLEGAL_ADDRESS").to_string();
        assert!(s.contains("cuMemAlloc_v2 failed on device 2"), "{s}");
        assert!(s.contains("CUDA_ERROR_ILLEGAL_ADDRESS (700)"), "{s}");
        assert!(s.contains("restart the process"), "{s}");
        let s = driver("CUDA_ERROR_OUT_OF_MEMORY").to_string();
        assert!(s.contains("free or spill live buffers"), "{s}");
        let s = driver("CUDA_ERROR_SOMETHING_NEW").to_string();
        assert!(s.contains("nvidia-smi"), "{s}");
    }

    #[test]
    fn a_missing_device_names_the_ordinals_there_are() {
        let e = Error::NoSuchDevice {
            requested: 3,
            count: 2,
            backend: "cuda",
        };
        let s = e.to_string();
        assert!(s.starts_with("device 3 does not exist"), "{s}");
        assert!(
            s.contains("2 device(s), ordinals 0 to 1; use one of those"),
            "{s}"
        );
        assert!(s.contains("CUDA_VISIBLE_DEVICES"), "{s}");
        let none = Error::NoSuchDevice {
            requested: 0,
            count: 0,
            backend: "cuda",
        };
        let s = none.to_string();
        assert!(s.contains("the cuda backend has no device"), "{s}");
        assert!(s.contains("RMM_BACKEND=sim"), "{s}");
    }

    #[test]
    fn invalid_pointers_and_injected_faults_say_what_to_do() {
        let s = Error::InvalidPointer {
            ptr: 0x1000,
            bytes: 256,
            resource: "PoolMemoryResource",
        }
        .to_string();
        assert!(
            s.contains("0x1000 (256 bytes) given to PoolMemoryResource"),
            "{s}"
        );
        assert!(s.contains("free each allocation once"), "{s}");
        let s = Error::InjectedFault {
            what: "copy",
            device: 1,
        }
        .to_string();
        assert!(s.contains("copy on device 1"), "{s}");
        assert!(s.contains("SimBackend::clear_faults"), "{s}");
    }
}
