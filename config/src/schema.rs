//! Every key, its value kind, and the key and value checks that give the error messages.

use crate::size::{ParseSizeError, Size};
use rmm_allocator::backend::BackendChoice;

use crate::MAX_WORKERS_PER_DEVICE as MAX_WORKERS;
use crate::types::{Devices, LogLevel, parse_opt_size, parse_ordinal};

/// The prefix of every environment variable the loader reads.
pub const ENV_PREFIX: &str = "RMM_";

/// `RMM_*` variables that are not keys, left alone: the file path, the simulated device's
/// settings, the CLI's log filter, the benchmarks' knobs. Add other crates' variables here.
pub const ENV_NOT_KEYS: &[&str] = &["RMM_CONFIG", "RMM_SIM_*", "RMM_LOG", "RMM_BENCH_*"];

/// RAPIDS RMM's own `RMM_*` variables (its debug log): ignored with a note, not refused.
pub const ENV_RAPIDS_IGNORED: &[&str] = &[
    "RMM_DEBUG_LOG_FILE",
    "RMM_LOG_FILE",
    "RMM_LOGGING_LEVEL",
    "RMM_DEFAULT_LOGGING_LEVEL",
];

/// The value a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Backend,
    Devices,
    /// A whole number from 1 to [`crate::MAX_WORKERS_PER_DEVICE`].
    Count,
    Bool,
    /// `true`, `false` or `"auto"`.
    Switch,
    Size,
    /// A size or the keyword (case-insensitive), which means "not set".
    OptSize(&'static str),
    Path,
    /// A path or `"none"`.
    OptPath,
    /// A size, `"auto"` or `"none"` ([`crate::types::PinAhead`]).
    PinAhead,
    /// A share such as `"5%"` or `"none"` ([`crate::overhead::Overhead`]).
    Overhead,
    Level,
}

#[derive(Debug)]
pub(crate) struct KeySpec {
    /// The dotted TOML key, e.g. `pool.initial_size`.
    pub key: &'static str,
    pub kind: Kind,
    /// Whether `[device.N]` tables may override it.
    pub per_device: bool,
}

const fn key(key: &'static str, kind: Kind) -> KeySpec {
    KeySpec {
        key,
        kind,
        per_device: false,
    }
}

const fn device_key(key: &'static str, kind: Kind) -> KeySpec {
    KeySpec {
        key,
        kind,
        per_device: true,
    }
}

/// Every key, in the order `rmm info` lists them. A test checks this against `Config`.
pub(crate) const KEYS: &[KeySpec] = &[
    key("backend", Kind::Backend),
    key("devices", Kind::Devices),
    key("workers_per_device", Kind::Count),
    key("pool.enabled", Kind::Bool),
    key("pool.managed", Kind::Bool),
    key("pool.async", Kind::Bool),
    device_key("pool.initial_size", Kind::OptSize("auto")),
    device_key("pool.maximum_size", Kind::OptSize("none")),
    device_key("pool.release_threshold", Kind::OptSize("none")),
    device_key("pool.growth", Kind::Size),
    key("pool.vmm", Kind::Switch),
    key("pool.max_overhead", Kind::Overhead),
    key("logging.enabled", Kind::Bool),
    key("logging.directory", Kind::Path),
    key("logging.file_name", Kind::Path),
    key("logging.level", Kind::Level),
    device_key("limits.device_memory_limit", Kind::OptSize("none")),
    key("spill.enabled", Kind::Bool),
    device_key("spill.device_memory_limit", Kind::Size),
    device_key("spill.host_pool_size", Kind::OptSize("none")),
    key("spill.pin_ahead", Kind::PinAhead),
    key("spill.on_demand", Kind::Bool),
    key("spill.eager_unspill", Kind::Bool),
    key("spill.disk_directory", Kind::OptPath),
    key("stats.enabled", Kind::Bool),
    key("tracking.enabled", Kind::Bool),
    key("tracking.backtraces", Kind::Bool),
];

/// Every key (dotted), in listing order; per-device ones may also appear as `device.N.<key>`.
pub fn keys() -> impl Iterator<Item = &'static str> {
    KEYS.iter().map(|k| k.key)
}

/// The keys a `[device.N]` table may set (without the `device.N.` prefix).
pub fn per_device_keys() -> impl Iterator<Item = &'static str> {
    KEYS.iter().filter(|k| k.per_device).map(|k| k.key)
}

/// The environment variable for a dotted key: `pool.initial_size` → `RMM_POOL__INITIAL_SIZE`,
/// `device.1.pool.initial_size` → `RMM_DEVICE__1__POOL__INITIAL_SIZE`.
pub fn env_var_name(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

/// Whether `name` is one of [`ENV_NOT_KEYS`] (a trailing `*` matches a prefix).
pub(crate) fn env_is_not_a_key(name: &str) -> bool {
    ENV_NOT_KEYS
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *pattern,
        })
}

/// What a dotted path names.
pub(crate) enum Lookup {
    Leaf(&'static KeySpec),
    /// A table: `pool`, `device`, `device.1`, `device.1.pool`.
    Section,
    Unknown,
}

pub(crate) fn lookup(path: &str) -> Lookup {
    if path == "device" {
        return Lookup::Section;
    }
    match device_scope(path) {
        Some((None, _)) => Lookup::Unknown,
        Some((Some(_), "")) => Lookup::Section,
        Some((Some(_), tail)) => lookup_in(tail, true),
        None => lookup_in(path, false),
    }
}

/// For a path under `device.`: the ordinal after it (`None`: not an ordinal) and the rest of
/// the path (`""` if none).
fn device_scope(path: &str) -> Option<(Option<u32>, &str)> {
    let rest = path.strip_prefix("device.")?;
    let (ordinal, tail) = rest.split_once('.').unwrap_or((rest, ""));
    Some((parse_ordinal(ordinal), tail))
}

fn lookup_in(path: &str, per_device: bool) -> Lookup {
    let specs = || KEYS.iter().filter(move |k| !per_device || k.per_device);
    if let Some(spec) = specs().find(|k| k.key == path) {
        return Lookup::Leaf(spec);
    }
    let is_section = specs().any(|k| {
        k.key
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    });
    if is_section {
        Lookup::Section
    } else {
        Lookup::Unknown
    }
}

/// Rewrites `device.01.x` as `device.1.x` so that one device has one spelling.
pub(crate) fn canonical_path(path: &str) -> String {
    match device_scope(path) {
        Some((Some(n), "")) => format!("device.{n}"),
        Some((Some(n), tail)) => format!("device.{n}.{tail}"),
        _ => path.to_string(),
    }
}

/// The ordinal of a path inside a `[device.N]` table (`device.N.…`).
fn inside_device(path: &str) -> Option<u32> {
    let (ordinal, _) = path.strip_prefix("device.")?.split_once('.')?;
    parse_ordinal(ordinal)
}

/// Valid dotted names near `path` (leaves and tables), for "did you mean".
fn candidates(path: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for spec in KEYS {
        let mut parts: Vec<&str> = spec.key.split('.').collect();
        while !parts.is_empty() {
            names.push(parts.join("."));
            parts.pop();
        }
    }
    names.push("device".into());
    // Inside `device.N`, offer that device's keys.
    if let Some(n) = inside_device(path) {
        names.extend(per_device_keys().map(|k| format!("device.{n}.{k}")));
    }
    names.sort();
    names.dedup();
    names
}

/// Suggestions for an unknown dotted key: the keys with the same last component when there
/// are one or two (`pool.device_memory_limit` → limits.… and spill.…), else the closest name.
pub(crate) fn suggest(path: &str) -> Vec<String> {
    let scope_prefix = match device_scope(path) {
        // A global-only key or a bad ordinal: the hint says more than a guess.
        Some((Some(_), tail)) if KEYS.iter().any(|k| k.key == tail) => return Vec::new(),
        Some((None, _)) => return Vec::new(),
        Some((Some(n), _)) => format!("device.{n}."),
        None => String::new(),
    };
    let leaf = path.rsplit('.').next().unwrap_or(path);
    let same_leaf: Vec<String> = KEYS
        .iter()
        .filter(|k| scope_prefix.is_empty() || k.per_device)
        .filter(|k| k.key.rsplit('.').next() == Some(leaf))
        .map(|k| format!("{scope_prefix}{}", k.key))
        .collect();
    if (1..=2).contains(&same_leaf.len()) {
        return same_leaf;
    }
    closest(path, candidates(path)).into_iter().collect()
}

/// The name most like `name` among `names`, if one is at least 70 % alike.
fn closest(name: &str, names: Vec<String>) -> Option<String> {
    names
        .into_iter()
        .map(|other| (strsim::normalized_damerau_levenshtein(name, &other), other))
        .filter(|(score, _)| *score >= 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, other)| other)
}

/// A hint for an unknown key when there is no suggestion.
pub(crate) fn hint(path: &str) -> String {
    if let Some((ordinal, tail)) = device_scope(path) {
        if ordinal.is_none() {
            return "per-device tables are keyed by ordinal, e.g. [device.1]".into();
        }
        let settable = per_device_keys().collect::<Vec<_>>().join(", ");
        return if KEYS.iter().any(|k| k.key == tail) {
            format!("{tail} cannot be set per device; a [device.N] table takes {settable}")
        } else {
            format!("a [device.N] table takes {settable}")
        };
    }
    let (section, _) = path.rsplit_once('.').unwrap_or(("", path));
    let in_section: Vec<&str> = KEYS
        .iter()
        .filter_map(|k| {
            let (s, leaf) = k.key.rsplit_once('.').unwrap_or(("", k.key));
            (s == section).then_some(leaf)
        })
        .collect();
    match (section, in_section.is_empty()) {
        (_, true) => "see the example rmm.toml for every key".into(),
        ("", false) => format!(
            "the top-level keys are {} and the tables [pool], [logging], [limits], [spill], \
             [stats], [tracking], [device.N]",
            in_section.join(", ")
        ),
        (section, false) => format!("[{section}] takes {}", in_section.join(", ")),
    }
}

/// Environment names near `name` (an unknown `RMM_*` variable).
pub(crate) fn suggest_env(name: &str, path: &str) -> Option<String> {
    let mut names: Vec<String> = KEYS.iter().map(|k| env_var_name(k.key)).collect();
    if let Some(n) = inside_device(path) {
        names.extend(per_device_keys().map(|k| env_var_name(&format!("device.{n}.{k}"))));
    }
    closest(name, names)
}

impl Kind {
    /// The accepted forms, for "expected …" in errors. `env` selects the text forms.
    pub(crate) fn expected(self, env: bool) -> String {
        let forms = match self {
            Kind::Backend => r#""auto", "cuda" or "sim""#,
            Kind::Devices if env => {
                r#""all" or ordinals and UUIDs separated by commas, e.g. "0,1" or "GPU-8932f937-…""#
            }
            Kind::Devices => {
                r#""all", an ordinal, or a list of ordinals and UUIDs, e.g. [0, 1] or ["GPU-8932f937-…"]"#
            }
            Kind::Count => return format!("expected a whole number from 1 to {MAX_WORKERS}"),
            Kind::Bool if env => "true or false (or 1/0, yes/no, on/off)",
            Kind::Bool => "true or false",
            Kind::Switch if env => "true, false or auto (or 1/0, yes/no, on/off)",
            Kind::Switch => r#"true, false or "auto""#,
            Kind::Size => r#"bytes, "2GiB" or "50%""#,
            Kind::OptSize(keyword) => {
                return format!(r#"expected bytes, "2GiB", "50%" or "{keyword}""#);
            }
            Kind::PinAhead => r#"bytes, "2GiB", "50%", "auto" or "none""#,
            Kind::Overhead => {
                r#"a share of the peak in use such as "5%" (or the fraction 0.05, at most 1), or "none""#
            }
            Kind::Path => "a directory path",
            Kind::OptPath => r#"a directory path or "none""#,
            Kind::Level => r#""trace", "debug", "info", "warn", "error" or "off""#,
        };
        format!("expected {forms}")
    }

    /// Checks a value; the error is the whole problem text (reason and expected form).
    pub(crate) fn check(self, value: &toml::Value, env: bool) -> Result<(), String> {
        let valid = |ok: bool| if ok { Ok(()) } else { Err(None) };
        let string = value.as_str();
        let result: Result<(), Option<String>> = match self {
            Kind::Backend => valid(string.and_then(BackendChoice::from_name).is_some()),
            Kind::Level => valid(string.and_then(LogLevel::parse).is_some()),
            Kind::Bool => valid(value.is_bool()),
            Kind::Switch => valid(crate::types::Switch::from_toml(value).is_some()),
            Kind::Overhead => valid(crate::overhead::Overhead::from_toml(value).is_some()),
            Kind::Count => valid(
                value
                    .as_integer()
                    .is_some_and(|n| n >= 1 && n <= i64::from(MAX_WORKERS)),
            ),
            Kind::Path | Kind::OptPath => valid(string.is_some_and(|s| !s.trim().is_empty())),
            Kind::Devices => Devices::from_toml(value).map(drop),
            Kind::Size => Size::from_toml(value).map(drop).map_err(size_reason),
            Kind::OptSize(keyword) => parse_opt_size(value, keyword)
                .map(drop)
                .map_err(size_reason),
            Kind::PinAhead => crate::types::PinAhead::from_toml(value)
                .map(drop)
                .map_err(size_reason),
        };
        result.map_err(|reason| match reason {
            None => self.expected(env),
            Some(reason) => format!("{reason}; {}", self.expected(env)),
        })
    }

    /// Turns environment text into the TOML value it stands for; [`Kind::check`] then judges it.
    pub(crate) fn parse_text(self, text: &str) -> toml::Value {
        let trimmed = text.trim();
        let as_string = || toml::Value::String(text.to_string());
        match self {
            Kind::Bool | Kind::Switch => match trimmed.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => toml::Value::Boolean(true),
                "false" | "0" | "no" | "off" => toml::Value::Boolean(false),
                _ => as_string(),
            },
            Kind::Count => trimmed
                .parse()
                .map(toml::Value::Integer)
                .unwrap_or_else(|_| as_string()),
            // A bare number is a fraction, as in TOML ("0.05"); "5%" and "none" stay text.
            Kind::Overhead => trimmed
                .parse::<f64>()
                .map(toml::Value::Float)
                .unwrap_or_else(|_| as_string()),
            Kind::Devices if trimmed.eq_ignore_ascii_case("all") => as_string(),
            Kind::Devices => toml::Value::Array(
                trimmed
                    .split(',')
                    .map(|item| {
                        let item = item.trim();
                        match parse_ordinal(item) {
                            Some(n) => toml::Value::Integer(n.into()),
                            None => toml::Value::String(item.to_string()),
                        }
                    })
                    .collect(),
            ),
            _ => as_string(),
        }
    }
}

/// The reason worth stating before "expected …"; none for plain malformed input.
fn size_reason(error: ParseSizeError) -> Option<String> {
    match error {
        ParseSizeError::Malformed => None,
        other => Some(other.to_string()),
    }
}
