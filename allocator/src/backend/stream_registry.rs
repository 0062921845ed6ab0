//! Which stream handles a backend made, and which it destroyed. Querying a destroyed stream makes
//! the driver read freed memory (a SIGSEGV), and pools ask about other threads' streams: destroying
//! takes the write lock, asking the read lock, so none is destroyed between check and call.

use std::collections::HashSet;

use parking_lot::RwLock;

use super::RawStream;
use crate::error::{Error, Result};

/// Handles below this are the driver's default streams (0, legacy 1, per-thread 2).
const DEFAULT_STREAMS: RawStream = 3;

/// Streams a backend made and has not destroyed, and destroyed ones whose handles are not reused.
#[derive(Debug, Default)]
pub(crate) struct StreamRegistry {
    sets: RwLock<Sets>,
}

#[derive(Debug, Default)]
struct Sets {
    live: HashSet<RawStream>,
    destroyed: HashSet<RawStream>,
}

impl StreamRegistry {
    /// Records a stream the driver just made (its handle may be a destroyed stream's again).
    pub(crate) fn created(&self, stream: RawStream) {
        let mut sets = self.sets.write();
        sets.destroyed.remove(&stream);
        sets.live.insert(stream);
    }

    /// Runs `destroy` (the driver call) with every other use held off; records it on success.
    pub(crate) fn destroy(
        &self,
        stream: RawStream,
        destroy: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut sets = self.sets.write();
        destroy()?;
        sets.live.remove(&stream);
        sets.destroyed.insert(stream);
        Ok(())
    }

    /// Runs `call` on `stream` unless this backend destroyed it (then an error). For its owner.
    pub(crate) fn unless_destroyed<T>(
        &self,
        stream: RawStream,
        call: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let sets = self.sets.read();
        if sets.destroyed.contains(&stream) {
            return Err(Error::invalid_argument(
                "stream",
                format!("{stream:#x}"),
                "a stream that has not been destroyed",
            ));
        }
        call()
    }

    /// Runs `call` on `stream` only when it is a default stream or one made here and not
    /// destroyed; else `None`. For callers not owning it; `call` must not block.
    pub(crate) fn if_alive<T>(
        &self,
        stream: RawStream,
        call: impl FnOnce() -> Result<T>,
    ) -> Result<Option<T>> {
        let sets = self.sets.read();
        if stream < DEFAULT_STREAMS || sets.live.contains(&stream) {
            call().map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_streams_made_here_and_alive_are_vouched_for() {
        let r = StreamRegistry::default();
        assert_eq!(r.if_alive(0, || Ok(1)).unwrap(), Some(1), "default stream");
        assert_eq!(
            r.if_alive(2, || Ok(1)).unwrap(),
            Some(1),
            "per-thread stream"
        );
        assert_eq!(
            r.if_alive(0x1000, || Ok(1)).unwrap(),
            None,
            "foreign stream"
        );
        r.created(0x1000);
        assert_eq!(r.if_alive(0x1000, || Ok(1)).unwrap(), Some(1));
        r.destroy(0x1000, || Ok(())).unwrap();
        assert_eq!(r.if_alive(0x1000, || Ok(1)).unwrap(), None);
        let e = r.unless_destroyed(0x1000, || Ok(1)).unwrap_err();
        assert!(e.to_string().contains("0x1000"), "{e}");
        assert_eq!(r.unless_destroyed(0x2000, || Ok(1)).unwrap(), 1, "foreign");
        r.created(0x1000);
        assert_eq!(
            r.unless_destroyed(0x1000, || Ok(1)).unwrap(),
            1,
            "handle reused"
        );
    }

    #[test]
    fn a_failed_destroy_leaves_the_stream_alive() {
        let r = StreamRegistry::default();
        r.created(0x10);
        let e = r
            .destroy(0x10, || {
                Err(Error::invalid_argument("stream", "0x10", "a valid stream"))
            })
            .unwrap_err();
        assert!(e.to_string().contains("0x10"));
        assert_eq!(r.if_alive(0x10, || Ok(())).unwrap(), Some(()));
    }

    #[test]
    fn a_destroy_waits_for_calls_in_flight() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Duration;
        let r = Arc::new(StreamRegistry::default());
        r.created(0x20);
        let in_call = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (r, in_call, done) = (Arc::clone(&r), Arc::clone(&in_call), Arc::clone(&done));
            std::thread::spawn(move || {
                r.if_alive(0x20, || {
                    in_call.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    done.store(true, Ordering::SeqCst);
                    Ok(())
                })
            })
        };
        while !in_call.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        r.destroy(0x20, || {
            assert!(
                done.load(Ordering::SeqCst),
                "the stream was destroyed while a call on it was in flight"
            );
            Ok(())
        })
        .unwrap();
        assert_eq!(t.join().unwrap().unwrap(), Some(()));
    }
}
