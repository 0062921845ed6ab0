//! Output files (`--plot`, `--torch-snapshot`) opened before the work, so that a path that
//! cannot be written fails at once instead of after the whole run.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

/// An output file, open for writing since the command started. A file this command created
/// is removed again if nothing is written to it (the run failed); a file that was there is
/// left as it was until [`OutputFile::write`] replaces its contents.
#[derive(Debug)]
pub struct OutputFile {
    path: PathBuf,
    file: Option<File>,
    created: bool,
}

impl OutputFile {
    /// Opens (creating if missing, not yet truncating) `path`, given as `option`; the error
    /// names the option, the path, why, and what to do.
    pub fn open(option: &str, path: &Path) -> Result<OutputFile, String> {
        let problem = |why: String| {
            format!(
                "{option} {}: {why}; give a file path in an existing, writable directory",
                path.display()
            )
        };
        if path.is_dir() {
            return Err(problem("is a directory".into()));
        }
        let existed = path.exists();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| problem(format!("cannot be written ({e})")))?;
        Ok(OutputFile {
            path: path.to_path_buf(),
            file: Some(file),
            created: !existed,
        })
    }

    /// [`OutputFile::open`] when `path` is given (an optional `option` such as `--plot`).
    pub fn open_optional(option: &str, path: Option<&Path>) -> Result<Option<OutputFile>, String> {
        path.map(|p| OutputFile::open(option, p)).transpose()
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file's contents with `bytes`.
    pub fn write(mut self, bytes: &[u8]) -> Result<(), String> {
        let Some(mut file) = self.file.take() else {
            return Ok(());
        };
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(bytes))
            .and_then(|()| file.flush())
            .map_err(|e| format!("writing {}: {e}", self.path.display()))
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.file.take().is_some() && self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_created_and_never_written_is_removed_and_one_written_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.svg");
        drop(OutputFile::open("--plot", &path).unwrap());
        assert!(!path.exists());
        OutputFile::open("--plot", &path)
            .unwrap()
            .write(b"<svg/>")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"<svg/>");
        // An existing file keeps its contents until written.
        drop(OutputFile::open("--plot", &path).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"<svg/>");
        OutputFile::open("--plot", &path)
            .unwrap()
            .write(b"1")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"1");
        let err = OutputFile::open("--plot", dir.path()).unwrap_err();
        assert!(err.contains("is a directory"), "{err}");
    }
}
