//! Runtime reports (worker, device, reinitialize, shutdown), as tables or JSON (in seconds).

use std::fmt;
use std::time::Duration;

use rmm_allocator::adaptor::MemoryReport;
use rmm_allocator::fmt_bytes;
use serde::{Serialize, Serializer};

use crate::error::LiveMemory;
use crate::spill::SpillStatistics;
use crate::worker_id::WorkerId;

fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One worker's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerReport {
    /// The worker.
    pub id: WorkerId,
    /// Tasks it has started (panicked ones included).
    pub tasks_run: u64,
    /// Time spent running tasks.
    #[serde(serialize_with = "secs")]
    pub busy: Duration,
    /// Tasks queued for it, plus the one it runs.
    pub queued: usize,
    /// Tasks that panicked.
    pub panics: u64,
}

/// A pool's figures at one moment: reserved against in use, and how its free memory is split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PoolFigures {
    /// Bytes the pool holds from the device.
    pub reserved_bytes: u64,
    /// The most it held since it was made or its peak was reset.
    pub peak_reserved_bytes: u64,
    /// Bytes handed out and not freed (as the pool rounds them).
    pub in_use_bytes: u64,
    /// Bytes free in the pool, ready for requests (arenas, caches and unassigned space).
    pub free_bytes: u64,
    /// The largest free block: the largest request served without growing.
    pub largest_free_block: u64,
    /// 1 − largest free block / free bytes: 0 when the free memory is one block.
    pub fragmentation: f64,
    /// Arenas (streams × thread lanes) the pool has.
    pub arenas: usize,
    /// `pool.max_overhead`: the most it holds above its peak in use, as a share; `None`: no limit.
    pub max_overhead: Option<f64>,
}

impl fmt::Display for PoolFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pool: reserved {} (peak {}), in use {}, free {} (largest block {}, fragmentation \
             {:.1}%), {} arenas",
            fmt_bytes(self.reserved_bytes as usize),
            fmt_bytes(self.peak_reserved_bytes as usize),
            fmt_bytes(self.in_use_bytes as usize),
            fmt_bytes(self.free_bytes as usize),
            fmt_bytes(self.largest_free_block as usize),
            self.fragmentation * 100.0,
            self.arenas
        )?;
        if let Some(share) = self.max_overhead {
            write!(
                f,
                ", held within {:.1}% above its peak in use",
                share * 100.0
            )?;
        }
        Ok(())
    }
}

/// One device's allocation figures over a phase: from the start (phase 0) or the n-th
/// reinitialize (phase n) to the next one, or now. Each phase's stack starts its statistics
/// at zero, so the runtime keeps ended phases' figures for reports made after a reinitialize.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PhaseStatistics {
    /// The phase: 0 from the start, n after the n-th reinitialize (for totals: the current).
    pub phase: u64,
    /// Highest bytes in use at once.
    pub peak_bytes: u64,
    /// Bytes allocated in all.
    pub total_bytes: u64,
    /// Highest number of allocations live at once.
    pub peak_allocations: u64,
    /// Allocations made in all.
    pub total_allocations: u64,
    /// Allocations refused for lack of memory.
    pub out_of_memory_errors: u64,
}

impl PhaseStatistics {
    /// The figures over all `phases`: highest peaks, summed totals, the last `phase`.
    pub fn combined(phases: &[PhaseStatistics]) -> PhaseStatistics {
        phases
            .iter()
            .fold(PhaseStatistics::default(), |a, p| PhaseStatistics {
                phase: p.phase,
                peak_bytes: a.peak_bytes.max(p.peak_bytes),
                total_bytes: a.total_bytes + p.total_bytes,
                peak_allocations: a.peak_allocations.max(p.peak_allocations),
                total_allocations: a.total_allocations + p.total_allocations,
                out_of_memory_errors: a.out_of_memory_errors + p.out_of_memory_errors,
            })
    }
}

impl fmt::Display for PhaseStatistics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peak {} ({} allocations), total {} ({} allocations), {} out of memory",
            fmt_bytes(self.peak_bytes as usize),
            self.peak_allocations,
            fmt_bytes(self.total_bytes as usize),
            self.total_allocations,
            self.out_of_memory_errors
        )
    }
}

/// One device's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// The device ordinal.
    pub device: u32,
    /// Its stack, top first.
    pub stack: String,
    /// Live allocations through the stack.
    pub live_allocations: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Bytes the stack holds from the device (the pool's size, …).
    pub reserved_bytes: u64,
    /// The pool's figures, when the stack has a pool.
    pub pool: Option<PoolFigures>,
    /// The statistics report, with `stats.enabled`.
    pub statistics: Option<MemoryReport>,
    /// Spill figures, with `spill.enabled`.
    pub spill: Option<SpillStatistics>,
    /// Allocation figures per phase, oldest first: those reinitializes ended, then the current.
    pub phases: Vec<PhaseStatistics>,
    /// The figures over all of `phases` (highest peaks, summed totals).
    pub totals: PhaseStatistics,
}

/// The time of each step of one reinitialize.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReinitReport {
    /// The devices after it.
    pub devices: Vec<u32>,
    /// Loading and resolving the new configuration.
    #[serde(serialize_with = "secs")]
    pub resolve: Duration,
    /// Holding submissions and waiting for queued and running tasks.
    #[serde(serialize_with = "secs")]
    pub drain: Duration,
    /// Spilling every spillable buffer not in use to host memory (except those kept in place).
    #[serde(serialize_with = "secs")]
    pub spill: Duration,
    /// Device bytes spilled for the switch.
    pub spilled_bytes: u64,
    /// Device bytes of idle spillable data the new pools took over in place, without a copy.
    pub kept_in_place_bytes: u64,
    /// Device bytes brought back after it (`spill.eager_unspill`).
    pub unspilled_bytes: u64,
    /// Bringing them back.
    #[serde(serialize_with = "secs")]
    pub unspill: Duration,
    /// Looking for live allocations.
    #[serde(serialize_with = "secs")]
    pub check: Duration,
    /// Replacing the stacks (devices in parallel): releasing or handing over memory, building.
    #[serde(serialize_with = "secs")]
    pub build: Duration,
    /// Installing them (and re-spawning workers when the layout changed).
    #[serde(serialize_with = "secs")]
    pub install: Duration,
    /// Everything.
    #[serde(serialize_with = "secs")]
    pub total: Duration,
    /// Bytes the old pools gave back to the driver.
    pub released_bytes: u64,
    /// Bytes the new pools took over from the old ones (no driver call).
    pub adopted_bytes: u64,
    /// True when the workers were re-spawned (devices or workers per device changed).
    pub respawned: bool,
    /// What changed for data still alive: a device left or stopped spilling with spillable data
    /// alive (where it goes now); data `spill.eager_unspill` could not bring back (back on use).
    pub notes: Vec<String>,
}

impl fmt::Display for ReinitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reinitialize {}: resolve {}, drain {}, spill {} ({} spilled, {} kept in place), check {}, build {} ({} adopted, {} released), install {}, unspill {} ({}){}",
            ms(self.total),
            ms(self.resolve),
            ms(self.drain),
            ms(self.spill),
            fmt_bytes(self.spilled_bytes as usize),
            fmt_bytes(self.kept_in_place_bytes as usize),
            ms(self.check),
            ms(self.build),
            fmt_bytes(self.adopted_bytes as usize),
            fmt_bytes(self.released_bytes as usize),
            ms(self.install),
            ms(self.unspill),
            fmt_bytes(self.unspilled_bytes as usize),
            if self.respawned {
                " (workers re-spawned)"
            } else {
                ""
            }
        )?;
        for note in &self.notes {
            write!(f, "; note: {note}")?;
        }
        Ok(())
    }
}

/// The time of each step of start-up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StartReport {
    /// Opening the backend, taking the devices' inventory and resolving the configuration.
    #[serde(serialize_with = "secs")]
    pub resolve: Duration,
    /// Building every device's stack and its workers' streams (all devices in parallel).
    #[serde(serialize_with = "secs")]
    pub build: Duration,
    /// Installing the stacks and starting the workers.
    #[serde(serialize_with = "secs")]
    pub install: Duration,
    /// Everything.
    #[serde(serialize_with = "secs")]
    pub total: Duration,
}

impl fmt::Display for StartReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "start {}: resolve {}, build {}, install {}",
            ms(self.total),
            ms(self.resolve),
            ms(self.build),
            ms(self.install)
        )
    }
}

/// What a shutdown found.
#[derive(Debug, Clone, Serialize)]
pub struct ShutdownReport {
    /// True when every task finished within the timeout (else the queued ones were cancelled).
    pub drained: bool,
    /// Allocations still live per device (leaks).
    #[serde(skip)]
    pub leaks: Vec<LiveMemory>,
    /// How long it took.
    #[serde(serialize_with = "secs")]
    pub elapsed: Duration,
}

/// The runtime's figures at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeReport {
    /// The backend.
    pub backend: String,
    /// Time since start.
    #[serde(serialize_with = "secs")]
    pub uptime: Duration,
    /// Every worker.
    pub workers: Vec<WorkerReport>,
    /// Every device.
    pub devices: Vec<DeviceReport>,
    /// Start-up.
    pub start: StartReport,
    /// Reinitializations done.
    pub reinitializations: u64,
    /// The last one.
    pub last_reinitialize: Option<ReinitReport>,
}

impl RuntimeReport {
    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"serializing the report: {e}\"}}"))
    }
}

impl fmt::Display for RuntimeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "backend: {}; up {:.3} s",
            self.backend,
            self.uptime.as_secs_f64()
        )?;
        writeln!(
            f,
            "{:<8} {:>12} {:>12} {:>8} {:>8}",
            "worker", "tasks", "busy", "queued", "panics"
        )?;
        for w in &self.workers {
            writeln!(
                f,
                "{:<8} {:>12} {:>12} {:>8} {:>8}",
                w.id.to_string(),
                w.tasks_run,
                format!("{:.3} s", w.busy.as_secs_f64()),
                w.queued,
                w.panics
            )?;
        }
        writeln!(
            f,
            "{:<8} {:>12} {:>12} {:>12}  stack",
            "device", "live", "live bytes", "reserved"
        )?;
        for d in &self.devices {
            writeln!(
                f,
                "{:<8} {:>12} {:>12} {:>12}  {}",
                d.device,
                d.live_allocations,
                fmt_bytes(d.live_bytes as usize),
                fmt_bytes(d.reserved_bytes as usize),
                d.stack
            )?;
            if let Some(p) = &d.pool {
                writeln!(f, "         {p}")?;
            }
            if d.phases.len() > 1 {
                for p in &d.phases {
                    writeln!(f, "         phase {}: {p}", p.phase)?;
                }
                writeln!(f, "         all phases: {}", d.totals)?;
            }
            let statistics = d.statistics.as_ref().map(ToString::to_string);
            let spill = d.spill.as_ref().map(ToString::to_string);
            for line in statistics.iter().chain(&spill).flat_map(|s| s.lines()) {
                writeln!(f, "         {line}")?;
            }
        }
        writeln!(f, "{}", self.start)?;
        write!(f, "reinitializations: {}", self.reinitializations)?;
        if let Some(r) = &self.last_reinitialize {
            write!(f, "; last: {r}")?;
        }
        Ok(())
    }
}
