//! The configuration as serde structs. Field docs give the TOML key and the default.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use rmm_allocator::backend::BackendChoice;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Source;
use crate::size::{ParseSizeError, Size, toml_value_conversions};

/// `spill.pin_ahead`: pinned host memory kept free for spilling (with `host_pool_size = "none"`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "toml::Value")]
pub enum PinAhead {
    /// `"auto"`: the spill limit, at most host memory / [`crate::PIN_AHEAD_HOST_SHARE`], divided
    /// between the devices of the process (it pins for all of them at one rate).
    #[default]
    Auto,
    /// `"none"`: nothing is pinned ahead; spills pin as they go.
    Off,
    /// At most this much (a fraction is of the device's total memory).
    Up(Size),
}

impl PinAhead {
    /// Reads `"auto"`, `"none"` or a size (else the size's error).
    pub(crate) fn from_toml(value: &toml::Value) -> Result<PinAhead, ParseSizeError> {
        match value {
            toml::Value::String(s) if s.trim().eq_ignore_ascii_case("auto") => Ok(PinAhead::Auto),
            toml::Value::String(s) if s.trim().eq_ignore_ascii_case("none") => Ok(PinAhead::Off),
            other => Size::from_toml(other).map(PinAhead::Up),
        }
    }
}

impl fmt::Display for PinAhead {
    /// `auto`, `none` or the size as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PinAhead::Auto => f.write_str("auto"),
            PinAhead::Off => f.write_str("none"),
            PinAhead::Up(size) => write!(f, "{size}"),
        }
    }
}

toml_value_conversions!(
    PinAhead,
    ParseSizeError,
    PinAhead::from_toml,
    |p: &PinAhead| match p {
        PinAhead::Up(size) => size.to_toml(),
        other => toml::Value::String(other.to_string()),
    }
);

/// Level of the allocation log (`logging.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation (RMM's default).
    #[default]
    Info,
    /// Warnings.
    Warn,
    /// Errors only.
    Error,
    /// Nothing.
    Off,
}

impl LogLevel {
    /// The level named `text` ([`LogLevel::as_str`]'s names, case-insensitive).
    pub(crate) fn parse(text: &str) -> Option<LogLevel> {
        use LogLevel::*;
        let text = text.trim().to_ascii_lowercase();
        [Trace, Debug, Info, Warn, Error, Off]
            .into_iter()
            .find(|level| level.as_str() == text)
    }

    /// The canonical lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
            LogLevel::Off => "off",
        }
    }
}

impl TryFrom<String> for LogLevel {
    type Error = String;

    fn try_from(text: String) -> Result<LogLevel, String> {
        LogLevel::parse(&text).ok_or_else(|| format!("{text:?} is not a log level"))
    }
}

impl From<LogLevel> for String {
    fn from(level: LogLevel) -> String {
        level.as_str().into()
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A switch that may also be left to rmm-rs (`pool.vmm`): `true`, `false` or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "toml::Value")]
pub enum Switch {
    /// `false`.
    Off,
    /// `true`.
    On,
    /// `"auto"`: on where it can be, else off.
    #[default]
    Auto,
}

impl Switch {
    /// A bool, or `"auto"`, `"true"` or `"false"` (case-insensitive).
    pub(crate) fn from_toml(value: &toml::Value) -> Option<Switch> {
        match value {
            toml::Value::Boolean(true) => Some(Switch::On),
            toml::Value::Boolean(false) => Some(Switch::Off),
            toml::Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                "auto" => Some(Switch::Auto),
                "true" => Some(Switch::On),
                "false" => Some(Switch::Off),
                _ => None,
            },
            _ => None,
        }
    }
}

impl fmt::Display for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Switch::Off => "false",
            Switch::On => "true",
            Switch::Auto => "auto",
        })
    }
}

toml_value_conversions!(
    Switch,
    String,
    |v| Switch::from_toml(v).ok_or_else(|| format!("{v} is not true, false or \"auto\"")),
    |s: &Switch| match s {
        Switch::Auto => toml::Value::String("auto".into()),
        on_or_off => toml::Value::Boolean(*on_or_off == Switch::On),
    }
);

/// One entry of `devices`: an ordinal or a device UUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceSelector {
    /// A CUDA device ordinal (`0`).
    Ordinal(u32),
    /// A UUID as `nvidia-smi -L` prints it (`"GPU-8932f937-…"`, `"MIG-…"`), case-insensitive.
    Uuid(String),
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Ordinal(n) => write!(f, "{n}"),
            DeviceSelector::Uuid(uuid) => f.write_str(uuid),
        }
    }
}

/// The devices the runtime uses (`devices`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "toml::Value")]
pub enum Devices {
    /// Every device the backend reports (`"all"`).
    All,
    /// These devices, in this order (`[0, 1]`, `["GPU-…"]`, or a single `0`).
    List(Vec<DeviceSelector>),
}

impl Default for Devices {
    /// Device 0, as RMM's `reinitialize(devices=0)`.
    fn default() -> Self {
        Devices::List(vec![DeviceSelector::Ordinal(0)])
    }
}

impl Devices {
    /// Parses `"all"`, an ordinal, a UUID or a non-empty array of those; `Err`: a precise reason.
    pub(crate) fn from_toml(value: &toml::Value) -> Result<Devices, Option<String>> {
        if let toml::Value::String(s) = value
            && s.trim().eq_ignore_ascii_case("all")
        {
            return Ok(Devices::All);
        }
        let items = match value {
            toml::Value::Array(items) if items.is_empty() => {
                return Err(Some("the list is empty".into()));
            }
            toml::Value::Array(items) => items.as_slice(),
            single => std::slice::from_ref(single),
        };
        let mut list: Vec<DeviceSelector> = Vec::with_capacity(items.len());
        for item in items {
            let selector = match item {
                toml::Value::Integer(i) => u32::try_from(*i)
                    .map(DeviceSelector::Ordinal)
                    .map_err(|_| Some(format!("{i} is not a device ordinal")))?,
                toml::Value::String(s) if is_uuid(s) => DeviceSelector::Uuid(s.trim().into()),
                _ => return Err(None),
            };
            if list.iter().any(|seen| same_selector(seen, &selector)) {
                return Err(Some(format!("device {selector} is listed twice")));
            }
            list.push(selector);
        }
        Ok(Devices::List(list))
    }

    fn to_toml(&self) -> toml::Value {
        match self {
            Devices::All => toml::Value::String("all".into()),
            Devices::List(list) => toml::Value::Array(
                list.iter()
                    .map(|s| match s {
                        DeviceSelector::Ordinal(n) => toml::Value::Integer(i64::from(*n)),
                        DeviceSelector::Uuid(u) => toml::Value::String(u.clone()),
                    })
                    .collect(),
            ),
        }
    }
}

fn is_uuid(text: &str) -> bool {
    let text = text.trim();
    text.len() > 4
        && text.is_char_boundary(4)
        && ["gpu-", "mig-"].contains(&text[..4].to_ascii_lowercase().as_str())
}

fn same_selector(a: &DeviceSelector, b: &DeviceSelector) -> bool {
    match (a, b) {
        (DeviceSelector::Uuid(a), DeviceSelector::Uuid(b)) => a.eq_ignore_ascii_case(b),
        _ => a == b,
    }
}

impl fmt::Display for Devices {
    /// `all` or the TOML list, e.g. `[0, "GPU-…"]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::All => f.write_str("all"),
            list => write!(f, "{}", list.to_toml()),
        }
    }
}

toml_value_conversions!(
    Devices,
    String,
    |v| Devices::from_toml(v).map_err(|why| why.unwrap_or_else(|| "not a device list".into())),
    Devices::to_toml
);

/// `[pool]`: the device memory pool (RMM's `pool_allocator`, `managed_memory`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// `pool.enabled` (default `false`): suballocate from a pool instead of the driver.
    pub enabled: bool,
    /// `pool.managed` (default `false`): the memory comes from `cuMemAllocManaged`.
    pub managed: bool,
    /// `pool.async` (default `false`): memory from `cuMemAllocAsync`; conflicts with `managed`.
    #[serde(rename = "async")]
    pub use_async: bool,
    /// `pool.initial_size` (default `"auto"` = `None`: half the free memory at start, as RMM;
    /// with only `async`, the driver's default).
    #[serde(with = "auto_size")]
    pub initial_size: Option<Size>,
    /// `pool.maximum_size` (default `"none"` = `None`: grow while the device has memory).
    #[serde(with = "none_size")]
    pub maximum_size: Option<Size>,
    /// `pool.release_threshold` (default `"none"`, with `async`): what the pool keeps on
    /// synchronize.
    #[serde(with = "none_size")]
    pub release_threshold: Option<Size>,
    /// `pool.growth` (default `"1GiB"`, with `enabled`): the pool grows by requests rounded up
    /// to a multiple of it, never past the maximum size.
    pub growth: Size,
    /// `pool.vmm` (default `"auto"`, with `enabled`): map the pool's chunks into one virtual
    /// address range per device, so free space stays in one piece and wholly free chunks go
    /// back one by one; `"auto"`: where the device supports it for plain device memory, else
    /// `cuMemAlloc` chunks.
    pub vmm: Switch,
    /// `pool.max_overhead` (default `"none"`, with `enabled`): the most the pool holds above its
    /// peak in use, as a share of it; before growing past that it gives wholly free memory back.
    pub max_overhead: crate::overhead::Overhead,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            enabled: false,
            managed: false,
            use_async: false,
            initial_size: None,
            maximum_size: None,
            release_threshold: None,
            growth: Size::Bytes(1 << 30),
            vmm: Switch::Auto,
            max_overhead: crate::overhead::Overhead::Unlimited,
        }
    }
}

/// `[logging]`: the allocation log, one CSV file per device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// `logging.enabled` (default `false`).
    pub enabled: bool,
    /// `logging.directory` (default `"."`, relative to the working directory): where logs go.
    pub directory: PathBuf,
    /// `logging.file_name` (default `"rmm_log.csv"`): device N logs to it with `.devN` before the
    /// extension ([`device_log_file_name`]), as RAPIDS RMM does. A file name only: the
    /// directory is `logging.directory`.
    pub file_name: String,
    /// `logging.level` (default `"info"`).
    pub level: LogLevel,
}

/// RAPIDS RMM's per-device log name: `.dev<ordinal>` before the extension as Python's
/// `os.path.splitext` finds it (`mylog.csv` → `mylog.dev0.csv`, `.log` → `.log.dev0`).
pub fn device_log_file_name(file_name: &str, ordinal: u32) -> String {
    let (stem, ext) = match file_name.rfind('.') {
        Some(i) if file_name[..i].chars().any(|c| c != '.') => file_name.split_at(i),
        _ => (file_name, ""),
    };
    format!("{stem}.dev{ordinal}{ext}")
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            enabled: false,
            directory: PathBuf::from("."),
            file_name: "rmm_log.csv".into(),
            level: LogLevel::Info,
        }
    }
}

/// `[limits]`: hard caps (RMM's limiting adaptor).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `limits.device_memory_limit` (default `"none"`): allocations past this on one device fail.
    #[serde(with = "none_size")]
    pub device_memory_limit: Option<Size>,
}

/// `[spill]`: spilling device buffers to pinned host memory (and on to disk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpillConfig {
    /// `spill.enabled` (default `false`).
    pub enabled: bool,
    /// `spill.device_memory_limit` (default `"80%"`, dask-cuda's): spill when a device holds more;
    /// a fraction is of the device's memory, or of `limits.device_memory_limit` if set.
    pub device_memory_limit: Size,
    /// `spill.host_pool_size` (default `"none"`: pin as needed); a fraction is of *device* memory.
    #[serde(with = "none_size")]
    pub host_pool_size: Option<Size>,
    /// `spill.pin_ahead` (default `"auto"`): see [`PinAhead`].
    pub pin_ahead: PinAhead,
    /// `spill.on_demand` (default `true`): on an out-of-memory error, spill and retry.
    pub on_demand: bool,
    /// `spill.eager_unspill` (default `false`): move data back once memory allows, not on use.
    pub eager_unspill: bool,
    /// `spill.disk_directory` (default `"none"` = no disk tier): where host memory spills to.
    #[serde(with = "none_path")]
    pub disk_directory: Option<PathBuf>,
}

impl Default for SpillConfig {
    fn default() -> Self {
        SpillConfig {
            enabled: false,
            device_memory_limit: Size::Fraction(0.8),
            host_pool_size: None,
            pin_ahead: PinAhead::Auto,
            on_demand: true,
            eager_unspill: false,
            disk_directory: None,
        }
    }
}

/// `[stats]`: allocation statistics (RMM's statistics adaptor).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsConfig {
    /// `stats.enabled` (default `false`).
    pub enabled: bool,
}

/// `[tracking]`: tracking of live allocations (RMM's tracking adaptor).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrackingConfig {
    /// `tracking.enabled` (default `false`).
    pub enabled: bool,
    /// `tracking.backtraces` (default `false`, with `enabled`): a backtrace per allocation (slow).
    pub backtraces: bool,
}

/// `[device.N.pool]`. `None`: not overridden; `Some(None)`: `"auto"`/`"none"` on this device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolOverride {
    /// Overrides `pool.initial_size`.
    #[serde(with = "auto_size_override", skip_serializing_if = "Option::is_none")]
    pub initial_size: Option<Option<Size>>,
    /// Overrides `pool.maximum_size`.
    #[serde(with = "none_size_override", skip_serializing_if = "Option::is_none")]
    pub maximum_size: Option<Option<Size>>,
    /// Overrides `pool.release_threshold`.
    #[serde(with = "none_size_override", skip_serializing_if = "Option::is_none")]
    pub release_threshold: Option<Option<Size>>,
    /// Overrides `pool.growth`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<Size>,
}

/// `[device.N.limits]`: per-device hard cap.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsOverride {
    /// Overrides `limits.device_memory_limit`.
    #[serde(with = "none_size_override", skip_serializing_if = "Option::is_none")]
    pub device_memory_limit: Option<Option<Size>>,
}

/// `[device.N.spill]`: per-device spill sizes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpillOverride {
    /// Overrides `spill.device_memory_limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory_limit: Option<Size>,
    /// Overrides `spill.host_pool_size`.
    #[serde(with = "none_size_override", skip_serializing_if = "Option::is_none")]
    pub host_pool_size: Option<Option<Size>>,
}

/// `[device.N]`: sizes that differ on device N (e.g. `[device.1] pool.initial_size = "8GiB"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceOverride {
    /// Pool sizes for this device.
    #[serde(skip_serializing_if = "is_default")]
    pub pool: PoolOverride,
    /// Hard cap for this device.
    #[serde(skip_serializing_if = "is_default")]
    pub limits: LimitsOverride,
    /// Spill sizes for this device.
    #[serde(skip_serializing_if = "is_default")]
    pub spill: SpillOverride,
}

/// Whether `value` is its type's default: an override that overrides nothing.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The whole configuration ([`crate::ConfigLoader`]). `Default` is RMM's Python
/// `reinitialize()` default (no pool, device 0, no logging), one worker per device, features
/// off. Equality ignores where values came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `backend` (default `"auto"`).
    pub backend: BackendChoice,
    /// `devices` (default `[0]`): `"all"`, ordinals, UUIDs.
    pub devices: Devices,
    /// `workers_per_device` (default `1`): up to [`crate::MAX_WORKERS_PER_DEVICE`].
    pub workers_per_device: u32,
    /// `[pool]`.
    pub pool: PoolConfig,
    /// `[logging]`.
    pub logging: LoggingConfig,
    /// `[limits]`.
    pub limits: LimitsConfig,
    /// `[spill]`.
    pub spill: SpillConfig,
    /// `[stats]`.
    pub stats: StatsConfig,
    /// `[tracking]`.
    pub tracking: TrackingConfig,
    /// `[device.N]` tables, by ordinal.
    #[serde(with = "ordinal_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub device: BTreeMap<u32, DeviceOverride>,
    /// Where each non-default key came from; filled by the loader.
    #[serde(skip)]
    pub(crate) sources: Provenance,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendChoice::Auto,
            devices: Devices::default(),
            workers_per_device: 1,
            pool: PoolConfig::default(),
            logging: LoggingConfig::default(),
            limits: LimitsConfig::default(),
            spill: SpillConfig::default(),
            stats: StatsConfig::default(),
            tracking: TrackingConfig::default(),
            device: BTreeMap::new(),
            sources: Provenance::default(),
        }
    }
}

/// Key → source for keys not at their default. Not part of a config's value: always equal.
#[derive(Debug, Clone, Default)]
pub(crate) struct Provenance(pub(crate) BTreeMap<String, Source>);

impl PartialEq for Provenance {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// An ordinal written as decimal digits only (so `+1` or `1.0` are not ordinals).
pub(crate) fn parse_ordinal(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `keyword` (case-insensitive) → `None`, anything else → a size.
pub(crate) fn parse_opt_size(
    value: &toml::Value,
    keyword: &str,
) -> Result<Option<Size>, crate::size::ParseSizeError> {
    match value {
        toml::Value::String(s) if s.trim().eq_ignore_ascii_case(keyword) => Ok(None),
        other => Size::from_toml(other).map(Some),
    }
}

fn serialize_opt_size<S: Serializer>(
    value: &Option<Size>,
    keyword: &str,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(size) => size.serialize(serializer),
        None => serializer.serialize_str(keyword),
    }
}

fn deserialize_opt_size<'de, D: Deserializer<'de>>(
    deserializer: D,
    keyword: &str,
) -> Result<Option<Size>, D::Error> {
    let value = toml::Value::deserialize(deserializer)?;
    parse_opt_size(&value, keyword).map_err(serde::de::Error::custom)
}

/// Serde for `Option<Size>` as a size or a keyword, and per-device `Option<Option<Size>>`
/// (outer `None`: key absent, not serialized).
macro_rules! opt_size_modules {
    ($plain:ident, $overridden:ident, $keyword:literal) => {
        mod $plain {
            use super::*;
            pub(crate) fn serialize<S: Serializer>(
                v: &Option<Size>,
                s: S,
            ) -> Result<S::Ok, S::Error> {
                serialize_opt_size(v, $keyword, s)
            }
            pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
                d: D,
            ) -> Result<Option<Size>, D::Error> {
                deserialize_opt_size(d, $keyword)
            }
        }

        mod $overridden {
            use super::*;
            pub(crate) fn serialize<S: Serializer>(
                v: &Option<Option<Size>>,
                s: S,
            ) -> Result<S::Ok, S::Error> {
                match v {
                    Some(inner) => serialize_opt_size(inner, $keyword, s),
                    None => s.serialize_none(),
                }
            }
            pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
                d: D,
            ) -> Result<Option<Option<Size>>, D::Error> {
                deserialize_opt_size(d, $keyword).map(Some)
            }
        }
    };
}

opt_size_modules!(auto_size, auto_size_override, "auto");
opt_size_modules!(none_size, none_size_override, "none");

/// `Option<PathBuf>` written as a path or `"none"`.
mod none_path {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(v: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(path) => path.serialize(s),
            None => s.serialize_str("none"),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<PathBuf>, D::Error> {
        let text = String::deserialize(d)?;
        Ok((!text.trim().eq_ignore_ascii_case("none")).then(|| PathBuf::from(text)))
    }
}

/// `BTreeMap<u32, _>` with string keys, as TOML tables need; empty overrides are skipped.
mod ordinal_map {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        map: &BTreeMap<u32, DeviceOverride>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(
            map.iter()
                .filter(|(_, o)| !is_default(*o))
                .map(|(n, o)| (n.to_string(), o)),
        )
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<u32, DeviceOverride>, D::Error> {
        BTreeMap::<String, DeviceOverride>::deserialize(d)?
            .into_iter()
            .map(|(key, o)| match parse_ordinal(&key) {
                Some(n) => Ok((n, o)),
                None => Err(serde::de::Error::custom(format!(
                    "[device.{key}]: device tables are keyed by ordinal, e.g. [device.1]"
                ))),
            })
            .collect()
    }
}
