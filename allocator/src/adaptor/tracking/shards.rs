//! The record maps: 64 shards picked by a hash of the address, each a spin-locked map of
//! small records (and of backtraces, when captured) with its share of the outstanding bytes.

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::stream_view::StreamView;
use crate::sync::SpinLock;

/// Hashes a pointer: multiplicative, the high half folded into the low bits (aligned pointers').
#[derive(Default, Clone, Copy)]
pub(super) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u64` keys; a plain multiplicative fold for completeness.
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        let h = (x ^ self.0).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        self.0 = h ^ (h >> 32);
    }
}

type BuildPtrHasher = BuildHasherDefault<PtrHasher>;

/// A record as stored: 24 bytes; the pointer is the key, a backtrace lives in its own map.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rec {
    pub(super) size: usize,
    pub(super) stream: StreamView,
    /// Bits 24..64: the time (ticking monotonic ns >> 20); bits 0..24: the thread's slot.
    pub(super) tag: u64,
}

/// Slots a thread table can hold; [`SLOT_UNKNOWN`] is the last.
pub(super) const SLOTS_MAX: usize = 1 << 24;
/// The slot of allocations made when the table is full: reported as made by the reporting thread.
pub(super) const SLOT_UNKNOWN: u32 = (SLOTS_MAX - 1) as u32;
pub(super) const TIME_SHIFT: u32 = 20;

impl Rec {
    pub(super) fn new(size: usize, stream: StreamView, at_ns: u64, slot: u32) -> Rec {
        Rec {
            size,
            stream,
            tag: (at_ns >> TIME_SHIFT) << 24 | u64::from(slot),
        }
    }

    pub(super) fn slot(&self) -> u32 {
        (self.tag & (SLOTS_MAX as u64 - 1)) as u32
    }

    pub(super) fn at_ns(&self) -> u64 {
        (self.tag >> 24) << TIME_SHIFT
    }
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Rec>() == 24);

/// A shard's records, and the backtraces of those that have one.
#[derive(Default)]
pub(super) struct Maps {
    pub(super) records: HashMap<u64, Rec, BuildPtrHasher>,
    pub(super) backtraces: HashMap<u64, Arc<Backtrace>, BuildPtrHasher>,
}

/// One lock, its map and its share of the outstanding bytes, on cache lines of their own.
#[repr(align(128))]
pub(super) struct Shard {
    /// Critical sections are one map insert or remove.
    pub(super) map: SpinLock<Maps>,
    /// Bytes outstanding in this shard (written under the lock, read without it).
    pub(super) bytes: AtomicUsize,
}

/// What an insert replaced or a remove took out: the record and its backtrace.
type Taken = (Option<Rec>, Option<Arc<Backtrace>>);

impl Shard {
    /// Records `addr` and counts its bytes (less the replaced record's); returns what it replaces.
    #[inline(always)]
    pub(super) fn insert(&self, addr: u64, rec: Rec, bt: Option<Arc<Backtrace>>) -> Taken {
        let mut maps = self.map.lock();
        let old = maps.records.insert(addr, rec);
        let old_bt = match bt {
            Some(bt) => maps.backtraces.insert(addr, bt),
            None if maps.backtraces.is_empty() => None,
            None => maps.backtraces.remove(&addr),
        };
        let freed = old.as_ref().map_or(0, |o| o.size);
        let b = self.bytes.load(Ordering::Relaxed);
        let b = b.wrapping_add(rec.size).wrapping_sub(freed);
        self.bytes.store(b, Ordering::Relaxed);
        (old, old_bt)
    }

    /// Removes `addr`'s record and backtrace, and its bytes from the count.
    #[inline(always)]
    pub(super) fn remove(&self, addr: u64) -> Taken {
        let mut maps = self.map.lock();
        let rec = maps.records.remove(&addr);
        let bt = (!maps.backtraces.is_empty())
            .then(|| maps.backtraces.remove(&addr))
            .flatten();
        if let Some(rec) = &rec {
            let b = self.bytes.load(Ordering::Relaxed).wrapping_sub(rec.size);
            self.bytes.store(b, Ordering::Relaxed);
        }
        (rec, bt)
    }
}
