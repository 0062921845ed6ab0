//! Sizes set for a feature that is off: an error, unless a later layer, override or change
//! to a running configuration turned the feature off, which is how a feature is turned off
//! without editing its sizes.

use std::collections::BTreeMap;

use crate::config::SizeKey;
use crate::error::{Error, Result, Setting};
use crate::loader::{Layer, SetAt};
use crate::size::Size;
use crate::types::{Config, PinAhead};

/// A size and the switches that put it to use (any one on).
struct Feature {
    switches: &'static [&'static str],
    /// What the switches turn on, for messages.
    name: &'static str,
}

const fn feature_of(switches: &'static [&'static str], name: &'static str) -> Feature {
    Feature { switches, name }
}

const POOL: Feature = feature_of(&["pool.enabled", "pool.async"], "the pool");
const POOL_ENABLED: Feature = feature_of(&["pool.enabled"], "rmm-rs's pool");
const POOL_ASYNC: Feature = feature_of(&["pool.async"], "the async pool");
const SPILL: Feature = feature_of(&["spill.enabled"], "spilling");

/// The feature a size belongs to; `None` for `limits.device_memory_limit` (always applies).
fn feature(key: SizeKey) -> Option<&'static Feature> {
    match key {
        SizeKey::PoolInitial | SizeKey::PoolMaximum => Some(&POOL),
        SizeKey::PoolGrowth => Some(&POOL_ENABLED),
        SizeKey::ReleaseThreshold => Some(&POOL_ASYNC),
        SizeKey::Limit => None,
        SizeKey::SpillThreshold | SizeKey::HostPool => Some(&SPILL),
    }
}

fn on(config: &Config, switch: &str) -> bool {
    match switch {
        "pool.enabled" => config.pool.enabled,
        "pool.async" => config.pool.use_async,
        "spill.enabled" => config.spill.enabled,
        _ => true,
    }
}

impl Config {
    /// Fails when a size is set (off its default) for a feature that is off and was not turned
    /// off after the size was set (`last`: when the loader last saw each key set).
    ///
    /// # Errors
    /// [`Error::UnusedSize`] for each such size ([`Error::Several`] when there are more).
    pub(crate) fn check_unused_sizes(&self, last: &BTreeMap<String, SetAt>) -> Result<()> {
        let defaults = Config::default();
        let mut found: Vec<(String, Option<Size>, &'static Feature)> = Vec::new();
        for key in SizeKey::ALL {
            let Some(f) = feature(key) else {
                continue;
            };
            // A size at its default (or keyword) sets nothing: rmm.toml lists every key so.
            let default = defaults.effective_size(None, key).size;
            let value = self.effective_size(None, key).size;
            if value.is_some() && value != default {
                found.push((key.key().to_string(), value, f));
            }
            for &ordinal in self.device.keys() {
                let e = self.effective_size(Some(ordinal), key);
                if e.key.starts_with("device.") && e.size.is_some() && e.size != default {
                    found.push((e.key, e.size, f));
                }
            }
        }
        if let PinAhead::Up(size) = self.spill.pin_ahead {
            found.push(("spill.pin_ahead".into(), Some(size), &SPILL));
        }
        let mut errors = Vec::new();
        for (key, value, f) in found {
            if f.switches.iter().any(|s| on(self, s)) {
                continue;
            }
            let Some(&size_set) = last.get(&key) else {
                continue;
            };
            // Carried over from a running configuration, or turned off after it was set.
            let turned_off_later = f
                .switches
                .iter()
                .filter_map(|s| last.get(*s))
                .any(|&at| at > size_set);
            if size_set.0 == Layer::Base || turned_off_later {
                continue;
            }
            let shown = value.map_or_else(String::new, |v| v.to_string());
            errors.push(Error::UnusedSize {
                setting: Box::new(self.setting(&key, shown)),
                feature: f.name,
                switches: f
                    .switches
                    .iter()
                    .map(|s| self.setting(s, "false".into()))
                    .collect::<Vec<Setting>>(),
            });
        }
        Error::from_list(errors)
    }
}
