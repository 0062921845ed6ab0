//! The runtime's errors: what failed, on which device, and what to do about it.

use std::fmt;
use std::time::Duration;

use rmm_allocator::fmt_bytes;

use crate::worker_id::WorkerId;

/// Result of runtime operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runtime errors (start-up, reinitialize, shutdown); task failures are [`TaskError`]s.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration did not load or resolve against the devices present.
    #[error(transparent)]
    Config(#[from] rmm_config::Error),

    /// The device layer failed outside one device's set-up (opening the backend, say).
    #[error(transparent)]
    Allocator(#[from] rmm_allocator::Error),

    /// Building or installing one device's resource stack failed.
    #[error("setting up device {device}: {source}")]
    DeviceSetup {
        /// The device ordinal.
        device: u32,
        /// What failed.
        #[source]
        source: rmm_allocator::Error,
    },

    /// reinitialize could not make the new spill tiers (`spill.host_pool_size`, `disk_directory`).
    #[error(
        "reinitialize refused, nothing changed: making device {device}'s new spill tiers \
         (spill.host_pool_size, spill.disk_directory): {source}"
    )]
    SpillTiers {
        /// The device ordinal.
        device: u32,
        /// What failed.
        #[source]
        source: rmm_allocator::Error,
    },

    /// reinitialize could not move a device's spillable data off it (into the new spill tiers).
    #[error(
        "reinitialize refused, nothing changed: device {device}'s spillable data could not \
         all be moved off the device before the switch (into the spill tiers of the new \
         configuration): {source}"
    )]
    SpillBeforeSwitch {
        /// The device ordinal.
        device: u32,
        /// What failed.
        #[source]
        source: rmm_allocator::Error,
    },

    /// reinitialize would remove a device a device store (a Dask worker's data,
    /// [`SpillManager::fix_limit`](crate::SpillManager::fix_limit)) spills on.
    #[error(
        "reinitialize refused, nothing changed: device {device} would leave the runtime, but a \
         device store spills on it (its limit was set with set_device_memory_limit, as a Dask \
         worker's DeviceStore does); keep device {device} in `devices`, or close the store's \
         worker first"
    )]
    StoreDeviceLeaves {
        /// The device ordinal.
        device: u32,
    },

    /// reinitialize must spill more than a fixed host tier without disk tier can take.
    #[error(
        "reinitialize refused, nothing changed: device {device}'s spillable data on the \
         device ({}) must be spilled before the switch, and its host tier has {} free with no \
         disk tier behind it; raise spill.host_pool_size (or \"none\" to pin as needed), \
         set spill.disk_directory, or drop data first",
        fmt_bytes(*to_move as usize),
        fmt_bytes(*room as usize)
    )]
    HostTierTooSmall {
        /// The device ordinal.
        device: u32,
        /// Bytes to spill.
        to_move: u64,
        /// Bytes free in the host tier.
        room: u64,
    },

    /// The configuration names a backend other than the one this process uses.
    #[error(
        "backend = \"{requested}\" but this process already uses the {active} backend \
         (chosen by RMM_BACKEND or an earlier start); set backend = \"auto\" or \"{active}\""
    )]
    BackendMismatch {
        /// The backend the configuration asks for.
        requested: &'static str,
        /// The backend in use.
        active: &'static str,
    },

    /// Another runtime in this process manages a device this one was asked to use.
    #[error(
        "device {device} is already managed by another runtime in this process; shut that \
         runtime down first, or leave the device out of `devices`"
    )]
    DeviceInUse {
        /// The device ordinal.
        device: u32,
    },

    /// reinitialize found allocations it cannot move (RMM leaves using them undefined).
    #[error("{}", LiveList(.0))]
    LiveAllocations(Vec<LiveMemory>),

    /// reinitialize or shutdown was called from a worker of the runtime (it would wait for itself).
    #[error(
        "{what} called from inside a task on worker {worker}: it waits for every task to \
         finish, its own included; call it from outside the runtime's workers"
    )]
    InsideWorker {
        /// `reinitialize` or `shutdown`.
        what: &'static str,
        /// The calling worker.
        worker: WorkerId,
    },

    /// In-flight tasks did not finish in time.
    #[error(
        "{what}: {tasks} task(s) still queued or running after {waited:?}; let them finish \
         (or raise the timeout) and try again"
    )]
    DrainTimeout {
        /// `reinitialize` or `shutdown`.
        what: &'static str,
        /// Tasks still queued or running.
        tasks: usize,
        /// How long it waited.
        waited: Duration,
    },

    /// The runtime has been shut down.
    #[error("the runtime has been shut down; start a new one")]
    ShutDown,

    /// A worker thread could not be started.
    #[error(
        "starting worker thread {worker}: {source}; the system refused a thread: lower \
         workers_per_device or the number of devices, or raise the process's thread limit \
         (ulimit -u)"
    )]
    Spawn {
        /// The worker that could not start.
        worker: WorkerId,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// For `map_err`: device `device`'s set-up failed ([`Error::DeviceSetup`]).
    pub(crate) fn setup(device: u32) -> impl Fn(rmm_allocator::Error) -> Error + Copy {
        move |source| Error::DeviceSetup { device, source }
    }
}

/// Live memory of one device that blocks a reinitialize.
#[derive(Debug, Clone)]
pub struct LiveMemory {
    /// The device ordinal.
    pub device: u32,
    /// Live allocations.
    pub count: u64,
    /// Their bytes (requested sizes).
    pub bytes: u64,
    /// With tracking on, each allocation with its thread, age and (with backtraces) site.
    pub allocations: Vec<String>,
}

struct LiveList<'a>(&'a [LiveMemory]);

impl fmt::Display for LiveList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reinitialize refused, nothing changed: ")?;
        if self.0.is_empty() {
            return write!(
                f,
                "memory of the old stacks kept being allocated or freed outside spillable \
                 buffers while it waited. Retry, or pause the threads allocating during \
                 reinitialize"
            );
        }
        for (i, live) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(
                f,
                "device {} has {} allocation(s) of {} still live that cannot be spilled",
                live.device,
                live.count,
                fmt_bytes(live.bytes as usize)
            )?;
            for a in live.allocations.iter().take(16) {
                write!(f, "\n  {a}")?;
            }
            if live.allocations.len() > 16 {
                write!(f, "\n  … and {} more", live.allocations.len() - 16)?;
            }
        }
        write!(
            f,
            ". Drop those buffers (or make them spillable) before reinitialize; \
             tracking.enabled = true lists where each was allocated"
        )
    }
}

/// Why a task produced no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The task panicked; the worker caught it and lives on.
    #[error("task panicked on worker {worker}: {message}")]
    Panicked {
        /// The worker it ran on.
        worker: WorkerId,
        /// The panic message.
        message: String,
    },
    /// The task never ran: the runtime shut down, or its target is gone.
    #[error(
        "task cancelled before it ran: {reason}; it had no effect: submit it again to a running runtime"
    )]
    Cancelled {
        /// Why.
        reason: String,
    },
    /// The task was submitted to a device or worker the runtime does not have.
    #[error("no {target} in this runtime (it has {have}); submit to one of those")]
    NoSuchTarget {
        /// The device or worker asked for.
        target: String,
        /// What the runtime has.
        have: String,
    },
    /// The task was submitted after shutdown.
    #[error("the runtime has been shut down; the task was not run")]
    ShutDown,
    /// [`TaskHandle::wait_timeout`](crate::TaskHandle::wait_timeout) ran out; the task goes on.
    #[error(
        "the task did not finish within {0:?}; it is still queued or running: wait on the \
         handle again (or with a longer timeout)"
    )]
    Timeout(Duration),
    /// The result was already taken by an earlier wait.
    #[error(
        "the task's result was already taken by an earlier wait; use the value that wait \
         returned (a handle yields its result once)"
    )]
    AlreadyTaken,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_failures_name_the_worker_and_the_remedy() {
        let e = Error::Spawn {
            worker: WorkerId {
                device: 1,
                index: 3,
            },
            source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
        };
        let s = e.to_string();
        assert!(s.starts_with("starting worker thread 1.3: "), "{s}");
        assert!(s.contains("lower workers_per_device"), "{s}");
        assert!(s.contains("ulimit -u"), "{s}");
    }

    #[test]
    fn task_errors_say_what_to_do() {
        let s = TaskError::Timeout(Duration::from_millis(250)).to_string();
        assert!(s.contains("within 250ms"), "{s}");
        assert!(s.contains("wait on the handle again"), "{s}");
        let s = TaskError::AlreadyTaken.to_string();
        assert!(s.contains("use the value that wait returned"), "{s}");
        let s = TaskError::Cancelled {
            reason: "worker 0.1 has stopped".into(),
        }
        .to_string();
        assert!(s.contains("worker 0.1 has stopped"), "{s}");
        assert!(s.contains("submit it again to a running runtime"), "{s}");
    }

    #[test]
    fn a_refusal_names_each_device_or_says_the_memory_was_in_flight() {
        let one = Error::LiveAllocations(vec![LiveMemory {
            device: 1,
            count: 2,
            bytes: 3 << 20,
            allocations: vec!["a".into()],
        }])
        .to_string();
        assert!(
            one.contains("device 1 has 2 allocation(s) of 3.00 MiB still live")
                && one.contains("\n  a"),
            "{one}"
        );
        let none = Error::LiveAllocations(Vec::new()).to_string();
        assert!(
            none.contains("kept being allocated or freed") && !none.contains(": ."),
            "{none}"
        );
    }
}
