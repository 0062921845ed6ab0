//! A log's lines, read with a bounded buffer: an input without line ends (`/dev/zero`, a
//! compressed file) is an error once a line passes [`MAX_LINE_BYTES`], not unbounded growth.

use std::io::{BufRead, Read};

use crate::error::{Error, Result};

/// The longest line a log may have, in bytes, its line end included (RMM's are about 100).
pub(crate) const MAX_LINE_BYTES: usize = 4096;

/// The lines of one input, one at a time, in a buffer of at most [`MAX_LINE_BYTES`].
pub(crate) struct Lines<R> {
    input: R,
    source: String,
    /// The last line read (reused: no allocation per line).
    text: String,
    /// Lines read so far, blank ones counted.
    number: usize,
}

impl<R> std::fmt::Debug for Lines<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("source", &self.source)
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

impl<R: BufRead> Lines<R> {
    /// `source` names `input` in errors.
    pub(crate) fn new(input: R, source: &str) -> Self {
        Lines {
            input,
            source: source.to_string(),
            text: String::new(),
            number: 0,
        }
    }

    /// The next non-blank line, without its line end, and its 1-based number; `None` at the end.
    /// [`Error::EventLog`] when the input cannot be read, or a line is too long or not UTF-8.
    pub(crate) fn next_line(&mut self) -> Result<Option<(usize, &str)>> {
        loop {
            let mut bytes = std::mem::take(&mut self.text).into_bytes();
            bytes.clear();
            if !self.read_line(&mut bytes)? {
                return Ok(None);
            }
            self.number += 1;
            self.text = String::from_utf8(bytes).map_err(|e| {
                self.error(
                    Some(self.number),
                    format!("found bytes that are not UTF-8 text ({})", e.utf8_error()),
                    "A log is text: is this a compressed or binary file? Decompress it first \
                     (e.g. zcat log.csv.gz | rmm replay -)",
                )
            })?;
            let line = self.text.trim_end_matches(['\n', '\r']);
            if !line.trim().is_empty() {
                self.text.truncate(line.len());
                return Ok(Some((self.number, self.text.as_str())));
            }
        }
    }

    /// Appends the next line (line end included) to `line`, reading at most [`MAX_LINE_BYTES`] + 1.
    fn read_line(&mut self, line: &mut Vec<u8>) -> Result<bool> {
        let read = (&mut self.input)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', line)
            .map_err(|e| {
                self.error(
                    None,
                    format!("reading the log failed: {e}"),
                    "Check the path; logs are text files such as rmm_log.dev0.csv",
                )
            })?;
        if line.len() > MAX_LINE_BYTES {
            return Err(self.error(
                Some(self.number + 1),
                format!(
                    "found a line longer than {MAX_LINE_BYTES} bytes, the most a log line \
                     may have (RMM's are about 100)"
                ),
                "Give a log in RMM's CSV format, one event per line, as text (a \
                 compressed log decompressed first, e.g. zcat log.csv.gz | rmm replay -)",
            ));
        }
        Ok(read > 0)
    }

    fn error(&self, line: Option<usize>, problem: String, hint: &str) -> Error {
        Error::event_log(&self.source, line, problem, hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Result<Vec<(usize, String)>> {
        let mut lines = Lines::new(input, "t.csv");
        let mut out = Vec::new();
        while let Some((n, l)) = lines.next_line()? {
            out.push((n, l.to_string()));
        }
        Ok(out)
    }

    #[test]
    fn blank_lines_are_counted_and_skipped_and_line_ends_trimmed() {
        let got = all(b"a\r\n\n  \nb\rc\nlast").unwrap();
        assert_eq!(
            got,
            [
                (1, "a".to_string()),
                (4, "b\rc".to_string()),
                (5, "last".to_string())
            ]
        );
    }

    #[test]
    fn a_line_past_the_limit_is_an_error_naming_it_and_one_at_the_limit_is_not() {
        let mut text = b"h\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES - 1));
        text.push(b'\n');
        assert_eq!(all(&text).unwrap()[1].1.len(), MAX_LINE_BYTES - 1);
        text.pop();
        text.extend(b"xx\n");
        let e = all(&text).unwrap_err().to_string();
        assert!(
            e.contains("t.csv line 2") && e.contains(&format!("longer than {MAX_LINE_BYTES}")),
            "{e}"
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_an_error_naming_the_line() {
        let e = all(b"h\nok\n\xff\xfe\n").unwrap_err().to_string();
        assert!(e.contains("t.csv line 3") && e.contains("not UTF-8"), "{e}");
    }
}
