//! The runtime: workers × devices, task submission, reinitialize, shutdown.
//!
//! # Life of a runtime
//! [`Runtime::start`] resolves the configuration against the devices present, builds every
//! device's [`DeviceStack`] in parallel (rayon) with its workers' streams, installs each stack
//! as its device's current resource and starts `workers_per_device` threads per device. If any
//! device fails, everything built is freed and no worker starts.
//!
//! [`RuntimeHandle::reinitialize`] is a transaction over all devices: resolve (a bad
//! configuration changes nothing) → hold new submissions from outside and pause the workers
//! (no queued top-level task starts) → let running tasks and the children they submit finish
//! → refuse if allocations are still live → per device, in parallel: the old stack gives back
//! what the new one cannot take over, the new stack is built (its pool adopting the old
//! pool's free memory), the old one gives back the rest; a failure keeps the old stacks
//! installed (they grow again on demand) → install → re-spawn workers if the device list or
//! `workers_per_device` changed (queued tasks move to the new workers) → resume, send on what
//! was held. Queued tasks then run on the new stacks.
//!
//! A running task that waits for a queued top-level task (one submitted from outside, or
//! from a thread the task started) cannot finish while the runtime is paused: reinitialize
//! then fails with [`Error::DrainTimeout`] after the drain timeout and changes nothing.
//!
//! # Submission
//! Every worker has two queues (top-level tasks, and children of running tasks, served
//! first) and a load count (queued + running). A task goes to the
//! least-loaded worker overall ([`RuntimeHandle::submit`]) or of one device
//! ([`RuntimeHandle::submit_to_device`]), to one worker, or to every worker
//! ([`RuntimeHandle::run_on_all`]). While a reinitialize is in progress, submissions from
//! outside the runtime are held and sent on afterwards; submissions from inside a task go
//! straight through, since the task that makes them may wait for them.

use std::collections::BTreeMap;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;
use rayon::prelude::*;
use rmm_allocator::backend::{self, Backend, BackendChoice, BackendKind};
use rmm_allocator::{Device, StreamView};
use rmm_config::{Config, ConfigLoader, DeviceFacts, ResolvedConfig};

use crate::error::{Error, LiveMemory, Result, TaskError};
use crate::inventory::Inventory;
use crate::report::{
    DeviceReport, PhaseStatistics, ReinitReport, RuntimeReport, ShutdownReport, StartReport,
    WorkerReport,
};
use crate::spill::SpillManager;
use crate::stack::{DeviceStack, StackPlan};
use crate::streams::WorkerStream;
use crate::task::{self, Job, TaskContext, TaskHandle};
use crate::worker::{self, Queued, Target, WorkerId, WorkerShared};

/// How long reinitialize and shutdown wait for queued and running tasks by default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Device ordinal → id of the runtime that manages it.
static OWNERS: LazyLock<Mutex<BTreeMap<u32, u64>>> = LazyLock::new(Default::default);

/// Opens the backend `choice` names as the process-wide one, or checks that the one already
/// in use agrees with it (`auto` accepts any).
pub fn open_backend(choice: rmm_config::Backend) -> Result<&'static dyn Backend> {
    let wanted = match choice {
        rmm_config::Backend::Auto => None,
        rmm_config::Backend::Cuda => Some(BackendKind::Cuda),
        rmm_config::Backend::Sim => Some(BackendKind::Sim),
    };
    let check = |b: &'static dyn Backend| match wanted {
        Some(kind) if b.kind() != kind => Err(Error::BackendMismatch {
            requested: kind.name(),
            active: b.kind().name(),
        }),
        _ => Ok(b),
    };
    if let Some(b) = backend::installed() {
        return check(b);
    }
    let b = match wanted {
        None => return Ok(backend::global()?),
        Some(BackendKind::Cuda) => backend::open(BackendChoice::Cuda)?,
        Some(BackendKind::Sim) => backend::open(BackendChoice::Sim)?,
    };
    match backend::install_global(b) {
        Ok(()) => Ok(b),
        Err(existing) => check(existing),
    }
}

/// What the devices of `backend` report, for resolving a configuration.
pub fn device_facts(backend: &'static dyn Backend) -> Result<Vec<DeviceFacts>> {
    Ok(Inventory::of(backend)?
        .devices
        .into_iter()
        .map(|d| DeviceFacts {
            ordinal: d.ordinal,
            uuid: d.uuid,
            total_memory: d.total_memory as u64,
            free_memory: d.free_memory as u64,
        })
        .collect())
}

/// One configuration's devices, stacks and workers.
pub(crate) struct Generation {
    pub(crate) config: ResolvedConfig,
    pub(crate) stacks: Vec<Arc<DeviceStack>>,
    /// Each device's spill manager, when it spills (same order as `stacks`).
    pub(crate) managers: Vec<Option<Arc<SpillManager>>>,
    workers: Vec<Arc<WorkerShared>>,
    /// Indices into `workers` of each device (same order as `stacks`).
    by_device: Vec<Range<usize>>,
}

impl Generation {
    fn empty(config: ResolvedConfig) -> Generation {
        Generation {
            config,
            stacks: Vec::new(),
            managers: Vec::new(),
            workers: Vec::new(),
            by_device: Vec::new(),
        }
    }

    fn pick(&self, target: Target) -> std::result::Result<&Arc<WorkerShared>, TaskError> {
        let range = match target {
            Target::Any => 0..self.workers.len(),
            Target::Device(d) => self
                .stacks
                .iter()
                .position(|s| s.device().ordinal() == d)
                .map(|i| self.by_device[i].clone())
                .ok_or_else(|| TaskError::NoSuchTarget {
                    target: format!("device {d}"),
                    have: self.describe_devices(),
                })?,
            Target::Worker(id) => {
                return self.workers.iter().find(|w| w.id == id).ok_or_else(|| {
                    TaskError::NoSuchTarget {
                        target: format!("worker {id}"),
                        have: format!(
                            "workers {}",
                            self.workers
                                .iter()
                                .map(|w| w.id.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                });
            }
        };
        least_loaded(&self.workers[range]).ok_or_else(|| TaskError::NoSuchTarget {
            target: "worker".into(),
            have: "no workers".into(),
        })
    }

    fn describe_devices(&self) -> String {
        let list: Vec<String> = self
            .stacks
            .iter()
            .map(|s| s.device().ordinal().to_string())
            .collect();
        format!("devices {}", list.join(", "))
    }

    fn layout(&self) -> (Vec<u32>, u32) {
        (
            self.config.devices.iter().map(|d| d.ordinal).collect(),
            self.config.workers_per_device,
        )
    }

    /// Tasks queued or running on every worker.
    fn queued(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.load.load(Ordering::SeqCst))
            .sum()
    }

    /// Tasks running, and children of running tasks queued, on every worker (one counter
    /// shared by all of them).
    fn active(&self) -> usize {
        self.workers
            .first()
            .map_or(0, |w| w.active.load(Ordering::SeqCst))
    }
}

thread_local! {
    /// Rotates the scan start so that ties spread over the workers.
    static ROTATE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn least_loaded(workers: &[Arc<WorkerShared>]) -> Option<&Arc<WorkerShared>> {
    let n = workers.len();
    if n == 0 {
        return None;
    }
    let start = ROTATE.with(|r| {
        let v = r.get().wrapping_add(1);
        r.set(v);
        v
    });
    let mut best = &workers[start % n];
    let mut best_load = best.load.load(Ordering::Relaxed);
    for i in 1..n {
        if best_load == 0 {
            break;
        }
        let w = &workers[(start + i) % n];
        let l = w.load.load(Ordering::Relaxed);
        if l < best_load {
            best = w;
            best_load = l;
        }
    }
    Some(best)
}

/// Held by reinitialize and shutdown for their whole run (they exclude each other).
struct Control {
    threads: Vec<JoinHandle<Option<Queued>>>,
}

/// What the report tells of past reinitializes. Apart from [`Control`] so that a task can
/// ask for a report while a reinitialize waits for it to finish.
#[derive(Default)]
struct History {
    start: StartReport,
    reinitializations: u64,
    last_reinitialize: Option<ReinitReport>,
    /// Per device, the allocation figures of the phases reinitializes ended (their stacks
    /// are gone, and with them their statistics).
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
    /// Running tasks plus queued children, all workers (see [`WorkerShared::active`]).
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

    fn dispatch(&self, target: Target, job: Box<dyn Job>) {
        let inside = worker::current().is_some_and(|(id, _)| id == self.id);
        if inside {
            // A child of a running task: never held or paused (the task may wait for it).
            let generation = self.generation.load();
            return match generation.pick(target) {
                Ok(w) => w.send_nested(target, job),
                Err(e) => job.cancel(e),
            };
        }
        self.entering.fetch_add(1, Ordering::SeqCst);
        if self.shut_down.load(Ordering::SeqCst) {
            self.entering.fetch_sub(1, Ordering::SeqCst);
            return job.cancel(TaskError::ShutDown);
        }
        if self.holding.load(Ordering::SeqCst) {
            let mut held = self.held.lock();
            if self.holding.load(Ordering::SeqCst) {
                held.push((target, job));
                self.entering.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        self.send(target, job);
        self.entering.fetch_sub(1, Ordering::SeqCst);
    }

    fn send(&self, target: Target, job: Box<dyn Job>) {
        let generation = self.generation.load();
        match generation.pick(target) {
            Ok(w) => w.send(target, job),
            Err(e) => job.cancel(e),
        }
    }

    /// Holds outside submissions and stops workers from starting top-level tasks.
    fn pause(&self) {
        self.holding.store(true, Ordering::SeqCst);
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Lets workers start tasks again and sends on what was held.
    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        let held = {
            let mut held = self.held.lock();
            self.holding.store(false, Ordering::SeqCst);
            std::mem::take(&mut *held)
        };
        for (target, job) in held {
            self.send(target, job);
        }
    }

    /// Waits until no outside submitter is mid-send and `busy(generation)` is 0: for
    /// reinitialize, the running tasks and their queued children ([`Generation::active`]);
    /// for shutdown, everything queued too ([`Generation::queued`]).
    fn drain(
        &self,
        what: &'static str,
        timeout: Duration,
        busy: fn(&Generation) -> usize,
    ) -> Result<()> {
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            let generation = self.generation.load();
            if self.entering.load(Ordering::SeqCst) == 0 && busy(&generation) == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(Error::DrainTimeout {
                    what,
                    tasks: busy(&generation),
                    waited: start.elapsed(),
                });
            }
            rounds += 1;
            if rounds < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn check_outside(&self, what: &'static str) -> Result<()> {
        match worker::current() {
            Some((id, worker)) if id == self.id => Err(Error::InsideWorker { what, worker }),
            _ => Ok(()),
        }
    }
}

/// Claims `devices` for runtime `id`; fails if another runtime has one.
fn claim(id: u64, devices: &[u32]) -> Result<()> {
    let mut owners = OWNERS.lock();
    if let Some(&device) = devices
        .iter()
        .find(|d| owners.get(d).is_some_and(|&o| o != id))
    {
        return Err(Error::DeviceInUse { device });
    }
    owners.retain(|_, o| *o != id);
    for &d in devices {
        owners.insert(d, id);
    }
    Ok(())
}

fn unclaim(id: u64) {
    OWNERS.lock().retain(|_, o| *o != id);
}

/// One device set up: its stack, its workers' streams, and what the stack it replaced gave
/// back to the driver.
struct DeviceSetup {
    stack: Arc<DeviceStack>,
    streams: Vec<WorkerStream>,
    released: u64,
}

/// Builds every device's stack (and `streams_per_device` streams) in parallel, each
/// replacing its device's stack in `previous` if there is one. All or nothing: on any
/// failure everything built is dropped (freed) and the first failing device is named.
fn set_up_devices(
    config: &ResolvedConfig,
    streams_per_device: u32,
    previous: Option<&Generation>,
    managers: &[Option<Arc<SpillManager>>],
) -> Result<Vec<DeviceSetup>> {
    let results: Vec<Result<DeviceSetup>> = config
        .devices
        .par_iter()
        .zip(managers.par_iter())
        .map(|(device, manager)| {
            let on_oom = manager.as_ref().map(|m| m.oom_handler());
            let fail = |source| Error::DeviceSetup {
                device: device.ordinal,
                source,
            };
            let replaced = previous.and_then(|g| {
                g.stacks
                    .iter()
                    .find(|s| s.device().ordinal() == device.ordinal)
            });
            let plan = StackPlan::new(config, device);
            let (stack, released) = match replaced {
                Some(previous) => plan.replace(previous, on_oom).map_err(fail)?,
                None => (plan.build_with(on_oom).map_err(fail)?, 0),
            };
            let dev = stack.device();
            let streams = (0..streams_per_device)
                .map(|_| WorkerStream::take(dev))
                .collect::<rmm_allocator::Result<Vec<_>>>()
                .map_err(fail)?;
            Ok(DeviceSetup {
                stack: Arc::new(stack),
                streams,
                released,
            })
        })
        .collect();
    // Collecting into Result drops every built stack on the first error.
    results.into_iter().collect()
}

/// Resolves `config` against the devices present; with `held`, a device's free memory counts
/// what the stack in `held` would give back, so `"auto"` sizes see the device as it will be.
fn resolve(
    backend: &'static dyn Backend,
    config: &Config,
    held: Option<&Generation>,
) -> Result<ResolvedConfig> {
    let mut facts = device_facts(backend)?;
    if let Some(generation) = held {
        for f in &mut facts {
            if let Some(s) = generation
                .stacks
                .iter()
                .find(|s| s.device().ordinal() == f.ordinal)
            {
                let live = s.live().bytes;
                let held_back = s.reserved_bytes().saturating_sub(live);
                f.free_memory = (f.free_memory + held_back).min(f.total_memory);
            }
        }
    }
    Ok(config.resolve(&facts)?)
}

/// Starts a runtime from code: the configuration comes from a [`ConfigLoader`] (by default
/// `./rmm.toml` or `RMM_CONFIG`, then `RMM_*` variables) or a ready [`Config`], with overrides.
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

    /// Overrides one key in code (e.g. `"pool.initial_size"`, `"8GiB"`).
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
    pub fn start(self) -> Result<Runtime> {
        let config = match self.config {
            Some(c) => c,
            None => self.loader.load()?,
        };
        Runtime::start_with(&config, self.drain_timeout)
    }
}

/// The runtime: workers on every configured device, each with its device's stack current.
/// Dropping it shuts it down ([`Runtime::shutdown`]). Submission and reinitialize are on
/// [`RuntimeHandle`], which it dereferences to and which tasks receive.
#[derive(Debug)]
pub struct Runtime {
    handle: RuntimeHandle,
}

/// A cheap, clonable handle for submitting tasks to a runtime and reinitializing it. Tasks get
/// one through [`TaskContext::runtime`]. After shutdown, submissions fail with
/// [`TaskError::ShutDown`].
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
    /// A builder (configuration from `./rmm.toml` / `RMM_CONFIG` and the environment unless
    /// told otherwise).
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// Starts the runtime `config` describes.
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
            }),
            history: Mutex::new(History::default()),
            managers: Mutex::new(BTreeMap::new()),
            drain_timeout,
            started,
        });
        let handle = RuntimeHandle { shared };
        let t = Instant::now();
        let result = handle.managers_for(&resolved).and_then(|managers| {
            let s = set_up_devices(&resolved, resolved.workers_per_device, None, &managers)?;
            start.build = t.elapsed();
            let t = Instant::now();
            handle.install_and_spawn(resolved, s, managers)?;
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

    /// Waits up to the drain timeout for queued and running tasks, cancels what is left,
    /// stops and joins the workers, reports live allocations as leaks (through `tracing`,
    /// with their sites when tracking is on), gives every pool's memory back and puts each
    /// device back on a plain `CudaMemoryResource`.
    pub fn shutdown(self) -> Result<ShutdownReport> {
        let timeout = self.handle.shared.drain_timeout;
        self.handle.shutdown_inner(timeout)
    }

    /// As [`Runtime::shutdown`] with a drain timeout of its own.
    pub fn shutdown_timeout(self, timeout: Duration) -> Result<ShutdownReport> {
        self.handle.shutdown_inner(timeout)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !self.handle.shared.shut_down.load(Ordering::SeqCst)
            && let Err(e) = self.handle.shutdown_inner(self.handle.shared.drain_timeout)
        {
            tracing::error!("shutting the runtime down: {e}");
        }
    }
}

impl RuntimeHandle {
    pub(crate) fn id(&self) -> u64 {
        self.shared.id
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Runs `f` on the least-loaded worker of any device.
    pub fn submit<F, T>(&self, f: F) -> TaskHandle<T>
    where
        F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (job, handle) = task::job(f);
        self.shared.dispatch(Target::Any, job);
        handle
    }

    /// Runs `f` on the least-loaded worker of device `device` (an ordinal).
    pub fn submit_to_device<F, T>(&self, device: u32, f: F) -> TaskHandle<T>
    where
        F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (job, handle) = task::job(f);
        self.shared.dispatch(Target::Device(device), job);
        handle
    }

    /// Runs `f` on worker `worker`.
    pub fn submit_to_worker<F, T>(&self, worker: WorkerId, f: F) -> TaskHandle<T>
    where
        F: FnOnce(&TaskContext<'_>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (job, handle) = task::job(f);
        self.shared.dispatch(Target::Worker(worker), job);
        handle
    }

    /// Runs `f` once on every worker (Dask's `client.run`); the handles are in the order of
    /// [`RuntimeHandle::workers`].
    pub fn run_on_all<F, T>(&self, f: F) -> Vec<TaskHandle<T>>
    where
        F: Fn(&TaskContext<'_>) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        let f = Arc::new(f);
        self.workers()
            .into_iter()
            .map(|id| {
                let f = Arc::clone(&f);
                self.submit_to_worker(id, move |ctx| f(ctx))
            })
            .collect()
    }

    /// Runs `f` on each item, each as its own task on the least-loaded worker; the handles
    /// are in the items' order.
    pub fn map<I, F, T>(&self, items: impl IntoIterator<Item = I>, f: F) -> Vec<TaskHandle<T>>
    where
        I: Send + 'static,
        F: Fn(&TaskContext<'_>, I) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        let f = Arc::new(f);
        items
            .into_iter()
            .map(|item| {
                let f = Arc::clone(&f);
                self.submit(move |ctx| f(ctx, item))
            })
            .collect()
    }

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
        self.shared
            .generation()
            .stacks
            .iter()
            .find(|s| s.device().ordinal() == device)
            .cloned()
    }

    /// Loads the configuration with `loader` and reinitializes to it.
    pub fn reinitialize_with(&self, loader: &ConfigLoader) -> Result<ReinitReport> {
        self.reinitialize(&loader.load()?)
    }

    /// Switches every device to the stack `config` describes, keeping the runtime running:
    /// see the module documentation for the steps. A configuration that does not resolve,
    /// live allocations, or a device whose new stack cannot be built leave the runtime as it
    /// was (old stacks installed and working) and return the error.
    pub fn reinitialize(&self, config: &Config) -> Result<ReinitReport> {
        let shared = &*self.shared;
        shared.check_outside("reinitialize")?;
        let mut control = shared.control.lock();
        if shared.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let _span = tracing::info_span!("reinitialize").entered();
        let mut report = ReinitReport::default();
        let total = Instant::now();
        let t = Instant::now();
        let old = shared.generation();
        if let rmm_config::Backend::Cuda | rmm_config::Backend::Sim = config.backend {
            open_backend(config.backend)?;
        }
        let resolved = resolve(shared.backend, config, Some(&old))?;
        let ordinals: Vec<u32> = resolved.devices.iter().map(|d| d.ordinal).collect();
        let old_ordinals: Vec<u32> = old.stacks.iter().map(|s| s.device().ordinal()).collect();
        // Old and new devices both belong to this runtime until the switch is decided.
        let both: Vec<u32> = old_ordinals
            .iter()
            .chain(&ordinals)
            .copied()
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .collect();
        claim(shared.id, &both)?;
        report.resolve = t.elapsed();

        let t = Instant::now();
        shared.pause();
        let result = self.switch(&mut control, &old, resolved, &mut report, t);
        shared.resume();
        // Keep the devices of the configuration now in force (a subset of what is claimed,
        // so this cannot conflict).
        let keep = if result.is_ok() {
            &ordinals
        } else {
            &old_ordinals
        };
        if let Err(e) = claim(shared.id, keep) {
            tracing::error!("narrowing the devices this runtime claims: {e}");
        }
        result?;
        report.total = total.elapsed();
        report.devices = ordinals;
        let mut history = shared.history.lock();
        // The old stacks served their last allocation: their figures end their phase.
        let ended = history.reinitializations;
        for s in &old.stacks {
            history
                .phases
                .entry(s.device().ordinal())
                .or_default()
                .push(PhaseStatistics::of(ended, s));
        }
        history.reinitializations += 1;
        history.last_reinitialize = Some(report.clone());
        drop(history);
        tracing::info!(total_ms = report.total.as_secs_f64() * 1e3, "reinitialized");
        Ok(report)
    }

    /// The part of reinitialize that runs with submissions held.
    fn switch(
        &self,
        control: &mut Control,
        old: &Generation,
        resolved: ResolvedConfig,
        report: &mut ReinitReport,
        drain_start: Instant,
    ) -> Result<()> {
        let shared = &*self.shared;
        shared.drain("reinitialize", shared.drain_timeout, Generation::active)?;
        report.drain = drain_start.elapsed();

        // Spillable data moves to host memory: it survives the switch and comes back, into
        // the new stacks, on next use. A buffer in use stays, and counts as live below.
        let t = Instant::now();
        let managers: Vec<Arc<SpillManager>> = shared.managers.lock().values().cloned().collect();
        let spilled: Vec<rmm_allocator::Result<u64>> =
            managers.par_iter().map(|m| m.spill_all()).collect();
        for (m, r) in managers.iter().zip(spilled) {
            report.spilled_bytes += r.map_err(|source| Error::DeviceSetup {
                device: m.device().ordinal(),
                source,
            })?;
        }
        report.spill = t.elapsed();

        let t = Instant::now();
        let live: Vec<LiveMemory> = old
            .stacks
            .par_iter()
            .map(|s| s.live())
            .filter(|l| l.count > 0)
            .collect();
        if !live.is_empty() {
            return Err(Error::LiveAllocations(live));
        }
        report.check = t.elapsed();

        // Per device, in parallel: the old stack gives back what the new one cannot take
        // over, the new pool adopts the rest of the old pool's memory (no driver call), the
        // old stack gives back what is left.
        let t = Instant::now();
        let respawn = old.layout()
            != (
                resolved.devices.iter().map(|d| d.ordinal).collect(),
                resolved.workers_per_device,
            )
            // A generation left without workers by a failed start of its threads.
            || old.workers.len() != old.stacks.len() * old.config.workers_per_device as usize;
        let streams = if respawn {
            resolved.workers_per_device
        } else {
            0
        };
        let held_before: u64 = old.stacks.iter().map(|s| s.reserved_bytes()).sum();
        let managers = self.managers_for(&resolved)?;
        let setups = set_up_devices(&resolved, streams, Some(old), &managers)?;
        // The new spill settings apply once the new stacks exist: a failed reinitialize leaves
        // the runtime as it was, limits included.
        for (d, m) in resolved.devices.iter().zip(&managers) {
            if let (Some(spill), Some(m)) = (&d.spill, m) {
                m.reconfigure(spill);
            }
        }
        // Devices that leave the runtime give everything back.
        for s in &old.stacks {
            if !setups.iter().any(|n| n.stack.device() == s.device()) {
                report.released_bytes += s.release().map_err(|source| Error::DeviceSetup {
                    device: s.device().ordinal(),
                    source,
                })?;
            }
        }
        report.released_bytes += setups.iter().map(|s| s.released).sum::<u64>();
        let held_after: u64 = old.stacks.iter().map(|s| s.reserved_bytes()).sum();
        report.adopted_bytes = held_before
            .saturating_sub(held_after)
            .saturating_sub(report.released_bytes);
        report.build = t.elapsed();

        let t = Instant::now();
        if respawn {
            report.respawned = true;
            // Paused and drained: no worker runs a task, so each stops at once. What was
            // queued for them goes to the new workers by the rule it was sent with.
            let queued = self.stop_workers(control, None);
            for s in &old.stacks {
                if !setups.iter().any(|n| n.stack.device() == s.device())
                    && let Err(e) = s.uninstall()
                {
                    tracing::error!("uninstalling device {}'s stack: {e}", s.device().ordinal());
                }
            }
            // From here on the old workers are gone: on failure the generation is left
            // empty, so these tasks (and later ones) are refused rather than stranded.
            let spawned = self.install_and_spawn_locked(control, resolved, setups, managers);
            for (target, job) in queued {
                shared.send(target, job);
            }
            spawned?;
        } else {
            let stacks: Vec<Arc<DeviceStack>> = setups.into_iter().map(|s| s.stack).collect();
            install(&stacks, &old.stacks)?;
            shared.generation.store(Arc::new(Generation {
                config: resolved,
                stacks,
                managers,
                workers: old.workers.clone(),
                by_device: old.by_device.clone(),
            }));
        }
        report.install = t.elapsed();

        // With `spill.eager_unspill`, spilled data comes back now (up to each limit).
        let t = Instant::now();
        let generation = shared.generation();
        let eager: Vec<&Arc<SpillManager>> = generation
            .managers
            .iter()
            .flatten()
            .filter(|m| m.eager_unspill())
            .collect();
        let back: Vec<rmm_allocator::Result<u64>> = eager
            .par_iter()
            .map(|m| m.unspill_all(StreamView::DEFAULT))
            .collect();
        for (m, r) in eager.iter().zip(back) {
            report.unspilled_bytes += r.map_err(|source| Error::DeviceSetup {
                device: m.device().ordinal(),
                source,
            })?;
        }
        report.unspill = t.elapsed();
        Ok(())
    }

    /// Each device's spill manager under `resolved` (made, and its host memory pinned, the
    /// first time a device spills; reconfigured after).
    fn managers_for(&self, resolved: &ResolvedConfig) -> Result<Vec<Option<Arc<SpillManager>>>> {
        let mut map = self.shared.managers.lock();
        resolved
            .devices
            .iter()
            .map(|d| {
                let Some(spill) = &d.spill else {
                    return Ok(None);
                };
                // An existing manager keeps its settings until the caller reconfigures it.
                if let Some(m) = map.get(&d.ordinal) {
                    return Ok(Some(Arc::clone(m)));
                }
                let device = Device::on(self.shared.backend, d.ordinal)?;
                let m = Arc::new(SpillManager::new(device, spill).map_err(|source| {
                    Error::DeviceSetup {
                        device: d.ordinal,
                        source,
                    }
                })?);
                map.insert(d.ordinal, Arc::clone(&m));
                Ok(Some(m))
            })
            .collect()
    }

    fn install_and_spawn(
        &self,
        resolved: ResolvedConfig,
        setups: Vec<DeviceSetup>,
        managers: Vec<Option<Arc<SpillManager>>>,
    ) -> Result<()> {
        let mut control = self.shared.control.lock();
        self.install_and_spawn_locked(&mut control, resolved, setups, managers)
    }

    /// Installs the stacks, publishes a generation with fresh workers and starts them.
    fn install_and_spawn_locked(
        &self,
        control: &mut Control,
        resolved: ResolvedConfig,
        setups: Vec<DeviceSetup>,
        managers: Vec<Option<Arc<SpillManager>>>,
    ) -> Result<()> {
        let mut stacks = Vec::with_capacity(setups.len());
        let mut workers = Vec::new();
        let mut queues = Vec::new();
        let mut by_device = Vec::with_capacity(setups.len());
        for (slot, setup) in setups.into_iter().enumerate() {
            let device = setup.stack.device().ordinal();
            let first = workers.len();
            for (index, stream) in setup.streams.into_iter().enumerate() {
                let id = WorkerId {
                    device,
                    index: index as u32,
                };
                let (w, q) = WorkerShared::new(id, slot, Arc::clone(&self.shared.active));
                workers.push(w);
                queues.push((q, stream));
            }
            by_device.push(first..workers.len());
            stacks.push(setup.stack);
        }
        if let Err(e) = install(&stacks, &[]) {
            let config = resolved.clone();
            self.shared
                .generation
                .store(Arc::new(Generation::empty(config)));
            return Err(e);
        }
        self.shared.generation.store(Arc::new(Generation {
            config: resolved,
            stacks,
            managers,
            workers: workers.clone(),
            by_device,
        }));
        for (w, (q, stream)) in workers.into_iter().zip(queues) {
            let id = w.id;
            match worker::spawn(self.clone(), w, q, stream) {
                Ok(thread) => control.threads.push(thread),
                Err(source) => {
                    let why = format!("worker {id} could not be started");
                    for (_, job) in self.stop_workers(control, Some(&why)) {
                        job.cancel(TaskError::Cancelled {
                            reason: why.clone(),
                        });
                    }
                    let generation = self.shared.generation();
                    for s in &generation.stacks {
                        let _ = s.uninstall();
                    }
                    let config = generation.config.clone();
                    self.shared
                        .generation
                        .store(Arc::new(Generation::empty(config)));
                    return Err(Error::Spawn { worker: id, source });
                }
            }
        }
        Ok(())
    }

    /// Stops and joins every worker; returns the top-level tasks they had not started, or
    /// with `cancel`, cancels them (with `why`) before joining, so that a running task
    /// waiting for one of them finishes instead of waiting for a worker that has stopped.
    fn stop_workers(&self, control: &mut Control, cancel: Option<&str>) -> Vec<Queued> {
        let generation = self.shared.generation();
        for w in &generation.workers {
            w.stop();
        }
        let mut left: Vec<Queued> = generation
            .workers
            .iter()
            .flat_map(|w| w.take_queued())
            .collect();
        if let Some(why) = cancel {
            for (_, job) in left.drain(..) {
                job.cancel(TaskError::Cancelled { reason: why.into() });
            }
        }
        for thread in control.threads.drain(..) {
            match thread.join() {
                Ok(aside) => left.extend(aside),
                Err(_) => tracing::error!("a worker thread panicked outside a task"),
            }
        }
        for w in &generation.workers {
            left.extend(w.take_queued());
        }
        left
    }

    fn shutdown_inner(&self, timeout: Duration) -> Result<ShutdownReport> {
        let shared = &*self.shared;
        shared.check_outside("shutdown")?;
        let start = Instant::now();
        let mut control = shared.control.lock();
        if shared.shut_down.swap(true, Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let _span = tracing::info_span!("runtime shutdown").entered();
        let drained = shared.drain("shutdown", timeout, Generation::queued);
        if let Err(e) = &drained {
            tracing::warn!("{e}; cancelling the queued tasks");
        }
        let why = "the runtime shut down before it ran";
        for (_, job) in self.stop_workers(&mut control, Some(why)) {
            job.cancel(TaskError::Cancelled { reason: why.into() });
        }
        // Live spillable data moves to host memory first: it stays valid, and does not keep
        // the old stacks' pools alive (it comes back into whatever the device's resource is
        // when next used).
        let managers: Vec<Arc<SpillManager>> = shared.managers.lock().values().cloned().collect();
        for m in managers {
            if let Err(e) = m.spill_all() {
                tracing::warn!(
                    device = m.device().ordinal(),
                    "spilling before shutdown: {e}; unspilled buffers keep their pool alive"
                );
            }
        }
        let generation = shared.generation();
        let mut leaks = Vec::new();
        for s in &generation.stacks {
            let live = s.live();
            if live.count > 0 {
                tracing::warn!(
                    device = live.device,
                    allocations = live.count,
                    bytes = live.bytes,
                    sites = %live.allocations.join("\n"),
                    "runtime shut down with live allocations (leaked; their memory goes back \
                     to the device when their last owner drops)"
                );
                leaks.push(live);
            }
            if let Err(e) = s.release() {
                tracing::error!("releasing device {}: {e}", s.device().ordinal());
            }
            if let Err(e) = s.uninstall() {
                tracing::error!("uninstalling device {}'s stack: {e}", s.device().ordinal());
            }
        }
        let config = generation.config.clone();
        drop(generation);
        // Dropping the last reference to each stack frees its pool.
        shared.generation.store(Arc::new(Generation::empty(config)));
        // Their pinned host pools go once the last spillable buffer using them does.
        shared.managers.lock().clear();
        unclaim(shared.id);
        Ok(ShutdownReport {
            drained: drained.is_ok(),
            leaks,
            elapsed: start.elapsed(),
        })
    }

    /// Tasks run, busy time and queue length per worker; per device the stack and its
    /// live, reserved and (with `stats.enabled`) statistics figures.
    pub fn report(&self) -> RuntimeReport {
        let shared = &*self.shared;
        let generation = shared.generation();
        let history = shared.history.lock();
        let workers = generation
            .workers
            .iter()
            .map(|w| {
                let load = w.load.load(Ordering::Relaxed);
                WorkerReport {
                    id: w.id,
                    tasks_run: w.tasks_run.load(Ordering::Relaxed),
                    busy: Duration::from_nanos(w.busy_ns.load(Ordering::Relaxed)),
                    queued: load,
                    panics: w.panics.load(Ordering::Relaxed),
                }
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
                phases.push(PhaseStatistics::of(history.reinitializations, s));
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

    /// Spills every spillable buffer of device `device` that is not in use; returns the
    /// device bytes freed (0 when the device does not spill).
    pub fn spill_all(&self, device: u32) -> Result<u64> {
        match self.spill_manager(device) {
            Some(m) => m
                .spill_all()
                .map_err(|source| Error::DeviceSetup { device, source }),
            None => Ok(0),
        }
    }

    /// The backend the runtime runs on.
    pub fn backend(&self) -> &'static dyn Backend {
        self.shared.backend
    }

    /// Device `ordinal` of the runtime's backend.
    pub fn device(&self, ordinal: u32) -> Result<Device> {
        Ok(Device::on(self.shared.backend, ordinal)?)
    }
}

/// Installs every stack as its device's current resource. On failure the devices already
/// switched get back their stack from `previous` (or their initial resource), so no device is
/// left with a stack the runtime does not use.
fn install(stacks: &[Arc<DeviceStack>], previous: &[Arc<DeviceStack>]) -> Result<()> {
    for (i, s) in stacks.iter().enumerate() {
        if let Err(source) = s.install() {
            for done in &stacks[..i] {
                let restored = match previous.iter().find(|p| p.device() == done.device()) {
                    Some(p) => p.install().map(|_| ()),
                    None => done.uninstall(),
                };
                if let Err(e) = restored {
                    tracing::error!("restoring device {}: {e}", done.device().ordinal());
                }
            }
            return Err(Error::DeviceSetup {
                device: s.device().ordinal(),
                source,
            });
        }
    }
    Ok(())
}
