//! Device claims: at most one runtime of the process manages a device; claimed at start, old
//! and new ones held while a reinitialize decides, given up at shutdown.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// Device ordinal → id of the runtime that manages it.
static OWNERS: LazyLock<Mutex<BTreeMap<u32, u64>>> = LazyLock::new(Default::default);

/// Claims `devices` for runtime `id`; fails if another runtime has one.
pub(super) fn claim(id: u64, devices: &[u32]) -> Result<()> {
    let mut owners = OWNERS.lock();
    if let Some(&device) = devices
        .iter()
        .find(|d| owners.get(d).is_some_and(|&o| o != id))
    {
        return Err(Error::DeviceInUse { device });
    }
    owners.retain(|_, o| *o != id);
    for &d in devices {
        owners.insert(d, id);
    }
    Ok(())
}

pub(super) fn unclaim(id: u64) {
    OWNERS.lock().retain(|_, o| *o != id);
}
