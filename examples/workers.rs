//! Workers per device: start the runtime from `rmm.toml` (plus overrides), run tasks that
//! allocate from their device's stack, switch every device to another stack between two
//! workloads with `reinitialize`, and print the runtime report.
//!
//! `cargo run --release --example workers`

use rmm::allocator::DeviceUVector;
use rmm::config::ConfigLoader;
use rmm::runtime::{Runtime, TaskHandle};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let phase_one = ConfigLoader::new()
        .set("devices", "all")
        .set("workers_per_device", 2)
        .set("pool.enabled", true)
        .set("pool.initial_size", "1GiB")
        .set("stats.enabled", true)
        .load()?;
    let runtime = Runtime::start(&phase_one)?;
    for hello in TaskHandle::wait_all(runtime.run_on_all(|ctx| {
        format!(
            "worker {} on {}: {}",
            ctx.worker(),
            ctx.device(),
            ctx.stack().describe()
        )
    }))? {
        println!("{hello}");
    }

    // Phase one: tasks on the pooled stacks, each checking its own result.
    let sums = runtime.map(0..64u64, |ctx, i| {
        let data: Vec<u64> = (0..100_000).map(|k| k * i).collect();
        let v = DeviceUVector::from_host(&data, ctx.stream())?;
        let back = v.to_vec(ctx.stream())?;
        Ok::<_, rmm::allocator::Error>(back.iter().sum::<u64>() == data.iter().sum::<u64>())
    });
    for (i, h) in sums.into_iter().enumerate() {
        if !h.wait()?? {
            return Err(
                format!("task {i}: the data read back differs from what was written").into(),
            );
        }
    }
    println!("phase one: 64 tasks, every checksum matched");

    // Phase two needs the memory back from the pools: plain cudaMalloc-style allocations.
    let phase_two = ConfigLoader::new()
        .set("devices", "all")
        .set("workers_per_device", 2)
        .set("stats.enabled", true)
        .load()?;
    println!("{}", runtime.reinitialize(&phase_two)?);
    let sizes = runtime.map(0..16u64, |ctx, i| {
        DeviceUVector::<u8>::new((i as usize + 1) << 20, ctx.stream()).map(|v| v.len())
    });
    for h in sizes {
        h.wait()??;
    }
    println!();
    println!("{}", runtime.report());
    runtime.shutdown()?;
    Ok(())
}
