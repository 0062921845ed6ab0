//! Fault injection from `RMM_SIM_*` variables when [`open`](crate::backend::open) makes the
//! simulated backend, for processes that cannot reach [`SimBackend`] (Python, Dask workers). The
//! variables and their syntax are in `docs/guide.md` (the simulated device's fault injection); any
//! other `RMM_SIM_FAIL_*` name is an error, lest a misspelt fault silently inject nothing.

use std::ffi::OsString;

use super::SimBackend;
use super::config::parse_capacity;
use crate::error::{Error, Result};

const ALLOCATION: &str = "RMM_SIM_FAIL_ALLOCATION";
const ALLOCATIONS_ABOVE: &str = "RMM_SIM_FAIL_ALLOCATIONS_ABOVE";
const COPY: &str = "RMM_SIM_FAIL_COPY";
const PIN: &str = "RMM_SIM_FAIL_PIN";
const FILE_WRITE: &str = "RMM_SIM_FAIL_FILE_WRITE";
const HOST_MEMORY: &str = "RMM_SIM_HOST_MEMORY";
const FAIL_PREFIX: &str = "RMM_SIM_FAIL_";
const FAIL_NAMES: [&str; 5] = [ALLOCATION, ALLOCATIONS_ABOVE, COPY, PIN, FILE_WRITE];

const COUNT_FORM: &str = "a count N for device 0 (the N-th operation fails; 0: none) or \
                          DEVICE:N, comma-separated for several devices, e.g. 3 or 0:3,1:5";
const SIZE_FORM: &str = "a size in bytes or with a unit for device 0, or DEVICE:SIZE, \
                         comma-separated for several devices, e.g. 64MiB or 0:64MiB,1:1GiB";
const PIN_FORM: &str = "a count N (the N-th pin of host memory fails, on any device: no \
                        DEVICE: part; 0: none), e.g. 3";
const HOST_FORM: &str = "a positive size in bytes or with a unit, e.g. 8GiB or 512MB";

/// Faults to inject into a simulated backend, as `RMM_SIM_*` variables ask; put in force by
/// [`SimFaults::apply`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimFaults {
    /// `RMM_SIM_FAIL_ALLOCATION`: `(device, n)`: the device's `n`-th allocation fails.
    pub allocation: Vec<(u32, u64)>,
    /// `RMM_SIM_FAIL_ALLOCATIONS_ABOVE`: `(device, bytes)`: its allocations above `bytes` fail.
    pub allocations_above: Vec<(u32, usize)>,
    /// `RMM_SIM_FAIL_COPY`: `(device, n)`: the device's `n`-th copy or memset fails.
    pub copy: Vec<(u32, u64)>,
    /// `RMM_SIM_FAIL_PIN`: the `n`-th host pin fails (pins belong to no device).
    pub pin: Option<u64>,
    /// `RMM_SIM_FAIL_FILE_WRITE`: `(device, n)`: the `n`-th write to its spill files fails.
    pub file_write: Vec<(u32, u64)>,
    /// `RMM_SIM_HOST_MEMORY`: the host memory the process may use, in bytes.
    pub host_memory: Option<u64>,
}

impl SimFaults {
    /// The faults `(name, value)` pairs ask for on `devices` devices; other names are ignored.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`]: an unparsable value, an unknown device, a device named twice in
    /// one variable, or an `RMM_SIM_FAIL_*` name that names no fault.
    pub fn from_vars<I, K, V>(vars: I, devices: u32) -> Result<SimFaults>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut faults = SimFaults::default();
        for (name, value) in vars {
            let (name, value) = (name.as_ref(), value.as_ref());
            match name {
                ALLOCATION => faults.allocation = per_device(ALLOCATION, value, devices, count)?,
                ALLOCATIONS_ABOVE => {
                    faults.allocations_above =
                        per_device(ALLOCATIONS_ABOVE, value, devices, parse_capacity)?;
                }
                COPY => faults.copy = per_device(COPY, value, devices, count)?,
                FILE_WRITE => faults.file_write = per_device(FILE_WRITE, value, devices, count)?,
                PIN => {
                    faults.pin = Some(
                        count(value)
                            .ok_or_else(|| Error::invalid_argument(PIN, value, PIN_FORM))?,
                    );
                }
                HOST_MEMORY => {
                    faults.host_memory = Some(
                        parse_capacity(value)
                            .ok_or_else(|| Error::invalid_argument(HOST_MEMORY, value, HOST_FORM))?
                            as u64,
                    );
                }
                _ if name.starts_with(FAIL_PREFIX) => {
                    return Err(Error::invalid_argument(
                        "RMM_SIM_FAIL_*",
                        format!("{name}={value}"),
                        format!(
                            "one of {}: this name injects no fault; check its spelling",
                            FAIL_NAMES.join(", ")
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(faults)
    }

    /// [`SimFaults::from_vars`] over the environment's `RMM_SIM_*` variables.
    ///
    /// # Errors
    /// As [`SimFaults::from_vars`].
    pub fn from_env(devices: u32) -> Result<SimFaults> {
        let vars = std::env::vars_os().filter_map(|(name, value): (OsString, OsString)| {
            let name = name.into_string().ok()?;
            name.starts_with("RMM_SIM_")
                .then(|| (name, value.to_string_lossy().into_owned()))
        });
        SimFaults::from_vars(vars, devices)
    }

    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        *self == SimFaults::default()
    }

    /// Puts the faults in force on `sim`, each `n` counting from its operations so far (as
    /// [`SimBackend::fail_nth_allocation`]); the host memory limit replaces any earlier one.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] when a fault names a device `sim` lacks.
    pub fn apply(&self, sim: &SimBackend) -> Result<()> {
        for &(dev, n) in &self.allocation {
            sim.fail_nth_allocation(dev, n)?;
        }
        for &(dev, bytes) in &self.allocations_above {
            sim.fail_allocations_above(dev, bytes)?;
        }
        for &(dev, n) in &self.copy {
            sim.fail_nth_copy(dev, n)?;
        }
        for &(dev, n) in &self.file_write {
            sim.fail_nth_file_write(dev, n)?;
        }
        if let Some(n) = self.pin {
            sim.fail_nth_pin(n);
        }
        if let Some(bytes) = self.host_memory {
            sim.limit_host_memory(Some(bytes));
        }
        Ok(())
    }
}

/// A count: digits, surrounding white space ignored.
fn count(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// Parses `variable`'s `value`: comma-separated `X` (device 0) or `D:X`, each device named once.
fn per_device<T>(
    variable: &'static str,
    value: &str,
    devices: u32,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<(u32, T)>> {
    let form = if variable == ALLOCATIONS_ABOVE {
        SIZE_FORM
    } else {
        COUNT_FORM
    };
    let bad = |why: String| Error::invalid_argument(variable, value, format!("{form}{why}"));
    let mut out: Vec<(u32, T)> = Vec::new();
    for entry in value.split(',') {
        let (dev, x) = match entry.split_once(':') {
            Some((d, x)) => {
                let dev = count(d)
                    .and_then(|d| u32::try_from(d).ok())
                    .ok_or_else(|| bad(format!(" ({:?} is not a device number)", d.trim())))?;
                (dev, x)
            }
            None => (0, entry),
        };
        if dev >= devices {
            return Err(bad(format!(
                " (device {dev} is not one of the {devices} simulated devices, 0 to {}: \
                 RMM_SIM_DEVICES sets how many there are)",
                devices.saturating_sub(1)
            )));
        }
        let x = parse(x).ok_or_else(|| bad(format!(" ({:?} does not parse)", x.trim())))?;
        if out.iter().any(|(d, _)| *d == dev) {
            return Err(bad(format!(" (device {dev} is named twice)")));
        }
        out.push((dev, x));
    }
    Ok(out)
}
