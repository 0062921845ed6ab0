//! A log line's action and its text, shared by the logging adaptor and the replay.

use std::fmt;

/// What a log line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogAction {
    /// A successful allocation.
    Allocate = 0,
    /// A free.
    Free = 1,
    /// A failed allocation (`allocate failure`).
    AllocateFailure = 2,
}

impl LogAction {
    /// Every action, in the order the log's format lists them (`ALL[a as usize]` is `a`).
    pub const ALL: [LogAction; 3] = [
        LogAction::Allocate,
        LogAction::Free,
        LogAction::AllocateFailure,
    ];

    /// The text in the log.
    pub const fn as_str(self) -> &'static str {
        match self {
            LogAction::Allocate => "allocate",
            LogAction::Free => "free",
            LogAction::AllocateFailure => "allocate failure",
        }
    }

    /// The action whose text is `text`, if any.
    pub fn parse(text: &str) -> Option<LogAction> {
        LogAction::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

impl fmt::Display for LogAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
