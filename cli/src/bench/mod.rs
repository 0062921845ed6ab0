//! Benchmarks as a library: what `cargo bench --bench allocators` and `rmm bench` run.
//!
//! - the workload traces ([`churn_trace`], [`random_trace`]: `churn`, `random`, `small`) and
//!   [`replay`], which times a trace against a resource;
//! - [`run_allocators`]: every resource on every workload shape in one run, as an
//!   [`AllocatorReport`] that prints as the markdown table and serializes to JSON;
//! - [`footprint`]: what a resource reserves, phase by phase, for a multi-stream workload
//!   whose live set stays under a cap.
//!
//! ```no_run
//! use rmm_cli::bench::{AllocatorBenchOptions, Scale, run_allocators};
//!
//! let backend = rmm::allocator::backend::global()?;
//! let report = run_allocators(backend, &AllocatorBenchOptions::at_scale(Scale::Tiny))?;
//! print!("{report}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod allocators;
pub mod footprint;
mod traces;

pub use allocators::{
    AllocatorBenchOptions, AllocatorReport, Failure, Resource, ResourceRow, Scale, Shape,
    SpeedupRow, Speedups, run as run_allocators, run_with as run_allocators_with,
};
pub use traces::{GIB, MIB, Op, Rng, churn_trace, peak_bytes, random_trace, replay};

/// Why a benchmark could not run (or one of its measurements failed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// An option is out of range or a name is unknown.
    #[error("invalid benchmark option {option}: {reason}")]
    InvalidOption {
        /// The option (e.g. `scale`).
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The device, a stream or a resource failed.
    #[error(transparent)]
    Allocator(#[from] rmm::allocator::Error),
    /// A benchmark thread could not be started.
    #[error("could not start a benchmark thread: {0}")]
    Spawn(std::io::Error),
    /// A benchmark thread panicked.
    #[error("a benchmark thread panicked")]
    ThreadPanicked,
    /// A multi-thread measurement failed.
    #[error("with {threads} threads: {source}")]
    Threads {
        /// The number of threads of the measurement.
        threads: usize,
        /// The first failure of a thread.
        source: Box<BenchError>,
    },
}

impl BenchError {
    pub(crate) fn invalid(option: &'static str, reason: impl Into<String>) -> Self {
        BenchError::InvalidOption {
            option,
            reason: reason.into(),
        }
    }
}
