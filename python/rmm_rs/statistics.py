"""Allocation statistics and a memory profiler, as RAPIDS RMM's ``rmm.statistics``.

Statistics are *enabled* on a device while its current memory resource is a
``StatisticsResourceAdaptor``, as in RMM. ``rmm_rs.initialize`` puts one on top of every
device stack it builds, so they are always enabled under a runtime; without one,
``enable_statistics()`` wraps the device's resource in an adaptor (and ``disable_statistics()``
takes that adaptor off again).

* ``enable_statistics()``, ``get_statistics()``: the counters of the innermost scope, as a
  ``Statistics`` (current, peak and total bytes and allocation counts; sizes as requested).
* ``push_statistics()`` / ``pop_statistics()``: start a scope of zeroed counters / end it and
  return its counters (the enclosing scope keeps counting through nested scopes). A scope
  survives ``rmm_rs.reinitialize`` (and ``finalize``): it counts on the new stack, and its
  counters are everything it counted.
* ``statistics()``: a context manager that pushes and pops a scope (enabling statistics for
  its duration when they were not).
* ``profiler(records=..., name=...)``: a decorator and a context manager that adds the
  statistics of each call or block to ``ProfilerRecords`` (``default_profiler_records`` unless
  given); ``records.report()`` is the per-function table.

Every function works on the calling thread's current device (device 0 unless changed), as
RMM's work on the current CUDA device; rmm-rs adds a keyword-only ``device=`` to choose
another. With statistics disabled, ``get/push/pop_statistics()`` return None and the profiler
records nothing, as in RMM.

The per-device dict of counters since the runtime started (bytes in use and reserved, the
pool's figures) is ``rmm_rs.device_statistics()``, outside this module.
"""

import inspect
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    Literal,
    Optional,
    Tuple,
    TypeVar,
    cast,
)

from . import _rmm_rs

_F = TypeVar("_F", bound=Callable[..., Any])

_ORDERS = ("num_calls", "memory_peak", "memory_total")


@dataclass
class Statistics:
    """Counters of one scope, returned by ``get_statistics()``, ``push_statistics()`` and
    ``pop_statistics()``.

    Attributes
    ----------
    current_bytes
        Bytes allocated and not yet freed (negative inside a scope that freed memory
        allocated before it).
    current_count
        Allocations not yet freed (may be negative, as ``current_bytes``).
    peak_bytes
        Highest ``current_bytes`` seen.
    peak_count
        Highest ``current_count`` seen.
    total_bytes
        Bytes of every allocation made.
    total_count
        Allocations made.
    """

    current_bytes: int
    current_count: int
    peak_bytes: int
    peak_count: int
    total_bytes: int
    total_count: int


def _device(device: Optional[int], what: str) -> Optional[int]:
    """``device`` checked: None (the calling thread's current device) or a device number."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(
            f"{what}(device={device!r}): expected None (the calling thread's current device) "
            "or a device number, an int >= 0"
        )
    return device


def _statistics(counts: Optional[Tuple[int, int, int, int, int, int]]) -> Optional[Statistics]:
    return None if counts is None else Statistics(*counts)


def enable_statistics(*, device: Optional[int] = None) -> None:
    """Enable allocation statistics on the device (RMM's ``enable_statistics``).

    Idempotent: when the device's current resource is already a statistics adaptor (always
    so under ``rmm_rs.initialize``), nothing changes. Otherwise the current resource is wrapped
    in a ``StatisticsResourceAdaptor``, which must stay on top while statistics are gathered.
    """
    _rmm_rs.statistics_enable(_device(device, "enable_statistics"))


def disable_statistics(*, device: Optional[int] = None) -> bool:
    """Take off the adaptor ``enable_statistics()`` put on the device (rmm-rs addition; with
    RMM one sets the adaptor's upstream as the current resource again).

    Returns True when it did; False when ``enable_statistics()`` put none on, or another
    resource (a runtime's stack, say) replaced it since. The statistics adaptor of an
    ``rmm_rs.initialize`` stack always stays.
    """
    return _rmm_rs.statistics_disable(_device(device, "disable_statistics"))


def get_statistics(*, device: Optional[int] = None) -> Optional[Statistics]:
    """The counters of the innermost scope, or None when statistics are disabled."""
    return _statistics(_rmm_rs.statistics_counters(_device(device, "get_statistics")))


def push_statistics(*, device: Optional[int] = None) -> Optional[Statistics]:
    """Start a scope of zeroed counters.

    Returns the counters of the scope that was innermost *before* the push, or None (and
    pushes nothing) when statistics are disabled.
    """
    return _statistics(_rmm_rs.statistics_push(_device(device, "push_statistics")))


def pop_statistics(*, device: Optional[int] = None) -> Optional[Statistics]:
    """End the innermost scope and return its counters; the enclosing scope's peak takes the
    popped one into account. A scope pushed before ``rmm_rs.reinitialize`` (or ``finalize``)
    returns what it counted on the stacks before and after (nothing while no runtime or
    statistics adaptor was there).

    Returns None when statistics are disabled. Raises ``IndexError`` when no scope was pushed
    (the outermost counters cannot be popped), as RMM does.
    """
    return _statistics(_rmm_rs.statistics_pop(_device(device, "pop_statistics")))


@contextmanager
def statistics(*, device: Optional[int] = None) -> Iterator[None]:
    """A context of its own allocation statistics (RMM's ``statistics()``).

    With statistics enabled, a scope is pushed on entry and popped on exit; it survives
    ``rmm_rs.reinitialize`` inside the context. Otherwise statistics are enabled on entry and
    the adaptor is taken off again on exit.

    Raises
    ------
    ValueError
        If statistics were enabled by the context and its adaptor was replaced inside it (by
        ``rmm_rs.initialize``, say), as RMM does: there is no adaptor of its own to take off.
    """
    device = _device(device, "statistics")
    pushed = push_statistics(device=device) is not None
    enabled_here = False
    if not pushed:
        enabled_here = _rmm_rs.statistics_enable(device)
        if not enabled_here:  # another thread enabled them in between
            pushed = push_statistics(device=device) is not None
    entered, entered_names = _rmm_rs.current_resource(device)
    try:
        yield
    finally:
        if enabled_here:
            now, now_names = _rmm_rs.current_resource(device)
            if now != entered:
                raise ValueError(
                    "the memory resource changed inside rmm_rs.statistics.statistics(), "
                    f"which enabled statistics: it was {entered_names!r} on entry and is "
                    f"{now_names!r} on exit; start rmm_rs (rmm_rs.initialize) before entering "
                    "the context, whose scope then survives reinitialize"
                )
            disable_statistics(device=device)
        elif pushed:
            pop_statistics(device=device)


class ProfilerRecords:
    """Memory statistics recorded by ``profiler``, by name (RMM's ``ProfilerRecords``)."""

    @dataclass
    class MemoryRecord:
        """Memory statistics of one function or code block.

        Attributes
        ----------
        num_calls
            Times the function or block ran.
        memory_total
            Bytes allocated by all of those runs together.
        memory_peak
            Highest peak of bytes allocated in one run.
        """

        num_calls: int = 0
        memory_total: int = 0
        memory_peak: int = 0

        def add(self, memory_total: int, memory_peak: int) -> None:
            """Count one more run that allocated ``memory_total`` bytes, with a peak of
            ``memory_peak``."""
            self.num_calls += 1
            self.memory_total += memory_total
            self.memory_peak = max(self.memory_peak, memory_peak)

    # The name of older RMM releases.
    Data = MemoryRecord

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: Dict[str, ProfilerRecords.MemoryRecord] = defaultdict(
            ProfilerRecords.MemoryRecord
        )

    def add(self, name: str, data: Statistics) -> None:
        """Add ``data`` (one run's statistics) to the record named ``name``; thread-safe."""
        if not isinstance(name, str):
            raise TypeError(
                f"ProfilerRecords.add(name={name!r}): expected a str, the record's name"
            )
        if not isinstance(data, Statistics):
            raise TypeError(
                f"ProfilerRecords.add(data={data!r}): expected an rmm_rs.statistics.Statistics "
                "(what pop_statistics() returns)"
            )
        with self._lock:
            self._records[name].add(memory_total=data.total_bytes, memory_peak=data.peak_bytes)

    @property
    def records(self) -> Dict[str, "ProfilerRecords.MemoryRecord"]:
        """The records by name (a copy of the mapping)."""
        with self._lock:
            return dict(self._records)

    def report(
        self, ordered_by: Literal["num_calls", "memory_peak", "memory_total"] = "memory_peak"
    ) -> str:
        """The records as a table, one row per name, largest ``ordered_by`` first.

        Parameters
        ----------
        ordered_by
            ``"memory_peak"`` (the default), ``"memory_total"`` or ``"num_calls"``.
        """
        if ordered_by not in _ORDERS:
            raise ValueError(
                f"ProfilerRecords.report(ordered_by={ordered_by!r}): expected one of "
                + ", ".join(repr(o) for o in _ORDERS)
            )
        rows = sorted(
            self.records.items(), key=lambda item: getattr(item[1], ordered_by), reverse=True
        )
        out = ["Memory Profiling", "================", ""]
        if not rows:
            out.append(
                "No data, maybe profiling wasn't enabled? (rmm_rs.statistics."
                "enable_statistics(), or rmm_rs.initialize())"
            )
            return "\n".join(out)
        out += [
            "Legends:",
            "  ncalls       - number of times the function or code block was called",
            "  memory_peak  - peak memory allocated in function or code block (in bytes)",
            "  memory_total - total memory allocated in function or code block (in bytes)",
            "",
            f"Ordered by: {ordered_by}",
            "",
            "ncalls     memory_peak    memory_total  filename:lineno(function)",
        ]
        for name, data in rows:
            out.append(
                f"{data.num_calls:6,d} {data.memory_peak:15,d} {data.memory_total:15,d}  {name}"
            )
        return "\n".join(out)

    # The name of older RMM releases.
    pretty_print = report

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.records})"

    def __str__(self) -> str:
        return self.report()


def get_descriptive_name_of_object(obj: object) -> str:
    """``filename:lineno(qualified name)`` of a function or class, the profiler's default
    record name (the function's name alone when its source cannot be found)."""
    target: Any = inspect.unwrap(obj) if callable(obj) else obj
    qualname = getattr(target, "__qualname__", None) or repr(target)
    try:
        _, line = inspect.getsourcelines(target)
        path = inspect.getfile(target)
    except (OSError, TypeError):
        return qualname
    return f"{path}:{line}({qualname})"


default_profiler_records = ProfilerRecords()


class ProfilerContext:
    """What ``profiler()`` returns: a decorator, and a context manager when named."""

    def __init__(self, records: ProfilerRecords, name: str, device: Optional[int]) -> None:
        self._records = records
        self._name = name
        self._device = device
        self._pushed: threading.local = threading.local()

    def _push(self) -> bool:
        return push_statistics(device=self._device) is not None

    def _pop(self, name: str) -> None:
        stats = pop_statistics(device=self._device)
        if stats is not None:
            self._records.add(name, stats)

    def __call__(self, func: _F) -> _F:
        if not callable(func):
            raise TypeError(
                f"profiler(...)({func!r}): expected a function to decorate; use "
                "`with profiler(name=...):` to profile a block of code"
            )
        name = self._name or get_descriptive_name_of_object(func)

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # Statistics enabled inside the call leave nothing of ours to pop.
            pushed = self._push()
            try:
                return func(*args, **kwargs)
            finally:
                if pushed:
                    self._pop(name)

        return cast(_F, wrapper)

    def __enter__(self) -> "ProfilerContext":
        if not self._name:
            raise ValueError(
                "profiler(name=''): a name is needed when the profiler is used as a context "
                "manager (`with profiler(name=\"load\"):`); only a decorated function has a "
                "default name"
            )
        stack = getattr(self._pushed, "stack", None)
        if stack is None:
            stack = self._pushed.stack = []
        stack.append(self._push())
        return self

    def __exit__(self, *exc: Any) -> "Literal[False]":
        if self._pushed.stack.pop():
            self._pop(self._name)
        return False


def profiler(
    *,
    records: ProfilerRecords = default_profiler_records,
    name: str = "",
    device: Optional[int] = None,
) -> ProfilerContext:
    """A decorator and a context manager that records the memory statistics of a function or
    block of code (RMM's ``profiler``).

    Each call of a decorated function (each run of a ``with`` block) pushes a scope of
    counters and pops it at the end, adding its total and peak bytes to ``records`` under
    ``name``; a call that reinitializes rmm_rs is recorded whole. With statistics disabled, it
    records nothing.

    Parameters
    ----------
    records
        Where the statistics go (``default_profiler_records`` unless given).
    name
        The record's name: needed for a context manager; a decorated function defaults to
        ``filename:lineno(function)``.
    device
        The device (rmm-rs addition): None for the calling thread's current device.
    """
    if not isinstance(records, ProfilerRecords):
        raise TypeError(
            f"profiler(records={records!r}): expected an rmm_rs.statistics.ProfilerRecords "
            "(or leave it out for default_profiler_records)"
        )
    if not isinstance(name, str):
        raise TypeError(f"profiler(name={name!r}): expected a str")
    return ProfilerContext(records, name, _device(device, "profiler"))


__all__ = [
    "ProfilerContext",
    "ProfilerRecords",
    "Statistics",
    "default_profiler_records",
    "disable_statistics",
    "enable_statistics",
    "get_descriptive_name_of_object",
    "get_statistics",
    "pop_statistics",
    "profiler",
    "push_statistics",
    "statistics",
]
