//! Device stacks: one device's memory resource, built exactly as `rmm.toml` configures it.
//!
//! A [`StackPlan`] is what one [`ResolvedDevice`] asks for, layer by layer ([`UpstreamPlan`],
//! [`PoolPlan`]); [`StackPlan::build`] makes it a [`DeviceStack`]; [`DeviceStack::install`]
//! makes that the device's current resource. The runtime, `rmm info` and the Python package
//! all go through these, so a worker gets the stack `rmm info` describes.
//!
//! Layers, bottom to top:
//!
//! | layer | when |
//! |---|---|
//! | `CudaMemoryResource`, `ManagedMemoryResource` or `CudaAsyncMemoryResource` | always one: `pool.managed`, `pool.async`, else plain |
//! | `PoolMemoryResource` (initial, maximum) | `pool.enabled` |
//! | `LimitingResourceAdaptor` | `limits.device_memory_limit` |
//! | `FailureCallbackResourceAdaptor` (spill and retry on out-of-memory) | `spill.enabled` and `spill.on_demand` |
//! | `TrackingResourceAdaptor` | `tracking.enabled` (`tracking.backtraces`) |
//! | `LoggingResourceAdaptor` (one CSV per device in `logging.directory`) | `logging.enabled` and a level other than `off` |
//! | `StatisticsResourceAdaptor` | always |
//!
//! The statistics adaptor is always on top: it counts the live allocations that make a
//! reinitialize refuse and a shutdown report leaks. `stats.enabled` decides whether its full
//! report (peaks, totals, reserved bytes) is in the runtime report.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rmm_allocator::adaptor::{
    FailureCallbackResourceAdaptor, LimitingResourceAdaptor, LoggingResourceAdaptor, MemoryReport,
    StatisticsResourceAdaptor, TrackingResourceAdaptor, chain_names,
};
use rmm_allocator::resource::{
    CudaAsyncMemoryResource, CudaMemoryResource, LiveBlock, ManagedMemoryResource, PoolBuilder,
    PoolMemoryResource, SharedResource, VirtualMemory,
};
use rmm_allocator::{Device, Result, fmt_bytes, per_device};
use rmm_config::{LogLevel, PoolPlan, ResolvedConfig, ResolvedDevice, Switch, UpstreamPlan};
use serde::Serialize;

use crate::error::LiveMemory;
use crate::report::{PhaseStatistics, PoolFigures};

/// One device's configured stack; Display: top first, like [`DeviceStack::describe`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StackPlan {
    /// The device ordinal.
    pub device: u32,
    /// The bottom layer.
    pub upstream: UpstreamPlan,
    /// A pool over the upstream.
    pub pool: Option<PoolPlan>,
    /// A hard cap on bytes in use.
    pub limit: Option<u64>,
    /// Track every live allocation (`Some(true)`: with backtraces).
    pub tracking: Option<bool>,
    /// The CSV event log.
    pub log_file: Option<PathBuf>,
    /// The statistics report is in the runtime report (the adaptor is always there).
    pub report_statistics: bool,
    /// Spill and retry on out-of-memory (`spill.on_demand`; see [`StackPlan::build_with`]).
    pub spill_on_demand: bool,
}

/// Out-of-memory handler: frees `bytes` of device memory by spilling; true if worth a retry.
pub type OomHandler = Arc<dyn Fn(usize) -> bool + Send + Sync>;

impl StackPlan {
    /// The plan for `device` of `config`.
    pub fn new(config: &ResolvedConfig, device: &ResolvedDevice) -> StackPlan {
        StackPlan {
            device: device.ordinal,
            upstream: device.upstream.clone(),
            pool: device.pool,
            limit: device.memory_limit,
            tracking: config.tracking.then_some(config.backtraces),
            log_file: device
                .log_file
                .clone()
                .filter(|_| config.logging_level != LogLevel::Off),
            report_statistics: config.stats,
            spill_on_demand: device.spill.as_ref().is_some_and(|s| s.on_demand),
        }
    }

    /// The layers, top first, each with its settings.
    pub fn layers(&self) -> Vec<String> {
        let mut out = vec!["StatisticsResourceAdaptor".to_string()];
        if let Some(path) = &self.log_file {
            out.push(format!("LoggingResourceAdaptor({})", path.display()));
        }
        match self.tracking {
            Some(true) => out.push("TrackingResourceAdaptor(backtraces)".into()),
            Some(false) => out.push("TrackingResourceAdaptor".into()),
            None => {}
        }
        if self.spill_on_demand {
            out.push("FailureCallbackResourceAdaptor(spill and retry)".into());
        }
        if let Some(limit) = self.limit {
            out.push(format!(
                "LimitingResourceAdaptor({})",
                fmt_bytes(limit as usize)
            ));
        }
        if let Some(pool) = &self.pool {
            // `pool.vmm` shows unless "auto", the default (`chunk_source` says what it chose).
            let vmm = match pool.vmm {
                Switch::Auto => String::new(),
                set => format!(", vmm {set}"),
            };
            out.push(format!(
                "PoolMemoryResource(initial {}, maximum {}, growth {}{vmm})",
                fmt_bytes(pool.initial_size as usize),
                pool.maximum_size
                    .map_or("the device".into(), |m| fmt_bytes(m as usize)),
                fmt_bytes(pool.growth as usize)
            ));
        }
        out.push(match &self.upstream {
            UpstreamPlan::Cuda => "CudaMemoryResource".into(),
            UpstreamPlan::Managed => "ManagedMemoryResource".into(),
            UpstreamPlan::Async {
                release_threshold,
                initial_size,
            } => {
                let mut s = "CudaAsyncMemoryResource(".to_string();
                s += &release_threshold.map_or("keeps all".into(), |t| {
                    format!("release threshold {}", fmt_bytes(t as usize))
                });
                if let Some(i) = initial_size {
                    s += &format!(", initial {}", fmt_bytes(*i as usize));
                }
                s + ")"
            }
        });
        out
    }

    /// Builds the stack on `self.device` without installing it; on error all built so far is
    /// freed. Spilling on demand needs [`StackPlan::build_with`].
    ///
    /// # Errors
    /// The failing layer's: [`OutOfMemory`](rmm_allocator::Error::OutOfMemory),
    /// [`Unsupported`](rmm_allocator::Error::Unsupported),
    /// [`EventLog`](rmm_allocator::Error::EventLog); with spilling on demand,
    /// [`InvalidArgument`](rmm_allocator::Error::InvalidArgument).
    pub fn build(&self) -> Result<DeviceStack> {
        self.build_replacing(None, None, &[])
    }

    /// As [`StackPlan::build`], with the spill manager's out-of-memory handler.
    ///
    /// # Errors
    /// As [`StackPlan::build`].
    pub fn build_with(&self, on_oom: Option<OomHandler>) -> Result<DeviceStack> {
        self.build_replacing(None, on_oom, &[])
    }

    /// Bytes of `previous`'s pool this plan's pool can take over: its initial size when both use
    /// `cuMemAlloc` and both map it or neither do, else 0.
    pub fn adoptable_from(&self, previous: &DeviceStack) -> u64 {
        let (Some(plan), Some(old)) = (&self.pool, &previous.pool) else {
            return 0;
        };
        let adoptable = self.upstream == UpstreamPlan::Cuda
            && previous.plan.upstream == UpstreamPlan::Cuda
            && pool_builder(plan, Arc::clone(old.upstream()))
                .maps_memory()
                .is_ok_and(|maps| maps == old.uses_virtual_memory());
        if adoptable { plan.initial_size } else { 0 }
    }

    /// Builds the stack replacing `previous` (a reinitialize): `previous` gives back what the new
    /// pool cannot adopt ([`StackPlan::adoptable_from`]), the new pool adopts the rest of its free
    /// memory, and `previous` gives back what is left. Returns the stack and the bytes released.
    /// The new pool also takes over `live` (idle spillable data) with its chunks, in place and
    /// provisionally ([`PoolBuilder::adopt_live`]): until [`DeviceStack::commit_live`], dropping
    /// the new stack gives them back. [`DeviceStack::adopted_live`] lists those taken.
    ///
    /// # Errors
    /// Releasing or building failed; `previous` still works (its pool grows again on demand).
    pub fn replace(
        &self,
        previous: &DeviceStack,
        on_oom: Option<OomHandler>,
        live: &[LiveBlock],
    ) -> Result<(DeviceStack, u64)> {
        let mut released = previous.release_keeping(self.adoptable_from(previous))?;
        let stack = self.build_replacing(Some(previous), on_oom, live)?;
        released += previous.release()?;
        Ok((stack, released))
    }

    /// True when this plan replacing `previous` can take over its live allocations in place.
    pub fn can_keep_live_from(&self, previous: &DeviceStack) -> bool {
        self.device == previous.plan.device && self.adoptable_from(previous) > 0
    }

    fn build_replacing(
        &self,
        previous: Option<&DeviceStack>,
        on_oom: Option<OomHandler>,
        live: &[LiveBlock],
    ) -> Result<DeviceStack> {
        if self.spill_on_demand && on_oom.is_none() {
            return Err(rmm_allocator::Error::invalid_argument(
                "on_oom",
                "none",
                "the spill manager's handler for a stack with spill.on_demand",
            ));
        }
        let device = Device::new(self.device)?;
        let _span = tracing::debug_span!("build device stack", device = self.device).entered();
        let mut async_resource = None;
        let mut resource: SharedResource = match &self.upstream {
            UpstreamPlan::Cuda => Arc::new(CudaMemoryResource::new(device)),
            UpstreamPlan::Managed => Arc::new(ManagedMemoryResource::new(device)?),
            UpstreamPlan::Async {
                release_threshold,
                initial_size,
            } => {
                let r = Arc::new(match release_threshold {
                    Some(t) => CudaAsyncMemoryResource::with_release_threshold(device, *t)?,
                    None => CudaAsyncMemoryResource::new(device)?,
                });
                if let Some(bytes) = initial_size {
                    r.reserve(*bytes as usize)?;
                }
                async_resource = Some(Arc::clone(&r));
                r
            }
        };
        let mut pool = None;
        if let Some(plan) = &self.pool {
            let mut builder = pool_builder(plan, Arc::clone(&resource));
            if let Some(donor) = previous.and_then(|p| p.pool.clone()) {
                builder = builder.adopt_from(donor);
                if !live.is_empty() {
                    builder = builder.adopt_live(live.to_vec()).adopt_provisionally();
                }
            }
            pool = Some(on_top(builder.build()?, &mut resource));
        }
        let limiting = self.limit.map(|limit| {
            let l = LimitingResourceAdaptor::with_bytes(Arc::clone(&resource), limit as usize);
            on_top(l, &mut resource)
        });
        if let Some(handler) = on_oom.filter(|_| self.spill_on_demand) {
            resource = Arc::new(FailureCallbackResourceAdaptor::from_bytes_fn(
                resource,
                move |bytes| handler(bytes),
            ));
        }
        let tracking = self.tracking.map(|backtraces| {
            let below = Arc::clone(&resource);
            let t = if backtraces {
                TrackingResourceAdaptor::with_backtraces(below)
            } else {
                TrackingResourceAdaptor::new(below)
            };
            on_top(t, &mut resource)
        });
        let mut logging = None;
        if let Some(path) = &self.log_file {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    rmm_allocator::Error::invalid_argument(
                        "logging.directory",
                        dir.display(),
                        format!("a directory that can be created ({e})"),
                    )
                })?;
            }
            let log = LoggingResourceAdaptor::new(Arc::clone(&resource), path)?;
            logging = Some(on_top(log, &mut resource));
        }
        let statistics = Arc::new(StatisticsResourceAdaptor::new(resource));
        Ok(DeviceStack {
            device,
            plan: self.clone(),
            top: statistics.clone(),
            statistics,
            tracking,
            logging,
            limiting,
            pool,
            async_resource,
        })
    }
}

impl fmt::Display for StackPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.layers().join(" > "))
    }
}

/// One device's built stack, with handles on the layers the runtime reads.
pub struct DeviceStack {
    device: Device,
    plan: StackPlan,
    top: SharedResource,
    statistics: Arc<StatisticsResourceAdaptor>,
    tracking: Option<Arc<TrackingResourceAdaptor>>,
    logging: Option<Arc<LoggingResourceAdaptor>>,
    limiting: Option<Arc<LimitingResourceAdaptor>>,
    pool: Option<Arc<PoolMemoryResource>>,
    async_resource: Option<Arc<CudaAsyncMemoryResource>>,
}

impl fmt::Debug for DeviceStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceStack")
            .field("device", &self.device)
            .field("stack", &self.describe())
            .finish_non_exhaustive()
    }
}

/// Builds `config`'s stack for `device` without installing it, for use without the runtime
/// (the Python package's Dask plugin).
///
/// # Errors
/// As [`StackPlan::build`].
pub fn build_device_stack(config: &ResolvedConfig, device: &ResolvedDevice) -> Result<DeviceStack> {
    StackPlan::new(config, device).build()
}

impl DeviceStack {
    /// This stack's figures so far, as phase `phase` of the runtime report.
    pub(crate) fn phase_statistics(&self, phase: u64) -> PhaseStatistics {
        let s = self.statistics();
        let (bytes, count) = (s.lifetime_bytes(), s.lifetime_allocations());
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        PhaseStatistics {
            phase,
            peak_bytes: n(bytes.peak),
            total_bytes: n(bytes.total),
            peak_allocations: n(count.peak),
            total_allocations: n(count.total),
            out_of_memory_errors: s.out_of_memory_count(),
        }
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The plan it was built from.
    pub fn plan(&self) -> &StackPlan {
        &self.plan
    }

    /// The top: what the device's workers allocate from.
    pub fn resource(&self) -> &SharedResource {
        &self.top
    }

    /// The statistics adaptor on top.
    pub fn statistics(&self) -> &StatisticsResourceAdaptor {
        &self.statistics
    }

    /// The tracking adaptor, with `tracking.enabled`.
    pub fn tracking(&self) -> Option<&TrackingResourceAdaptor> {
        self.tracking.as_deref()
    }

    /// The pool, with `pool.enabled`.
    pub fn pool(&self) -> Option<&PoolMemoryResource> {
        self.pool.as_deref()
    }

    /// The chain as built, top first (`StatisticsResourceAdaptor > … > CudaMemoryResource`).
    pub fn describe(&self) -> String {
        chain_names(&*self.top)
    }

    /// The statistics report (peaks, totals, the pool's reserved bytes).
    pub fn memory_report(&self) -> MemoryReport {
        self.statistics.report()
    }

    /// Allocations made through the stack and not freed (each listed with tracking on).
    pub fn live(&self) -> LiveMemory {
        self.live_except(&[])
    }

    /// As [`DeviceStack::live`], not counting `kept` (taken over in place by a replacement).
    pub fn live_except(&self, kept: &[LiveBlock]) -> LiveMemory {
        let kept_bytes: u64 = kept.iter().map(|b| b.bytes as u64).sum();
        let count = (self.statistics.lifetime_allocations().value.max(0) as u64)
            .saturating_sub(kept.len() as u64);
        let bytes =
            (self.statistics.lifetime_bytes().value.max(0) as u64).saturating_sub(kept_bytes);
        let allocations = match &self.tracking {
            Some(t) if count > 0 => {
                let kept: std::collections::HashSet<u64> =
                    kept.iter().map(|b| b.ptr.addr()).collect();
                t.outstanding()
                    .iter()
                    .filter(|a| !kept.contains(&a.ptr.addr()))
                    .map(ToString::to_string)
                    .collect()
            }
            _ => Vec::new(),
        };
        LiveMemory {
            device: self.device.ordinal(),
            count,
            bytes,
            allocations,
        }
    }

    /// The replaced stack's allocations this pool took over ([`StackPlan::replace`]).
    pub fn adopted_live(&self) -> &[LiveBlock] {
        self.pool.as_ref().map_or(&[], |p| p.adopted_blocks())
    }

    /// Once installed, makes what it took over in place its own for good: its pool keeps the
    /// memory even if dropped, and every layer counts the allocations instead of `previous`'s.
    /// Returns the bytes.
    pub fn commit_live(&self, previous: &DeviceStack) -> u64 {
        let blocks = self.adopted_live();
        if let Some(p) = &self.pool {
            p.commit_adoption();
        }
        if blocks.is_empty() {
            return 0;
        }
        previous.hand_over_live(blocks);
        self.take_over_live(blocks);
        blocks.iter().map(|b| b.bytes as u64).sum()
    }

    /// Every accounting layer forgets `blocks` (another stack took them over).
    fn hand_over_live(&self, blocks: &[LiveBlock]) {
        self.statistics.hand_over_live(blocks);
        self.limiting.iter().for_each(|l| l.hand_over_live(blocks));
        self.tracking.iter().for_each(|t| t.hand_over_live(blocks));
        self.logging.iter().for_each(|l| l.hand_over_live(blocks));
    }

    /// Every accounting layer counts `blocks` as allocated through it.
    fn take_over_live(&self, blocks: &[LiveBlock]) {
        self.statistics.take_over_live(blocks);
        self.limiting.iter().for_each(|l| l.take_over_live(blocks));
        self.tracking.iter().for_each(|t| t.take_over_live(blocks));
        self.logging.iter().for_each(|l| l.take_over_live(blocks));
    }

    /// Makes this stack the device's current resource; returns the previous one.
    ///
    /// # Errors
    /// [`InvalidArgument`](rmm_allocator::Error::InvalidArgument): not a device of the
    /// process-wide backend; [`NoSuchDevice`](rmm_allocator::Error::NoSuchDevice).
    pub fn install(&self) -> Result<SharedResource> {
        per_device::set_per_device_resource(self.device.ordinal(), Arc::clone(&self.top))
    }

    /// True when this stack is the device's current resource.
    pub fn is_installed(&self) -> bool {
        per_device::get_per_device_resource(self.device.ordinal())
            .is_ok_and(|r| Arc::ptr_eq(&r, &self.top))
    }

    /// Puts the device back on a plain `CudaMemoryResource` if this stack is current.
    ///
    /// # Errors
    /// [`NoSuchDevice`](rmm_allocator::Error::NoSuchDevice) or the backend's error.
    pub fn uninstall(&self) -> Result<()> {
        if self.is_installed() {
            per_device::reset_per_device_resource(self.device.ordinal())?;
        }
        Ok(())
    }

    /// Gives every cached unused byte back (the pool's free chunks, the async pool's cache) and
    /// flushes the event log; returns the bytes the pool released.
    ///
    /// # Errors
    /// [`Driver`](rmm_allocator::Error::Driver) or [`EventLog`](rmm_allocator::Error::EventLog).
    pub fn release(&self) -> Result<u64> {
        self.release_keeping(0)
    }

    /// As [`DeviceStack::release`], keeping what a new pool of initial size `keep` would adopt.
    ///
    /// # Errors
    /// As [`DeviceStack::release`].
    pub fn release_keeping(&self, keep: u64) -> Result<u64> {
        let mut released = 0;
        if let Some(pool) = &self.pool {
            released = pool.release_except_adoptable(keep)?;
        }
        if let Some(a) = &self.async_resource {
            a.release()?;
        }
        if let Some(l) = &self.logging {
            l.flush()?;
        }
        Ok(released)
    }

    /// The pool's figures, if any. Takes the pool's locks in turn: not for hot paths.
    pub fn pool_figures(&self) -> Option<PoolFigures> {
        let pool = self.pool.as_ref()?;
        let u = pool.usage();
        Some(PoolFigures {
            reserved_bytes: u.pool_size as u64,
            peak_reserved_bytes: u.peak_pool_size as u64,
            in_use_bytes: u.in_use as u64,
            free_bytes: u.free as u64,
            largest_free_block: u.largest_free as u64,
            fragmentation: u.fragmentation(),
            arenas: u.arenas,
            max_overhead: pool.max_overhead(),
        })
    }

    /// Bytes held from the device: the pool's size, else the async reservation, else bytes in use.
    pub fn reserved_bytes(&self) -> u64 {
        if let Some(p) = &self.pool {
            return p.pool_size();
        }
        if let Some(a) = &self.async_resource
            && let Ok(r) = a.reserved_bytes()
        {
            return r;
        }
        self.statistics.lifetime_bytes().value.max(0) as u64
    }
}

/// Makes `layer` (built over `top`) the stack's new top; returns the stack's handle on it.
fn on_top<T: rmm_allocator::resource::DeviceMemoryResource>(
    layer: T,
    top: &mut SharedResource,
) -> Arc<T> {
    let layer = Arc::new(layer);
    *top = Arc::clone(&layer) as SharedResource;
    layer
}

fn pool_builder(plan: &PoolPlan, upstream: SharedResource) -> PoolBuilder {
    let mut builder = PoolMemoryResource::builder(upstream)
        .initial_size(plan.initial_size)
        .growth(plan.growth)
        .virtual_memory(match plan.vmm {
            Switch::On => VirtualMemory::On,
            Switch::Off => VirtualMemory::Off,
            Switch::Auto => VirtualMemory::Auto,
        });
    if let Some(m) = plan.maximum_size {
        builder = builder.maximum_size(m);
    }
    if let Some(f) = plan.max_overhead.fraction() {
        builder = builder.max_overhead(f);
    }
    builder
}
