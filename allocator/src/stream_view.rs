//! [`StreamView`]: a stream named by its handle, as RMM's `cuda_stream_view`; what every
//! stream-ordered call takes. It owns nothing and knows no device, so the device and memory
//! types below the streams can name it.

use std::fmt;

use crate::backend::RawStream;

/// A non-owning, copyable view of a stream (RMM's `cuda_stream_view`). The default is the
/// device's default stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StreamView(RawStream);

impl StreamView {
    /// The default stream.
    pub const DEFAULT: StreamView = StreamView(0);

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
}

impl fmt::Debug for StreamView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            f.write_str("StreamView(default)")
        } else {
            write!(f, "StreamView({:#x})", self.0)
        }
    }
}
