//! The code behind the `rmm` command (package `rmm-cli`): the subcommands' workloads, kept in a
//! library so that `cargo bench` and the tests run the same code as the command.
//!
//! - [`demo`]: `rmm demo`, a Dask-shaped workload through the runtime with reinitializes and
//!   spilling, checked end to end;
//! - [`bench`](mod@bench): the allocator benchmarks of `rmm bench` and `cargo bench --bench allocators`
//!   (the workload traces, every resource on every shape, the pool's footprint);
//! - [`timeline`]: memory over time per device, drawn as an SVG picture or written as a
//!   PyTorch memory snapshot (`--plot`, `--torch-snapshot`).
//! - [`atomic_file`]: files written whole or not at all (the plots and snapshots).
//!
//! The memory runtime itself is the [`rmm`] crate; this one adds the command line, the
//! progress display, the plotting and the snapshot formats on top.

pub mod atomic_file;
pub mod bench;
pub mod demo;
pub mod plural;
pub mod replay;
pub mod table;
pub mod timeline;
pub mod units;
