//! Methods on [`Config`]: checks, sources, effective values, TOML output.

use std::fmt::Write as _;

use crate::error::{Error, Result, Setting, Source};
use crate::loader::ConfigLoader;
use crate::overhead::Overhead;
use crate::schema::KEYS;
use crate::size::{Size, align_down};
use crate::types::{Config, Switch};

/// The sizes that `[device.N]` tables may override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SizeKey {
    PoolInitial,
    PoolMaximum,
    ReleaseThreshold,
    PoolGrowth,
    Limit,
    SpillThreshold,
    HostPool,
}

impl SizeKey {
    pub(crate) const ALL: [SizeKey; 7] = [
        SizeKey::PoolInitial,
        SizeKey::PoolMaximum,
        SizeKey::ReleaseThreshold,
        SizeKey::PoolGrowth,
        SizeKey::Limit,
        SizeKey::SpillThreshold,
        SizeKey::HostPool,
    ];

    pub(crate) fn key(self) -> &'static str {
        match self {
            SizeKey::PoolInitial => "pool.initial_size",
            SizeKey::PoolMaximum => "pool.maximum_size",
            SizeKey::ReleaseThreshold => "pool.release_threshold",
            SizeKey::PoolGrowth => "pool.growth",
            SizeKey::Limit => "limits.device_memory_limit",
            SizeKey::SpillThreshold => "spill.device_memory_limit",
            SizeKey::HostPool => "spill.host_pool_size",
        }
    }

    /// What "not set" is written as.
    fn keyword(self) -> &'static str {
        match self {
            SizeKey::PoolInitial => "auto",
            _ => "none",
        }
    }
}

/// A size in effect for one device (or globally): the key it was read from and its value.
pub(crate) struct EffectiveSize {
    pub key: String,
    pub size: Option<Size>,
}

/// One row of `rmm info`: a key, its effective value, and where that value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveValue {
    /// The dotted key, e.g. `pool.initial_size` or `device.1.pool.initial_size`.
    pub key: String,
    /// The value as `rmm.toml` would spell it, without quotes (`2GiB`, `auto`, `[0, 1]`).
    pub value: String,
    /// Where it came from.
    pub source: Source,
}

impl Config {
    /// Reads `text` as a complete configuration file, without environment: the inverse of
    /// [`Config::to_toml`].
    ///
    /// # Errors
    /// As [`ConfigLoader::load`]: [`Error::Parse`], [`Error::UnknownKey`], [`Error::InvalidValue`]
    /// ([`Error::Several`] for more), or a conflict between keys.
    pub fn from_toml_str(text: &str) -> Result<Config> {
        ConfigLoader::new()
            .no_env()
            .complete_toml_str("<toml string>", text)
            .load()
    }

    /// The configuration as a TOML document with every key, read back equal by
    /// [`Config::from_toml_str`].
    ///
    /// # Errors
    /// [`Error::Serialize`] for a path that is not UTF-8.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::Serialize(e.to_string()))
    }

    /// Where the value of `key` came from ([`Source::Default`] for keys never set).
    pub fn source(&self, key: &str) -> Source {
        self.sources.0.get(key).cloned().unwrap_or(Source::Default)
    }

    /// Every key with its effective value and source, in the example `rmm.toml`'s order, then the
    /// `[device.N]` overrides set. Sources are the loader's: a field changed in code afterwards
    /// keeps its loaded source.
    pub fn effective_values(&self) -> Vec<EffectiveValue> {
        let row = |key: String, value: String| EffectiveValue {
            source: self.source(&key),
            key,
            value,
        };
        let mut rows: Vec<EffectiveValue> = KEYS
            .iter()
            .map(|spec| row(spec.key.to_string(), self.value_text(spec.key)))
            .collect();
        for &ordinal in self.device.keys() {
            for size_key in SizeKey::ALL {
                if let Some(size) = self.overridden(ordinal, size_key) {
                    let value = show(size, size_key);
                    rows.push(row(format!("device.{ordinal}.{}", size_key.key()), value));
                }
            }
        }
        rows
    }

    /// The display text of a global key (see [`EffectiveValue::value`]).
    fn value_text(&self, key: &str) -> String {
        let on = |flag: bool| flag.to_string();
        if let Some(size_key) = SizeKey::ALL.into_iter().find(|k| k.key() == key) {
            return show(self.global_size(size_key), size_key);
        }
        match key {
            "backend" => self.backend.to_string(),
            "devices" => self.devices.to_string(),
            "workers_per_device" => self.workers_per_device.to_string(),
            "pool.enabled" => on(self.pool.enabled),
            "pool.managed" => on(self.pool.managed),
            "pool.async" => on(self.pool.use_async),
            "pool.vmm" => self.pool.vmm.to_string(),
            "pool.max_overhead" => self.pool.max_overhead.to_string(),
            "logging.enabled" => on(self.logging.enabled),
            "logging.directory" => self.logging.directory.display().to_string(),
            "logging.file_name" => self.logging.file_name.clone(),
            "logging.level" => self.logging.level.to_string(),
            "spill.enabled" => on(self.spill.enabled),
            "spill.pin_ahead" => self.spill.pin_ahead.to_string(),
            "spill.on_demand" => on(self.spill.on_demand),
            "spill.eager_unspill" => on(self.spill.eager_unspill),
            "spill.disk_directory" => self
                .spill
                .disk_directory
                .as_ref()
                .map_or_else(|| "none".into(), |p| p.display().to_string()),
            "stats.enabled" => on(self.stats.enabled),
            "tracking.enabled" => on(self.tracking.enabled),
            "tracking.backtraces" => on(self.tracking.backtraces),
            // Unreachable for keys of `KEYS`; a test checks that every key is covered.
            _ => String::new(),
        }
    }

    /// The checks needing no device facts: conflicts between keys. [`ConfigLoader::load`] and
    /// [`Config::resolve`] call it; call it after changing fields in code.
    ///
    /// # Errors
    /// [`Error::InvalidValue`], [`Error::AsyncWithManaged`], [`Error::InitialAboveMaximum`] or
    /// [`Error::InitialAboveLimit`]; [`Error::Several`] for more than one.
    pub fn validate(&self) -> Result<()> {
        let mut errors = Vec::new();
        // Loaded values are checked by the loader; this catches a field set in code.
        if !(1..=crate::MAX_WORKERS_PER_DEVICE).contains(&self.workers_per_device) {
            errors.push(Error::InvalidValue {
                origin: self.source("workers_per_device"),
                key: "workers_per_device".into(),
                value: self.workers_per_device.to_string(),
                problem: crate::schema::Kind::Count.expected(false),
            });
        }
        let name = std::path::Path::new(&self.logging.file_name);
        if self.logging.file_name.is_empty() || name.file_name() != Some(name.as_os_str()) {
            errors.push(Error::InvalidValue {
                origin: self.source("logging.file_name"),
                key: "logging.file_name".into(),
                value: self.logging.file_name.clone(),
                problem: "a file name without a directory (put the directory in \
                          logging.directory)"
                    .into(),
            });
        }
        // A footprint limit gives memory back in mapped chunks: it needs a pool that maps.
        if self.pool.enabled && self.pool.max_overhead != Overhead::Unlimited {
            // (An async upstream is refused when the pool is built, as pool.vmm = true is.)
            // The key, whether it is set so, its value then, a value that maps.
            let vmm_off = self.pool.vmm == Switch::Off;
            let unmapped = [
                ("pool.vmm", vmm_off, "false", "\"auto\""),
                ("pool.managed", self.pool.managed, "true", "false"),
            ];
            if let Some((key, _, value, mapping)) = unmapped.into_iter().find(|&(_, on, _, _)| on) {
                errors.push(Error::InvalidValue {
                    origin: self.source("pool.max_overhead"),
                    key: "pool.max_overhead".into(),
                    value: self.pool.max_overhead.to_string(),
                    problem: format!(
                        "a pool that maps its memory through CUDA's virtual memory API, which \
                         {key} = {value} ({}) rules out: set pool.max_overhead = \"none\", or \
                         {key} = {mapping}",
                        self.source(key),
                    ),
                });
            }
        }
        if self.pool.use_async && self.pool.managed {
            errors.push(Error::AsyncWithManaged {
                async_origin: self.source("pool.async"),
                managed_origin: self.source("pool.managed"),
            });
        }
        if self.pool.enabled || self.pool.use_async {
            // Sizes of one kind compare without device facts; resolve checks the rest.
            let ordinals = std::iter::once(None).chain(self.device.keys().copied().map(Some));
            for ordinal in ordinals {
                let initial = self.effective_size(ordinal, SizeKey::PoolInitial);
                let maximum = self.effective_size(ordinal, SizeKey::PoolMaximum);
                // A device that overrides neither repeats the global error.
                let own = ordinal.is_none()
                    || initial.key.starts_with("device.")
                    || maximum.key.starts_with("device.");
                if let (Some(a), Some(b), true) = (initial.size, maximum.size, own)
                    && exceeds(a, b)
                {
                    errors.push(Error::InitialAboveMaximum {
                        device: ordinal,
                        initial: Box::new(self.setting(&initial.key, a.to_string())),
                        maximum: Box::new(self.setting(&maximum.key, b.to_string())),
                    });
                }
            }
        }
        Error::from_list(errors)
    }

    pub(crate) fn setting(&self, key: &str, value: String) -> Setting {
        Setting {
            key: key.to_string(),
            value,
            origin: self.source(key),
        }
    }

    fn global_size(&self, key: SizeKey) -> Option<Size> {
        match key {
            SizeKey::PoolInitial => self.pool.initial_size,
            SizeKey::PoolMaximum => self.pool.maximum_size,
            SizeKey::ReleaseThreshold => self.pool.release_threshold,
            SizeKey::PoolGrowth => Some(self.pool.growth),
            SizeKey::Limit => self.limits.device_memory_limit,
            SizeKey::SpillThreshold => Some(self.spill.device_memory_limit),
            SizeKey::HostPool => self.spill.host_pool_size,
        }
    }

    /// The override of `key` for device `ordinal`: `Some(None)` when set to the keyword.
    fn overridden(&self, ordinal: u32, key: SizeKey) -> Option<Option<Size>> {
        let o = self.device.get(&ordinal)?;
        match key {
            SizeKey::PoolInitial => o.pool.initial_size,
            SizeKey::PoolMaximum => o.pool.maximum_size,
            SizeKey::ReleaseThreshold => o.pool.release_threshold,
            SizeKey::PoolGrowth => o.pool.growth.map(Some),
            SizeKey::Limit => o.limits.device_memory_limit,
            SizeKey::SpillThreshold => o.spill.device_memory_limit.map(Some),
            SizeKey::HostPool => o.spill.host_pool_size,
        }
    }

    /// The size in effect on `ordinal` (`None`: the global value), and the key it is read from.
    pub(crate) fn effective_size(&self, ordinal: Option<u32>, key: SizeKey) -> EffectiveSize {
        match ordinal.and_then(|n| Some((n, self.overridden(n, key)?))) {
            Some((n, size)) => EffectiveSize {
                key: format!("device.{n}.{}", key.key()),
                size,
            },
            None => EffectiveSize {
                key: key.key().to_string(),
                size: self.global_size(key),
            },
        }
    }
}

fn show(size: Option<Size>, key: SizeKey) -> String {
    size.map_or_else(|| key.keyword().to_string(), |s| s.to_string())
}

/// Whether `a > b` is certain without knowing the device.
fn exceeds(a: Size, b: Size) -> bool {
    match (a, b) {
        (Size::Bytes(a), Size::Bytes(b)) => align_down(a) > align_down(b),
        (Size::Fraction(a), Size::Fraction(b)) => a > b,
        _ => false,
    }
}

/// Formats rows as an aligned three-column table (`KEY  VALUE  SOURCE`) for `rmm info`.
pub fn render(values: &[EffectiveValue]) -> String {
    let width = |f: fn(&EffectiveValue) -> usize, title: &str| {
        values.iter().map(f).chain([title.len()]).max().unwrap_or(0)
    };
    let key_width = width(|v| v.key.chars().count(), "KEY");
    let value_width = width(|v| v.value.chars().count(), "VALUE");
    let mut out = String::new();
    let mut line = |key: &str, value: &str, source: &str| {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "{key:<key_width$}  {value:<value_width$}  {source}");
    };
    line("KEY", "VALUE", "SOURCE");
    for v in values {
        line(&v.key, &v.value, &v.source.to_string());
    }
    out
}
