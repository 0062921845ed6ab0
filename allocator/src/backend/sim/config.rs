//! The simulated device's configuration (count, size, backed or not) and `RMM_SIM_*` variables.

use crate::error::{Error, Result};

/// Whether simulated device memory holds data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimMemoryMode {
    /// Host memory backs every allocation; copies move real bytes.
    Backed,
    /// Addresses only; copies are checked but move nothing, reads see zeros.
    Unbacked,
}

/// How the simulated backend is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of devices.
    pub devices: u32,
    /// Memory of each device in bytes.
    pub capacity: usize,
    /// Backed or unbacked memory.
    pub mode: SimMemoryMode,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 2,
            capacity: 24 << 30,
            mode: SimMemoryMode::Backed,
        }
    }
}

impl SimConfig {
    /// The default overridden by `RMM_SIM_DEVICES`, `RMM_SIM_MEMORY` (e.g. `80GiB`), `RMM_SIM_MODE`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an invalid value.
    pub fn from_env() -> Result<Self> {
        let mut cfg = SimConfig::default();
        if let Ok(v) = std::env::var("RMM_SIM_DEVICES") {
            cfg.devices = v
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    Error::invalid_argument("RMM_SIM_DEVICES", &v, "a device count from 1 to 64")
                })?;
        }
        if let Ok(v) = std::env::var("RMM_SIM_MEMORY") {
            cfg.capacity = parse_capacity(&v).ok_or_else(|| {
                Error::invalid_argument(
                    "RMM_SIM_MEMORY",
                    &v,
                    "a positive size in bytes or with a unit, e.g. 80GiB or 512MB",
                )
            })?;
        }
        if let Ok(v) = std::env::var("RMM_SIM_MODE") {
            cfg.mode = match v.trim().to_ascii_lowercase().as_str() {
                "backed" => SimMemoryMode::Backed,
                "unbacked" => SimMemoryMode::Unbacked,
                _ => {
                    return Err(Error::invalid_argument(
                        "RMM_SIM_MODE",
                        &v,
                        "\"backed\" or \"unbacked\"",
                    ));
                }
            };
        }
        Ok(cfg)
    }
}

/// Parses `123`, `80GiB`, `512 MB`, `1.5GB` into bytes.
pub(super) fn parse_capacity(text: &str) -> Option<usize> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = value * scale;
    (1.0..1e18).contains(&bytes).then_some(bytes as usize)
}
