//! Moving a buffer's data to and from pinned host memory through [`PinnedCopy`] (which owns the
//! host memory meanwhile), including spills whose copies stay in flight ([`PendingSpill`]).

use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::MutexGuard;

use super::kept::reclaimable;
use super::{SpillableBuffer, State};
use crate::backend::host::PinnedSlice;
use crate::backend::pinned_copy::{CopyFailed, PinnedCopy};
use crate::backend::{DevicePtr, RawEvent, RawStream};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::per_device::get_per_device_resource;
use crate::resource::SharedResource;
use crate::spill::copy::Direction;
use crate::stream::Event;
use crate::stream_view::StreamView;

/// A copy's result, or its error with the pinned memory if that came back.
pub(super) type Copied<T> = std::result::Result<T, (Error, Option<Vec<PinnedSlice>>)>;
/// An enqueued copy, or why it failed.
type Enqueued = std::result::Result<PinnedCopy<PinnedSlice>, Box<CopyFailed<PinnedSlice>>>;

impl SpillableBuffer {
    /// Takes pinned slices and enqueues the data's copy into them after the buffer stream's queued
    /// work; `None` if the data is not on the device.
    pub(super) fn start_to_host(&self, state: &State) -> Result<Option<Outbound>> {
        let State::Device { ptr, stream, .. } = state else {
            return Ok(None);
        };
        let asked = Instant::now();
        let slices = self.host_slices()?;
        let start = Instant::now();
        let released = self.release_events();
        let enqueue =
            |device, lane, event| PinnedCopy::to_host(device, lane, event, *ptr, self.size, slices);
        let copy = self.start_copy(Direction::ToHost, *stream, &released, enqueue);
        let copy = copy.map_err(|(error, _)| error)?;
        Ok(Some(Outbound {
            copy,
            start,
            enqueued: Instant::now(),
            host_wait: start - asked,
        }))
    }

    /// Waits for the copy `out` started, frees the device memory and records the move (timed from
    /// `since` if later than the copy's start).
    pub(super) fn complete_to_host(
        &self,
        state: &mut State,
        out: Outbound,
        since: Option<Instant>,
    ) -> Result<()> {
        let slices = self.finish_copy(Direction::ToHost, out.copy, out.enqueued, out.start);
        let slices = slices.map_err(|(error, _)| error)?;
        if !matches!(state, State::Device { .. }) {
            return Ok(());
        }
        self.free_device_memory(state)?;
        let start = since.map_or(out.start, |s| s.max(out.start));
        self.moved(state, State::Host(slices), start);
        Ok(())
    }

    /// Starts a copy in `direction` via `enqueue` (given device, copy stream, event) on a copy
    /// stream after `after`'s queued work, or only after the `released` events if given.
    pub(super) fn start_copy(
        &self,
        direction: Direction,
        after: StreamView,
        released: &[RawEvent],
        enqueue: impl FnOnce(Device, RawStream, Event) -> Enqueued,
    ) -> Copied<PinnedCopy<PinnedSlice>> {
        let copies = self.store.copies();
        // On failure nothing was enqueued: `enqueue` (and the memory it owns) is dropped unused.
        let lane = copies
            .ordered_after(direction, after, released)
            .map_err(|e| (e, None))?;
        let event = copies.event().map_err(|e| (e, None))?;
        enqueue(self.device(), lane, event).map_err(|f| self.settle(*f))
    }

    /// Waits for `copy`: its memory back, or the error and the memory if it came back.
    pub(super) fn finish_copy(
        &self,
        direction: Direction,
        copy: PinnedCopy<PinnedSlice>,
        enqueued: Instant,
        start: Instant,
    ) -> Copied<Vec<PinnedSlice>> {
        let waited = copy.wait();
        tracing::trace!(
            target: "rmm::spill::copy",
            id = self.id,
            bytes = self.size,
            ?direction,
            enqueue_us = (enqueued - start).as_micros() as u64,
            wait_us = enqueued.elapsed().as_micros() as u64,
            "copy"
        );
        let (memory, event) = waited.map_err(|f| self.settle(*f))?;
        self.store.copies().recycle(event);
        Ok(memory)
    }

    /// Returns a failed copy's event to the pool; its error and memory (if it came back).
    pub(super) fn settle(&self, f: CopyFailed<PinnedSlice>) -> (Error, Option<Vec<PinnedSlice>>) {
        if let Some(event) = f.event {
            self.store.copies().recycle(event);
        }
        (f.error, f.memory)
    }

    /// Copies `slices` to the device bytes at `ptr` on a copy stream after `after`'s work (which
    /// covers `ptr`'s allocation) and waits; the slices come back, also on error unless a copy may
    /// still read them: then the data is lost ([`Error::DataLost`]).
    pub(super) fn copy_in(
        &self,
        ptr: DevicePtr,
        slices: Vec<PinnedSlice>,
        after: StreamView,
    ) -> Copied<Vec<PinnedSlice>> {
        let start = Instant::now();
        // Kept aside: a copy that fails before it starts drops what it owns.
        let mut kept = Some(slices);
        let copy = self.start_copy(Direction::ToDevice, after, &[], |device, lane, event| {
            let slices = kept.take().unwrap_or_default();
            PinnedCopy::to_device(device, lane, event, slices, ptr, self.size)
        });
        let copy = match copy {
            Ok(c) => c,
            Err((e, memory)) => return Err(self.lost_unless(e, memory.or(kept))),
        };
        self.finish_copy(Direction::ToDevice, copy, Instant::now(), start)
            .map_err(|(e, memory)| self.lost_unless(e, memory))
    }

    /// `error` with the memory if it came back, else [`Error::DataLost`] (marking the buffer lost).
    pub(super) fn lost_unless(
        &self,
        error: Error,
        memory: Option<Vec<PinnedSlice>>,
    ) -> (Error, Option<Vec<PinnedSlice>>) {
        if memory.is_some() {
            return (error, memory);
        }
        self.lost.store(true, Ordering::Release);
        tracing::error!("unspilling buffer {}: {error}; its data is lost", self.id);
        (self.data_lost(error.to_string()), None)
    }

    /// Starts moving the data to the pinned host pool: [`PendingSpill::finish`] completes the move,
    /// so a caller spilling many buffers waits once. Without host room, data goes to disk now.
    ///
    /// # Errors
    /// As [`spill`](Self::spill); the buffer stays valid on the device.
    pub fn begin_spill(&self) -> Result<SpillStep<'_>> {
        let Some(state) = self.lock_idle() else {
            return Ok(SpillStep::Skipped);
        };
        self.begin_spill_locked(state)
    }

    pub(super) fn begin_spill_locked<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
    ) -> Result<SpillStep<'a>> {
        if self.spill_to_kept(&mut state)? {
            return Ok(SpillStep::Done(self.size));
        }
        match self.start_to_host(&state) {
            Ok(Some(out)) => Ok(SpillStep::Pending(Box::new(PendingSpill {
                buffer: self,
                state,
                out,
            }))),
            Ok(None) => Ok(SpillStep::Skipped),
            Err(Error::HostOutOfMemory { .. }) if self.store.has_disk() => {
                self.device_to_disk(&mut state)?;
                Ok(SpillStep::Done(self.size))
            }
            Err(e) => Err(e),
        }
    }
}

/// A host copy in flight: when it started and was enqueued, and how long getting host memory took.
pub(super) struct Outbound {
    copy: PinnedCopy<PinnedSlice>,
    start: Instant,
    enqueued: Instant,
    host_wait: std::time::Duration,
}

/// What [`SpillableBuffer::begin_spill`] did.
pub enum SpillStep<'a> {
    /// Nothing: the buffer is in use, busy, already spilled or empty.
    Skipped,
    /// The data moved (to disk); the device bytes freed.
    Done(usize),
    /// The copies to the host are in flight: [`PendingSpill::finish`] completes the move.
    Pending(Box<PendingSpill<'a>>),
}

/// A spill with copies in flight; the buffer stays locked until it completes. Dropping it without
/// [`finish`](Self::finish) waits for the copies and leaves the data on the device.
pub struct PendingSpill<'a> {
    buffer: &'a SpillableBuffer,
    state: MutexGuard<'a, State>,
    out: Outbound,
}

impl PendingSpill<'_> {
    /// The buffer's bytes.
    pub fn size(&self) -> usize {
        self.buffer.size
    }

    /// When its copies started (after its host memory was had).
    pub fn started(&self) -> Instant {
        self.out.start
    }

    /// Time getting host memory (pinning, making room), which a batch does not charge to its moves.
    pub fn host_wait(&self) -> std::time::Duration {
        self.out.host_wait
    }

    /// Waits for the copies, frees the device memory and records the move; returns the bytes freed.
    /// The move's time counts from `since` if later than the copies' start (so a batch's moves add
    /// up to its wall time).
    ///
    /// # Errors
    /// A copy failed: the buffer stays valid on the device.
    pub fn finish(mut self, since: Option<Instant>) -> Result<usize> {
        let buffer = self.buffer;
        buffer.complete_to_host(&mut self.state, self.out, since)?;
        Ok(buffer.size)
    }
}

impl SpillableBuffer {
    /// Brings host or disk data back into the device's current resource, for `stream`.
    pub(super) fn to_device(&self, state: &mut State, stream: StreamView) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(self.data_lost("an earlier unspill could not wait for its copy".into()));
        }
        if let Some(o) = &self.observer {
            o.make_room(self.id, self.size);
        }
        let resource = get_per_device_resource(self.device().ordinal())?;
        let ptr = resource.allocate(self.size, stream)?;
        let start = Instant::now();
        let copied = match state {
            State::Host(slices) => {
                self.copy_in(ptr, std::mem::take(slices), stream)
                    // A copy is kept in pinned memory only: pageable memory is the overflow
                    // of spills that could not wait for pinning, and goes back at once.
                    .map(|slices| {
                        (self.is_read_only() && slices.iter().all(PinnedSlice::is_pinned))
                            .then(|| reclaimable(slices, true))
                    })
                    .map_err(|(e, slices)| {
                        // The data stays on the host when the copy's memory came back.
                        if let Some(slices) = slices {
                            *state = State::Host(slices);
                        }
                        e
                    })
            }
            State::Disk(file, disk) => disk
                .read_to_device(self.store.copies(), file, ptr, stream)
                .map(|()| None),
            State::Device { .. } => Ok(None),
        };
        let kept = match copied {
            Ok(kept) => kept,
            Err(e) => return Err(self.failed_unspill(e, resource, ptr, stream)),
        };
        self.moved(
            state,
            State::Device {
                ptr,
                resource: Some(resource),
                stream,
                kept,
            },
            start,
        );
        Ok(())
    }

    /// An unspill's error after its copy into `ptr` failed, freeing `ptr` unless the data was lost
    /// (a copy may still write there).
    fn failed_unspill(
        &self,
        e: Error,
        resource: SharedResource,
        ptr: DevicePtr,
        stream: StreamView,
    ) -> Error {
        if matches!(e, Error::DataLost { .. }) {
            // A copy may still write into the new memory: it is left allocated.
            return e;
        }
        if let Err(free) = resource.deallocate(ptr, self.size, stream) {
            tracing::error!(
                "freeing after a failed unspill of buffer {}: {free}",
                self.id
            );
        }
        e
    }
}
