//! Backend choice: the process-wide backend a configuration asks for, and its device facts.

use rmm_allocator::Device;
use rmm_allocator::backend::{self, Backend, BackendChoice, BackendKind};
use rmm_config::{Config, DeviceFacts, ResolvedConfig};

use super::{Generation, stack_on};
use crate::error::{Error, Result};

/// Opens the backend `choice` names as the process-wide one, or checks that the one in use
/// agrees (`auto` accepts any).
///
/// # Errors
/// [`Error::BackendMismatch`]: another backend is in use; [`Error::Allocator`]: it cannot be
/// opened (e.g. [`NoDriver`](rmm_allocator::Error::NoDriver) for `cuda` without a driver).
pub fn open_backend(choice: BackendChoice) -> Result<&'static dyn Backend> {
    let wanted = match choice {
        BackendChoice::Auto => None,
        BackendChoice::Cuda => Some(BackendKind::Cuda),
        BackendChoice::Sim => Some(BackendKind::Sim),
    };
    let check = |b: &'static dyn Backend| match wanted {
        Some(kind) if b.kind() != kind => Err(Error::BackendMismatch {
            requested: kind.name(),
            active: b.kind().name(),
        }),
        _ => Ok(b),
    };
    if let Some(b) = backend::installed() {
        return check(b);
    }
    let b = match wanted {
        None => return Ok(backend::global()?),
        Some(_) => backend::open(choice)?,
    };
    match backend::install_global(b) {
        Ok(()) => Ok(b),
        Err(existing) => check(existing),
    }
}

/// What `backend`'s devices report, for resolving `config`: free memory only where a size
/// depends on it ([`Config::needs_free_memory`]: a driver call per device), host memory only
/// with spilling ([`Config::needs_host_memory`]).
///
/// # Errors
/// [`Error::Allocator`] ([`Driver`](rmm_allocator::Error::Driver)): unreadable device facts.
pub fn device_facts(backend: &'static dyn Backend, config: &Config) -> Result<Vec<DeviceFacts>> {
    let read_free = config.needs_free_memory();
    let host_memory = config
        .needs_host_memory()
        .then(|| backend.host_memory().usable());
    (0..backend.device_count())
        .map(|ordinal| {
            let device = Device::on(backend, ordinal)?;
            let properties = device.properties()?;
            let free = read_free.then(|| device.mem_info()).transpose()?;
            Ok(DeviceFacts {
                ordinal,
                uuid: properties.uuid,
                total_memory: properties.total_memory as u64,
                free_memory: free.map(|m| m.free as u64),
                host_memory,
            })
        })
        .collect()
}

/// Resolves `config` against the devices present; with `held`, free memory counts what its
/// stacks would give back, so `"auto"` sizes see the device as it will be.
pub(super) fn resolve(
    backend: &'static dyn Backend,
    config: &Config,
    held: Option<&Generation>,
) -> Result<ResolvedConfig> {
    let mut facts = device_facts(backend, config)?;
    if let Some(generation) = held {
        for f in &mut facts {
            if let (Some(free), Some(s)) = (f.free_memory, stack_on(&generation.stacks, f.ordinal))
            {
                let live = s.live().bytes;
                let held_back = s.reserved_bytes().saturating_sub(live);
                f.free_memory = Some((free + held_back).min(f.total_memory));
            }
        }
    }
    Ok(config.resolve(&facts)?)
}
