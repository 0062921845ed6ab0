//! Shared by the benchmarks: the workload traces of ANCHORS.md and the choice of backend.
#![allow(dead_code)]

use std::time::Instant;

use rmm::allocator::backend::{
    self, Backend, BackendChoice, CudaBackend, SimBackend, SimConfig, SimMemoryMode,
};
use rmm::allocator::{DeviceMemoryResource, DevicePtr, StreamView};

/// 1 MiB.
pub const MIB: usize = 1 << 20;
/// 1 GiB.
pub const GIB: usize = 1 << 30;

#[derive(Clone, Copy)]
pub enum Op {
    Alloc(usize),
    /// Free the live block at this index (swap-remove).
    Free(usize),
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn churn_trace(iterations: usize) -> Vec<Op> {
    (0..iterations)
        .flat_map(|_| [Op::Alloc(MIB), Op::Free(0)])
        .collect()
}

pub fn random_trace(steps: usize, lo: usize, hi: usize, cap: usize, seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (llo, lhi) = ((lo as f64).ln(), (hi as f64).ln());
    let mut live: Vec<usize> = Vec::new();
    let mut live_bytes = 0usize;
    let mut ops = Vec::with_capacity(steps + steps / 2);
    for _ in 0..steps {
        let size = (llo + rng.unit() * (lhi - llo)).exp() as usize;
        if live.is_empty() || (rng.unit() < 0.55 && live_bytes + size <= cap) {
            ops.push(Op::Alloc(size));
            live.push(size);
            live_bytes += size;
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            live_bytes -= live.swap_remove(i);
            ops.push(Op::Free(i));
        }
    }
    while !live.is_empty() {
        let i = live.len() - 1;
        live.pop();
        ops.push(Op::Free(i));
    }
    ops
}

/// The process-wide backend for this run: the GPU when there is one (or `RMM_BACKEND=cuda`),
/// else an unbacked simulated device of 80 GiB, so that allocator bookkeeping is measured.
pub fn backend_for_bench() -> &'static dyn Backend {
    backend_for_bench_with(1)
}

/// As [`backend_for_bench`], with `sim_devices` simulated devices when there is no GPU.
pub fn backend_for_bench_with(sim_devices: u32) -> &'static dyn Backend {
    let choice = BackendChoice::from_env().expect("RMM_BACKEND");
    let cuda = match choice {
        BackendChoice::Sim => None,
        _ => CudaBackend::load().ok().filter(|b| b.device_count() > 0),
    };
    let b: &'static dyn Backend = match (choice, cuda) {
        (_, Some(c)) => c,
        (BackendChoice::Cuda, None) => panic!("RMM_BACKEND=cuda but no CUDA device is visible"),
        _ => SimBackend::leak(SimConfig {
            devices: sim_devices,
            capacity: 80 * GIB,
            mode: SimMemoryMode::Unbacked,
        })
        .expect("simulated backend"),
    };
    if backend::install_global(b).is_err() {
        panic!("the process-wide backend was chosen before the benchmark could pick it");
    }
    b
}

/// Replays `ops`; returns ns per operation.
pub fn replay(
    mr: &dyn DeviceMemoryResource,
    ops: &[Op],
    stream: StreamView,
) -> Result<f64, String> {
    let mut live: Vec<(DevicePtr, usize)> = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    for op in ops {
        match *op {
            Op::Alloc(size) => {
                let p = mr.allocate(size, stream).map_err(|e| e.to_string())?;
                live.push((p, size));
            }
            Op::Free(i) => {
                let (p, size) = live.swap_remove(i);
                mr.deallocate(p, size, stream).map_err(|e| e.to_string())?;
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / ops.len() as f64;
    // A partial trace (warm-up) leaves blocks live: give them back, untimed.
    for (p, size) in live {
        mr.deallocate(p, size, stream).map_err(|e| e.to_string())?;
    }
    Ok(ns)
}
