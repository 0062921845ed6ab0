//! [`StreamView`]: a stream named by its handle (RMM's `cuda_stream_view`), taken by stream-ordered
//! calls; it owns nothing and knows no device, so types below streams can name it.

use std::fmt;

use crate::backend::RawStream;

/// A non-owning, copyable stream view (RMM's `cuda_stream_view`); defaults to the default stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StreamView(RawStream);

impl StreamView {
    /// The default stream.
    pub const DEFAULT: StreamView = StreamView(0);

    /// The per-thread default stream (CUDA's `cudaStreamPerThread`): one handle that names a
    /// different stream on each thread.
    pub const PER_THREAD: StreamView = StreamView(2);

    /// Wraps a backend stream handle.
    pub const fn from_raw(raw: RawStream) -> StreamView {
        StreamView(raw)
    }

    /// The backend's handle.
    pub const fn raw(self) -> RawStream {
        self.0
    }

    /// True for the default stream.
    pub const fn is_default(self) -> bool {
        self.0 == 0
    }

    /// True for the per-thread default stream ([`StreamView::PER_THREAD`]).
    pub const fn is_per_thread(self) -> bool {
        self.0 == Self::PER_THREAD.0
    }
}

impl fmt::Debug for StreamView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            f.write_str("StreamView(default)")
        } else if self.is_per_thread() {
            f.write_str("StreamView(per-thread)")
        } else {
            write!(f, "StreamView({:#x})", self.0)
        }
    }
}
