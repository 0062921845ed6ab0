//! Files written whole or not at all: the bytes go to a temporary file beside the target,
//! which replaces the target only once every byte is on disk. A write that fails (a full
//! disk) leaves the target as it was, and no temporary file behind.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};

/// A file to be written with [`AtomicFile::commit`]; until then nothing at its path changes.
/// Dropped without a commit, it leaves nothing behind.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    target: Target,
}

#[derive(Debug)]
enum Target {
    /// A regular file, or none yet: a temporary file in the same directory, renamed over it.
    Replace(tempfile::NamedTempFile),
    /// Not a regular file (a device such as `/dev/null`, a FIFO), which cannot be replaced:
    /// written in place.
    InPlace(File),
}

impl AtomicFile {
    /// Prepares to write `path`: a file already there must be writable, and its directory
    /// must take a new file (the temporary one, created now, with the permissions of the file
    /// it will replace, or those of a new file). A symbolic link's target is written, not the
    /// link.
    ///
    /// # Errors
    /// The I/O error when `path` is a directory, a file there cannot be written, or no file
    /// can be created beside it.
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        let path = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)?,
            _ => path.to_path_buf(),
        };
        let existing = match std::fs::metadata(&path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Some(m) = &existing {
            if m.is_dir() {
                return Err(io::Error::new(ErrorKind::IsADirectory, "is a directory"));
            }
            // Opened without truncating: the check that this process may write it.
            let file = OpenOptions::new().write(true).open(&path)?;
            if !m.is_file() {
                return Ok(AtomicFile {
                    path,
                    target: Target::InPlace(file),
                });
            }
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let prefix = match path.file_name() {
            Some(n) => format!(".{}.", n.to_string_lossy()),
            None => ".".to_string(),
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        match &existing {
            Some(m) => {
                builder.permissions(m.permissions());
            }
            None => {
                // Those of a new file (tempfile's own are the owner's only); the umask applies.
                #[cfg(unix)]
                builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
            }
        }
        let temp = builder.tempfile_in(dir)?;
        Ok(AtomicFile {
            path,
            target: Target::Replace(temp),
        })
    }

    /// The path written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` as the file's whole contents: to the temporary file, synced to disk,
    /// then renamed over the path (a device or FIFO is written in place).
    ///
    /// # Errors
    /// The I/O error of the write, the sync or the rename; the file at the path is then as it
    /// was, and the temporary file is removed.
    pub fn commit(self, bytes: &[u8]) -> io::Result<()> {
        match self.target {
            Target::Replace(mut temp) => {
                temp.write_all(bytes)?;
                temp.as_file().sync_all()?;
                temp.persist(&self.path).map_err(|e| e.error)?;
                Ok(())
            }
            Target::InPlace(mut file) => {
                file.write_all(bytes)?;
                file.flush()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_path_changes_only_on_commit_and_nothing_else_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.svg");
        drop(AtomicFile::create(&path).unwrap());
        assert!(names(dir.path()).is_empty(), "nothing left uncommitted");
        AtomicFile::create(&path)
            .unwrap()
            .commit(b"<svg/>")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"<svg/>");
        let pending = AtomicFile::create(&path).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"<svg/>",
            "as it was until the commit"
        );
        pending.commit(b"1").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"1");
        assert_eq!(names(dir.path()), ["x.svg"]);
        let e = AtomicFile::create(dir.path()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IsADirectory);
        let e = AtomicFile::create(&dir.path().join("missing").join("x.svg")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }

    #[cfg(unix)]
    #[test]
    fn a_replaced_file_keeps_its_permissions_and_a_link_its_target() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pickle");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        AtomicFile::create(&path).unwrap().commit(b"new").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        let link = dir.path().join("link.pickle");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        AtomicFile::create(&link)
            .unwrap()
            .commit(b"via link")
            .unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"via link");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_device_is_written_in_place_and_its_errors_come_back() {
        AtomicFile::create(Path::new("/dev/null"))
            .unwrap()
            .commit(b"x")
            .unwrap();
        let e = AtomicFile::create(Path::new("/dev/full"))
            .unwrap()
            .commit(b"x")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StorageFull, "{e}");
    }
}
