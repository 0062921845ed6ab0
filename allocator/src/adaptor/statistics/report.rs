//! [`MemoryReport`]: one statistics adaptor's figures in the shape of PyTorch's
//! `torch.cuda.memory_stats()`, with the pool and failure-callback figures of its chain.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Counter, StatisticsResourceAdaptor};
use crate::adaptor::failure_callback::FailureCallbackResourceAdaptor;
use crate::adaptor::{Upstream, chain, chain_names, find_in_chain};
use crate::error::fmt_bytes;
use crate::resource::PoolMemoryResource;

impl<U: Upstream + ?Sized> StatisticsResourceAdaptor<U> {
    /// A PyTorch-style report: allocated vs reserved bytes (reserved from the chain's first pool),
    /// retries (by the chain's failure-callback adaptors) and OOM errors.
    pub fn report(&self) -> MemoryReport {
        let usage =
            find_in_chain::<PoolMemoryResource>((*self.upstream).as_dyn()).map(|p| p.usage());
        let pool = usage.as_ref();
        let retries = chain((*self.upstream).as_dyn())
            .into_iter()
            .filter_map(|r| r.as_any().downcast_ref::<FailureCallbackResourceAdaptor>())
            .map(|f| f.retry_count())
            .sum();
        MemoryReport {
            device: self.upstream.device().ordinal(),
            resource: chain_names(self),
            allocated_bytes: self.lifetime_bytes(),
            allocations: self.lifetime_allocations(),
            reserved_bytes: pool.map(|p| p.pool_size as u64),
            reserved_peak_bytes: pool.map(|p| p.peak_pool_size as u64),
            reserved_maximum_bytes: pool.and_then(|p| p.maximum_size.map(|m| m as u64)),
            pool_in_use_bytes: pool.map(|p| p.in_use as u64),
            cached_free_bytes: pool.map(|p| p.pool_size.saturating_sub(p.in_use) as u64),
            pool_free_bytes: pool.map(|p| p.free as u64),
            largest_free_block: pool.map(|p| p.largest_free as u64),
            fragmentation_permille: pool.map(|p| (p.fragmentation() * 1000.0).round() as u64),
            num_device_alloc: pool.map(|p| p.device_allocations),
            num_device_free: pool.map(|p| p.device_frees),
            num_alloc_retries: retries,
            num_ooms: self.out_of_memory_count(),
            num_failed_allocations: self.failed_allocation_count(),
            peak_tolerance_bytes: self.tolerance_bytes as u64,
            threads: self.threads.load(Ordering::Relaxed) as u64,
        }
    }
}

/// A statistics adaptor's figures, PyTorch-style ([`MemoryReport::memory_stats`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Device ordinal.
    pub device: u32,
    /// The resource chain, e.g. `StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource`.
    pub resource: String,
    /// Bytes handed out through the adaptor (requested sizes): current, peak, total.
    pub allocated_bytes: Counter,
    /// Allocations through the adaptor: current, peak, total.
    pub allocations: Counter,
    /// Bytes the first pool in the chain holds from its upstream (PyTorch's reserved bytes).
    pub reserved_bytes: Option<u64>,
    /// Peak `reserved_bytes` since creation or [`StatisticsResourceAdaptor::reset_peaks`].
    pub reserved_peak_bytes: Option<u64>,
    /// That pool's maximum size.
    pub reserved_maximum_bytes: Option<u64>,
    /// Bytes in use in that pool, rounded as the pool hands them out (all its users).
    pub pool_in_use_bytes: Option<u64>,
    /// Reserved but not in use: cached by the pool.
    pub cached_free_bytes: Option<u64>,
    /// That pool's free bytes: reserved − in use − those awaiting other streams.
    #[serde(default)]
    pub pool_free_bytes: Option<u64>,
    /// The largest free block of that pool: the largest request it can serve without growing.
    pub largest_free_block: Option<u64>,
    /// That pool's fragmentation in thousandths ([`MemoryReport::fragmentation`] × 1000).
    #[serde(default)]
    pub fragmentation_permille: Option<u64>,
    /// Chunks that pool took from the device (PyTorch's `num_device_alloc`: segment `cudaMalloc`s).
    #[serde(default)]
    pub num_device_alloc: Option<u64>,
    /// Chunks it gave back (PyTorch's `num_device_free`).
    #[serde(default)]
    pub num_device_free: Option<u64>,
    /// Retries made by failure-callback adaptors in the chain (PyTorch's `num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory (PyTorch's `num_ooms`).
    pub num_ooms: u64,
    /// Allocations that failed otherwise.
    pub num_failed_allocations: u64,
    /// The peak tolerance in bytes (0: exact peaks).
    pub peak_tolerance_bytes: u64,
    /// Threads that used the adaptor.
    pub threads: u64,
}

impl MemoryReport {
    /// 1 − largest free block / free bytes of the pool (0: one block; near 1: many pieces), if any.
    pub fn fragmentation(&self) -> Option<f64> {
        self.fragmentation_permille.map(|f| f as f64 / 1000.0)
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"serializing the report: {e}\"}}"))
    }

    /// The figures under PyTorch's `memory_stats()` key names (`allocated_bytes.all.current`,
    /// `reserved_bytes.all.current`, `num_ooms`, ...); pool figures only when there is a pool.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let (b, a) = (self.allocated_bytes, self.allocations);
        let mut m: BTreeMap<String, i64> = [
            ("allocated_bytes.all.current", b.value),
            ("allocated_bytes.all.peak", b.peak),
            ("allocated_bytes.all.allocated", b.total),
            ("allocated_bytes.all.freed", b.total - b.value),
            ("allocation.all.current", a.value),
            ("allocation.all.peak", a.peak),
            ("allocation.all.allocated", a.total),
            ("allocation.all.freed", a.total - a.value),
            ("num_alloc_retries", self.num_alloc_retries as i64),
            ("num_ooms", self.num_ooms as i64),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect();
        let pool_figures = [
            ("reserved_bytes.all.current", self.reserved_bytes),
            ("reserved_bytes.all.peak", self.reserved_peak_bytes),
            ("inactive_split_bytes.all.current", self.cached_free_bytes),
            ("largest_free_block", self.largest_free_block),
            ("pool_free_bytes", self.pool_free_bytes),
            ("fragmentation_permille", self.fragmentation_permille),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ];
        for (key, value) in pool_figures {
            m.extend(value.map(|v| (key.to_string(), v as i64)));
        }
        m
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = |v: i64| {
            let sign = if v < 0 { "-" } else { "" };
            format!("{sign}{}", fmt_bytes(v.unsigned_abs() as usize))
        };
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| fmt_bytes(v as usize));
        writeln!(
            f,
            "memory report, device {}: {}",
            self.device, self.resource
        )?;
        writeln!(
            f,
            "  allocated  {} current, {} peak, {} total",
            bytes(self.allocated_bytes.value),
            bytes(self.allocated_bytes.peak),
            bytes(self.allocated_bytes.total)
        )?;
        writeln!(
            f,
            "  allocations {} current, {} peak, {} total",
            self.allocations.value, self.allocations.peak, self.allocations.total
        )?;
        writeln!(
            f,
            "  reserved   {} (peak {}, maximum {}), in use {}, cached {}, free {}, largest free block {}, \
             fragmentation {}",
            opt(self.reserved_bytes),
            opt(self.reserved_peak_bytes),
            opt(self.reserved_maximum_bytes),
            opt(self.pool_in_use_bytes),
            opt(self.cached_free_bytes),
            opt(self.pool_free_bytes),
            opt(self.largest_free_block),
            self.fragmentation()
                .map_or_else(|| "-".to_string(), |f| format!("{:.1}%", f * 100.0))
        )?;
        write!(
            f,
            "  retries {}, out-of-memory {}, other failures {}",
            self.num_alloc_retries, self.num_ooms, self.num_failed_allocations
        )
    }
}
