//! The output options every reporting subcommand (`bench`, `demo`, `info`, `replay`) takes the
//! same way: `--json`, `--quiet` and `--format`.
//!
//! - default: a few `key: value` lines and aligned tables ([`TableFormat::Text`]) on standard
//!   output; progress and notes on standard error;
//! - `--format markdown`: the same tables as markdown;
//! - `--json`: one JSON document on standard output and nothing else there (sizes in bytes,
//!   durations in seconds); notes still go to standard error;
//! - `--quiet`: nothing on standard output and no progress; errors still go to standard error
//!   and the exit status says how it went. Files asked for (`--plot`) are still written.
//!
//! `--json` and `--quiet` exclude each other, and `--format` applies to tables only, so it
//! excludes `--json` (clap reports such a mix as a usage error, exit status 2).

use clap::Args;
use rmm_cli::table::{Table, TableFormat};

/// `--json`, `--quiet`, `--format`.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct OutputArgs {
    /// Print one JSON document on standard output instead of text (sizes in bytes, durations
    /// in seconds).
    #[arg(long, conflicts_with_all = ["quiet", "format"])]
    pub json: bool,
    /// Print nothing on standard output and no progress; errors still go to standard error.
    #[arg(long, short)]
    pub quiet: bool,
    /// How tables are printed: aligned text, or markdown to paste into a page.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<TableFormat>,
}

impl OutputArgs {
    /// Whether text (lines and tables) goes to standard output.
    pub fn text(&self) -> bool {
        !self.json && !self.quiet
    }

    /// Whether progress and notes go to standard error.
    pub fn progress(&self) -> bool {
        !self.quiet
    }

    /// The table format.
    pub fn table_format(&self) -> TableFormat {
        self.format.unwrap_or_default()
    }

    /// `table` in the chosen format.
    pub fn table(&self, table: &Table) -> String {
        table.render(self.table_format())
    }
}
