//! Live allocations taken over by another stack (a reinitialize that keeps data in place):
//! the accounting layers of the old stack forget them (`hand_over_live`) and those of the
//! new one count them (`take_over_live`), so that each is counted exactly once, and the new
//! stack's figures drop to zero once they are freed through it.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::MIB;
use rmm_allocator::adaptor::{
    LimitingResourceAdaptor, LoggingResourceAdaptor, StatisticsResourceAdaptor,
    TrackingResourceAdaptor,
};
use rmm_allocator::backend::{SimBackend, SimConfig, SimMemoryMode};
use rmm_allocator::resource::DeviceMemoryResource;
use rmm_allocator::resource::{
    CudaMemoryResource, LiveBlock, PoolMemoryResource, SharedResource, VirtualMemory,
};
use rmm_allocator::{Device, StreamView};

/// A log sink the test can read.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    /// Lines whose action is `action`.
    fn count(&self, action: &str) -> usize {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| l.split(',').nth(2) == Some(action))
            .count()
    }
}

/// Statistics > logging > tracking > limiting > pool, as the runtime builds it.
struct Stack {
    statistics: Arc<StatisticsResourceAdaptor>,
    logging: Arc<LoggingResourceAdaptor>,
    tracking: Arc<TrackingResourceAdaptor>,
    limiting: Arc<LimitingResourceAdaptor>,
    pool: Arc<PoolMemoryResource>,
    log: Sink,
}

impl Stack {
    fn on(pool: PoolMemoryResource) -> Stack {
        let pool = Arc::new(pool);
        let limiting = Arc::new(LimitingResourceAdaptor::with_bytes(
            Arc::clone(&pool) as SharedResource,
            64 * MIB,
        ));
        let tracking = Arc::new(TrackingResourceAdaptor::new(
            Arc::clone(&limiting) as SharedResource
        ));
        let log = Sink::default();
        let logging = Arc::new(
            LoggingResourceAdaptor::to_writer(Arc::clone(&tracking) as SharedResource, log.clone())
                .unwrap(),
        );
        let statistics = Arc::new(StatisticsResourceAdaptor::new(
            Arc::clone(&logging) as SharedResource
        ));
        Stack {
            statistics,
            logging,
            tracking,
            limiting,
            pool,
            log,
        }
    }

    fn hand_over(&self, blocks: &[LiveBlock]) {
        self.statistics.hand_over_live(blocks);
        self.logging.hand_over_live(blocks);
        self.tracking.hand_over_live(blocks);
        self.limiting.hand_over_live(blocks);
    }

    fn take_over(&self, blocks: &[LiveBlock]) {
        self.statistics.take_over_live(blocks);
        self.logging.take_over_live(blocks);
        self.tracking.take_over_live(blocks);
        self.limiting.take_over_live(blocks);
    }

    /// (current bytes, current count, tracked count, limited bytes, pool in use).
    fn figures(&self) -> (i64, i64, usize, usize, u64) {
        (
            self.statistics.bytes_counter().value,
            self.statistics.allocations_counter().value,
            self.tracking.outstanding_count(),
            self.limiting.used_bytes(),
            self.pool.validate().unwrap().in_use,
        )
    }
}

fn pool_builder(d: Device) -> rmm_allocator::resource::PoolBuilder {
    PoolMemoryResource::builder(Arc::new(CudaMemoryResource::new(d)))
        .initial_size((16 * MIB) as u64)
        .growth(4 * MIB as u64)
        .virtual_memory(VirtualMemory::On)
}

#[test]
fn each_layer_counts_a_block_taken_over_exactly_once() {
    let b = SimBackend::leak(SimConfig {
        devices: 1,
        capacity: 1 << 30,
        mode: SimMemoryMode::Backed,
    })
    .unwrap();
    let d = Device::on(b, 0).unwrap();
    let s = StreamView::DEFAULT;
    let old = Stack::on(pool_builder(d).build().unwrap());
    let sizes = [4 * MIB, 3 * MIB + 17];
    let blocks: Vec<LiveBlock> = sizes
        .iter()
        .map(|&n| LiveBlock {
            ptr: old.statistics.allocate(n, s).unwrap(),
            bytes: n,
            stream: s,
        })
        .collect();
    let bytes: usize = sizes.iter().sum();
    let rounded = 4 * MIB + (3 * MIB + 256);
    assert_eq!(old.figures(), (bytes as i64, 2, 2, rounded, rounded as u64));
    let new = Stack::on(
        pool_builder(d)
            .adopt_from(Arc::clone(&old.pool))
            .adopt_live(blocks.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(new.pool.adopted_blocks(), blocks.as_slice());
    old.hand_over(&blocks);
    new.take_over(&blocks);
    assert_eq!(old.figures(), (0, 0, 0, 0, 0), "the old stack forgot them");
    assert_eq!(
        new.figures(),
        (bytes as i64, 2, 2, rounded, rounded as u64),
        "the new stack counts them once"
    );
    assert_eq!(new.statistics.lifetime_bytes().peak, bytes as i64);
    // Freed through the new stack: every figure goes back to zero.
    for b in &blocks {
        new.statistics.deallocate(b.ptr, b.bytes, s).unwrap();
    }
    assert_eq!(new.figures(), (0, 0, 0, 0, 0));
    // Each log replays on its own: the old one frees what it handed over, the new one
    // allocates what it took over before freeing it.
    old.logging.flush().unwrap();
    new.logging.flush().unwrap();
    assert_eq!((old.log.count("allocate"), old.log.count("free")), (2, 2));
    assert_eq!((new.log.count("allocate"), new.log.count("free")), (2, 2));
}
