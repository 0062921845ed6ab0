//! Reading memory event logs in RMM's CSV format, whole into an [`EventLog`] or a line at a time
//! with a [`LogReader`], every line checked and each free tied to the allocation it frees.

mod lines;
mod parser;
mod reader;

pub use parser::{EventLog, Freed, LogEvent};
pub use reader::{LogFigures, LogLine, LogReader};
