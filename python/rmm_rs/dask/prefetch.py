"""Bringing the inputs of a worker's next tasks back to the device before they run.

Dask's worker reads a task's inputs from its ``data`` on its event loop, just before it hands
the task to a thread: a spilled input is copied back to the device right there, and while it
is, the worker neither serves its peers nor takes what they send. :class:`Prefetcher` (a
worker plugin the device store installs) watches the worker's tasks start; as one starts, the
spilled inputs of the next ones in the worker's ready queue are brought back on a thread of
the store's own, so that reading them finds them on the device. Nothing waits for it: an input
read while its copy is still running waits only for the rest of that copy."""

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, List, Optional, Set

logger = logging.getLogger(__name__)

# How many of the next ready tasks have their inputs brought back when a task starts.
DEPTH = 2


def _off_device(adopted: Any) -> bool:
    """True when some of a stored value's data is off the device (spilled, not in its own
    memory); a look that does not wait for spilling under way."""
    return bool(adopted.is_spilled) and any(a is None for a in adopted.device_allocations())


class Prefetcher:
    """Brings spilled values back to the device on a thread of its own, ahead of the tasks
    that read them (see the module's documentation). ``store`` is the worker's
    :class:`~rmm_rs.dask.DeviceStore`; ``depth`` how many of the next ready tasks are served
    as one starts (0 turns it off)."""

    name = "rmm-rs-prefetch"

    def __init__(self, store: Any, depth: int = DEPTH):
        if depth < 0:
            raise ValueError(f"prefetch depth {depth!r} is negative: use 0 (off) or more")
        self.store = store
        self.depth = int(depth)
        self.worker: Optional[Any] = None
        self._lock = threading.Lock()
        # Values whose copy back is queued or running (by id of their adopted value).
        self._pending: Set[int] = set()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._closed = False
        self.brought_back = 0

    # Dask's WorkerPlugin interface (duck-typed: plugins are called by name).

    def setup(self, worker: Any) -> None:
        """Serves ``worker`` from now on."""
        self.worker = worker

    def teardown(self, worker: Any) -> None:
        """Stops the thread (copies already queued are dropped)."""
        self.close()

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """On a task starting: the spilled inputs of the next ``depth`` ready tasks are
        brought back."""
        if finish != "executing" or self.depth == 0 or self.worker is None:
            return
        state = getattr(self.worker, "state", None)
        ready = getattr(state, "ready", None)
        if ready is None:
            return
        try:
            keys = [dep.key for ts in ready.peekn(self.depth) for dep in ts.dependencies]
        except Exception as e:  # noqa: BLE001 - another distributed: no prefetching
            logger.debug("rmm-rs: no prefetching on this worker: %s", e)
            self.depth = 0
            return
        self.prefetch(keys)

    # The work.

    def prefetch(self, keys: Iterable[Any]) -> int:
        """Queues the spilled values of ``keys`` (those in the store) to be brought back to
        the device; returns how many were queued."""
        queued = 0
        with self._lock:
            if self._closed:
                return 0
            for key in keys:
                entry = self.store._device.get(key)
                if entry is None or not _off_device(entry.adopted):
                    continue
                if id(entry.adopted) in self._pending:
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="rmm-rs-prefetch")
                try:
                    self._pool.submit(self._bring_back, entry.adopted)
                except RuntimeError as e:  # the interpreter is shutting down
                    logger.debug("rmm-rs: no prefetching now: %s", e)
                    break
                self._pending.add(id(entry.adopted))
                queued += 1
        return queued

    def _bring_back(self, adopted: Any) -> None:
        try:
            if _off_device(adopted):
                # The views are dropped at once: the data stays on the device, as any data
                # brought back there, until the limit spills it again.
                adopted.device_frames([], False)
                self.brought_back += 1
        except Exception as e:  # noqa: BLE001 - a full device, say: the task reads it later
            logger.debug("rmm-rs: a value not brought back ahead of its task: %s", e)
        finally:
            with self._lock:
                self._pending.discard(id(adopted))

    def wait(self) -> None:
        """Returns once what is queued now has been brought back (or failed)."""
        with self._lock:
            pool = self._pool
            if pool is None:
                return
            done = pool.submit(lambda: None)
        done.result()

    def close(self) -> None:
        """Stops for good: what is queued is dropped, and a copy running ends on its own
        (this does not wait for it: it runs on the worker's event loop)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._pending.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
