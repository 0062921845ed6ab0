"""Spilling the values a worker's tasks read furthest ahead first.

Dask runs a shuffle output by output, each output reading a piece of every input in turn:
under a limit smaller than the inputs, the value read longest ago is the one read next, and
spilling the least recently used value first makes each read bring back what was just
spilled. :class:`NextUse` (a worker plugin the device store installs) tells the
store when each value will next be read: the position, in Dask's order, of the first of its
dependents still to run. The store then spills the values with no task left to read them
first (least recently used first), then those read furthest ahead."""

import logging
import weakref
from typing import Any, Dict, Iterable, Optional

logger = logging.getLogger(__name__)

# The states of a dependent that has still to read its input.
_PENDING = frozenset(("waiting", "ready", "constrained", "executing", "long-running"))


def position(priority: Any) -> Optional[int]:
    """A task's place in Dask's order as one integer (smaller: sooner), from its priority
    ``(-user priority, generation, dask.order's position, ...)``; None when it has none."""
    if not isinstance(priority, tuple) or len(priority) < 3:
        return None
    user, generation, order = (int(x) for x in priority[:3])
    return ((user + (1 << 15)) & 0xFFFF) << 48 | (generation & 0xFFFF) << 32 | (order & 0xFFFFFFFF)


class NextUse:
    """Keeps the store's spill order by next use (see the module's documentation): as a task
    finishes, its value's next use and that of each of its inputs is set again."""

    name = "rmm-rs-next-use"

    def __init__(self, store: Any):
        self.store = store
        self.worker: Optional[Any] = None
        # Per stored value, the next use of each key it is stored under (a task's view of its
        # input shares the input's data): the value is placed by the soonest.
        self._keys: "weakref.WeakKeyDictionary[Any, Dict[Any, Optional[int]]]" = (
            weakref.WeakKeyDictionary()
        )

    def setup(self, worker: Any) -> None:
        """Serves ``worker`` from now on."""
        self.worker = worker

    def teardown(self, worker: Any) -> None:
        """Stops serving ``worker``."""
        self.worker = None

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """A value now in memory, and the inputs of the task that made it, get their next use."""
        if finish != "memory" or self.worker is None:
            return
        tasks = getattr(getattr(self.worker, "state", None), "tasks", None)
        ts = None if tasks is None else tasks.get(key)
        if ts is None:
            return
        try:
            self.rank([ts, *ts.dependencies])
        except Exception as e:  # noqa: BLE001 - another distributed: least recently used
            logger.debug("rmm-rs: spilling by next use is off on this worker: %s", e)
            self.worker = None

    def rank(self, states: Iterable[Any]) -> None:
        """Sets the next use of the store's values of ``states`` (Dask's task states)."""
        device = self.store._device
        for ts in states:
            entry = device.get(ts.key)
            if entry is None:
                continue
            upcoming = [
                p
                for d in ts.dependents
                if d.state in _PENDING and (p := position(d.priority)) is not None
            ]
            adopted = entry.adopted
            # The keys still stored as this value (a key deleted or stored again is dropped).
            keys = {
                k: p
                for k, p in self._keys.get(adopted, {}).items()
                if getattr(device.get(k), "adopted", None) is adopted
            }
            keys[ts.key] = min(upcoming) if upcoming else None
            self._keys[adopted] = keys
            known = [p for p in keys.values() if p is not None]
            adopted.set_next_use(min(known) if known else None)
