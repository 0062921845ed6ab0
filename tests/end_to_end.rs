//! End to end through the `rmm` facade, as a program uses it: an `rmm.toml` on disk, the
//! runtime's workers running tasks on containers, spillable data pushed to pinned host memory
//! and on to disk by a small limit, a reinitialize to another stack with every byte kept,
//! and a shutdown that leaves no allocation and no spill file's bytes behind; and a footprint
//! limit from `rmm.toml` holding a loop of changing sizes near its peak. On the simulated
//! device (`RMM_BACKEND=sim`, as `cargo xtask test` runs it) or a GPU.

use std::path::PathBuf;
use std::sync::Arc;

use rmm::prelude::*;

const MIB: usize = 1 << 20;

/// A directory of this test's own, removed with what it holds when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path).expect("a temporary directory");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `text` to the `rmm.toml` at `path` and loads it, as a program reads its file.
fn write_and_load(path: &std::path::Path, text: &str) -> Config {
    std::fs::write(path, text).expect("write rmm.toml");
    ConfigLoader::new()
        .file(path)
        .load()
        .expect("the rmm.toml loads")
}

#[test]
fn an_rmm_toml_runs_tasks_spills_to_disk_and_keeps_data_across_a_reinitialize() {
    let dir = TempDir::new("rmm-end-to-end");
    let spill_dir = dir.0.join("spill");
    let toml = dir.0.join("rmm.toml");
    let config = write_and_load(
        &toml,
        &format!(
            r#"
workers_per_device = 2

[pool]
enabled = true
initial_size = "64MiB"

[spill]
enabled = true
device_memory_limit = "8MiB"
host_pool_size = "8MiB"
disk_directory = "{}"
"#,
            spill_dir.display()
        ),
    );
    let runtime = Runtime::start(&config).expect("the runtime starts");
    let device = runtime.devices()[0];
    assert_eq!(
        runtime.workers().len(),
        2,
        "workers_per_device = 2 on one device"
    );

    // Every worker runs a task on its device's pool: a vector there and back.
    let sums = TaskHandle::wait_all(runtime.run_on_all(|ctx| {
        let v = DeviceUVector::from_host(&[1u64, 2, 3, 4], ctx.stream())?;
        Ok::<_, rmm::allocator::Error>(v.to_vec(ctx.stream())?.iter().sum::<u64>())
    }))
    .expect("the tasks run");
    assert_eq!(
        sums.into_iter()
            .collect::<Result<Vec<_>, _>>()
            .expect("sums"),
        vec![10, 10]
    );

    // Four times the limit of spillable data: the oldest goes to the host tier, then to disk.
    let m = runtime.spill_manager(device).expect("spilling is on");
    // Each buffer's bytes differ from every other's and from one offset to the next.
    let data: Vec<Vec<u8>> = (0..8u8)
        .map(|i| (0..4 * MIB).map(|j| (j % 251) as u8 ^ i).collect())
        .collect();
    let buffers: Vec<Arc<SpillableBuffer>> = data
        .iter()
        .map(|d| {
            m.from_host(d, StreamView::DEFAULT)
                .expect("a spillable buffer")
        })
        .collect();
    m.settle();
    let tiers: Vec<Tier> = buffers.iter().map(|b| b.tier()).collect();
    assert!(
        tiers.contains(&Tier::Disk),
        "past the host pool, data went to disk: {tiers:?}"
    );
    assert!(m.statistics().disk_bytes > 0, "bytes in spill files");

    // Another stack (plain allocations, no pool); every byte is kept.
    let plain = ConfigLoader::new()
        .file(&toml)
        .set("pool.enabled", false)
        .set("pool.initial_size", "auto")
        .load()
        .expect("the second configuration");
    let report = runtime.reinitialize(&plain).expect("the reinitialize");
    assert_eq!(report.devices, vec![device]);
    for (b, d) in buffers.iter().zip(&data) {
        assert!(b.to_vec().expect("read back") == *d, "a buffer changed");
    }

    // The data leaves nothing behind as it goes: no spill file holds bytes any more.
    drop((buffers, m));
    let m = runtime.spill_manager(device).expect("spilling is still on");
    assert_eq!(
        m.statistics().disk_bytes,
        0,
        "spill files gone with their buffers"
    );
    drop(m);
    let shutdown = runtime.shutdown().expect("the shutdown");
    assert!(shutdown.drained, "every task ran");
    assert!(
        shutdown.leaks.iter().all(|l| l.count == 0),
        "nothing left allocated: {:?}",
        shutdown.leaks
    );
}

#[test]
fn a_footprint_limit_in_rmm_toml_keeps_a_changing_size_loop_near_its_peak() {
    let dir = TempDir::new("rmm-end-to-end-footprint");
    let toml = dir.0.join("rmm.toml");
    let config = write_and_load(
        &toml,
        r#"
[pool]
enabled = true
initial_size = "16MiB"
max_overhead = "5%"
"#,
    );
    let runtime = Runtime::start(&config).expect("the runtime starts");
    let device = runtime.devices()[0];
    // A loop whose sizes change every step, on a worker: activations made, then freed newest
    // first with a gradient of each size made and freed; returns the peak in use.
    let peak = runtime
        .submit_to_device(device, |ctx| {
            let (mut now, mut peak) = (0usize, 0usize);
            let mut x: u64 = 7;
            for _ in 0..20 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let len = 64 + (x >> 33) as usize % 961;
                let sizes = [len * 6144, len * 24576, 48 * len * len, len * 100_514];
                let mut acts = Vec::new();
                for size in sizes.iter().cycle().take(13) {
                    acts.push(DeviceBuffer::new(*size, ctx.stream())?);
                    now += size;
                    peak = peak.max(now);
                }
                while let Some(a) = acts.pop() {
                    let grad = DeviceBuffer::new(a.size(), ctx.stream())?;
                    peak = peak.max(now + grad.size());
                    now -= a.size();
                }
            }
            Ok::<_, rmm::allocator::Error>(peak as u64)
        })
        .wait()
        .expect("the task runs")
        .expect("the loop's allocations");
    let report = runtime.report();
    let pool = report.devices[0].pool.expect("the device has a pool");
    assert_eq!(pool.max_overhead, Some(0.05), "the limit reached the pool");
    let bound = (peak as f64 * 1.05) as u64 + 18 * MIB as u64;
    assert!(
        pool.peak_reserved_bytes <= bound,
        "the pool held {} for a peak of {peak} in use ({:.3}×)",
        pool.peak_reserved_bytes,
        pool.peak_reserved_bytes as f64 / peak as f64
    );
    assert!(
        report
            .to_string()
            .contains("held within 5.0% above its peak in use")
    );
    runtime.shutdown().expect("the shutdown");
}
