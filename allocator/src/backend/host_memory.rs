//! [`HostMemory`]: how much host memory this process may use, physical memory or its cgroup's
//! limit, so over-pinning is refused with an error instead of the OOM killer ending the process.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::fmt_bytes;

/// The memory bound of the process's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The file the limit was read from (`…/memory.max` or `…/memory.limit_in_bytes`).
    pub limit_file: PathBuf,
    /// The limit in bytes.
    pub limit: u64,
    /// Bytes the cgroup uses less inactive file cache (its working set).
    pub used: u64,
}

/// Host memory as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMemory {
    /// Physical memory (`MemTotal`).
    pub physical: u64,
    /// Memory the system could give now without swapping (`MemAvailable`).
    pub available_now: u64,
    /// The tightest limit of the process's cgroup and its ancestors, if below physical memory.
    pub cgroup: Option<CgroupMemory>,
}

impl HostMemory {
    /// Reads `/proc` and `/sys/fs/cgroup`; what cannot be read is no limit (`u64::MAX`).
    pub fn read() -> HostMemory {
        Self::read_from(Path::new("/proc"), Path::new("/sys/fs/cgroup"))
    }

    /// [`read`](Self::read) with other roots for `/proc` and `/sys/fs/cgroup` (tests).
    pub fn read_from(proc_root: &Path, cgroup_root: &Path) -> HostMemory {
        let meminfo = std::fs::read_to_string(proc_root.join("meminfo")).unwrap_or_default();
        let field = |name: &str| {
            meminfo.lines().find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix(':')?;
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                Some(kib.saturating_mul(1024))
            })
        };
        let physical = field("MemTotal").unwrap_or(u64::MAX);
        let available_now = field("MemAvailable").unwrap_or(physical);
        let groups = std::fs::read_to_string(proc_root.join("self/cgroup")).unwrap_or_default();
        let cgroup = cgroup_limit(&groups, cgroup_root).filter(|c| c.limit < physical);
        HostMemory {
            physical,
            available_now,
            cgroup,
        }
    }

    /// The most this process may use in all: physical memory, or its cgroup's limit if lower.
    pub fn usable(&self) -> u64 {
        self.cgroup
            .as_ref()
            .map_or(self.physical, |c| c.limit.min(self.physical))
    }

    /// What can still be taken now: the system's available memory, within the cgroup's room.
    pub fn available(&self) -> u64 {
        let room = self
            .cgroup
            .as_ref()
            .map_or(u64::MAX, |c| c.limit.saturating_sub(c.used));
        self.available_now.min(room)
    }
}

impl fmt::Display for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = |n: u64| {
            if n == u64::MAX {
                "unknown".to_string()
            } else {
                fmt_bytes(n as usize)
            }
        };
        match &self.cgroup {
            Some(c) => write!(
                f,
                "{} available: the process's cgroup limits it to {} ({}), {} of it in use",
                bytes(self.available()),
                bytes(c.limit),
                c.limit_file.display(),
                bytes(c.used)
            ),
            None => write!(
                f,
                "{} available of {} physical memory",
                bytes(self.available()),
                bytes(self.physical)
            ),
        }
    }
}

/// One hierarchy of `/proc/self/cgroup`: where its memory files are and which names they have.
struct Hierarchy {
    dir: PathBuf,
    limit: &'static str,
    usage: &'static str,
    inactive_file: &'static str,
}

/// The tightest memory limit over the process's cgroups (`groups`) and their ancestors, v1 or v2.
fn cgroup_limit(groups: &str, root: &Path) -> Option<CgroupMemory> {
    let mut hierarchies = Vec::new();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            hierarchies.push(Hierarchy {
                dir: root.join(path),
                limit: "memory.max",
                usage: "memory.current",
                inactive_file: "inactive_file",
            });
        } else if controllers.split(',').any(|c| c == "memory") {
            hierarchies.push(Hierarchy {
                dir: root.join("memory").join(path),
                limit: "memory.limit_in_bytes",
                usage: "memory.usage_in_bytes",
                inactive_file: "total_inactive_file",
            });
        }
    }
    hierarchies
        .into_iter()
        .filter_map(|h| tightest(&h, root))
        .min_by_key(|c| c.limit)
}

/// The lowest limit from `h.dir` up to `root` (in a container `h.dir` may not exist: then the
/// root's, which is the process's cgroup).
fn tightest(h: &Hierarchy, root: &Path) -> Option<CgroupMemory> {
    let mut best: Option<CgroupMemory> = None;
    let mut dir = Some(h.dir.as_path());
    while let Some(d) = dir {
        if d.join(h.limit).is_file() {
            let limit_file = d.join(h.limit);
            let limit = std::fs::read_to_string(&limit_file)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            if let Some(limit) = limit
                && best.as_ref().is_none_or(|b| limit < b.limit)
            {
                best = Some(CgroupMemory {
                    limit_file,
                    limit,
                    used: working_set(d, h),
                });
            }
        }
        if !d.starts_with(root) || d == root {
            break;
        }
        dir = d.parent();
    }
    best
}

/// The cgroup's usage less its inactive file cache (0 when unreadable).
fn working_set(dir: &Path, h: &Hierarchy) -> u64 {
    let usage = std::fs::read_to_string(dir.join(h.usage))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let inactive = std::fs::read_to_string(dir.join("memory.stat"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(' ')?;
            (name == h.inactive_file).then(|| value.trim().parse::<u64>().ok())?
        })
        .unwrap_or(0);
    usage.saturating_sub(inactive)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn proc_with(dir: &Path, cgroup: &str) -> PathBuf {
        let proc_root = dir.join("proc");
        write(
            &proc_root.join("meminfo"),
            "MemTotal:       16777216 kB\nMemFree: 1 kB\nMemAvailable:    8388608 kB\n",
        );
        write(&proc_root.join("self/cgroup"), cgroup);
        proc_root
    }

    #[test]
    fn without_a_cgroup_limit_physical_and_available_memory_bound_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = proc_with(dir.path(), "0::/\n");
        let cg = dir.path().join("cgroup");
        write(&cg.join("memory.max"), "max\n");
        let m = HostMemory::read_from(&proc_root, &cg);
        assert_eq!(m.physical, 16 * GIB);
        assert_eq!(m.available_now, 8 * GIB);
        assert_eq!(m.cgroup, None);
        assert_eq!(m.usable(), 16 * GIB);
        assert_eq!(m.available(), 8 * GIB);
    }

    #[test]
    fn a_v2_limit_of_an_ancestor_bounds_the_process_less_its_working_set() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = proc_with(dir.path(), "0::/job/step\n");
        let cg = dir.path().join("cgroup");
        write(&cg.join("job/memory.max"), &format!("{}\n", 3 * GIB));
        write(&cg.join("job/memory.current"), &format!("{}\n", GIB));
        write(
            &cg.join("job/memory.stat"),
            &format!("anon 1\ninactive_file {}\n", GIB / 2),
        );
        write(&cg.join("job/step/memory.max"), "max\n");
        let m = HostMemory::read_from(&proc_root, &cg);
        let c = m.cgroup.clone().unwrap();
        assert_eq!(c.limit, 3 * GIB);
        assert_eq!(c.used, GIB / 2);
        assert_eq!(m.usable(), 3 * GIB);
        assert_eq!(m.available(), 3 * GIB - GIB / 2);
        assert!(m.to_string().contains("memory.max"), "{m}");
    }

    #[test]
    fn a_v1_memory_hierarchy_limit_is_read_and_an_unlimited_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = proc_with(dir.path(), "5:cpu:/\n4:memory:/api/one\n0::/\n");
        let cg = dir.path().join("cgroup");
        write(
            &cg.join("memory/api/one/memory.limit_in_bytes"),
            &format!("{}\n", 2 * GIB),
        );
        write(&cg.join("memory/api/one/memory.usage_in_bytes"), "0\n");
        write(
            &cg.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        let m = HostMemory::read_from(&proc_root, &cg);
        assert_eq!(m.usable(), 2 * GIB);
        assert_eq!(m.available(), 2 * GIB);
        // No limit set below physical memory: none.
        let proc_root = proc_with(dir.path(), "4:memory:/\n");
        assert_eq!(HostMemory::read_from(&proc_root, &cg).cgroup, None);
    }

    #[test]
    fn a_cgroup_path_not_under_the_mount_reads_the_mounted_root() {
        let dir = tempfile::tempdir().unwrap();
        // Inside a container: /proc/self/cgroup names the host's path, the mount is its own.
        let proc_root = proc_with(dir.path(), "0::/kubepods/pod1/abc\n");
        let cg = dir.path().join("cgroup");
        write(&cg.join("memory.max"), &format!("{}\n", GIB));
        let m = HostMemory::read_from(&proc_root, &cg);
        assert_eq!(m.usable(), GIB);
    }

    #[test]
    fn unreadable_files_refuse_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let m = HostMemory::read_from(&dir.path().join("none"), &dir.path().join("none"));
        assert_eq!(m.usable(), u64::MAX);
        assert_eq!(m.available(), u64::MAX);
        assert!(m.to_string().contains("unknown"), "{m}");
    }
}
