//! The crate's error type and the record of where a value came from.

use std::fmt;
use std::path::PathBuf;

use crate::size::human;

/// Where an effective value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The built-in default.
    Default,
    /// A configuration file (or TOML text given to [`crate::ConfigLoader::toml_str`]).
    File(PathBuf),
    /// An environment variable, by name.
    Env(String),
    /// An override in code ([`crate::ConfigLoader::set`]).
    Code,
}

impl fmt::Display for Source {
    /// `default`, `file rmm.toml`, `environment RMM_POOL__ENABLED` or `code`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Env(name) => write!(f, "environment {name}"),
            Source::Code => f.write_str("code"),
        }
    }
}

/// A key, its value as written, and its source; shown in conflict messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The dotted key, e.g. `pool.initial_size` or `device.1.pool.initial_size`.
    pub key: String,
    /// The value as written, possibly with what it resolved to (`50% = 40GiB`).
    pub value: String,
    /// Where the value came from.
    pub origin: Source,
}

impl fmt::Display for Setting {
    /// `pool.initial_size = 8GiB (file rmm.toml)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {} ({})", self.key, self.value, self.origin)
    }
}

/// Errors loading, checking or resolving a configuration, each naming where, key, value and fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file exists (or was named explicitly) but cannot be read.
    #[error(
        "{}: cannot read the configuration file: {source}; check the path and that this \
         process may read it, or name another file (RMM_CONFIG, ConfigLoader::file)",
        path.display()
    )]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `RMM_CONFIG` names a file that does not exist.
    #[error(
        "environment RMM_CONFIG = \"{}\": no such file; create it, or unset RMM_CONFIG to read \
         ./rmm.toml when present",
        path.display()
    )]
    ConfigFileMissing {
        /// The path from `RMM_CONFIG`.
        path: PathBuf,
    },
    /// The file is not valid TOML.
    #[error(
        "{}: not valid TOML: {message}\nFix the syntax at the line and column shown: \
         `key = value` lines under `[section]` headers, text values in quotes",
        path.display()
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// A key (or `RMM_*` variable) that the configuration does not have.
    #[error("{}", unknown_key(origin, key, suggestions, hint))]
    UnknownKey {
        /// Where it was written.
        origin: Source,
        /// The dotted key (for the environment, derived from the variable name).
        key: String,
        /// Close valid names (environment names for the environment).
        suggestions: Vec<String>,
        /// What the valid keys are, when there is no suggestion.
        hint: String,
    },
    /// A value that is not of the key's form.
    #[error("{}", invalid_value(origin, key, value, problem))]
    InvalidValue {
        /// Where it was written.
        origin: Source,
        /// The dotted key.
        key: String,
        /// The value as written (TOML syntax, or the quoted environment text).
        value: String,
        /// Why it is wrong and what is expected.
        problem: String,
    },
    /// `pool.async` and `pool.managed` are both on.
    #[error(
        "pool.async = true ({async_origin}) conflicts with pool.managed = true \
         ({managed_origin}): CUDA's async allocator cannot allocate managed memory; set one \
         of them to false"
    )]
    AsyncWithManaged {
        /// Where `pool.async` was set.
        async_origin: Source,
        /// Where `pool.managed` was set.
        managed_origin: Source,
    },
    /// The pool's initial size is above its maximum.
    #[error(
        "{}{initial} is above {maximum}; lower the initial size or raise the maximum",
        on_device(*device)
    )]
    InitialAboveMaximum {
        /// The device, when only its sizes conflict.
        device: Option<u32>,
        /// The initial size.
        initial: Box<Setting>,
        /// The maximum size.
        maximum: Box<Setting>,
    },
    /// The default initial size (half the free memory) needs the device's free memory, not given.
    #[error(
        "device {device}: the pool's default initial size is half the device's free memory, \
         and its DeviceFacts have no free_memory; read it when Config::needs_free_memory is \
         true (device_facts does), or set pool.initial_size"
    )]
    FreeMemoryNotGiven {
        /// The device.
        device: u32,
    },
    /// The pool's initial size is above the device's hard cap.
    #[error(
        "on device {device}, {initial} is above {limit}: the pool could not start; lower the \
         initial size or raise the limit"
    )]
    InitialAboveLimit {
        /// The device.
        device: u32,
        /// The initial size.
        initial: Box<Setting>,
        /// The hard cap.
        limit: Box<Setting>,
    },
    /// A device named by `devices` or by a `[device.N]` table is not present.
    #[error(
        "{key} ({origin}) names device {selector}, which is not present; present devices: \
         {present}; {remedy}"
    )]
    DeviceNotPresent {
        /// `devices` or `device.N`.
        key: String,
        /// Where it was set.
        origin: Source,
        /// The ordinal or UUID as written.
        selector: String,
        /// The devices the backend reports, e.g. `0 (GPU-…), 1 (GPU-…)`.
        present: String,
        /// What to do.
        remedy: &'static str,
    },
    /// One device is selected twice (by ordinal and by UUID).
    #[error(
        "devices ({origin}) selects device {ordinal} twice (by ordinal and by UUID); list it once"
    )]
    DeviceSelectedTwice {
        /// The device.
        ordinal: u32,
        /// Where `devices` was set.
        origin: Source,
    },
    /// `devices = "all"` and the backend reports no device.
    #[error(
        "devices = all ({origin}) but no device is present; check the driver and \
         CUDA_VISIBLE_DEVICES, or set backend = \"sim\""
    )]
    NoDevices {
        /// Where `devices` was set.
        origin: Source,
    },
    /// A size is larger than the device's total memory.
    #[error(
        "{setting} is larger than device {device}'s {} of memory; use at most that, or a \
         fraction such as \"90%\"",
        human(*total_memory)
    )]
    LargerThanDevice {
        /// The device.
        device: u32,
        /// The size.
        setting: Box<Setting>,
        /// The device's total memory in bytes.
        total_memory: u64,
    },
    /// A size is set for a feature that is off, so it does nothing.
    #[error(
        "{setting} has no effect: {feature} is off ({}); turn it on, or remove the key",
        switches.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    UnusedSize {
        /// The size.
        setting: Box<Setting>,
        /// What is off, e.g. "the pool".
        feature: &'static str,
        /// The switches that would turn it on, all off.
        switches: Vec<Setting>,
    },
    /// The spill limit is above the hard limit: allocations fail before spilling starts.
    #[error(
        "on device {device}, {spill} is above {limit}: allocations fail at the hard limit \
         before the device ever holds enough to start spilling; lower the spill limit below \
         the hard limit (dask-cuda spills at 80% of its limit)"
    )]
    SpillAboveLimit {
        /// The device.
        device: u32,
        /// `spill.device_memory_limit`, resolved.
        spill: Box<Setting>,
        /// `limits.device_memory_limit`, resolved.
        limit: Box<Setting>,
    },
    /// A size of pinned host memory is larger than the host memory the process may use.
    #[error(
        "{setting} is larger than the {} of host memory this process may use (pinned memory \
         cannot be paged out: pinning it would get the process killed); use less, or \
         \"none\" to pin only as spilling needs",
        human(*host_memory)
    )]
    LargerThanHost {
        /// The size.
        setting: Box<Setting>,
        /// Host memory the process may use, in bytes (physical memory, or its cgroup's limit).
        host_memory: u64,
    },
    /// A size is below 256 bytes and so rounds down to zero.
    #[error(
        "{setting} is below 256 bytes on device {device}: sizes are rounded down to a multiple \
         of 256 bytes; use at least 256 bytes"
    )]
    RoundsToZero {
        /// The device.
        device: u32,
        /// The size.
        setting: Box<Setting>,
    },
    /// A value nests deeper than [`crate::MAX_NESTING`] levels (or contains itself).
    #[error(
        "{origin}: {key} nests tables or arrays deeper than {limit} levels (the limit); a \
         configuration value needs at most a few (e.g. device.1.pool.initial_size): flatten it"
    )]
    TooDeep {
        /// Where it was written.
        origin: Source,
        /// The dotted key path to the first value past the limit, e.g. `devices[0][0]`.
        key: String,
        /// The limit, [`crate::MAX_NESTING`].
        limit: usize,
    },
    /// More than one problem; each is listed.
    #[error("{} problems in the configuration:{}", .0.len(), list(.0))]
    Several(Vec<Error>),
    /// [`crate::Config::to_toml`] failed (a path that is not UTF-8).
    #[error("cannot write the configuration as TOML: {0}; use UTF-8 paths")]
    Serialize(String),
    /// A bug in rmm-config: a checked value failed to deserialize.
    #[error("internal error in rmm-config (please report): {0}")]
    Internal(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// One error as is, several as [`Error::Several`]; `Ok` when there are none.
    pub(crate) fn from_list(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Several(errors)),
        }
    }

    /// The individual errors: itself, or each of [`Error::Several`].
    pub fn all(&self) -> Vec<&Error> {
        match self {
            Error::Several(list) => list.iter().collect(),
            one => vec![one],
        }
    }
}

fn list(errors: &[Error]) -> String {
    errors.iter().map(|e| format!("\n- {e}")).collect()
}

fn on_device(device: Option<u32>) -> String {
    device.map_or_else(String::new, |n| format!("on device {n}, "))
}

fn invalid_value(origin: &Source, key: &str, value: &str, problem: &str) -> String {
    match origin {
        Source::File(path) => format!("{}: {key} = {value}: {problem}", path.display()),
        Source::Env(name) => format!("environment {name} = {value}: {problem}"),
        Source::Code => format!("code override {key} = {value}: {problem}"),
        Source::Default => format!("default {key} = {value}: {problem}"),
    }
}

fn unknown_key(origin: &Source, key: &str, suggestions: &[String], hint: &str) -> String {
    let what = match origin {
        Source::File(path) => format!("{}: unknown key {key}", path.display()),
        Source::Env(name) => format!("environment {name}: unknown setting {key}"),
        Source::Code => format!("code override: unknown key {key}"),
        Source::Default => format!("unknown key {key}"),
    };
    match suggestions {
        [] => format!("{what}; {hint}"),
        [one] => format!("{what}; did you mean {one}?"),
        [first, rest @ ..] => format!("{what}; did you mean {first} or {}?", rest.join(" or ")),
    }
}
