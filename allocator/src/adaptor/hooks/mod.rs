//! Memory hooks, as CuPy's `cupy.cuda.MemoryHook`: callbacks before and after memory is taken from
//! the device, served by a pool, and given back to a pool.
//!
//! # Events and their order
//! | event | fires | fields |
//! |---|---|---|
//! | `malloc_preprocess` | before a pool looks for a block | `size` (requested), `mem_size` (rounded) |
//! | `alloc_preprocess` | before the pool takes a chunk from its upstream (growth) | `mem_size` (chunk) |
//! | `alloc_postprocess` | after that upstream allocation | `mem_size`, `ptr` (null on failure) |
//! | `malloc_postprocess` | after the pool served the request | `size`, `mem_size`, `ptr` (null on failure) |
//! | `free_preprocess` | before a block goes back to the pool | `size`, `mem_size`, `ptr` |
//! | `free_postprocess` | after it went back | `size`, `mem_size`, `ptr` |
//!
//! A cache hit fires `malloc_pre, malloc_post`; growth fires `malloc_pre, alloc_pre, alloc_post,
//! malloc_post` (an `alloc` pair per upstream try: the pool halves its try when refused). As in
//! CuPy, returning cached chunks ([`PoolMemoryResource::release`] / `trim`) and a pool's initial
//! chunk are not events. Every event carries the device ordinal, the stream, and the firing
//! resource's name and identity ([`resource_id`]).
//!
//! [`PoolMemoryResource`] fires all six; wrap other resources in a
//! [`HookedResourceAdaptor`](crate::adaptor::HookedResourceAdaptor) for `malloc_*` and `free_*`.
//!
//! # Registration
//! A hook is registered for the calling thread ([`register_thread_hook`], or [`with_thread_hook`]
//! as CuPy's `with hook:`) or the process ([`register_process_hook`]) until its guard drops.
//! Process-wide hooks run first, then the thread's, each in registration order.
//!
//! Without hooks, a hooked operation costs only the check [`active`]. Hooks run on the allocating
//! thread inside the allocation: keep them short, never panic, and never allocate from a hooked
//! pool in a hook (not dispatched, so no recursion, but the pool may hold a lock).
//!
//! [`PoolMemoryResource`]: crate::resource::PoolMemoryResource
//! [`PoolMemoryResource::release`]: crate::resource::PoolMemoryResource::release

mod profile;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{RwLock, const_rwlock};
use serde::Serialize;

pub use profile::{
    LineProfileHook, SiteProfile, TracingHook, allocate_here, at_call_site, current_call_site,
};

use crate::backend::DevicePtr;
use crate::error::Result;
use crate::stream_view::StreamView;

/// Which of the six hook points an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum HookPoint {
    /// Before memory is taken from the upstream (the device, for a pool over CUDA).
    AllocPre,
    /// After memory was taken from the upstream.
    AllocPost,
    /// Before a pool serves a request.
    MallocPre,
    /// After a pool served a request.
    MallocPost,
    /// Before a block goes back to a pool.
    FreePre,
    /// After a block went back to a pool.
    FreePost,
}

impl HookPoint {
    /// CuPy's method name, e.g. `"malloc_preprocess"`.
    pub const fn name(self) -> &'static str {
        match self {
            HookPoint::AllocPre => "alloc_preprocess",
            HookPoint::AllocPost => "alloc_postprocess",
            HookPoint::MallocPre => "malloc_preprocess",
            HookPoint::MallocPost => "malloc_postprocess",
            HookPoint::FreePre => "free_preprocess",
            HookPoint::FreePost => "free_postprocess",
        }
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One hook event. See the module documentation for which fields each point fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookEvent {
    /// The hook point.
    pub point: HookPoint,
    /// Device ordinal (CuPy's `device_id`).
    pub device: u32,
    /// Bytes requested by the caller (`malloc_*`, `free_*`); for `alloc_*`, the chunk size.
    pub size: usize,
    /// Bytes after rounding (CuPy's `mem_size`): the block handed out or taken back, or the chunk.
    pub mem_size: usize,
    /// The pointer (CuPy's `mem_ptr`); null in pre events but `free_preprocess`, and failed posts.
    pub ptr: DevicePtr,
    /// The stream of the operation.
    pub stream: StreamView,
    /// Name of the resource that fired the event, e.g. `"PoolMemoryResource"`.
    pub resource: &'static str,
    /// The firing resource's identity ([`resource_id`]), to tell pools apart (as CuPy's `pmem_id`).
    pub resource_id: usize,
}

/// A set of callbacks, as CuPy's `MemoryHook`. Every method does nothing by default.
pub trait MemoryHook: Send + Sync + 'static {
    /// A name for reports.
    fn name(&self) -> &str {
        "MemoryHook"
    }
    /// Before memory is taken from the upstream.
    fn alloc_preprocess(&self, _event: &HookEvent) {}
    /// After memory was taken from the upstream (`event.ptr` is null on failure).
    fn alloc_postprocess(&self, _event: &HookEvent) {}
    /// Before a pool serves a request.
    fn malloc_preprocess(&self, _event: &HookEvent) {}
    /// After a pool served a request (`event.ptr` is null on failure).
    fn malloc_postprocess(&self, _event: &HookEvent) {}
    /// Before a block goes back to a pool.
    fn free_preprocess(&self, _event: &HookEvent) {}
    /// After a block went back to a pool.
    fn free_postprocess(&self, _event: &HookEvent) {}
    /// Every event: calls the method of its point unless overridden (one place for all six).
    fn on_event(&self, e: &HookEvent) {
        match e.point {
            HookPoint::AllocPre => self.alloc_preprocess(e),
            HookPoint::AllocPost => self.alloc_postprocess(e),
            HookPoint::MallocPre => self.malloc_preprocess(e),
            HookPoint::MallocPost => self.malloc_postprocess(e),
            HookPoint::FreePre => self.free_preprocess(e),
            HookPoint::FreePost => self.free_postprocess(e),
        }
    }
}

type HookList = Vec<(u64, Arc<dyn MemoryHook>)>;

/// Process-wide hooks registered (the fast-path check reads only this count).
static PROCESS_HOOK_COUNT: AtomicUsize = AtomicUsize::new(0);
static PROCESS_HOOKS: RwLock<Option<Arc<HookList>>> = const_rwlock(None);
static NEXT_HOOK_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Hooks registered on this thread (the fast-path check reads only this count).
    static THREAD_HOOK_COUNT: Cell<usize> = const { Cell::new(0) };
    static THREAD_HOOKS: RefCell<Option<Rc<HookList>>> = const { RefCell::new(None) };
    /// True while a hook runs on this thread: events raised meanwhile are not dispatched.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    /// The resource dispatching allocate/deallocate on this thread: its inner call runs plainly.
    static SERVING: Cell<usize> = const { Cell::new(0) };
    /// The call site set by [`allocate_here`] / [`at_call_site`].
    static CALL_SITE: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// True when any hook is registered for the process or the calling thread: the whole hot-path
/// cost of hooks when none is.
#[inline(always)]
pub fn active() -> bool {
    PROCESS_HOOK_COUNT.load(Ordering::Relaxed) != 0 || THREAD_HOOK_COUNT.with(Cell::get) != 0
}

/// A resource's identity in hook events ([`HookEvent::resource_id`]): its address
/// (`resource_id(&*arc)` for an `Arc`).
pub fn resource_id<R: ?Sized>(resource: &R) -> usize {
    (resource as *const R).cast::<()>() as usize
}

/// Removes a process-wide hook when dropped. Keep it alive as long as the hook should run.
#[derive(Debug)]
#[must_use = "the hook is removed when the guard drops"]
pub struct ProcessHookGuard {
    id: u64,
}

/// Registers `hook` for every thread of the process until the guard drops.
pub fn register_process_hook(hook: Arc<dyn MemoryHook>) -> ProcessHookGuard {
    let id = NEXT_HOOK_ID.fetch_add(1, Ordering::Relaxed);
    let mut list = PROCESS_HOOKS.write();
    let mut next: HookList = list.as_deref().cloned().unwrap_or_default();
    next.push((id, hook));
    *list = Some(Arc::new(next));
    PROCESS_HOOK_COUNT.fetch_add(1, Ordering::Release);
    ProcessHookGuard { id }
}

impl Drop for ProcessHookGuard {
    fn drop(&mut self) {
        let mut list = PROCESS_HOOKS.write();
        let (next, removed) = without_hook(list.as_deref(), self.id);
        if removed {
            PROCESS_HOOK_COUNT.fetch_sub(1, Ordering::Release);
        }
        *list = next.map(Arc::new);
    }
}

/// `list` without the hook `id` (`None` when no hook is left), and whether `id` was in it.
fn without_hook(list: Option<&HookList>, id: u64) -> (Option<HookList>, bool) {
    let mut next: HookList = list.cloned().unwrap_or_default();
    let before = next.len();
    next.retain(|(h, _)| *h != id);
    let removed = next.len() < before;
    ((!next.is_empty()).then_some(next), removed)
}

/// Removes a thread hook when dropped; it cannot leave its thread.
#[derive(Debug)]
#[must_use = "the hook is removed when the guard drops"]
pub struct ThreadHookGuard {
    id: u64,
    _not_send: PhantomData<*const ()>,
}

/// Registers `hook` for the calling thread until the guard drops (per thread, as in CuPy).
pub fn register_thread_hook(hook: Arc<dyn MemoryHook>) -> ThreadHookGuard {
    let id = NEXT_HOOK_ID.fetch_add(1, Ordering::Relaxed);
    THREAD_HOOKS.with(|l| {
        let mut l = l.borrow_mut();
        let mut next: HookList = l.as_deref().cloned().unwrap_or_default();
        next.push((id, hook));
        *l = Some(Rc::new(next));
    });
    THREAD_HOOK_COUNT.with(|c| c.set(c.get() + 1));
    ThreadHookGuard {
        id,
        _not_send: PhantomData,
    }
}

impl Drop for ThreadHookGuard {
    fn drop(&mut self) {
        // During thread teardown the lists may already be gone: nothing is left to remove.
        let _ = THREAD_HOOKS.try_with(|l| {
            let Ok(mut l) = l.try_borrow_mut() else {
                return;
            };
            let (next, removed) = without_hook(l.as_deref(), self.id);
            if removed {
                THREAD_HOOK_COUNT.with(|c| c.set(c.get().saturating_sub(1)));
            }
            *l = next.map(Rc::new);
        });
    }
}

/// Runs `f` with `hook` registered for the calling thread (CuPy's `with hook:`).
pub fn with_thread_hook<R>(hook: Arc<dyn MemoryHook>, f: impl FnOnce() -> R) -> R {
    let _guard = register_thread_hook(hook);
    f()
}

/// Restores a thread-local cell when dropped (also on unwind).
struct Restore<T: Copy + 'static> {
    cell: &'static std::thread::LocalKey<Cell<T>>,
    old: T,
}

impl<T: Copy + 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        let old = self.old;
        let _ = self.cell.try_with(|c| c.set(old));
    }
}

fn set_local<T: Copy + 'static>(
    cell: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
) -> Restore<T> {
    Restore {
        cell,
        old: cell.with(|c| c.replace(value)),
    }
}

/// Delivers `event` to every registered hook (process-wide first, then the thread's).
#[cold]
#[inline(never)]
pub fn fire(event: &HookEvent) {
    if IN_HOOK.with(Cell::get) {
        return;
    }
    let _in_hook = set_local(&IN_HOOK, true);
    if PROCESS_HOOK_COUNT.load(Ordering::Acquire) != 0 {
        let list = PROCESS_HOOKS.read().clone();
        for (_, h) in list.iter().flat_map(|l| l.iter()) {
            h.on_event(event);
        }
    }
    if THREAD_HOOK_COUNT.with(Cell::get) != 0 {
        let list = THREAD_HOOKS
            .try_with(|l| l.try_borrow().ok().and_then(|l| l.clone()))
            .ok()
            .flatten();
        for (_, h) in list.iter().flat_map(|l| l.iter()) {
            h.on_event(event);
        }
    }
}

#[inline]
fn rounded(bytes: usize, granule: usize) -> usize {
    bytes
        .checked_next_multiple_of(granule.max(1))
        .unwrap_or(bytes)
}

/// An event's resource: device, name and identity ([`resource_id`]); all this module knows of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// Device ordinal.
    pub device: u32,
    /// Name, e.g. `"PoolMemoryResource"`.
    pub name: &'static str,
    /// Identity ([`resource_id`]).
    pub id: usize,
}

impl Source {
    /// The source `resource` (its address is its identity) of `device`, named `name`.
    pub fn of<R: ?Sized>(resource: &R, device: u32, name: &'static str) -> Source {
        Source {
            device,
            name,
            id: resource_id(resource),
        }
    }

    /// Whether an operation of this resource dispatches: not nested in its own, nor in a hook.
    fn dispatches(self) -> bool {
        SERVING.with(Cell::get) != self.id && !IN_HOOK.with(Cell::get)
    }

    /// Fires `pre` (an event of `size`, `mem_size`, `ptr` on `stream`), runs `run`, then fires
    /// `post` with the pointer `post_ptr` gives for the result. With `serve`, the resource's
    /// nested call inside `run` takes the plain path.
    fn around<T>(
        self,
        (pre, post): (HookPoint, HookPoint),
        (size, mem_size, ptr, stream): (usize, usize, DevicePtr, StreamView),
        serve: bool,
        run: impl FnOnce() -> T,
        post_ptr: impl FnOnce(&T) -> DevicePtr,
    ) -> T {
        let event = HookEvent {
            point: pre,
            device: self.device,
            size,
            mem_size,
            ptr,
            stream,
            resource: self.name,
            resource_id: self.id,
        };
        fire(&event);
        let result = {
            let _serving = serve.then(|| set_local(&SERVING, self.id));
            run()
        };
        let ptr = post_ptr(&result);
        fire(&HookEvent {
            point: post,
            ptr,
            ..event
        });
        result
    }
}

/// The pointer an allocation's result carries (null on failure).
fn result_ptr(result: &Result<DevicePtr>) -> DevicePtr {
    result.as_ref().map_or(DevicePtr::NULL, |p| *p)
}

/// For resources with built-in hooks: fires `malloc_preprocess`, runs `allocate` (the resource's
/// own; its nested call takes the plain path), fires `malloc_postprocess`. `None` means run the
/// plain path: inside that nested call, inside a hook, or for zero bytes. Call when [`active`]:
///
/// ```ignore
/// if hooks::active()
///     && let Some(r) = hooks::dispatch_malloc(self.source(), bytes, 256, stream, || {
///         self.allocate(bytes, stream)
///     })
/// {
///     return r;
/// }
/// ```
#[cold]
#[inline(never)]
pub fn dispatch_malloc(
    source: Source,
    bytes: usize,
    granule: usize,
    stream: StreamView,
    allocate: impl FnOnce() -> Result<DevicePtr>,
) -> Option<Result<DevicePtr>> {
    let points = (HookPoint::MallocPre, HookPoint::MallocPost);
    let event = (bytes, rounded(bytes, granule), DevicePtr::NULL, stream);
    (bytes != 0 && source.dispatches())
        .then(|| source.around(points, event, true, allocate, result_ptr))
}

/// As [`dispatch_malloc`] for `free_*` around `deallocate`; also `None` for a null pointer.
#[cold]
#[inline(never)]
pub fn dispatch_free(
    source: Source,
    ptr: DevicePtr,
    bytes: usize,
    granule: usize,
    stream: StreamView,
    deallocate: impl FnOnce() -> Result<()>,
) -> Option<Result<()>> {
    let points = (HookPoint::FreePre, HookPoint::FreePost);
    let event = (bytes, rounded(bytes, granule), ptr, stream);
    (!ptr.is_null() && source.dispatches())
        .then(|| source.around(points, event, true, deallocate, |_| ptr))
}

/// For pools: wraps the upstream allocation `allocate` of a `mem_size`-byte chunk in `alloc_*`
/// events when [`active`].
///
/// # Errors
/// Whatever `allocate` returns.
#[inline]
pub fn alloc_from_upstream(
    source: Source,
    mem_size: usize,
    stream: StreamView,
    allocate: impl FnOnce() -> Result<DevicePtr>,
) -> Result<DevicePtr> {
    if active() {
        alloc_hooked(source, mem_size, stream, allocate)
    } else {
        allocate()
    }
}

#[cold]
#[inline(never)]
fn alloc_hooked(
    source: Source,
    mem_size: usize,
    stream: StreamView,
    allocate: impl FnOnce() -> Result<DevicePtr>,
) -> Result<DevicePtr> {
    let points = (HookPoint::AllocPre, HookPoint::AllocPost);
    let event = (mem_size, mem_size, DevicePtr::NULL, stream);
    source.around(points, event, false, allocate, result_ptr)
}
