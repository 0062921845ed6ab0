//! Resolution against the devices present: device selection and concrete byte sizes.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::{EffectiveSize, SizeKey};
use crate::error::{Error, Result, Setting};
use crate::size::{Size, align_down, human};
use rmm_allocator::backend::BackendChoice;
use rmm_allocator::resource::default_initial_size;

use crate::plan::{PoolPlan, UpstreamPlan};
use crate::types::{Config, DeviceSelector, Devices, LogLevel, PinAhead};

/// What the backend reports of one device; the runtime fills it in (this crate talks to none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceFacts {
    /// The CUDA ordinal.
    pub ordinal: u32,
    /// The UUID as `nvidia-smi -L` prints it, e.g. `GPU-8932f937-…`.
    pub uuid: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Free device memory in bytes now; `None` if not read ([`Config::needs_free_memory`] false).
    pub free_memory: Option<u64>,
    /// Host memory the process may use, in bytes (physical, or its cgroup's lower limit): pinned
    /// host memory is checked against it and `spill.pin_ahead = "auto"` derives from it. `None`:
    /// unknown; nothing checked, `"auto"` pins at most [`PIN_AHEAD_WITHOUT_HOST_FACTS`] ahead.
    pub host_memory: Option<u64>,
}

/// `spill.pin_ahead = "auto"` pins at most the process's host memory divided by this (shared by
/// its devices), so an 8-GPU host's workers keep under half of it pinned ahead.
pub const PIN_AHEAD_HOST_SHARE: u64 = 16;

/// What `spill.pin_ahead = "auto"` pins ahead at most when the host's memory is not known.
pub const PIN_AHEAD_WITHOUT_HOST_FACTS: u64 = 1 << 30;

/// The configuration with devices chosen and every size in bytes (multiples of 256).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedConfig {
    /// The backend to open.
    pub backend: BackendChoice,
    /// Worker threads per device.
    pub workers_per_device: u32,
    /// The selected devices, in the order `devices` lists them (`all`: the facts' order).
    pub devices: Vec<ResolvedDevice>,
    /// Level of the allocation log (used where [`ResolvedDevice::log_file`] is set).
    pub logging_level: LogLevel,
    /// Collect allocation statistics.
    pub stats: bool,
    /// Track live allocations.
    pub tracking: bool,
    /// Record a backtrace per tracked allocation (only when `tracking`).
    pub backtraces: bool,
}

/// One selected device and its settings in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedDevice {
    /// The CUDA ordinal.
    pub ordinal: u32,
    /// The device UUID.
    pub uuid: String,
    /// Total memory in bytes.
    pub total_memory: u64,
    /// Free memory in bytes when resolved, where it was read ([`DeviceFacts::free_memory`]).
    pub free_memory: Option<u64>,
    /// Where the device's memory comes from.
    pub upstream: UpstreamPlan,
    /// The pool over it (`pool.enabled`).
    pub pool: Option<PoolPlan>,
    /// Hard cap on allocated bytes (`limits.device_memory_limit`).
    pub memory_limit: Option<u64>,
    /// Spilling, when enabled.
    pub spill: Option<ResolvedSpill>,
    /// The CSV allocation log with logging on: [`crate::device_log_file_name`] in the directory.
    pub log_file: Option<PathBuf>,
}

/// Spilling for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedSpill {
    /// Spill when the device holds more than this many bytes.
    pub threshold: u64,
    /// Size of the pinned host pool; `None`: pin as needed.
    pub host_pool_size: Option<u64>,
    /// `spill.pin_ahead` in bytes (0: none).
    pub pin_ahead: u64,
    /// Spill and retry on out-of-memory.
    pub on_demand: bool,
    /// Unspill as soon as memory allows.
    pub eager_unspill: bool,
    /// Where host memory spills to; `None`: no disk tier.
    pub disk_directory: Option<PathBuf>,
}

impl Config {
    /// Whether resolving needs each device's free memory: only for a pool's default initial size
    /// (`"auto"`: half the free memory, as RMM); else the runtime does not ask the driver.
    pub fn needs_free_memory(&self) -> bool {
        self.pool.enabled
            && (self.pool.initial_size.is_none()
                || self
                    .device
                    .values()
                    .any(|o| matches!(o.pool.initial_size, Some(None))))
    }

    /// Whether resolving uses [`DeviceFacts::host_memory`] (only spilling's pinned memory does).
    pub fn needs_host_memory(&self) -> bool {
        self.spill.enabled
    }

    /// Chooses the devices and turns every size into bytes for each, checking what needs the
    /// device facts. Sizes of features that are off are ignored, so turning a feature off from
    /// the environment needs no other change.
    ///
    /// # Errors
    /// As [`Config::validate`]; [`Error::DeviceNotPresent`], [`Error::DeviceSelectedTwice`],
    /// [`Error::NoDevices`], [`Error::LargerThanDevice`], [`Error::RoundsToZero`],
    /// [`Error::InitialAboveMaximum`], [`Error::InitialAboveLimit`], or
    /// [`Error::FreeMemoryNotGiven`] (a default initial size); [`Error::Several`] for more.
    pub fn resolve(&self, present: &[DeviceFacts]) -> Result<ResolvedConfig> {
        self.validate()?;
        let selected = self.select(present)?;
        let mut errors = Vec::new();
        for &ordinal in self.device.keys() {
            if !present.iter().any(|d| d.ordinal == ordinal) {
                let prefix = format!("device.{ordinal}.");
                let origin = self
                    .sources
                    .0
                    .iter()
                    .find(|(key, _)| key.starts_with(&prefix))
                    .map(|(_, origin)| origin.clone())
                    .unwrap_or(crate::Source::Code);
                errors.push(Error::DeviceNotPresent {
                    key: format!("device.{ordinal}"),
                    origin,
                    selector: ordinal.to_string(),
                    present: list_present(present),
                    remedy: "remove the table or correct its ordinal",
                });
            }
        }
        let mut devices = Vec::with_capacity(selected.len());
        // The devices that pin ahead of demand (a host pool pinned as needed) share "auto".
        let pinning_ahead = selected
            .iter()
            .filter(|f| {
                self.effective_size(Some(f.ordinal), SizeKey::HostPool)
                    .size
                    .is_none()
            })
            .count() as u64;
        for facts in selected {
            match self.resolve_device(facts, pinning_ahead) {
                Ok(device) => devices.push(device),
                Err(mut more) => errors.append(&mut more),
            }
        }
        Error::from_list(errors)?;
        Ok(ResolvedConfig {
            backend: self.backend,
            workers_per_device: self.workers_per_device,
            devices,
            logging_level: self.logging.level,
            stats: self.stats.enabled,
            tracking: self.tracking.enabled,
            backtraces: self.tracking.enabled && self.tracking.backtraces,
        })
    }

    fn select<'a>(&self, present: &'a [DeviceFacts]) -> Result<Vec<&'a DeviceFacts>> {
        let origin = self.source("devices");
        let list = match &self.devices {
            Devices::All if present.is_empty() => return Err(Error::NoDevices { origin }),
            Devices::All => return Ok(present.iter().collect()),
            Devices::List(list) => list,
        };
        let mut errors = Vec::new();
        let mut selected: Vec<&DeviceFacts> = Vec::with_capacity(list.len());
        for selector in list {
            let found = present.iter().find(|d| match selector {
                DeviceSelector::Ordinal(n) => d.ordinal == *n,
                DeviceSelector::Uuid(uuid) => d.uuid.eq_ignore_ascii_case(uuid),
            });
            match found {
                Some(d) if selected.iter().any(|s| s.ordinal == d.ordinal) => {
                    errors.push(Error::DeviceSelectedTwice {
                        ordinal: d.ordinal,
                        origin: origin.clone(),
                    });
                }
                Some(d) => selected.push(d),
                None => errors.push(Error::DeviceNotPresent {
                    key: "devices".into(),
                    origin: origin.clone(),
                    selector: selector.to_string(),
                    present: list_present(present),
                    remedy: "choose from those, or use \"all\"",
                }),
            }
        }
        Error::from_list(errors)?;
        Ok(selected)
    }

    /// One device's settings; `pinning_ahead` devices of the process pin ahead of demand and
    /// share its pinning.
    fn resolve_device(
        &self,
        facts: &DeviceFacts,
        pinning_ahead: u64,
    ) -> Result<ResolvedDevice, Vec<Error>> {
        let mut errors = Vec::new();
        let ordinal = facts.ordinal;
        let mut bytes = |key: SizeKey| -> Option<u64> {
            let effective = self.effective_size(Some(ordinal), key);
            // Not bound by the device: the host pool (host memory), growth (just grows as needed).
            let device_bound = !matches!(key, SizeKey::HostPool | SizeKey::PoolGrowth);
            match self.to_bytes(facts, &effective, device_bound) {
                Ok(n) => n,
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        };
        let pool = &self.pool;
        let pool_in_use = pool.enabled || pool.use_async;
        let limit = bytes(SizeKey::Limit);
        let initial = pool_in_use.then(|| bytes(SizeKey::PoolInitial)).flatten();
        let maximum = pool_in_use.then(|| bytes(SizeKey::PoolMaximum)).flatten();
        let growth = pool.enabled.then(|| bytes(SizeKey::PoolGrowth)).flatten();
        let release = pool
            .use_async
            .then(|| bytes(SizeKey::ReleaseThreshold))
            .flatten();
        let spill = self.spill.enabled.then(|| {
            // A fraction is of the memory rmm-rs may use: the hard limit if set (80% of it by
            // default: spill before allocations fail). `None` only after an error, in `errors`.
            let threshold = match (
                self.effective_size(Some(ordinal), SizeKey::SpillThreshold)
                    .size,
                limit,
            ) {
                (Some(size @ Size::Fraction(_)), Some(limit)) => {
                    size.resolve(limit.min(facts.total_memory))
                }
                _ => bytes(SizeKey::SpillThreshold).unwrap_or(0),
            };
            let pin_ahead = match self.spill.pin_ahead {
                PinAhead::Up(size) => size.resolve(facts.total_memory),
                PinAhead::Off => 0,
                // Shared by the process's devices: a process pins through one driver lock at
                // one rate whatever its devices, and its CUDA calls wait while it pins.
                PinAhead::Auto => align_down(
                    threshold.min(
                        facts
                            .host_memory
                            .map_or(PIN_AHEAD_WITHOUT_HOST_FACTS, |h| h / PIN_AHEAD_HOST_SHARE),
                    ) / pinning_ahead.max(1),
                ),
            };
            ResolvedSpill {
                threshold,
                host_pool_size: bytes(SizeKey::HostPool),
                pin_ahead,
                on_demand: self.spill.on_demand,
                eager_unspill: self.spill.eager_unspill,
                disk_directory: self.spill.disk_directory.clone(),
            }
        });
        let shown = |key: SizeKey, n: u64| Box::new(self.resolved_setting(ordinal, key, n));
        if let Some(spill) = &spill {
            if let Some(limit) = limit.filter(|&l| spill.threshold > l) {
                errors.push(Error::SpillAboveLimit {
                    device: ordinal,
                    spill: shown(SizeKey::SpillThreshold, spill.threshold),
                    limit: shown(SizeKey::Limit, limit),
                });
            }
            if let Some(host) = facts.host_memory {
                if let Some(pool) = spill.host_pool_size.filter(|&p| p > host) {
                    errors.push(Error::LargerThanHost {
                        setting: shown(SizeKey::HostPool, pool),
                        host_memory: host,
                    });
                }
                if let PinAhead::Up(size) = self.spill.pin_ahead
                    && spill.pin_ahead > host
                {
                    errors.push(Error::LargerThanHost {
                        setting: Box::new(self.setting("spill.pin_ahead", size.to_string())),
                        host_memory: host,
                    });
                }
            }
        }

        if let Some(initial) = initial {
            if let Some(maximum) = maximum.filter(|&m| initial > m) {
                errors.push(Error::InitialAboveMaximum {
                    device: Some(ordinal),
                    initial: shown(SizeKey::PoolInitial, initial),
                    maximum: shown(SizeKey::PoolMaximum, maximum),
                });
            }
            if let Some(limit) = limit.filter(|&l| initial > l) {
                errors.push(Error::InitialAboveLimit {
                    device: ordinal,
                    initial: shown(SizeKey::PoolInitial, initial),
                    limit: shown(SizeKey::Limit, limit),
                });
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        // RMM's default initial pool (`default_initial_size`: half the free memory), here
        // also kept within the maximum and the hard limit since the user did not ask for more.
        let initial = match (pool.enabled, initial) {
            (true, None) => {
                let Some(free) = facts.free_memory else {
                    return Err(vec![Error::FreeMemoryNotGiven { device: ordinal }]);
                };
                [Some(default_initial_size(free)), maximum, limit]
                    .into_iter()
                    .flatten()
                    .min()
            }
            (_, initial) => initial,
        };
        let upstream = if pool.use_async {
            UpstreamPlan::Async {
                release_threshold: release,
                // Reserved by the async pool itself only when no pool sits above it.
                initial_size: if pool.enabled { None } else { initial },
            }
        } else if pool.managed {
            UpstreamPlan::Managed
        } else {
            UpstreamPlan::Cuda
        };
        let pool = match (pool.enabled, initial, growth) {
            (false, ..) => None,
            (true, Some(initial_size), Some(growth)) => Some(PoolPlan {
                initial_size,
                maximum_size: maximum,
                growth,
                vmm: pool.vmm,
                max_overhead: pool.max_overhead,
            }),
            // Unreachable: both are set for an enabled pool, or resolving them returned an error.
            (true, ..) => {
                return Err(vec![Error::Internal(format!(
                    "device {ordinal}: an enabled pool without an initial size or growth step"
                ))]);
            }
        };
        Ok(ResolvedDevice {
            ordinal,
            uuid: facts.uuid.clone(),
            total_memory: facts.total_memory,
            free_memory: facts.free_memory,
            upstream,
            pool,
            memory_limit: limit,
            spill,
            log_file: self.logging.enabled.then(|| {
                self.logging.directory.join(crate::device_log_file_name(
                    &self.logging.file_name,
                    ordinal,
                ))
            }),
        })
    }

    /// Bytes for an effective size on `facts`' device; `device_bound`: may not exceed it.
    fn to_bytes(
        &self,
        facts: &DeviceFacts,
        effective: &EffectiveSize,
        device_bound: bool,
    ) -> Result<Option<u64>> {
        let Some(size) = effective.size else {
            return Ok(None);
        };
        size.resolve_on_device(facts.ordinal, facts.total_memory, device_bound, || {
            self.setting(&effective.key, size.to_string())
        })
        .map(Some)
    }

    /// `key = 50% = 40GiB (source)` for messages about resolved sizes.
    fn resolved_setting(&self, ordinal: u32, key: SizeKey, bytes: u64) -> Setting {
        let effective = self.effective_size(Some(ordinal), key);
        let value = match effective.size {
            Some(size @ Size::Fraction(_)) => format!("{size} = {}", human(bytes)),
            Some(size) => size.to_string(),
            None => human(bytes),
        };
        self.setting(&effective.key, value)
    }
}

impl Size {
    /// The bytes this size stands for on `device` of `total_memory` bytes, by the one rule for
    /// rmm.toml, the environment and code (a Dask device store's limit): larger than the device
    /// is refused when `within_device` (not for host memory or a pool's growth step), rounding
    /// to zero always. `setting` names the size in the error (`key = value (source)`).
    ///
    /// # Errors
    /// [`Error::LargerThanDevice`] or [`Error::RoundsToZero`].
    pub fn resolve_on_device(
        &self,
        device: u32,
        total_memory: u64,
        within_device: bool,
        setting: impl FnOnce() -> Setting,
    ) -> Result<u64, Error> {
        if within_device && self.unaligned(total_memory) > total_memory {
            return Err(Error::LargerThanDevice {
                device,
                setting: Box::new(setting()),
                total_memory,
            });
        }
        match self.resolve(total_memory) {
            0 => Err(Error::RoundsToZero {
                device,
                setting: Box::new(setting()),
            }),
            n => Ok(n),
        }
    }
}

fn list_present(present: &[DeviceFacts]) -> String {
    if present.is_empty() {
        return "none".into();
    }
    present
        .iter()
        .map(|d| format!("{} ({})", d.ordinal, d.uuid))
        .collect::<Vec<_>>()
        .join(", ")
}
