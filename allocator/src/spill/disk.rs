//! The disk tier: one file per spilled buffer under `spill.disk_directory`.
//!
//! Data reaches a file from the host tier (pinned slices written out) or straight from the
//! device when the host tier is full. Device traffic goes through two pinned staging slots
//! the store pinned when it was made (so the disk tier works exactly when host memory is
//! short), in a pipeline: while one slot's bytes are written to (or read from) the file, the
//! next chunk is copied into (or out of) the other slot on the copy stream.
//!
//! Files are created new (`O_EXCL`, mode 0600, never following a planted link) and removed
//! when the buffer leaves the disk tier or is dropped; a failed write removes its file.
//!
//! Files a process leaves behind when it dies (SIGKILL, a crash) are removed by the next disk
//! tier that starts in that directory: every file is named `rmm-spill-<pid>-…`, and the files
//! of a pid that is no longer alive are swept. A process that ends on a signal it handles
//! (the `rmm` CLI on SIGINT and SIGTERM) removes its own with [`remove_files_for_exit`].

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
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
use crate::stream::StreamView;

/// The prefix of every spill file's name: `rmm-spill-<pid>-…`.
const FILE_PREFIX: &str = "rmm-spill-";

/// The directories disk tiers of this process use, and whether new files may still be
/// created there (not once [`remove_files_for_exit`] ran). A file is created under the read
/// lock, so that the removal at exit (under the write lock) sees every file.
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
    if !proc.join("self").exists() {
        return None;
    }
    Some(proc.join(pid.to_string()).exists())
}

/// Removes the spill files in `directory` of processes that are no longer alive (and, with
/// `own`, of this process's pid: files left by an earlier process that had it). Returns how
/// many were removed. Failures are logged: sweeping is best effort.
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

/// Registers `directory` as used by a disk tier of this process, sweeping the files that
/// processes no longer alive left there first.
fn register(directory: &Path) {
    let key = std::fs::canonicalize(directory).unwrap_or_else(|_| directory.to_path_buf());
    let mut dirs = DIRECTORIES.write();
    // The first store of this process here: no file of this process can be in it yet, so
    // one with this pid is an earlier process's (pids are reused).
    let first = !dirs.list.contains(&key);
    sweep(directory, first);
    if first {
        dirs.list.push(key);
    }
}

/// Removes every spill file this process has in the directories its disk tiers use, and
/// makes later attempts to create one fail: for a process about to exit without unwinding
/// (on SIGINT or SIGTERM, from a signal-handling thread), so that it leaves no file behind.
/// Returns how many files were removed. Buffers whose data was on disk lose it: call it only
/// on the way out.
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
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore")
            .field("directory", &self.directory)
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish()
    }
}

/// One buffer's bytes in a file; the file is removed on drop.
pub(crate) struct DiskFile {
    path: PathBuf,
    len: usize,
    held: Arc<AtomicU64>,
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::error!("removing spill file {}: {e}", self.path.display());
        }
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

/// Checks at start-up that `directory` is (or can be made) a directory this process can
/// create files in, by creating and removing a probe file: a bad `spill.disk_directory`
/// (`/proc`, a file, a read-only mount) fails here, not at the first spill.
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
    /// Spill files of `device` under `directory` (created if missing); pins the staging
    /// slots through `device`'s backend.
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
        })
    }

    /// The backend's fault-injection point before a write to a spill file.
    fn before_write(&self) -> Result<()> {
        self.device
            .backend()
            .before_file_write(self.device.ordinal())
    }

    /// The directory.
    pub(crate) fn directory(&self) -> &Path {
        &self.directory
    }

    /// Bytes held in files now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// A new, empty file for `len` bytes (removed again if the caller fails).
    fn create(&self, id: u64, len: usize) -> Result<(File, DiskFile)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.directory.join(format!("{}-{id}-{n}.bin", self.prefix));
        // Held while the file is made, so that the removal at exit sees it.
        let dirs = DIRECTORIES.read();
        if dirs.closed {
            return Err(io_error(
                &path,
                "create",
                std::io::Error::other("the process is exiting and has removed its spill files"),
            ));
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error(&path, "create", e))?;
        drop(dirs);
        self.held.fetch_add(len as u64, Ordering::Relaxed);
        Ok((
            file,
            DiskFile {
                path,
                len,
                held: Arc::clone(&self.held),
            },
        ))
    }

    /// Writes the first `len` bytes held in `slices` to a new file for buffer `id`.
    pub(crate) fn write_slices(
        &self,
        id: u64,
        slices: &[PinnedSlice],
        len: usize,
    ) -> Result<DiskFile> {
        let (mut file, disk) = self.create(id, len)?;
        let mut left = len;
        for s in slices {
            let n = left.min(s.len());
            self.before_write()?;
            file.write_all(&s.as_slice()[..n])
                .map_err(|e| io_error(&disk.path, "write", e))?;
            left -= n;
        }
        finish(file, &disk)?;
        Ok(disk)
    }

    /// Reads `disk` into `slices` (which hold at least its length).
    pub(crate) fn read_slices(&self, disk: &DiskFile, slices: &mut [PinnedSlice]) -> Result<()> {
        let mut file = File::open(&disk.path).map_err(|e| io_error(&disk.path, "read", e))?;
        let mut left = disk.len;
        for s in slices {
            let n = left.min(s.len());
            file.read_exact(&mut s.as_mut_slice()[..n])
                .map_err(|e| io_error(&disk.path, "read", e))?;
            left -= n;
        }
        Ok(())
    }

    /// The file's bytes in a new vector.
    pub(crate) fn read_vec(&self, disk: &DiskFile) -> Result<Vec<u8>> {
        let mut out = vec![0u8; disk.len];
        File::open(&disk.path)
            .and_then(|mut f| f.read_exact(&mut out))
            .map_err(|e| io_error(&disk.path, "read", e))?;
        Ok(out)
    }

    /// Writes `len` device bytes at `src` of `device` to a new file for buffer `id`, after
    /// the work queued on `after`; returns when the file holds them.
    pub(crate) fn write_from_device(
        &self,
        copies: &CopyStreams,
        id: u64,
        src: DevicePtr,
        len: usize,
        after: StreamView,
    ) -> Result<DiskFile> {
        let device = copies.device();
        let (mut file, disk) = self.create(id, len)?;
        let mut staging = self.staging.lock();
        let mut free = self.take_slots(&mut staging)?;
        let mut pending: VecDeque<(usize, PinnedCopy<PinnedSlice>)> = VecDeque::new();
        // Chunks are copied into the free slots while the oldest copied chunk is written out.
        let result = (|| -> Result<()> {
            let stream = copies.ordered_after(Direction::ToHost, after)?;
            let chunks = len.div_ceil(STAGING);
            let mut next = 0;
            loop {
                while next < chunks
                    && let Some(slot) = free.pop()
                {
                    let off = next * STAGING;
                    let n = (len - off).min(STAGING);
                    let event = match copies.event() {
                        Ok(e) => e,
                        Err(e) => {
                            free.push(slot);
                            return Err(e);
                        }
                    };
                    let copy =
                        PinnedCopy::to_host(device, stream, event, src.offset(off), n, vec![slot])
                            .map_err(|f| reclaim(copies, &mut free, *f))?;
                    pending.push_back((n, copy));
                    next += 1;
                }
                let Some((n, copy)) = pending.pop_front() else {
                    return Ok(());
                };
                let (slots, event) = copy.wait().map_err(|f| reclaim(copies, &mut free, *f))?;
                copies.recycle(event);
                let written = self.before_write().and_then(|()| {
                    slots.first().map_or(Ok(()), |slot| {
                        file.write_all(&slot.as_slice()[..n])
                            .map_err(|e| io_error(&disk.path, "write", e))
                    })
                });
                free.extend(slots);
                written?;
            }
        })();
        self.put_back(copies, &mut staging, free, pending);
        result?;
        finish(file, &disk)?;
        Ok(disk)
    }

    /// Copies `disk` to `len` device bytes at `dst` of `device`, after the work queued on
    /// `after`; returns when the device holds them.
    pub(crate) fn read_to_device(
        &self,
        copies: &CopyStreams,
        disk: &DiskFile,
        dst: DevicePtr,
        after: StreamView,
    ) -> Result<()> {
        let device = copies.device();
        let len = disk.len;
        let mut file = File::open(&disk.path).map_err(|e| io_error(&disk.path, "read", e))?;
        let mut staging = self.staging.lock();
        let mut free = self.take_slots(&mut staging)?;
        let mut pending: VecDeque<(usize, PinnedCopy<PinnedSlice>)> = VecDeque::new();
        // Each chunk is read into a free slot while the slots read before are copied out.
        let result = (|| -> Result<()> {
            let stream = copies.ordered_after(Direction::ToDevice, after)?;
            for i in 0..len.div_ceil(STAGING) {
                if free.is_empty()
                    && let Some((_, copy)) = pending.pop_front()
                {
                    let (slots, event) = copy.wait().map_err(|f| reclaim(copies, &mut free, *f))?;
                    copies.recycle(event);
                    free.extend(slots);
                }
                let Some(mut slot) = free.pop() else {
                    return Err(Error::HostOutOfMemory {
                        requested: STAGING,
                        resource: "the disk tier's staging slots",
                    });
                };
                let off = i * STAGING;
                let n = (len - off).min(STAGING);
                if let Err(e) = file.read_exact(&mut slot.as_mut_slice()[..n]) {
                    free.push(slot);
                    return Err(io_error(&disk.path, "read", e));
                }
                let event = match copies.event() {
                    Ok(e) => e,
                    Err(e) => {
                        free.push(slot);
                        return Err(e);
                    }
                };
                let copy =
                    PinnedCopy::to_device(device, stream, event, vec![slot], dst.offset(off), n)
                        .map_err(|f| reclaim(copies, &mut free, *f))?;
                pending.push_back((n, copy));
            }
            while let Some((_, copy)) = pending.pop_front() {
                let (slots, event) = copy.wait().map_err(|f| reclaim(copies, &mut free, *f))?;
                copies.recycle(event);
                free.extend(slots);
            }
            Ok(())
        })();
        self.put_back(copies, &mut staging, free, pending);
        result
    }

    /// The staging slots, out of the store for one pipeline (a slot lost to a copy that could
    /// not be waited for is replaced first, if the staging pool still can).
    fn take_slots(&self, staging: &mut Vec<PinnedSlice>) -> Result<Vec<PinnedSlice>> {
        while staging.len() < 2 {
            staging.push(self.staging_pool.allocate(STAGING)?);
        }
        Ok(std::mem::take(staging))
    }

    /// Puts a pipeline's slots back, waiting first for the copies still in flight (after an
    /// error); a slot a copy may still use is leaked by its copy, not put back.
    fn put_back(
        &self,
        copies: &CopyStreams,
        staging: &mut Vec<PinnedSlice>,
        mut free: Vec<PinnedSlice>,
        pending: VecDeque<(usize, PinnedCopy<PinnedSlice>)>,
    ) {
        for (_, copy) in pending {
            match copy.wait() {
                Ok((slots, event)) => {
                    copies.recycle(event);
                    free.extend(slots);
                }
                Err(f) => {
                    let e = reclaim(copies, &mut free, *f);
                    tracing::error!(
                        "waiting for the disk tier's copies on {}: {e}",
                        copies.device()
                    );
                }
            }
        }
        *staging = free;
    }
}

/// A failed copy's memory back among `free` and its event back in the pool, when they came
/// back; its error.
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

/// Flushes `file` to the operating system (not to stable storage: spill files do not outlive
/// the process).
fn finish(mut file: File, disk: &DiskFile) -> Result<()> {
    file.flush().map_err(|e| io_error(&disk.path, "write", e))
}
