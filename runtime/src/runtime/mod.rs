//! The runtime: workers × devices, task submission, reinitialize, shutdown.
//!
//! # Life of a runtime
//! [`Runtime::start`] resolves the configuration against the devices present, builds every
//! device's [`DeviceStack`] with its workers' streams in parallel (rayon), installs each as its
//! device's current resource and starts `workers_per_device` threads per device; if a device
//! fails, all built is freed and no worker starts. Then tasks are submitted ([`dispatch`]);
//! [`RuntimeHandle::reinitialize`] switches configurations between workloads
//! ([`reinitialize`], [`keep`]); [`Runtime::shutdown`] (or drop) drains, reports leaks and
//! gives the memory back ([`shutdown`]).
//!
//! This module holds the public types ([`Runtime`], [`RuntimeHandle`], [`RuntimeBuilder`]),
//! their shared state, starting, queries and the report. Also: [`backend`] (backend choice,
//! resolution), [`claims`] (one runtime per device), [`setup`] (stacks and workers).

mod backend;
mod claims;
mod dispatch;
mod keep;
mod per_device;
mod reinitialize;
mod setup;
mod shutdown;
mod task;
mod worker;

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;
use rmm_allocator::Device;
use rmm_allocator::backend::Backend;
use rmm_config::{Config, ConfigLoader, ResolvedConfig};

use crate::error::{Error, Result};
use crate::report::{
    DeviceReport, PhaseStatistics, ReinitReport, RuntimeReport, StartReport, WorkerReport,
};
use crate::spill::SpillManager;
use crate::stack::DeviceStack;
use crate::worker_id::WorkerId;
use task::Job;
use worker::{Queued, Target};

use backend::resolve;
use claims::{claim, unclaim};
use setup::set_up_devices;

pub use backend::{device_facts, open_backend};
pub(crate) use dispatch::Generation;
pub use task::{TaskContext, TaskHandle};
/// How long reinitialize and shutdown wait for queued and running tasks by default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Held by reinitialize and shutdown for their whole run (they exclude each other).
struct Control {
    threads: Vec<JoinHandle<Option<Queued>>>,
    /// The configuration in force as loaded: what [`RuntimeHandle::reconfigure`] starts from.
    config: Config,
}

/// Past reinitializes, for the report; apart from [`Control`] so a task can ask for a report
/// while a reinitialize waits for it.
#[derive(Default)]
struct History {
    start: StartReport,
    reinitializations: u64,
    last_reinitialize: Option<ReinitReport>,
    /// Per device, allocation figures of phases ended by reinitializes (their stacks are gone).
    phases: BTreeMap<u32, Vec<PhaseStatistics>>,
}

pub(crate) struct Shared {
    id: u64,
    backend: &'static dyn Backend,
    generation: ArcSwap<Generation>,
    /// True while a reinitialize holds outside submissions.
    holding: AtomicBool,
    /// True while a reinitialize switches stacks: workers start no top-level task.
    paused: AtomicBool,
    /// Outside submitters between their checks and their send.
    entering: AtomicUsize,
    /// Running tasks plus queued children ([`WorkerShared::active`](worker::WorkerShared::active)).
    active: Arc<AtomicUsize>,
    held: Mutex<Vec<(Target, Box<dyn Job>)>>,
    shut_down: AtomicBool,
    control: Mutex<Control>,
    history: Mutex<History>,
    /// Spill managers by device, kept across reinitializes with their buffers.
    managers: Mutex<BTreeMap<u32, Arc<SpillManager>>>,
    drain_timeout: Duration,
    started: Instant,
}

impl Shared {
    pub(crate) fn generation(&self) -> Guard<Arc<Generation>> {
        self.generation.load()
    }

    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Publishes a generation of `config` without stacks or workers: its tasks are refused.
    fn clear_generation(&self, config: ResolvedConfig) {
        self.generation.store(Arc::new(Generation::empty(config)));
    }

    fn check_outside(&self, what: &'static str) -> Result<()> {
        match worker::current() {
            Some((id, worker)) if id == self.id => Err(Error::InsideWorker { what, worker }),
            _ => Ok(()),
        }
    }
}

/// Starts a runtime from code, configured by a [`ConfigLoader`] (by default `./rmm.toml` or
/// `RMM_CONFIG`, then `RMM_*` variables) or a ready [`Config`], with overrides.
///
/// ```no_run
/// # mod rmm { pub use rmm_runtime as runtime; }
/// let runtime = rmm::runtime::Runtime::builder()
///     .set("pool.enabled", true)
///     .set("workers_per_device", 4)
///     .start()?;
/// let device = runtime.submit(|ctx| ctx.device().ordinal()).wait()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RuntimeBuilder {
    loader: ConfigLoader,
    config: Option<Config>,
    drain_timeout: Duration,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder {
            loader: ConfigLoader::new(),
            config: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

impl RuntimeBuilder {
    /// Loads the configuration with `loader` (replacing the default one).
    pub fn loader(mut self, loader: ConfigLoader) -> Self {
        self.loader = loader;
        self
    }

    /// Uses `config` as loaded; [`RuntimeBuilder::set`] overrides are then ignored.
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Overrides one key in code (`"pool.initial_size"`, `"8GiB"`).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<toml::Value>) -> Self {
        self.loader = self.loader.set(key, value);
        self
    }

    /// How long reinitialize and shutdown wait for tasks (default 60 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Loads the configuration and starts the runtime.
    ///
    /// # Errors
    /// [`Error::Config`] when the configuration does not load or resolve; else as
    /// [`Runtime::start`].
    pub fn start(self) -> Result<Runtime> {
        let config = self.config.map_or_else(|| self.loader.load(), Ok)?;
        Runtime::start_with(&config, self.drain_timeout)
    }
}

/// The runtime: workers on every configured device, each with its device's stack current.
/// Dropping it shuts it down ([`Runtime::shutdown`]); it dereferences to [`RuntimeHandle`].
#[derive(Debug)]
pub struct Runtime {
    handle: RuntimeHandle,
}

/// A cheap clonable handle for submitting tasks and reinitializing; tasks get one through
/// [`TaskContext::runtime`](crate::TaskContext::runtime). After shutdown, submissions fail
/// with [`TaskError::ShutDown`](crate::TaskError::ShutDown).
#[derive(Clone)]
pub struct RuntimeHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle")
            .field("id", &self.shared.id)
            .field("workers", &self.workers().len())
            .finish()
    }
}

impl Deref for Runtime {
    type Target = RuntimeHandle;
    fn deref(&self) -> &RuntimeHandle {
        &self.handle
    }
}

impl Runtime {
    /// A builder (configuration from `./rmm.toml` / `RMM_CONFIG` and the environment by default).
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// Starts the runtime `config` describes.
    ///
    /// # Errors
    /// [`Error::Config`]: `config` does not resolve; [`Error::BackendMismatch`]: another backend
    /// is in use; [`Error::DeviceInUse`]: another runtime holds a device; [`Error::DeviceSetup`]:
    /// a stack cannot be built; [`Error::Spawn`]: a worker thread cannot start.
    pub fn start(config: &Config) -> Result<Runtime> {
        Runtime::start_with(config, DEFAULT_DRAIN_TIMEOUT)
    }

    fn start_with(config: &Config, drain_timeout: Duration) -> Result<Runtime> {
        let started = Instant::now();
        let _span = tracing::info_span!("runtime start").entered();
        let backend = open_backend(config.backend)?;
        let resolved = resolve(backend, config, None)?;
        let mut start = StartReport {
            resolve: started.elapsed(),
            ..StartReport::default()
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let ordinals: Vec<u32> = resolved.devices.iter().map(|d| d.ordinal).collect();
        claim(id, &ordinals)?;
        let shared = Arc::new(Shared {
            id,
            backend,
            generation: ArcSwap::from_pointee(Generation::empty(resolved.clone())),
            holding: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            entering: AtomicUsize::new(0),
            active: Arc::new(AtomicUsize::new(0)),
            held: Mutex::new(Vec::new()),
            shut_down: AtomicBool::new(false),
            control: Mutex::new(Control {
                threads: Vec::new(),
                config: config.clone(),
            }),
            history: Mutex::new(History::default()),
            managers: Mutex::new(BTreeMap::new()),
            drain_timeout,
            started,
        });
        let handle = RuntimeHandle { shared };
        let t = Instant::now();
        let result = handle.managers_for(&resolved).and_then(|managers| {
            let s = set_up_devices(&resolved, resolved.workers_per_device, None, &managers, &[])?;
            start.build = t.elapsed();
            let t = Instant::now();
            let mut control = handle.shared.control.lock();
            handle.install_and_spawn_locked(&mut control, resolved, s, managers, |_| {})?;
            start.install = t.elapsed();
            Ok(())
        });
        if let Err(e) = result {
            unclaim(id);
            return Err(e);
        }
        start.total = started.elapsed();
        tracing::debug!("{start}");
        handle.shared.history.lock().start = start;
        tracing::info!(
            devices = ?ordinals,
            workers = handle.workers().len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "runtime started"
        );
        Ok(Runtime { handle })
    }

    /// Another handle on this runtime.
    pub fn handle(&self) -> RuntimeHandle {
        self.handle.clone()
    }
}

impl RuntimeHandle {
    /// Every worker, device by device.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.shared
            .generation()
            .workers
            .iter()
            .map(|w| w.id)
            .collect()
    }

    /// The devices in use, as configured.
    pub fn devices(&self) -> Vec<u32> {
        self.shared
            .generation()
            .stacks
            .iter()
            .map(|s| s.device().ordinal())
            .collect()
    }

    /// The configuration in force, resolved.
    pub fn config(&self) -> ResolvedConfig {
        self.shared.generation().config.clone()
    }

    /// The stack of device `device`, if the runtime uses that device.
    pub fn stack(&self, device: u32) -> Option<Arc<DeviceStack>> {
        stack_on(&self.shared.generation().stacks, device).cloned()
    }

    /// Tasks run, busy time and queue length per worker; per device the stack and its live,
    /// reserved and (with `stats.enabled`) statistics figures.
    pub fn report(&self) -> RuntimeReport {
        let shared = &*self.shared;
        let generation = shared.generation();
        let history = shared.history.lock();
        let workers = generation
            .workers
            .iter()
            .map(|w| WorkerReport {
                id: w.id,
                tasks_run: w.tasks_run.load(Ordering::Relaxed),
                busy: Duration::from_nanos(w.busy_ns.load(Ordering::Relaxed)),
                queued: w.load.load(Ordering::Relaxed),
                panics: w.panics.load(Ordering::Relaxed),
            })
            .collect();
        let devices = generation
            .stacks
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let live = s.live();
                let mut phases = history
                    .phases
                    .get(&s.device().ordinal())
                    .cloned()
                    .unwrap_or_default();
                phases.push(s.phase_statistics(history.reinitializations));
                DeviceReport {
                    totals: PhaseStatistics::combined(&phases),
                    phases,
                    spill: generation
                        .managers
                        .get(i)
                        .and_then(|m| m.as_ref())
                        .map(|m| m.statistics()),
                    device: s.device().ordinal(),
                    stack: s.describe(),
                    live_allocations: live.count,
                    live_bytes: live.bytes,
                    reserved_bytes: s.reserved_bytes(),
                    pool: s.pool_figures(),
                    statistics: s.plan().report_statistics.then(|| s.memory_report()),
                }
            })
            .collect();
        RuntimeReport {
            backend: shared.backend.describe(),
            uptime: shared.started.elapsed(),
            workers,
            devices,
            start: history.start.clone(),
            reinitializations: history.reinitializations,
            last_reinitialize: history.last_reinitialize.clone(),
        }
    }

    /// The spill manager of device `device`, when it spills (`spill.enabled`).
    pub fn spill_manager(&self, device: u32) -> Option<Arc<SpillManager>> {
        self.shared.managers.lock().get(&device).cloned()
    }

    /// Spills every spillable buffer of `device` not in use; returns the bytes freed (0 when the
    /// device does not spill).
    ///
    /// # Errors
    /// [`Error::DeviceSetup`]: a buffer cannot be spilled (full host tier, failed copy or write).
    pub fn spill_all(&self, device: u32) -> Result<u64> {
        match self.spill_manager(device) {
            Some(m) => m.spill_all().map_err(Error::setup(device)),
            None => Ok(0),
        }
    }

    /// The backend the runtime runs on.
    pub fn backend(&self) -> &'static dyn Backend {
        self.shared.backend
    }

    /// Device `ordinal` of the runtime's backend.
    ///
    /// # Errors
    /// [`Error::Allocator`] ([`NoSuchDevice`](rmm_allocator::Error::NoSuchDevice)).
    pub fn device(&self, ordinal: u32) -> Result<Device> {
        Ok(Device::on(self.shared.backend, ordinal)?)
    }
}

/// The stack of device `device` among `stacks`.
fn stack_on(stacks: &[Arc<DeviceStack>], device: u32) -> Option<&Arc<DeviceStack>> {
    stacks.iter().find(|s| s.device().ordinal() == device)
}
