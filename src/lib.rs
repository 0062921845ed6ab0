//! rmm-rs: a memory runtime for multi-GPU worker processes.
//!
//! This facade re-exports the member crates: [`allocator`] (backends, resources, adaptors,
//! containers), [`config`] (`rmm.toml`) and [`runtime`] (workers, spilling, reinitialize).
//! The `rmm` command (demo, benchmarks, replay, info) is the `rmm-cli` crate.

pub use rmm_allocator as allocator;
pub use rmm_config as config;
pub use rmm_runtime as runtime;
