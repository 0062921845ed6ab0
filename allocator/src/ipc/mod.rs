//! Device memory shared between processes of one host: how a worker hands a peer on the same
//! machine a value's bytes without sending them through a socket. The sender stages the
//! bytes in its device's [`ExportArena`] (memory the driver can export: `cuMemAlloc` and
//! `cuIpcGetMemHandle`, or a shared file on the simulated device) and sends an
//! [`IpcDescriptor`] of a few dozen bytes; the receiver maps the arena once
//! ([`Imports`], `cuIpcOpenMemHandle`) and copies the bytes where it keeps them, device to
//! device over NVLink or PCIe, or straight into its pinned host tier. The sender holds the
//! [`ExportSlot`] until the receiver says it has copied.

mod descriptor;
mod export;
mod import;

pub use descriptor::IpcDescriptor;
pub use export::{
    DEFAULT_ARENA_BYTES, ExportArena, ExportSlot, arena_bytes, export_arena, exported_bytes,
};
pub use import::{Imports, Located};
