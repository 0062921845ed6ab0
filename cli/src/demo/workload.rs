//! The demo's tasks: what one task does on its worker, and the host-side expectations the
//! results are checked against.
//!
//! The "transform" is made of device copies and a memset (no kernels: the runtime loads only
//! the driver API): rotate the bytes left by `k`, then fill a stripe with one value. The host
//! computes the same result from the same seed and compares 64-bit XXH3 hashes.

use std::sync::Arc;

use parking_lot::Mutex;

use rmm::allocator::DeviceBuffer;
use rmm::allocator::spill::SpillableBuffer;
use rmm::allocator::synchronize_stream;
use rmm::runtime::TaskContext;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::DemoError;
use crate::bench::Rng;

/// Deterministic pseudo-random bytes (the benchmarks' xorshift64*, eight bytes per step).
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = vec![0u8; len];
    for chunk in out.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_le_bytes()[..chunk.len()]);
    }
    out
}

/// The parameters of one transform, derived from a seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transform {
    /// Rotate left by this many bytes.
    pub rotate: usize,
    /// Stripe start and length.
    pub stripe: (usize, usize),
    /// Stripe value.
    pub value: u8,
}

impl Transform {
    pub(crate) fn from_seed(len: usize, seed: u64) -> Transform {
        if len == 0 {
            return Transform {
                rotate: 0,
                stripe: (0, 0),
                value: 0,
            };
        }
        let s = seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        let rotate = (s % len as u64) as usize;
        let start = ((s >> 20) % len as u64) as usize;
        let stripe_len = (len - start).min(len / 8 + 1);
        Transform {
            rotate,
            stripe: (start, stripe_len),
            value: (s >> 56) as u8,
        }
    }

    /// The transform applied on the host: the reference [`hash_applied`](Self::hash_applied)
    /// is tested against.
    #[cfg(test)]
    pub(crate) fn apply(&self, data: &mut [u8]) {
        if data.is_empty() {
            return;
        }
        data.rotate_left(self.rotate);
        let (a, n) = self.stripe;
        data[a..a + n].fill(self.value);
    }

    /// The hash of `data` transformed ([`apply`](Self::apply)), without transforming it: the
    /// bytes are hashed in the order the transform puts them, the stripe as its value. This
    /// spares the host a pass that reads and writes every byte of every result.
    pub(crate) fn hash_applied(&self, data: &[u8]) -> u64 {
        let len = data.len();
        if len == 0 {
            return xxh3_64(data);
        }
        let mut h = Xxh3::new();
        // Output bytes p..q are input bytes (p + rotate)..(q + rotate), wrapping at the end.
        let copied = |h: &mut Xxh3, p: usize, q: usize| {
            let start = (p + self.rotate) % len;
            let n = q - p;
            if start + n <= len {
                h.update(&data[start..start + n]);
            } else {
                h.update(&data[start..]);
                h.update(&data[..n - (len - start)]);
            }
        };
        let (a, n) = self.stripe;
        copied(&mut h, 0, a);
        let fill = [self.value; 4096];
        let mut left = n;
        while left > 0 {
            let k = left.min(fill.len());
            h.update(&fill[..k]);
            left -= k;
        }
        copied(&mut h, a + n, len);
        h.digest()
    }

    /// The transform from `src` into `dst` (both `len` bytes) on `stream`.
    pub(crate) fn enqueue(
        &self,
        ctx: &TaskContext<'_>,
        dst: rmm::allocator::backend::DevicePtr,
        src: rmm::allocator::backend::DevicePtr,
        len: usize,
    ) -> Result<(), DemoError> {
        if len == 0 {
            return Ok(());
        }
        let (d, s) = (ctx.device(), ctx.stream());
        let k = self.rotate;
        d.copy_device_to_device_async(dst, src.offset(k), len - k, s)?;
        if k > 0 {
            d.copy_device_to_device_async(dst.offset(len - k), src, k, s)?;
        }
        let (a, n) = self.stripe;
        d.memset_async(dst.offset(a), self.value, n, s)?;
        Ok(())
    }
}

/// One result kept between phases: a spillable buffer and the hash its bytes must have.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub buffer: Arc<SpillableBuffer>,
    pub hash: u64,
    pub seed: u64,
}

/// Sizes of the short-lived allocations a task makes besides its result (a Dask task's
/// temporaries): 8 of them, 256 B – 1 MiB, freed before the task ends.
fn temporaries(ctx: &TaskContext<'_>, seed: u64) -> Result<usize, DemoError> {
    let mut x = seed | 1;
    let mut held = Vec::with_capacity(8);
    for _ in 0..8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 256usize << (x % 13);
        let b = DeviceBuffer::new(size, ctx.stream())?;
        ctx.device()
            .memset_async(b.data(), (x >> 8) as u8, size, ctx.stream())?;
        held.push(b);
    }
    Ok(held.len())
}

/// Phase 1: makes an input from `seed`, transforms it into a spillable result, frees the
/// input; returns the result and the number of device allocations made.
pub(crate) fn produce(
    ctx: &TaskContext<'_>,
    size: usize,
    seed: u64,
) -> Result<(Kept, u64), DemoError> {
    let manager = ctx
        .spill_manager()
        .ok_or(DemoError::Check("spilling is off on a device".into()))?;
    let stream = ctx.stream();
    let host = pattern(size, seed);
    let input = DeviceBuffer::from_host(&host, stream)?;
    let out = manager.buffer(size, stream)?;
    let t = Transform::from_seed(size, seed ^ 0x5151);
    {
        let guard = out.device_view(stream)?;
        t.enqueue(ctx, guard.ptr(), input.data(), size)?;
        synchronize_stream(ctx.device(), stream)?;
    }
    let temps = temporaries(ctx, seed)?;
    drop(input);
    Ok((
        Kept {
            buffer: out,
            hash: t.hash_applied(&host),
            seed,
        },
        2 + temps as u64,
    ))
}

/// Host buffers for reading results back, reused from task to task (a fresh buffer per result
/// would have the kernel fault in and zero every page first); they go when the last clone
/// does.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReadBuffers(Arc<Mutex<Vec<Vec<u8>>>>);

impl ReadBuffers {
    /// `f` of a buffer of `len` bytes (contents unspecified), which goes back afterwards.
    fn with<R>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut buffer = self.0.lock().pop().unwrap_or_default();
        buffer.resize(len, 0);
        let r = f(&mut buffer);
        self.0.lock().push(buffer);
        r
    }
}

/// Reads a buffer through the device (bringing it back into the current stack if it was
/// spilled) into one of `buffers`, checks its hash and returns `then` of its bytes.
fn read_checked<R>(
    ctx: &TaskContext<'_>,
    kept: &Kept,
    buffers: &ReadBuffers,
    then: impl FnOnce(&[u8]) -> R,
) -> Result<R, DemoError> {
    let stream = ctx.stream();
    let guard = kept.buffer.device_view(stream)?;
    synchronize_stream(ctx.device(), stream)?;
    buffers.with(kept.buffer.size(), |bytes| {
        ctx.device().copy_to_host(bytes, guard.ptr())?;
        if xxh3_64(bytes) != kept.hash {
            return Err(DemoError::Check(format!(
                "buffer {} (seed {}, {} bytes) changed between phases",
                kept.buffer.id(),
                kept.seed,
                kept.buffer.size()
            )));
        }
        Ok(then(bytes))
    })
}

/// Phase 3: checks a kept result (on the device, in the new stack) and transforms it again
/// into a new spillable result.
pub(crate) fn transform_again(
    ctx: &TaskContext<'_>,
    kept: &Kept,
    buffers: &ReadBuffers,
) -> Result<(Kept, u64), DemoError> {
    let manager = ctx
        .spill_manager()
        .ok_or(DemoError::Check("spilling is off on a device".into()))?;
    let stream = ctx.stream();
    let size = kept.buffer.size();
    let t = Transform::from_seed(size, kept.seed ^ 0xA7A7);
    // The hash the result must have, from the checked bytes as they are now.
    let hash = read_checked(ctx, kept, buffers, |bytes| t.hash_applied(bytes))?;
    let out = manager.buffer(size, stream)?;
    {
        let src = kept.buffer.device_view(stream)?;
        let dst = out.device_view(stream)?;
        t.enqueue(ctx, dst.ptr(), src.ptr(), size)?;
        synchronize_stream(ctx.device(), stream)?;
    }
    let temps = temporaries(ctx, kept.seed.rotate_left(7))?;
    Ok((
        Kept {
            buffer: out,
            hash,
            seed: kept.seed,
        },
        2 + temps as u64,
    ))
}

/// The final check of a result, wherever it is (device, host or disk), read into `buffer`
/// (reused from one result to the next).
pub(crate) fn check(kept: &Kept, buffer: &mut Vec<u8>) -> Result<(), DemoError> {
    buffer.resize(kept.buffer.size(), 0);
    kept.buffer.read_into(buffer)?;
    if xxh3_64(buffer) == kept.hash {
        Ok(())
    } else {
        Err(DemoError::Check(format!(
            "result buffer {} (seed {}) does not hold the expected bytes",
            kept.buffer.id(),
            kept.seed
        )))
    }
}

/// Phase 2: plain (unpooled) allocations of `chunk` bytes until `bytes` are held, each
/// filled and spot-checked, then all freed; `tick` is called per chunk. Returns the number
/// of allocations.
pub(crate) fn fill_device(
    ctx: &TaskContext<'_>,
    bytes: usize,
    chunk: usize,
    tick: &dyn Fn(),
) -> Result<u64, DemoError> {
    let stream = ctx.stream();
    let mut held = Vec::new();
    let mut total = 0;
    while total < bytes {
        let n = chunk.min(bytes - total);
        let b = DeviceBuffer::new(n, stream)?;
        let value = (held.len() as u8).wrapping_mul(37).wrapping_add(1);
        ctx.device().memset_async(b.data(), value, n, stream)?;
        held.push((b, value));
        total += n;
        tick();
    }
    synchronize_stream(ctx.device(), stream)?;
    for (b, value) in &held {
        let mut probe = [0u8; 256];
        let take = probe.len().min(b.size());
        let at = b.size() - take;
        ctx.device()
            .copy_to_host(&mut probe[..take], b.data().offset(at))?;
        if probe[..take].iter().any(|x| x != value) {
            return Err(DemoError::Check(format!(
                "a plain allocation of {} bytes on device {} does not hold the value written",
                b.size(),
                ctx.device().ordinal()
            )));
        }
    }
    let count = held.len() as u64;
    drop(held);
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transforms_are_deterministic_and_stay_in_bounds() {
        for len in [1usize, 2, 7, 4096, 100_003] {
            for seed in 0..20 {
                let t = Transform::from_seed(len, seed);
                assert!(t.rotate < len);
                assert!(t.stripe.0 + t.stripe.1 <= len);
                let mut a = pattern(len, seed);
                let mut b = a.clone();
                t.apply(&mut a);
                Transform::from_seed(len, seed).apply(&mut b);
                assert_eq!(a, b);
            }
        }
        assert_eq!(pattern(17, 3), pattern(17, 3));
        assert_ne!(pattern(64, 3), pattern(64, 4));
    }

    #[test]
    fn hashing_a_transform_unapplied_equals_hashing_its_result() {
        for len in [0usize, 1, 2, 7, 4096, 4097, 100_003] {
            for seed in 0..40 {
                let t = Transform::from_seed(len, seed);
                let data = pattern(len, seed + 1);
                let mut applied = data.clone();
                t.apply(&mut applied);
                assert_eq!(
                    t.hash_applied(&data),
                    xxh3_64(&applied),
                    "len {len}, seed {seed}"
                );
            }
        }
    }
}
