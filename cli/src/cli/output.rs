//! Output files (`--plot`, `--torch-snapshot`) prepared before the work, so that a path that
//! cannot be written fails at once instead of after the whole run, and written whole or not
//! at all ([`AtomicFile`]): a run that fails, or a disk that fills up, leaves the file as it
//! was and nothing beside it.

use std::path::Path;

use rmm_cli::atomic_file::AtomicFile;

/// An output file, checked and prepared since the command started (a temporary file beside
/// it); nothing at its path changes until [`OutputFile::write`] replaces it whole.
#[derive(Debug)]
pub struct OutputFile {
    option: String,
    file: AtomicFile,
}

impl OutputFile {
    /// Prepares `path`, given as `option`; the error names the option, the path, why, and
    /// what to do.
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
        let file =
            AtomicFile::create(path).map_err(|e| problem(format!("cannot be written ({e})")))?;
        Ok(OutputFile {
            option: option.to_string(),
            file,
        })
    }

    /// [`OutputFile::open`] when `path` is given (an optional `option` such as `--plot`).
    pub fn open_optional(option: &str, path: Option<&Path>) -> Result<Option<OutputFile>, String> {
        path.map(|p| OutputFile::open(option, p)).transpose()
    }

    /// The path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Replaces the file with `bytes`; when that fails, the file is as it was.
    pub fn write(self, bytes: &[u8]) -> Result<(), String> {
        let path = self.file.path().display().to_string();
        self.file.commit(bytes).map_err(|e| {
            format!(
                "{} {path}: writing it failed ({e}) and it was not replaced; free space on its \
                 disk, or give another path",
                self.option
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_there_only_once_written_and_an_old_one_stays_until_then() {
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
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no other file"
        );
        let err = OutputFile::open("--plot", dir.path()).unwrap_err();
        assert!(err.contains("is a directory"), "{err}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_full_disk_is_an_error_naming_the_option_and_the_path() {
        let err = OutputFile::open("--torch-snapshot", Path::new("/dev/full"))
            .unwrap()
            .write(b"snapshot")
            .unwrap_err();
        assert!(
            err.starts_with("--torch-snapshot /dev/full: writing it failed (")
                && err.contains("No space left on device"),
            "{err}"
        );
    }
}
