//! Spilling across a reinitialize: a runtime with `spill.enabled`, a small
//! `spill.device_memory_limit` (32 MiB), a fixed pinned host pool (`spill.host_pool_size`,
//! 32 MiB) and a disk tier in a temporary directory. Three times the limit of spillable data
//! is made (untyped buffers and typed vectors, from the main thread and from a task), so the
//! oldest data moves to the host and on to disk; a host view reads (and changes) data on the
//! host; then the runtime is reinitialized pool → managed memory → pool with the data kept,
//! and every byte is checked after each switch. The spill statistics and the reinitialize
//! reports are printed; the temporary directory is removed at the end.
//!
//! `cargo run --release --example spilling`

use std::path::PathBuf;
use std::sync::Arc;

use rmm::allocator::spill::{SpillableBuffer, SpillableVector, Tier};
use rmm::allocator::synchronize_stream;
use rmm::allocator::{Device, StreamView};
use rmm::config::{Config, ConfigLoader};
use rmm::runtime::Runtime;

const MIB: usize = 1 << 20;
/// Bytes of each buffer, and buffers of each kind.
const SIZE: usize = 8 * MIB;
const PER_KIND: usize = 4;
const S: StreamView = StreamView::DEFAULT;

type Error = Box<dyn std::error::Error>;

/// The spill directory; removed (with anything left in it) when dropped, also on error.
struct SpillDir(PathBuf);

impl Drop for SpillDir {
    fn drop(&mut self) {
        if self.0.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.0)
        {
            eprintln!("removing {}: {e}", self.0.display());
        }
    }
}

/// Deterministic bytes: `len` of them from `seed` (xorshift).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The configuration of one phase: `pool` (a pool over cuMemAlloc) or `managed` (plain
/// cuMemAllocManaged), with the same spilling settings.
fn phase(device: u32, dir: &str, managed: bool) -> Result<Config, Error> {
    let mut loader = ConfigLoader::new()
        .set("devices", vec![i64::from(device)])
        .set("workers_per_device", 2)
        .set("pool.enabled", !managed)
        .set("pool.managed", managed);
    if !managed {
        // A pool size with the pool off would be refused as having no effect.
        loader = loader.set("pool.initial_size", "256MiB");
    }
    Ok(loader
        .set("spill.enabled", true)
        .set("spill.device_memory_limit", "32MiB")
        .set("spill.host_pool_size", "32MiB")
        .set("spill.disk_directory", dir)
        .set("stats.enabled", true)
        .load()?)
}

/// Reads a buffer through the device: brings it back into the current stack first if it was
/// spilled.
fn read_on_device(b: &SpillableBuffer) -> Result<Vec<u8>, Error> {
    let guard = b.device_view(S)?;
    synchronize_stream(b.device(), S)?;
    let mut out = vec![0u8; b.size()];
    b.device().copy_to_host(&mut out, guard.ptr())?;
    Ok(out)
}

/// Where each buffer is, as one line per tier.
fn show_tiers(what: &str, buffers: &[(String, Arc<SpillableBuffer>)]) -> [usize; 3] {
    println!("{what}:");
    let mut counts = [0; 3];
    for (i, tier) in [Tier::Device, Tier::Host, Tier::Disk]
        .into_iter()
        .enumerate()
    {
        let names: Vec<&str> = buffers
            .iter()
            .filter(|(_, b)| b.tier() == tier)
            .map(|(n, _)| n.as_str())
            .collect();
        counts[i] = names.len();
        let list = if names.is_empty() {
            "-".to_string()
        } else {
            names.join(" ")
        };
        println!("  {:<6} {:>2}: {list}", tier.name(), names.len());
    }
    counts
}

fn main() -> Result<(), Error> {
    let dir =
        SpillDir(std::env::temp_dir().join(format!("rmm-spill-example-{}", std::process::id())));
    let dir_str = dir
        .0
        .to_str()
        .ok_or("the temporary directory is not UTF-8")?;
    let device = Device::current()?.ordinal();
    let runtime = Runtime::start(&phase(device, dir_str, false)?)?;
    let m = runtime
        .spill_manager(device)
        .ok_or("spilling is on, so the device has a spill manager")?;
    println!(
        "device {device}: {}",
        runtime.stack(device).ok_or("no stack")?.describe()
    );
    println!("spill directory: {}", dir.0.display());

    // Untyped buffers: copies of host bytes (the oldest, so they go furthest).
    let mut expected: Vec<Vec<u8>> = Vec::new();
    let mut buffers: Vec<(String, Arc<SpillableBuffer>)> = Vec::new();
    for i in 0..PER_KIND {
        let data = pattern(SIZE, i as u64);
        buffers.push((format!("b{i}"), m.from_host(&data, S)?));
        expected.push(data);
    }
    // Typed vectors, made inside a task through the worker's context.
    let values: Vec<Vec<u64>> = (0..PER_KIND)
        .map(|k| (0..SIZE / 8).map(|i| (i * i + k) as u64).collect())
        .collect();
    let vectors: Vec<SpillableVector<u64>> = {
        let values = values.clone();
        runtime
            .submit_to_device(device, move |ctx| {
                let m = ctx.spill_manager().ok_or("no spill manager in the task")?;
                values
                    .iter()
                    .map(|v| {
                        m.vector_from_slice(v, ctx.stream())
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .wait()??
    };
    for (k, v) in vectors.iter().enumerate() {
        buffers.push((format!("v{k}"), Arc::clone(v.buffer())));
        expected.push(bytemuck::cast_slice(&values[k]).to_vec());
    }
    // Uninitialized buffers, filled through a device view.
    for i in 0..PER_KIND {
        let data = pattern(SIZE, 100 + i as u64);
        let b = m.buffer(SIZE, S)?;
        {
            let guard = b.device_view(S)?;
            b.device().copy_to_device(guard.ptr(), &data)?;
        }
        buffers.push((format!("u{i}"), b));
        expected.push(data);
    }

    let s = m.statistics();
    println!(
        "\n{} buffers of {} MiB = {} MiB made, device limit {} MiB, host pool {} MiB",
        buffers.len(),
        SIZE / MIB,
        buffers.len() * SIZE / MIB,
        s.limit as usize / MIB,
        s.host_pool_bytes as usize / MIB
    );
    let counts = show_tiers("where the data is", &buffers);
    // The newest four fit under the limit, the four before them in the host pool, the
    // oldest four went on to disk.
    if counts != [4, 4, 4] {
        return Err(format!("tiers (device, host, disk) {counts:?}, expected [4, 4, 4]").into());
    }
    if s.tracked_bytes > s.limit {
        return Err(format!("{} device bytes tracked, above the limit", s.tracked_bytes).into());
    }

    // A host view of the oldest buffer: it comes from disk into pinned host memory (which
    // moves the least recently used host data on to disk). Read it, then change it there.
    {
        let (name, b) = &buffers[0];
        let mut host = b.host_view()?;
        if host.to_vec() != expected[0] {
            return Err(format!("{name}: the host view differs from what was written").into());
        }
        let pieces = host.chunks().count();
        for chunk in host.chunks_mut() {
            chunk.iter_mut().for_each(|x| *x ^= 0xA5);
        }
        expected[0].iter_mut().for_each(|x| *x ^= 0xA5);
        println!(
            "\nhost view of {name}: now on the {}, {} bytes in {pieces} pinned piece(s), \
             checked, then changed in place",
            b.tier(),
            host.len()
        );
    }
    show_tiers("after the host view", &buffers);
    if buffers[0].1.tier() != Tier::Host {
        return Err("the host view left b0 off the host".into());
    }
    // Every byte, read without moving anything.
    for ((name, b), want) in buffers.iter().zip(&expected) {
        if b.to_vec()? != *want {
            return Err(format!("{name} changed").into());
        }
    }

    // Reinitialize twice with the data kept: each switch spills everything first; data comes
    // back into the new stack when used.
    for (label, managed) in [("pool -> managed", true), ("managed -> pool", false)] {
        let report = runtime.reinitialize(&phase(device, dir_str, managed)?)?;
        println!("\n== reinitialize {label}\n{report}");
        if let Some((name, _)) = buffers.iter().find(|(_, b)| !b.is_spilled()) {
            return Err(format!("{name} was not spilled by the reinitialize").into());
        }
        show_tiers("after the reinitialize", &buffers);
        let stack = runtime.stack(device).ok_or("no stack")?;
        println!("device {device} now: {}", stack.describe());
        for ((name, b), want) in buffers.iter().zip(&expected) {
            if read_on_device(b)? != *want {
                return Err(format!("{name}: bytes differ after {label}").into());
            }
        }
        for (k, v) in vectors.iter().enumerate() {
            if v.to_vec()? != values[k] {
                return Err(format!("v{k}: elements differ after {label}").into());
            }
        }
        let s = m.statistics();
        println!(
            "every byte of the {} buffers checked on the device; the new stack holds {} of \
             them ({} MiB, the limit is {} MiB)",
            buffers.len(),
            stack.live().count,
            stack.live().bytes as usize / MIB,
            s.limit as usize / MIB
        );
        if s.tracked_bytes != stack.live().bytes || s.tracked_bytes > s.limit {
            return Err(format!(
                "the spill manager tracks {} bytes, the stack counts {} live",
                s.tracked_bytes,
                stack.live().bytes
            )
            .into());
        }
    }

    let s = m.statistics();
    println!("\n== spill statistics\n{s}");
    if s.host.spilled_count == 0 || s.disk.spilled_count == 0 || s.unspilled_count == 0 {
        return Err("expected moves to the host, to disk and back".into());
    }
    println!("{}", runtime.report());

    // Dropping the buffers frees their memory in every tier, spill files included.
    drop(vectors);
    drop(buffers);
    let s = m.statistics();
    let files = std::fs::read_dir(&dir.0)?.count();
    if (s.tracked_bytes, s.host_bytes, s.disk_bytes, files) != (0, 0, 0, 0) {
        return Err(format!(
            "after dropping every buffer: {} device, {} host, {} disk bytes, {files} files",
            s.tracked_bytes, s.host_bytes, s.disk_bytes
        )
        .into());
    }
    drop(m);
    runtime.shutdown()?;
    drop(dir);
    println!("spilling example: every check passed (spill directory removed)");
    Ok(())
}
