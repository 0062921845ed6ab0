//! [`FixedSizeMemoryResource`]: blocks of one size from per-stream free lists, RMM's
//! `fixed_size_memory_resource`.

use parking_lot::Mutex;
use std::any::Any;

use super::stream_arenas::{StreamArenas, sync_stream_or_device};
use super::{DeviceMemoryResource, out_of_memory};
use crate::backend::{DevicePtr, RawStream};
use crate::device::Device;
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::SharedResource;
use crate::stream_view::StreamView;

/// Default block size (1 MiB), as RMM.
pub const DEFAULT_BLOCK_SIZE: usize = 1 << 20;
/// Default number of blocks taken from the upstream at a time, as RMM.
pub const DEFAULT_BLOCKS_TO_PREALLOCATE: usize = 128;
/// Blocks moved from the stock list to a stream's list at a time.
const REFILL: usize = 32;
const NAME: &str = "FixedSizeMemoryResource";

#[derive(Debug)]
struct FixedArena {
    stream: RawStream,
    free: Mutex<Vec<u64>>,
}

/// The blocks no stream owns, and the upstream chunks (address, bytes) all blocks were cut from.
#[derive(Debug, Default)]
struct BlockStock {
    free: Vec<u64>,
    chunks: Vec<(u64, usize)>,
}

/// Serves requests of up to `block_size` bytes with whole blocks. A stream reuses its freed blocks
/// at once; other streams only after its work completes. Memory returns to the upstream on drop.
pub struct FixedSizeMemoryResource {
    upstream: SharedResource,
    device: Device,
    block_size: usize,
    blocks_per_chunk: usize,
    arenas: StreamArenas<FixedArena>,
    stock: Mutex<BlockStock>,
}

impl std::fmt::Debug for FixedSizeMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(NAME)
            .field("device", &self.device)
            .field("block_size", &self.block_size)
            .field("blocks_per_chunk", &self.blocks_per_chunk)
            .finish_non_exhaustive()
    }
}

impl FixedSizeMemoryResource {
    /// Blocks of `block_size` bytes (rounded up to 256), taken from `upstream`
    /// `blocks_to_preallocate` at a time, starting with one such chunk.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size; [`Error::OutOfMemory`] if the first chunk fails.
    pub fn new(
        upstream: SharedResource,
        block_size: usize,
        blocks_to_preallocate: usize,
    ) -> Result<Self> {
        if block_size == 0 || blocks_to_preallocate == 0 {
            return Err(Error::invalid_argument(
                "block_size / blocks_to_preallocate",
                format!("{block_size} / {blocks_to_preallocate}"),
                "both at least 1",
            ));
        }
        let block_size = block_size.next_multiple_of(crate::ALLOCATION_ALIGNMENT);
        let r = FixedSizeMemoryResource {
            device: upstream.device(),
            upstream,
            block_size,
            blocks_per_chunk: blocks_to_preallocate,
            arenas: StreamArenas::new(),
            stock: Mutex::new(BlockStock::default()),
        };
        r.grow(&mut r.stock.lock(), StreamView::DEFAULT)?;
        Ok(r)
    }

    /// A resource with RMM's defaults: 1 MiB blocks, 128 at a time.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] if the first chunk cannot be taken.
    pub fn with_defaults(upstream: SharedResource) -> Result<Self> {
        Self::new(upstream, DEFAULT_BLOCK_SIZE, DEFAULT_BLOCKS_TO_PREALLOCATE)
    }

    /// The size of every block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    #[inline]
    fn arena(&self, stream: StreamView) -> Result<&FixedArena> {
        self.arenas.get(stream.raw(), || FixedArena {
            stream: stream.raw(),
            free: Mutex::new(Vec::with_capacity(REFILL * 4)),
        })
    }

    fn grow(&self, stock: &mut BlockStock, stream: StreamView) -> Result<()> {
        let bytes = self.block_size * self.blocks_per_chunk;
        let p = self.upstream.allocate(bytes, stream)?;
        stock.chunks.push((p.addr(), bytes));
        let blocks = (0..self.blocks_per_chunk).rev();
        stock
            .free
            .extend(blocks.map(|i| p.addr() + (i * self.block_size) as u64));
        let device = self.device.ordinal();
        tracing::debug!(device, bytes, "fixed-size resource grew");
        Ok(())
    }

    #[cold]
    fn allocate_slow(
        &self,
        arena: &FixedArena,
        bytes: usize,
        stream: StreamView,
    ) -> Result<DevicePtr> {
        let mut stock = self.stock.lock();
        if stock.free.is_empty()
            && let Err(e) = self.grow(&mut stock, stream)
        {
            if !e.is_out_of_memory() {
                return Err(e);
            }
            // Take back blocks other streams are not using, once their work is done.
            let backend = self.device.backend();
            for other in self.arenas.all() {
                // The same stream's other lanes are its own work, except for the per-thread
                // default stream: there each is another thread's stream.
                let same = other.stream == arena.stream
                    && !StreamView::from_raw(arena.stream).is_per_thread();
                if same || std::ptr::eq(other, arena) {
                    continue;
                }
                let mut list = other.free.lock();
                if !list.is_empty() {
                    sync_stream_or_device(backend, self.device.ordinal(), other.stream)?;
                    stock.free.append(&mut list);
                }
            }
            if stock.free.is_empty() {
                return Err(out_of_memory(self.device, bytes, NAME, None));
            }
        }
        let at = stock.free.len().saturating_sub(REFILL);
        let mut list = arena.free.lock();
        list.extend(stock.free.drain(at..));
        list.pop()
            .map(DevicePtr)
            .ok_or_else(|| out_of_memory(self.device, bytes, NAME, None))
    }
}

impl DeviceMemoryResource for FixedSizeMemoryResource {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if stream.is_per_thread() {
            super::stream_arenas::settle_own_lane(self.device)?;
        }
        if bytes > self.block_size {
            return Err(Error::invalid_argument(
                "bytes",
                fmt_bytes(bytes),
                format!(
                    "at most the block size {} of this FixedSizeMemoryResource",
                    fmt_bytes(self.block_size)
                ),
            ));
        }
        let arena = self.arena(stream)?;
        if let Some(p) = arena.free.lock().pop() {
            return Ok(DevicePtr(p));
        }
        self.allocate_slow(arena, bytes, stream)
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, _bytes: usize, stream: StreamView) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        if stream.is_per_thread() {
            super::stream_arenas::settle_late_free(self.device)?;
        }
        self.arena(stream)?.free.lock().push(ptr.addr());
        Ok(())
    }

    fn device(&self) -> Device {
        self.device
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for FixedSizeMemoryResource {
    fn drop(&mut self) {
        if let Err(e) = self.device.synchronize() {
            tracing::error!(
                "synchronizing {} before releasing fixed-size blocks: {e}",
                self.device
            );
        }
        let upstream = &self.upstream;
        for (addr, bytes) in std::mem::take(&mut self.stock.lock().chunks) {
            if let Err(e) = upstream.deallocate(DevicePtr(addr), bytes, StreamView::DEFAULT) {
                tracing::error!("returning {bytes} bytes at {addr:#x} upstream: {e}");
            }
        }
    }
}
