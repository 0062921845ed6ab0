//! Device memory shared between processes of one host: the sender stages a value in its device's
//! [`ExportArena`] and sends an [`IpcDescriptor`]; the receiver maps the arena once ([`Imports`])
//! and copies from it. The sender holds the [`ExportSlot`] until the receiver has copied.

mod descriptor;
mod export;
mod import;

pub use descriptor::IpcDescriptor;
pub use export::{
    DEFAULT_ARENA_BYTES, ExportArena, ExportSlot, arena_bytes, export_arena, exported_bytes,
};
pub use import::{Imports, Located};
