//! [`FailureCallbackResourceAdaptor`]: on out-of-memory, asks a callback whether to retry (RMM's
//! `failure_callback_resource_adaptor`); spilling plugs in here. The adaptor retries as long as
//! the callback answers [`FailureAction::Retry`], so one that cannot free more must answer
//! [`FailureAction::Fail`] ([`AllocationFailure::attempt`] helps bound retries). Other errors go
//! straight to the caller.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::stream_view::StreamView;

/// What the callback wants done after an out-of-memory failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureAction {
    /// Try the allocation again (the callback freed something, or waited).
    Retry,
    /// Give the error to the caller.
    Fail,
}

impl FailureAction {
    /// `Retry` when `retry`, else `Fail`.
    pub fn retry_if(retry: bool) -> Self {
        if retry {
            FailureAction::Retry
        } else {
            FailureAction::Fail
        }
    }
}

/// What the callback is told about a failed allocation.
#[derive(Debug, Clone, Copy)]
pub struct AllocationFailure<'a> {
    /// Bytes requested.
    pub bytes: usize,
    /// 1 for the first failure of this request, 2 after one retry, and so on.
    pub attempt: u32,
    /// Device ordinal.
    pub device: u32,
    /// The stream of the request.
    pub stream: StreamView,
    /// The out-of-memory error the upstream returned.
    pub error: &'a Error,
}

type Callback = dyn Fn(&AllocationFailure<'_>) -> FailureAction + Send + Sync;

/// Calls a callback on upstream out-of-memory, retrying while it answers [`FailureAction::Retry`].
pub struct FailureCallbackResourceAdaptor {
    upstream: SharedResource,
    callback: Box<Callback>,
    retries: AtomicU64,
    failures: AtomicU64,
}

impl fmt::Debug for FailureCallbackResourceAdaptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCallbackResourceAdaptor")
            .field("upstream", &self.upstream.name())
            .field("retries", &self.retry_count())
            .field("failures", &self.failure_count())
            .finish_non_exhaustive()
    }
}

impl FailureCallbackResourceAdaptor {
    /// Wraps `upstream`; `callback` decides after each out-of-memory failure.
    pub fn new(
        upstream: SharedResource,
        callback: impl Fn(&AllocationFailure<'_>) -> FailureAction + Send + Sync + 'static,
    ) -> Self {
        FailureCallbackResourceAdaptor {
            upstream,
            callback: Box::new(callback),
            retries: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// RMM's shape: `callback(bytes)` returns true to retry.
    pub fn from_bytes_fn(
        upstream: SharedResource,
        callback: impl Fn(usize) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self::new(upstream, move |f| {
            FailureAction::retry_if(callback(f.bytes))
        })
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// Retries made so far (PyTorch's `num_alloc_retries`).
    pub fn retry_count(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Out-of-memory failures given back to callers after the callback answered `Fail`.
    pub fn failure_count(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    #[cold]
    #[inline(never)]
    fn on_failure(&self, bytes: usize, stream: StreamView, first: Error) -> Result<DevicePtr> {
        let device = self.upstream.device().ordinal();
        let mut error = first;
        let mut attempt = 1u32;
        loop {
            let action = (self.callback)(&AllocationFailure {
                bytes,
                attempt,
                device,
                stream,
                error: &error,
            });
            let retry = action == FailureAction::Retry;
            let what = if retry { "retrying" } else { "giving up" };
            tracing::debug!(
                device,
                requested = bytes,
                attempt,
                "failure callback: {what}"
            );
            if !retry {
                self.failures.fetch_add(1, Ordering::Relaxed);
                return Err(error);
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            match self.upstream.allocate(bytes, stream) {
                Ok(p) => return Ok(p),
                Err(e) if e.is_out_of_memory() || e.is_driver_out_of_memory() => {
                    error = e;
                    attempt = attempt.saturating_add(1);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl DeviceMemoryResource for FailureCallbackResourceAdaptor {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        match self.upstream.allocate(bytes, stream) {
            Err(e) if e.is_out_of_memory() || e.is_driver_out_of_memory() => {
                self.on_failure(bytes, stream, e)
            }
            other => other,
        }
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        self.upstream.deallocate(ptr, bytes, stream)
    }

    crate::adaptor::upstream_tail!("FailureCallbackResourceAdaptor");
}
