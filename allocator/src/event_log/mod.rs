//! Reading memory event logs in RMM's CSV format (RMM's own, or one written by
//! [`LoggingResourceAdaptor`](crate::adaptor::LoggingResourceAdaptor)): whole into an
//! [`EventLog`], or a line at a time with a [`LogReader`]. Every line is checked as it is read,
//! and each free is tied to the allocation it frees. `rmm replay` plays logs against a resource.

mod lines;
mod parser;
mod reader;

pub use parser::{EventLog, Freed, LogEvent};
pub use reader::{LogFigures, LogLine, LogReader};
