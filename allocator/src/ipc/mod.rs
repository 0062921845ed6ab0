//! Device memory shared between processes of one host, so a worker hands a local peer a value's
//! bytes without a socket. The sender stages them in its device's [`ExportArena`] (exportable:
//! `cuMemAlloc` and `cuIpcGetMemHandle`, or a shared file on the simulated device) and sends an
//! [`IpcDescriptor`] of a few dozen bytes; the receiver maps the arena once ([`Imports`],
//! `cuIpcOpenMemHandle`) and copies device to device over NVLink or PCIe, or into its pinned host
//! tier. The sender holds the [`ExportSlot`] until the receiver has copied.

mod descriptor;
mod export;
mod import;

pub use descriptor::IpcDescriptor;
pub use export::{
    DEFAULT_ARENA_BYTES, ExportArena, ExportSlot, arena_bytes, export_arena, exported_bytes,
};
pub use import::{Imports, Located};
