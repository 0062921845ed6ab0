//! The disk tier: one file per spilled buffer under `spill.disk_directory`.
//!
//! Data reaches a file from the host tier or straight from the device, through two pinned staging
//! slots (so the tier works when host memory is short), pipelined with the file I/O.
//!
//! Spill files have no name (`O_TMPFILE`, or `O_EXCL` and unlinked at once; mode 0600), so none
//! is left behind however the process ends. Only a process killed between creating and unlinking
//! a named file (`rmm-spill-<pid>-…`) can leave one; the next disk tier in that directory sweeps
//! those of dead pids. See also [`remove_files_for_exit`].

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::copy::{CopyStreams, Direction};
use crate::backend::DevicePtr;
use crate::backend::host::PinnedSlice;
use crate::backend::pinned_copy::{CopyFailed, PinnedCopy};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::PinnedHostPool;
use crate::stream_view::StreamView;

/// The prefix of every spill file's name: `rmm-spill-<pid>-…`.
const FILE_PREFIX: &str = "rmm-spill-";

/// Directories in use by this process's disk tiers, and whether files may still be made there.
/// Files are created under the read lock, so the exit removal (write lock) sees them all.
static DIRECTORIES: RwLock<Directories> = RwLock::new(Directories {
    closed: false,
    list: Vec::new(),
});

struct Directories {
    closed: bool,
    list: Vec<PathBuf>,
}

/// The pid a spill file's name carries (`rmm-spill-<pid>-…`), if it is one.
fn owner_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(FILE_PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

/// Whether process `pid` is alive; `None` when this system cannot tell (no `/proc`).
fn alive(pid: u32) -> Option<bool> {
    let proc = Path::new("/proc");
    (proc.join("self").exists()).then(|| proc.join(pid.to_string()).exists())
}

/// Removes dead processes' spill files in `directory` (with `own`, this pid's too: a former
/// process's); returns how many. Best effort: failures are logged.
fn sweep(directory: &Path, own: bool) -> usize {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return 0;
    };
    let me = std::process::id();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner_of) else {
            continue;
        };
        let stale = if pid == me {
            own
        } else {
            alive(pid) == Some(false)
        };
        if !stale || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                "removing {} (left by process {pid}, which is gone): {e}",
                entry.path().display()
            ),
        }
    }
    if removed > 0 {
        tracing::info!(
            "removed {removed} spill file(s) left in {} by processes that are gone",
            directory.display()
        );
    }
    removed
}

/// Registers `directory` for this process's disk tiers, first sweeping dead processes' files.
fn register(directory: &Path) {
    let key = std::fs::canonicalize(directory).unwrap_or_else(|_| directory.to_path_buf());
    let mut dirs = DIRECTORIES.write();
    // First store here: files with this pid are an earlier process's (pids are reused).
    let first = !dirs.list.contains(&key);
    sweep(directory, first);
    if first {
        dirs.list.push(key);
    }
}

/// For a process about to exit without unwinding (on SIGINT/SIGTERM, from a signal thread): removes
/// this process's named spill files (at most one, being made) and makes spilling to disk fail from
/// then on; data already on disk stays readable. Returns how many were removed.
pub fn remove_files_for_exit() -> usize {
    let mut dirs = DIRECTORIES.write();
    dirs.closed = true;
    let prefix = format!("{FILE_PREFIX}{}-", std::process::id());
    let mut removed = 0;
    for dir in &dirs.list {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
                && std::fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}

/// Bytes per staging slot (two slots per device).
pub(crate) const STAGING: usize = 32 << 20;

/// Spill files of one device.
#[derive(Debug)]
pub(crate) struct DiskStore {
    device: Device,
    directory: PathBuf,
    prefix: String,
    /// Two pinned slots; holding the lock serializes a device's traffic with its disk.
    staging: Mutex<Vec<PinnedSlice>>,
    /// Where the slots come from (and a lost one's replacement).
    staging_pool: PinnedHostPool,
    held: Arc<AtomicU64>,
    next: AtomicU64,
    /// The process's limit of open files when the store was made, for messages.
    file_limit: Option<u64>,
}

/// One buffer's bytes in an unnamed file, open while this lives; dropping it frees the space.
pub(crate) struct DiskFile {
    file: File,
    /// The file's name in messages (it has none on disk): the directory and the buffer.
    path: PathBuf,
    len: usize,
    held: Arc<AtomicU64>,
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        self.held.fetch_sub(self.len as u64, Ordering::Relaxed);
    }
}

fn io_error(path: &Path, operation: &'static str, e: std::io::Error) -> Error {
    Error::SpillFile {
        path: path.display().to_string(),
        operation,
        problem: e.to_string(),
    }
}

/// Checks at start-up with a probe file that this process can create files in `directory` (made if
/// missing), so a bad `spill.disk_directory` fails here, not at the first spill.
fn check_directory(directory: &Path) -> Result<()> {
    let bad = |problem: String| {
        Error::invalid_argument(
            "spill.disk_directory",
            directory.display(),
            format!(
                "a writable directory, but {problem}; create it, choose another directory, \
                 or set spill.disk_directory = \"none\" to spill to host memory only"
            ),
        )
    };
    std::fs::create_dir_all(directory).map_err(|e| bad(format!("it cannot be created ({e})")))?;
    match std::fs::metadata(directory) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(bad("it is not a directory".into())),
        Err(e) => return Err(bad(format!("it cannot be read ({e})"))),
    }
    // Unique within the process: the devices' stores start in parallel.
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let probe = directory.join(format!(
        "{FILE_PREFIX}{}-probe{}.tmp",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"rmm"))
        .map_err(|e| bad(format!("no file can be written in it ({e})")))?;
    std::fs::remove_file(&probe).map_err(|e| bad(format!("a file in it cannot be removed ({e})")))
}

impl DiskStore {
    /// Spill files of `device` under `directory`; pins staging slots through `device`'s backend.
    pub(crate) fn new(device: Device, directory: &Path) -> Result<DiskStore> {
        check_directory(directory)?;
        register(directory);
        let staging_pool = PinnedHostPool::on(device.backend(), 2 * STAGING)?;
        let staging = vec![
            staging_pool.allocate(STAGING)?,
            staging_pool.allocate(STAGING)?,
        ];
        Ok(DiskStore {
            device,
            directory: directory.to_path_buf(),
            prefix: format!(
                "{FILE_PREFIX}{}-dev{}",
                std::process::id(),
                device.ordinal()
            ),
            staging: Mutex::new(staging),
            staging_pool,
            held: Arc::new(AtomicU64::new(0)),
            next: AtomicU64::new(0),
            file_limit: open_file_limit(),
        })
    }

    /// The backend's fault-injection point before a write to a spill file.
    fn before_write(&self) -> Result<()> {
        self.device
            .backend()
            .before_file_write(self.device.ordinal())
    }

    pub(crate) fn directory(&self) -> &Path {
        &self.directory
    }

    /// Bytes held in files now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// A new empty unnamed file for `len` bytes of buffer `id`, freed when the [`DiskFile`] drops.
    fn create(&self, id: u64, len: usize) -> Result<DiskFile> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.directory.join(format!("{}-{id}-{n}.bin", self.prefix));
        // Held while a named file may exist, so that the removal at exit sees it.
        let dirs = DIRECTORIES.read();
        if dirs.closed {
            return Err(io_error(
                &path,
                "create",
                std::io::Error::other("the process is exiting and has removed its spill files"),
            ));
        }
        let file = match unnamed(&self.directory) {
            Some(Ok(file)) => file,
            Some(Err(e)) => {
                return Err(io_error(&path, "create", with_remedy(e, self.file_limit)));
            }
            None => named_then_unlinked(&path, self.file_limit)?,
        };
        drop(dirs);
        self.held.fetch_add(len as u64, Ordering::Relaxed);
        Ok(DiskFile {
            file,
            path,
            len,
            held: Arc::clone(&self.held),
        })
    }

    /// Writes `chunks` (`len` bytes in all: host slices' [`data_in`], or one piece) to a new file
    /// for buffer `id`.
    pub(crate) fn write_chunks<'a>(
        &self,
        id: u64,
        chunks: impl IntoIterator<Item = &'a [u8]>,
        len: usize,
    ) -> Result<DiskFile> {
        let disk = self.create(id, len)?;
        let mut file = &disk.file;
        for chunk in chunks {
            self.before_write()?;
            file.write_all(chunk)
                .map_err(|e| io_error(&disk.path, "write", e))?;
        }
        finish(file, &disk)?;
        Ok(disk)
    }

    /// Reads `disk` into `slices` (which hold at least its length).
    pub(crate) fn read_slices(&self, disk: &DiskFile, slices: &mut [PinnedSlice]) -> Result<()> {
        let mut offset = 0;
        for piece in data_in_mut(slices, disk.len) {
            self.read_range_into(disk, offset, piece)?;
            offset += piece.len();
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of the file from `offset` into `out`.
    pub(crate) fn read_range_into(
        &self,
        disk: &DiskFile,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        disk.file
            .read_exact_at(out, offset as u64)
            .map_err(|e| io_error(&disk.path, "read", e))
    }

    /// Writes `len` device bytes at `src` to a new file for `id` after `after`'s work; synchronous.
    pub(crate) fn write_from_device(
        &self,
        copies: &CopyStreams,
        id: u64,
        src: DevicePtr,
        len: usize,
        after: StreamView,
    ) -> Result<DiskFile> {
        let device = copies.device();
        let disk = self.create(id, len)?;
        let mut file = &disk.file;
        // Chunks are copied into the free slots while the oldest copied chunk is written out.
        self.with_slots(copies, |free, pending| {
            let stream = copies.ordered_after(Direction::ToHost, after, &[])?;
            let chunks = len.div_ceil(STAGING);
            let mut next = 0;
            loop {
                while next < chunks && !free.is_empty() {
                    let off = next * STAGING;
                    let n = (len - off).min(STAGING);
                    let event = copies.event()?;
                    let slot = free.split_off(free.len() - 1);
                    let copy = PinnedCopy::to_host(device, stream, event, src.offset(off), n, slot)
                        .map_err(|f| reclaim(copies, free, *f))?;
                    pending.push_back((n, copy));
                    next += 1;
                }
                let Some((n, copy)) = pending.pop_front() else {
                    return Ok(());
                };
                let slots = wait_for(copies, free, copy)?;
                let written = self.before_write().and_then(|()| {
                    slots.first().map_or(Ok(()), |slot| {
                        file.write_all(&slot.as_slice()[..n])
                            .map_err(|e| io_error(&disk.path, "write", e))
                    })
                });
                free.extend(slots);
                written?;
            }
        })?;
        finish(file, &disk)?;
        Ok(disk)
    }

    /// Copies `disk` to `len` device bytes at `dst` after `after`'s work; synchronous.
    pub(crate) fn read_to_device(
        &self,
        copies: &CopyStreams,
        disk: &DiskFile,
        dst: DevicePtr,
        after: StreamView,
    ) -> Result<()> {
        let device = copies.device();
        let len = disk.len;
        // Each chunk is read into a free slot while the slots read before are copied out.
        self.with_slots(copies, |free, pending| {
            let stream = copies.ordered_after(Direction::ToDevice, after, &[])?;
            for i in 0..len.div_ceil(STAGING) {
                if free.is_empty()
                    && let Some((_, copy)) = pending.pop_front()
                {
                    let slots = wait_for(copies, free, copy)?;
                    free.extend(slots);
                }
                let Some(slot) = free.last_mut() else {
                    let resource = "the disk tier's staging slots";
                    return Err(Error::host_out_of_memory(STAGING, resource));
                };
                let off = i * STAGING;
                let n = (len - off).min(STAGING);
                self.read_range_into(disk, off, &mut slot.as_mut_slice()[..n])?;
                let event = copies.event()?;
                let slot = free.split_off(free.len() - 1);
                let copy = PinnedCopy::to_device(device, stream, event, slot, dst.offset(off), n)
                    .map_err(|f| reclaim(copies, free, *f))?;
                pending.push_back((n, copy));
            }
            while let Some((_, copy)) = pending.pop_front() {
                let slots = wait_for(copies, free, copy)?;
                free.extend(slots);
            }
            Ok(())
        })
    }

    /// Runs a pipeline over the staging slots (`run(free slots, copies in flight)`), replacing one
    /// lost to an unwaitable copy first if it can; the slots go back once in-flight copies finish
    /// (one a copy may still use leaks instead).
    fn with_slots<R>(
        &self,
        copies: &CopyStreams,
        run: impl FnOnce(&mut Vec<PinnedSlice>, &mut InFlight) -> Result<R>,
    ) -> Result<R> {
        let mut staging = self.staging.lock();
        while staging.len() < 2 {
            staging.push(self.staging_pool.allocate(STAGING)?);
        }
        let mut free = std::mem::take(&mut *staging);
        let mut pending = InFlight::new();
        let result = run(&mut free, &mut pending);
        for (_, copy) in pending {
            match wait_for(copies, &mut free, copy) {
                Ok(slots) => free.extend(slots),
                Err(e) => tracing::error!(
                    "waiting for the disk tier's copies on {}: {e}",
                    copies.device()
                ),
            }
        }
        *staging = free;
        result
    }
}

/// A pipeline's copies in flight, oldest first, with their bytes.
type InFlight = VecDeque<(usize, PinnedCopy<PinnedSlice>)>;

/// The first `len` bytes held in `slices`, in order, a piece per slice.
pub(super) fn data_in(slices: &[PinnedSlice], len: usize) -> impl Iterator<Item = &[u8]> {
    let mut left = len;
    slices.iter().map(move |s| {
        let n = left.min(s.len());
        left -= n;
        &s.as_slice()[..n]
    })
}

/// [`data_in`], writable.
pub(super) fn data_in_mut(
    slices: &mut [PinnedSlice],
    len: usize,
) -> impl Iterator<Item = &mut [u8]> {
    let mut left = len;
    slices.iter_mut().map(move |s| {
        let n = left.min(s.len());
        left -= n;
        &mut s.as_mut_slice()[..n]
    })
}

/// Waits for `copy` and recycles its event: its slots, or the error with what came back in `free`.
fn wait_for(
    copies: &CopyStreams,
    free: &mut Vec<PinnedSlice>,
    copy: PinnedCopy<PinnedSlice>,
) -> Result<Vec<PinnedSlice>> {
    let (slots, event) = copy.wait().map_err(|f| reclaim(copies, free, *f))?;
    copies.recycle(event);
    Ok(slots)
}

/// Puts a failed copy's memory in `free` and event in the pool, if they came back; its error.
fn reclaim(
    copies: &CopyStreams,
    free: &mut Vec<PinnedSlice>,
    failed: CopyFailed<PinnedSlice>,
) -> Error {
    if let Some(memory) = failed.memory {
        free.extend(memory);
    }
    if let Some(event) = failed.event {
        copies.recycle(event);
    }
    failed.error
}

/// Flushes `file` to the OS, not to stable storage: spill files do not outlive the process.
fn finish(mut file: &File, disk: &DiskFile) -> Result<()> {
    file.flush().map_err(|e| io_error(&disk.path, "write", e))
}

/// `e`, with a remedy if it is the open-file limit (each buffer on disk keeps a file open);
/// `file_limit` was read earlier, as no file is left now.
fn with_remedy(e: std::io::Error, file_limit: Option<u64>) -> std::io::Error {
    if !matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
        return e;
    }
    let limit = file_limit.map_or_else(String::new, |n| format!(", {n} when the tier started"));
    std::io::Error::new(
        e.kind(),
        format!(
            "{e}; each buffer on disk keeps its spill file open: raise the process's limit of \
             open files (ulimit -n{limit}), or spill fewer buffers to disk (a larger \
             spill.host_pool_size)"
        ),
    )
}

/// The process's limit of open files (the soft one), from `/proc/self/limits`.
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A new unnamed read-write file in `directory` (`O_TMPFILE`, mode 0600); `None` where unsupported.
#[cfg(target_os = "linux")]
fn unnamed(directory: &Path) -> Option<std::io::Result<File>> {
    let made = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(directory);
    match made {
        Ok(file) => Some(Ok(file)),
        // Unsupported here (EOPNOTSUPP), or an old kernel took it for O_DIRECTORY (EISDIR, EINVAL).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// Unnamed files need `O_TMPFILE` (Linux); elsewhere the caller names and unlinks a file.
#[cfg(not(target_os = "linux"))]
fn unnamed(_directory: &Path) -> Option<std::io::Result<File>> {
    None
}

/// Creates `path` (`O_EXCL`, mode 0600, never following a link), unlinked at once but kept open.
fn named_then_unlinked(path: &Path, file_limit: Option<u64>) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io_error(path, "create", with_remedy(e, file_limit)))?;
    std::fs::remove_file(path).map_err(|e| {
        let problem = std::io::Error::new(e.kind(), format!("unlinking it once made: {e}"));
        io_error(path, "create", problem)
    })?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{SimBackend, SimConfig};

    /// A directory of its own under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!("rmm-disk-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn entries(&self) -> Vec<String> {
            std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_spill_file_has_no_name_and_keeps_its_data_until_dropped() {
        let backend = SimBackend::leak(SimConfig::default()).unwrap();
        let device = Device::on(backend, 0).unwrap();
        let dir = TempDir::new("unnamed");
        let store = DiskStore::new(device, &dir.0).unwrap();
        let pool = PinnedHostPool::on(backend, 2 << 20).unwrap();
        let data: Vec<u8> = (0..(1 << 20) + 77).map(|i| (i % 251) as u8).collect();
        let mut slices = vec![
            pool.allocate(1 << 20).unwrap(),
            pool.allocate(1 << 20).unwrap(),
        ];
        slices[0].as_mut_slice()[..1 << 20].copy_from_slice(&data[..1 << 20]);
        slices[1].as_mut_slice()[..77].copy_from_slice(&data[1 << 20..]);
        let file = store
            .write_chunks(7, data_in(&slices, data.len()), data.len())
            .unwrap();
        // Nothing in the directory that a killed process could leave behind.
        assert_eq!(dir.entries(), Vec::<String>::new());
        assert_eq!(store.held(), data.len() as u64);
        let mut read = vec![0u8; data.len()];
        store.read_range_into(&file, 0, &mut read).unwrap();
        assert_eq!(read, data);
        drop(slices);
        let mut back = vec![
            pool.allocate(1 << 20).unwrap(),
            pool.allocate(1 << 20).unwrap(),
        ];
        store.read_slices(&file, &mut back).unwrap();
        assert_eq!(&back[0].as_slice()[..1 << 20], &data[..1 << 20]);
        assert_eq!(&back[1].as_slice()[..77], &data[1 << 20..]);
        drop(file);
        assert_eq!(store.held(), 0);
        assert_eq!(dir.entries(), Vec::<String>::new());
    }

    /// Child of [`reaching_the_open_file_limit_says_how_to_raise_it`]: spills under a low open-file
    /// limit until stopped, then prints the error.
    #[test]
    #[ignore = "run as the child process of the open-file limit test"]
    fn spilling_child_of_the_open_file_limit_test() {
        let backend = SimBackend::leak(SimConfig::default()).unwrap();
        let dir = TempDir::new("limit-child");
        let store = DiskStore::new(Device::on(backend, 0).unwrap(), &dir.0).unwrap();
        let pool = PinnedHostPool::on(backend, 4096).unwrap();
        let slices = vec![pool.allocate(4096).unwrap()];
        let mut kept = Vec::new();
        while kept.len() < 100_000 {
            match store.write_chunks(1, data_in(&slices, 4096), 4096) {
                Ok(file) => kept.push(file),
                Err(e) => {
                    println!("after {} files: {e}", kept.len());
                    return;
                }
            }
        }
        panic!("100000 spill files and no limit reached");
    }

    #[test]
    fn reaching_the_open_file_limit_says_how_to_raise_it() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 64 && exec \"$0\" \"$@\"")
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "spill::disk::tests::spilling_child_of_the_open_file_limit_test",
                "--ignored",
                "--nocapture",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("keeps its spill file open")
                && stdout.contains("ulimit -n, 64 when the tier started"),
            "{stdout}"
        );
    }

    #[test]
    fn a_named_file_is_unlinked_once_made_and_stays_usable() {
        let dir = TempDir::new("named");
        let path = dir
            .0
            .join(format!("{FILE_PREFIX}{}-dev0-1-0.bin", std::process::id()));
        let mut file = named_then_unlinked(&path, None).unwrap();
        assert_eq!(dir.entries(), Vec::<String>::new());
        file.write_all(b"spilled").unwrap();
        let mut out = [0u8; 7];
        file.read_exact_at(&mut out, 0).unwrap();
        assert_eq!(&out, b"spilled");
        // A planted file (or link) of that name is refused, not followed or truncated.
        std::fs::write(&path, b"planted").unwrap();
        let err = named_then_unlinked(&path, None).unwrap_err();
        assert!(
            matches!(
                err,
                Error::SpillFile {
                    operation: "create",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"planted");
    }
}
