//! rmm-rs runtime: what the process runs on, and (as it grows) workers per device,
//! per-device default resources, spilling and reinitialize.

pub mod inventory;

pub use inventory::{DeviceSummary, Inventory};
