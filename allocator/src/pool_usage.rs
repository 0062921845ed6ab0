//! [`PoolUsage`]: a pool's figures at one moment, carried by its out-of-memory errors and read by
//! the statistics report (filled in and explained by the pool's `oom_report.rs`).

/// Streams listed by name in [`PoolUsage::streams`] (the ones holding the most free memory).
pub const LISTED_STREAMS: usize = 8;

/// Free memory one stream's arenas hold (all its thread lanes together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamUsage {
    /// The stream's raw handle (a backend `RawStream`; 0 the default stream).
    pub stream: u64,
    /// The stream's arenas (one per thread lane that used it).
    pub arenas: usize,
    /// Bytes handed out on the stream and not freed.
    pub in_use: usize,
    /// Free bytes the arenas hold (their heaps, bins and caches).
    pub free: usize,
    /// Of `free`, the bytes kept whole in the arenas' block caches.
    pub cached: usize,
    /// The largest free block among the stream's arenas.
    pub largest_free: usize,
}

/// Usage figures of a pool (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Bytes the pool holds from its upstream (reserved).
    pub pool_size: usize,
    /// The peak of [`PoolUsage::pool_size`] since the pool was made or `reset_peak_pool_size`.
    pub peak_pool_size: usize,
    /// Bytes handed out and not yet freed.
    pub in_use: usize,
    /// The largest free block the pool holds.
    pub largest_free: usize,
    /// The pool's maximum size, if it has one.
    pub maximum_size: Option<usize>,
    /// Free bytes: the unassigned free space plus what the arenas hold free (caches included).
    pub free: usize,
    /// Of `free`, the bytes granted to no stream's arena.
    pub unassigned: usize,
    /// Of `free`, the bytes kept whole in the arenas' block caches.
    pub cached: usize,
    /// Bytes freed on another stream than their arena's, waiting for that stream's work.
    pub pending: usize,
    /// Arenas (streams × thread lanes) the pool has.
    pub arenas: usize,
    /// The (at most [`LISTED_STREAMS`]) streams whose arenas hold the most free memory, most first.
    pub streams: Vec<StreamUsage>,
    /// Streams holding free memory that [`PoolUsage::streams`] leaves out.
    pub more_streams: usize,
    /// The pool's growth step.
    pub growth: usize,
    /// Chunks the pool took from the device (or its upstream) since it was made.
    pub device_allocations: u64,
    /// Chunks it gave back since it was made.
    pub device_frees: u64,
}
