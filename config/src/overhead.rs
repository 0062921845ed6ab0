//! `pool.max_overhead`: the pool's footprint limit as a share of its peak in use.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::size::toml_value_conversions;

/// `pool.max_overhead`: how far above its peak in use a pool may grow, as a share of that
/// peak (`"5%"`, `0.05`), or `"none"` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "toml::Value")]
pub enum Overhead {
    /// `"none"`: the pool keeps what it grew to.
    #[default]
    Unlimited,
    /// At most this fraction (at least 0) above the peak in use.
    Share(f64),
}

// Shares are finite (`from_toml` refuses NaN), so equality is reflexive.
impl Eq for Overhead {}

impl Overhead {
    /// From TOML: `"none"`, `"5%"` or a fraction of at most 1 (`0.05`); else (or negative) `None`.
    pub(crate) fn from_toml(value: &toml::Value) -> Option<Overhead> {
        let share = match value {
            toml::Value::String(s) => {
                let s = s.trim();
                if s.eq_ignore_ascii_case("none") {
                    return Some(Overhead::Unlimited);
                }
                s.strip_suffix('%')?.trim().parse::<f64>().ok()? / 100.0
            }
            // Above 1, more likely a percentage without its sign ("5"); "500%" is unambiguous.
            toml::Value::Float(f) if *f <= 1.0 => *f,
            toml::Value::Integer(i) if *i <= 1 => *i as f64,
            _ => return None,
        };
        (share.is_finite() && share >= 0.0).then_some(Overhead::Share(share))
    }

    /// The fraction, or `None` without a limit.
    pub fn fraction(self) -> Option<f64> {
        match self {
            Overhead::Unlimited => None,
            Overhead::Share(f) => Some(f),
        }
    }
}

impl fmt::Display for Overhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Overhead::Unlimited => f.write_str("none"),
            // Rounded: 0.07 × 100 is 7.000000000000001 in binary.
            Overhead::Share(s) => write!(f, "{}%", (s * 100.0 * 1e6).round() / 1e6),
        }
    }
}

toml_value_conversions!(
    Overhead,
    String,
    |v| Overhead::from_toml(v).ok_or_else(|| format!(
        "{v} is not a share of the peak in use such as \"5%\", or \"none\""
    )),
    |o: &Overhead| toml::Value::String(o.to_string())
);
