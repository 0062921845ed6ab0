//! rmm-rs's own log in a Python process: `RMM_LOG` (tracing's `EnvFilter` syntax, as for the
//! `rmm` command, e.g. `RMM_LOG=rmm::spill=debug`) sends its events to standard error, where
//! a Dask worker's log also goes. Unset, nothing is installed and events cost nothing.

use tracing_subscriber::EnvFilter;

/// Installs the standard-error log when `RMM_LOG` is set (once per process; a subscriber that
/// another library installed first stays). A filter that does not parse logs warnings only,
/// and says so there.
pub(crate) fn init_from_env() {
    let Ok(text) = std::env::var("RMM_LOG") else {
        return;
    };
    let (filter, bad) = match EnvFilter::try_new(&text) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("warn"), Some(e)),
    };
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_thread_names(true)
        .try_init()
        .is_ok();
    if let (true, Some(e)) = (installed, bad) {
        tracing::warn!(
            "RMM_LOG={text:?} is not a log filter ({e}): logging warnings only; write it as \
             RUST_LOG is written, e.g. RMM_LOG=rmm::spill=debug"
        );
    }
}
