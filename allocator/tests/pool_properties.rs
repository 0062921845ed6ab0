//! Property tests: a million random allocations and frees per resource over several streams,
//! with cheap checks at every step (alignment, no overlap) and full structural checks every
//! few thousand steps; at the end everything is freed and the pool must be fully coalesced.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{MIB, device};
use proptest::prelude::*;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::resource::{
    BinningMemoryResource, CudaMemoryResource, FixedSizeMemoryResource, PoolMemoryResource,
};
use rmm_allocator::{ALLOCATION_ALIGNMENT, Stream};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Live blocks by address (checked for overlap at every insertion), and in a vector for
/// picking a random one in O(1).
#[derive(Default)]
struct Shadow {
    by_addr: BTreeMap<u64, usize>,
    live: Vec<(u64, usize, usize)>,
    bytes: usize,
}

impl Shadow {
    fn insert(&mut self, p: DevicePtr, bytes: usize, stream: usize) {
        let a = p.addr();
        assert_eq!(
            a % ALLOCATION_ALIGNMENT as u64,
            0,
            "{bytes} B at {p} is not 256-byte aligned"
        );
        if let Some((&prev, &len)) = self.by_addr.range(..=a).next_back() {
            assert!(
                prev + len as u64 <= a,
                "{p}+{bytes} overlaps live {prev:#x}+{len}"
            );
        }
        if let Some((&next, _)) = self.by_addr.range(a..).next() {
            assert!(
                a + bytes as u64 <= next,
                "{p}+{bytes} overlaps live {next:#x}"
            );
        }
        self.by_addr.insert(a, bytes);
        self.live.push((a, bytes, stream));
        self.bytes += bytes;
    }

    fn take(&mut self, pick: u64) -> (DevicePtr, usize, usize) {
        let (a, len, s) = self.live.swap_remove(pick as usize % self.live.len());
        self.by_addr.remove(&a);
        self.bytes -= len;
        (DevicePtr(a), len, s)
    }

    fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

/// What [`exercise`] does.
struct Plan {
    ops: usize,
    max_size: usize,
    cap: usize,
    seed: u64,
    check_every: usize,
    /// Sizes from a short list instead of log-uniform ones, so that most requests are served
    /// by the arenas' caches of freed blocks.
    few_sizes: bool,
}

/// The sizes of a few-sizes plan.
const FEW_SIZES: [usize; 5] = [100, 4096, 300_000, MIB, 5 * MIB + 3];

/// Runs random operations against `mr` over `streams`; `check` runs every few steps.
fn exercise(mr: &dyn DeviceMemoryResource, streams: &[Stream], plan: Plan, check: &dyn Fn()) {
    let mut rng = Rng(plan.seed | 1);
    let mut shadow = Shadow::default();
    let log_max = (plan.max_size as f64).ln();
    for step in 0..plan.ops {
        let alloc = shadow.is_empty() || (rng.below(100) < 52 && shadow.bytes < plan.cap);
        if alloc {
            let size = if plan.few_sizes {
                FEW_SIZES[rng.below(FEW_SIZES.len() as u64) as usize]
            } else {
                ((rng.below(1 << 20) as f64 / (1 << 20) as f64) * log_max).exp() as usize
            };
            let s = rng.below(streams.len() as u64) as usize;
            let p = mr
                .allocate(size, streams[s].view())
                .unwrap_or_else(|e| panic!("step {step}: {e}"));
            shadow.insert(p, size.max(1), s);
        } else {
            let pick = rng.next();
            let (p, len, s) = shadow.take(pick);
            // One free in eight happens on another stream than the allocation's.
            let fs = if rng.below(8) == 0 {
                rng.below(streams.len() as u64) as usize
            } else {
                s
            };
            mr.deallocate(p, len, streams[fs].view())
                .unwrap_or_else(|e| panic!("step {step}: {e}"));
        }
        if step % plan.check_every == plan.check_every - 1 {
            check();
        }
    }
    for (a, len, s) in std::mem::take(&mut shadow.live) {
        mr.deallocate(DevicePtr(a), len, streams[s].view()).unwrap();
    }
    for s in streams {
        s.synchronize().unwrap();
    }
    check();
}

fn streams(n: usize) -> Vec<Stream> {
    (0..n).map(|_| Stream::new(device()).unwrap()).collect()
}

fn pool(initial: usize) -> Arc<PoolMemoryResource> {
    Arc::new(
        PoolMemoryResource::new(Arc::new(CudaMemoryResource::new(device())), initial, None)
            .unwrap(),
    )
}

/// Validates the pool and checks pool size = in use + free + pending.
fn accounts_add_up(p: &PoolMemoryResource) {
    let snap = p.validate().unwrap();
    assert_eq!(
        snap.pool_size,
        snap.in_use + snap.free + snap.pending,
        "{snap:?}"
    );
}

/// `ops` random operations over four streams on a 1 GiB pool (accounts checked every 4096),
/// then everything freed: nothing in use, cached or pending, every region one free block.
fn pool_over_four_streams(ops: usize, seed: u64, few_sizes: bool) {
    let p = pool(1 << 30);
    let s = streams(4);
    let check = || accounts_add_up(&p);
    exercise(
        &*p,
        &s,
        Plan {
            ops,
            max_size: 8 * MIB,
            cap: 512 * MIB,
            seed,
            check_every: 4096,
            few_sizes,
        },
        &check,
    );
    p.synchronize().unwrap();
    let snap = p.validate().unwrap();
    assert_eq!(
        (snap.in_use, snap.cached, snap.pending),
        (0, 0, 0),
        "{snap:?}"
    );
    assert_eq!(snap.free, snap.pool_size);
    assert!(
        snap.fully_coalesced,
        "not coalesced after everything was freed: {snap:?}"
    );
}

/// Random operations over four streams on a pool that starts empty, grows in 64 MiB steps and
/// may hold at most 1 GiB for a live set of at most 512 MiB: the grant path runs all the time
/// (reclaim from other streams' arenas, growth, stealing and gathering scattered free
/// blocks at the maximum), and the accounts add up after every 4096 steps.
#[test]
fn pool_growing_from_empty_in_small_steps_over_four_streams() {
    let p = Arc::new(
        PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(device())))
            .initial_size(0)
            .maximum_size((1 << 30) as u64)
            .growth(64 * MIB as u64)
            .build()
            .unwrap(),
    );
    let s = streams(4);
    let check = || accounts_add_up(&p);
    exercise(
        &*p,
        &s,
        Plan {
            ops: 300_000,
            max_size: 8 * MIB,
            cap: 512 * MIB,
            seed: 7,
            check_every: 4096,
            few_sizes: false,
        },
        &check,
    );
    p.synchronize().unwrap();
    let snap = p.validate().unwrap();
    assert_eq!(
        (snap.in_use, snap.cached, snap.pending),
        (0, 0, 0),
        "{snap:?}"
    );
    assert!(snap.pool_size <= 1 << 30, "{snap:?}");
}

#[test]
fn pool_million_operations_over_four_streams() {
    pool_over_four_streams(1_000_000, 42, false);
}

#[test]
fn pool_million_operations_from_four_threads_sharing_one_stream() {
    let p = pool(1 << 30);
    let shared = Stream::new(device()).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (p, shared) = (&p, &shared);
            scope.spawn(move || {
                // Each thread exercises the pool on the one stream (its own arena lane); two
                // of them with a few sizes, mostly through their arenas' block caches.
                let one = std::slice::from_ref(shared);
                exercise(
                    &**p,
                    one,
                    Plan {
                        ops: 250_000,
                        max_size: 8 * MIB,
                        cap: 128 * MIB,
                        seed: 7 + t,
                        check_every: usize::MAX,
                        few_sizes: t % 2 == 0,
                    },
                    &|| {},
                );
            });
        }
    });
    p.synchronize().unwrap();
    let snap = p.validate().unwrap();
    assert_eq!((snap.in_use, snap.pending), (0, 0), "{snap:?}");
    assert_eq!(snap.free, snap.pool_size);
}

#[test]
fn pool_operations_with_a_few_sizes_over_four_streams() {
    pool_over_four_streams(400_000, 9, true);
}

#[test]
fn fixed_size_million_operations_over_four_streams() {
    let upstream: SharedResource = Arc::new(CudaMemoryResource::new(device()));
    let fixed = FixedSizeMemoryResource::new(upstream, 64 * 1024, 256).unwrap();
    let s = streams(4);
    exercise(
        &fixed,
        &s,
        Plan {
            ops: 1_000_000,
            max_size: 64 * 1024,
            cap: 256 * MIB,
            seed: 7,
            check_every: 1 << 20,
            few_sizes: false,
        },
        &|| {},
    );
}

#[test]
fn binning_over_pool_million_operations_over_four_streams() {
    let p = pool(1 << 30);
    let bins = BinningMemoryResource::with_bins(Arc::clone(&p) as SharedResource, 8, 16).unwrap();
    let s = streams(4);
    let check = || {
        p.validate().unwrap();
    };
    exercise(
        &bins,
        &s,
        Plan {
            ops: 1_000_000,
            max_size: 4 * MIB,
            cap: 512 * MIB,
            seed: 99,
            check_every: 8192,
            few_sizes: false,
        },
        &check,
    );
    drop(bins);
    p.synchronize().unwrap();
    let snap = p.validate().unwrap();
    assert_eq!(snap.in_use, 0, "{snap:?}");
    assert!(snap.fully_coalesced, "{snap:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: usize },
    Free { pick: u64, stream: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..(3 << 20), 0usize..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        2 => (any::<u64>(), 0usize..3).prop_map(|(pick, stream)| Op::Free { pick, stream }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Short random programs, fully checked after every step (and shrunk on failure).
    #[test]
    fn pool_stays_consistent_after_every_step(ops in proptest::collection::vec(op(), 1..300)) {
        let p = pool(64 << 20);
        let s = streams(3);
        let mut shadow = Shadow::default();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => {
                    let ptr = p.allocate(size, s[stream].view()).unwrap();
                    if size > 0 {
                        shadow.insert(ptr, size, stream);
                    } else {
                        prop_assert!(ptr.is_null());
                    }
                }
                Op::Free { pick, stream } => {
                    if !shadow.is_empty() {
                        let (ptr, len, _) = shadow.take(pick);
                        p.deallocate(ptr, len, s[stream].view()).unwrap();
                    }
                }
            }
            let snap = p.validate().unwrap();
            prop_assert_eq!(snap.live_blocks, shadow.live.len());
            prop_assert_eq!(snap.pool_size, snap.in_use + snap.free + snap.pending);
        }
        for (a, len, st) in std::mem::take(&mut shadow.live) {
            p.deallocate(DevicePtr(a), len, s[st].view()).unwrap();
        }
        for st in &s {
            st.synchronize().unwrap();
        }
        p.synchronize().unwrap();
        let snap = p.validate().unwrap();
        prop_assert!(snap.fully_coalesced, "{:?}", snap);
    }
}
