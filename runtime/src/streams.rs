//! Worker streams: taken from a process-wide cache per device, given back when a worker stops,
//! never destroyed: a pool keeps an arena per stream and may later synchronize one it has seen,
//! and a buffer can outlive its worker, so a destroyed CUDA stream handle would dangle. A
//! stopped worker's stream waits for the next worker of its device (PyTorch likewise keeps its
//! streams for the life of the process).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use parking_lot::Mutex;
use rmm_allocator::{Device, Stream, StreamView};

static SPARE: LazyLock<Mutex<BTreeMap<u32, Vec<Stream>>>> = LazyLock::new(Default::default);

/// A stream lent to one worker; back to the cache on drop.
#[derive(Debug)]
pub(crate) struct WorkerStream(Option<Stream>);

impl WorkerStream {
    /// A spare stream of `device`, or a new one.
    pub(crate) fn take(device: Device) -> rmm_allocator::Result<WorkerStream> {
        let spare = SPARE.lock().get_mut(&device.ordinal()).and_then(|v| {
            let i = v.iter().position(|s| s.device() == device)?;
            Some(v.swap_remove(i))
        });
        Ok(WorkerStream(Some(
            spare.map_or_else(|| Stream::new(device), Ok)?,
        )))
    }

    pub(crate) fn view(&self) -> StreamView {
        self.0.as_ref().map_or(StreamView::DEFAULT, Stream::view)
    }
}

impl Drop for WorkerStream {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            SPARE
                .lock()
                .entry(s.device().ordinal())
                .or_default()
                .push(s);
        }
    }
}
