"""``DeviceStore``: a Dask worker's ``data`` with device values under rmm-rs's spill manager.

A value that lives on the device (anything Dask serializes with its "cuda" family: CuPy,
Numba, PyTorch, RAPIDS RMM and rmm-rs buffers, cuDF; collections of them too) is kept as it
is and handed to the device's spill manager, which counts its real device bytes (views of one
allocation once) beside rmm-rs's own spillable buffers. Over ``device_memory_limit`` values
nothing else holds are spilled in the order the worker's tasks need them: first those no task
will read again (least recently used first), then those read furthest ahead
(``rmm_rs.dask.next_use``), then those not yet placed (least recently used first): their
device frames are copied into the pinned host pool on the manager's copy streams (and
on to ``spill.disk_directory`` past the host pool), and the value is let go, which frees its
device memory. On access a spilled value is rebuilt over its data brought back into the
current rmm-rs stack, without a device copy, and its host copy is kept (Dask's values are
never written in place), so that spilling it again only frees its device memory; a value in
use by a running task is never spilled. cuDF's buffers are copy-on-write (one written through
moves to a copy of its own while other slices share its memory): the store reads their address
without a write access, and holds the memory each value was adopted at until the value is
spilled. Host values go to Dask's usual host store. Values survive
``client.run(rmm_rs.reinitialize, …)``.

Between workers, a spilled value a peer asks for is sent from the tier it is in (pinned host
memory or disk) as host frames, never brought back to the device to be sent, and a value
received from a peer goes straight into the store: on the device when it fits under the
limit, else into the pinned host tier (see :mod:`rmm_rs.dask.transfer`).

The policy is the runtime's (Rust); this module only finds a value's device frames and
rebuilds it.
"""

import atexit
import copy
import importlib
import importlib.util
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Hashable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union, cast

from distributed.protocol.serialize import deserialize, serialize

import rmm_rs

from .. import _rmm_rs
from . import transfer
from .prefetch import DEPTH
from .serialize import device_extent
from .transfer import HostFrames, Tally

# What a store's own work on its values costs (the Python side of keeping them): adopting a
# device value (serializing it twice: the second tells whether the first made copies; where
# it did, rebuilding it over them) and rebuilding a spilled value on use.
_COSTS = ("adopted", "copied_on_adopt", "rebuilt")

if TYPE_CHECKING:
    from .._rmm_rs import _Size

logger = logging.getLogger(__name__)

#: A Dask key.
Key = Hashable

# The device types whose Dask "cuda" serializers the store has registered when it starts:
# (module, type, whether to import the module for it when it is installed but not imported).
_DEVICE_TYPES = (
    ("cupy", "ndarray", True),
    ("torch", "Tensor", False),
    ("numba.cuda.cudadrv.devicearray", "DeviceNDArray", False),
    ("rmm", "DeviceBuffer", False),
    ("cudf", "DataFrame", False),
)


def register_device_serializers() -> List[str]:
    """Has Dask register its "cuda" serializers of the device libraries here now.

    Dask registers them lazily, on the first value of each type it serializes; for CuPy that
    imports ``distributed.protocol.cupy`` (and with it cupyx and Numba), about a second during
    which the first value stored would hold up the worker's event loop (its heartbeats and
    transfers included). CuPy is imported for it when installed; the other libraries are
    registered only when already imported. Returns the modules done.
    """
    from distributed.protocol.cuda import cuda_serialize

    done: List[str] = []
    for module, name, import_it in _DEVICE_TYPES:
        if module not in sys.modules and not (import_it and importlib.util.find_spec(module)):
            continue
        try:
            cuda_serialize.dispatch(getattr(importlib.import_module(module), name))
            done.append(module)
        except Exception as e:  # noqa: BLE001 - a library that cannot load is served lazily
            logger.debug("registering Dask's cuda serializer of %s.%s: %s", module, name, e)
    return done


_KINDS = ("device", "host", "disk")



def is_device_object(obj: Any) -> bool:
    """True for values the store keeps under the spill manager: objects exposing
    ``__cuda_array_interface__``, the device types Dask's "cuda" family serializes (cuDF
    frames expose ``__cuda_array_interface__`` on their columns, not themselves), and lists,
    tuples and dicts whose every item is one (a shuffle's groups: a dict of cuDF frames)."""
    if type(obj) in (list, tuple, dict):
        items = list(obj.values()) if type(obj) is dict else obj
        return bool(items) and all(is_device_object(x) for x in items)
    # The module first: reading a cuDF object's __cuda_array_interface__ may copy it (below).
    module = type(obj).__module__.partition(".")[0]
    return module in ("cudf", "dask_cudf", "rmm") or hasattr(obj, "__cuda_array_interface__")


_CUDF_SPILLS = (
    "cuDF spills it: cuDF's own spilling is on (dask-cuda's enable_cudf_spill, or "
    "cudf.set_option('spill', True)); its frames are left to it, not counted by the store"
)
_told_cudf_spills = False


def _cudf_spills(value: Any) -> Optional[str]:
    """Why the store leaves ``value`` to cuDF's own spilling (a cuDF frame, or a collection of
    them, while cuDF's "spill" option is on: cuDF counts and spills those buffers itself, and
    the store counting them too would spill them twice), or None."""
    global _told_cudf_spills
    cudf = sys.modules.get("cudf")
    if cudf is None or not _holds_cudf(value):
        return None
    try:
        on = bool(cudf.get_option("spill"))
    except Exception:  # noqa: BLE001 - a cuDF without the option spills nothing itself
        return None
    if not on:
        return None
    if not _told_cudf_spills:
        _told_cudf_spills = True
        logger.info("rmm-rs: %s", _CUDF_SPILLS)
    return _CUDF_SPILLS


def _holds_cudf(value: Any) -> bool:
    if type(value) in (list, tuple, dict):
        items = value.values() if type(value) is dict else value
        return any(_holds_cudf(x) for x in items)
    return type(value).__module__.partition(".")[0] in ("cudf", "dask_cudf")


def _copy_on_write(frame: Any) -> bool:
    """True for a cuDF ``Buffer``. cuDF's buffers are copy-on-write: a write access (reading
    ``__cuda_array_interface__`` is one, and cuDF's own serializer makes it) moves a buffer
    that shares its memory with other slices to a copy of its own. So the store reads their
    address as a read access (``ptr``) and holds the memory a value was adopted at
    (:func:`_hold`)."""
    buffer_type = getattr(sys.modules.get("cudf.core.buffer"), "Buffer", None)
    return buffer_type is not None and isinstance(frame, buffer_type)


def _is_device_frame(frame: Any) -> bool:
    return _copy_on_write(frame) or hasattr(frame, "__cuda_array_interface__")


def _frame_extent(frame: Any) -> Tuple[int, int]:
    """``(address, nbytes)`` of a device frame, without moving a copy-on-write one."""
    if _copy_on_write(frame):
        return int(frame.ptr), int(frame.size)
    return device_extent(frame)


def _hold(frames: List[Any]) -> Optional[List[Any]]:
    """What keeps the memory of ``frames`` allocated while their value is in the store: the
    owner of each copy-on-write buffer. Were the value's buffer moved to a copy (written
    through while a task's slice shared it), the memory adopted would otherwise be freed
    once nothing else viewed it, and a spill would copy whatever took its place. The owner,
    not a slice of it: a slice would make every later serialization of the value (a send, a
    collection's item stored again) move its buffers to copies. None when no frame is
    copy-on-write: other device objects never move, and the value alone keeps their memory."""
    held = [f.owner for f in frames if _copy_on_write(f)]
    return held or None


def _allocation_of(frame: Any) -> Tuple[int, int]:
    """``(address, bytes)`` of the allocation a device frame lies in: the whole memory of a
    CuPy array, a PyTorch tensor's storage, a rebuilt view's buffer; the frame's own extent
    for other objects."""
    if _copy_on_write(frame):
        return _frame_extent(frame)
    if isinstance(frame, _rmm_rs.DeviceView):
        base, size = frame.allocation
        return int(base), int(size)
    mem = getattr(getattr(frame, "data", None), "mem", None)  # CuPy
    if mem is not None and getattr(mem, "ptr", None):
        return int(mem.ptr), int(mem.size)
    storage = getattr(frame, "untyped_storage", None)  # PyTorch
    if callable(storage):
        s = storage()
        return int(s.data_ptr()), int(s.nbytes())
    return device_extent(frame)


def _device_pointers(frames: List[Any]) -> List[int]:
    return [_frame_extent(f)[0] for f in frames if _is_device_frame(f)]


def _own_serialization(value: Any) -> Tuple[Any, Dict[str, Any], List[Any], bool]:
    """``value``'s Dask "cuda" serialization, and the value the store keeps: ``value`` itself
    when its device frames are its own memory, else the value rebuilt over the frames.

    A serializer may copy: cuDF serializes a sliced column (a shuffle's pieces) as a compact
    copy, CuPy and PyTorch a non-contiguous array as a contiguous one. Such frames are
    temporaries, and the memory the value lives in is not theirs: a spill that read from
    their addresses once they were freed would copy whatever took their place. Serialized
    twice, frames that are the value's memory come back at the same addresses; copies (the
    first still alive) at new ones. The value then kept is the one rebuilt over the first
    copies, which is all the store counts, spills and frees (the last item returned: True
    then)."""
    # A collection is serialized item by item (Dask does so by itself only when its first
    # item has a "dask" serializer).
    collection = type(value) in (list, tuple, dict)
    original = value

    def serialized() -> Tuple[Dict[str, Any], List[Any]]:
        return cast(
            Tuple[Dict[str, Any], List[Any]],
            serialize(
                original, serializers=("cuda",), on_error="raise", iterate_collection=collection
            ),
        )

    header, frames = serialized()
    first = _device_pointers(frames)
    copied = False
    if first:
        _, again = serialized()
        copied = _device_pointers(again) != first
        del again
        if copied:
            value = deserialize(copy.deepcopy(header), frames, deserializers=("cuda",))
    return value, header, frames, copied


class _DeviceEntry:
    """A device value in the store: its serialization header, its frames (host frames as
    they are, device frames as ``(allocation, offset, nbytes)``), and the adopted value."""

    __slots__ = ("header", "frames", "adopted", "nbytes", "__weakref__")

    def __init__(
        self, header: Dict[str, Any], frames: List[Any], adopted: Any, nbytes: int
    ) -> None:
        self.header = header
        self.frames = frames
        self.adopted = adopted
        self.nbytes = nbytes

    def get(
        self,
        homes: "weakref.WeakValueDictionary[int, Any]",
        to_send: bool = False,
        costs: Optional[Tally] = None,
    ) -> Any:
        value = self.adopted.value()
        if value is not None:
            return value
        start = time.perf_counter()
        specs = [f for f in self.frames if isinstance(f, tuple)]
        views = self.adopted.device_frames(specs, to_send)
        for v in views:
            # A value made of these views and stored again is this entry's data.
            homes[v.allocation[0]] = self.adopted
        views = iter(views)
        frames = [next(views) if isinstance(f, tuple) else f for f in self.frames]
        # Dask's deserialize takes keys out of a collection's header: each rebuild gets a copy.
        value = deserialize(copy.deepcopy(self.header), frames, deserializers=("cuda",))
        if costs is not None:
            # The value's own bytes: an entry sharing a larger spilled value's data (a task's
            # piece of it) rebuilds only its piece.
            costs.add("rebuilt", sum(s[2] for s in specs), time.perf_counter() - start)
        return value

    def to_send(self, homes: "weakref.WeakValueDictionary[int, Any]") -> Any:
        """What to hand a peer that asked for the value: for an rmm-rs peer of this host,
        its data staged in memory both map (see :mod:`rmm_rs.dask.transfer`); else the value
        while it is on the device (in its own memory, or its data back there); else, as
        :class:`HostFrames`, its data read from the tier it is in."""
        value = self.adopted.value()
        if value is not None:
            # A peer of this host that maps this worker's memory copies it from there.
            shared = transfer.share_now(self.header, self.frames, self.adopted)
            return value if shared is None else shared
        if transfer.sharing():
            # Staged from wherever its data is as the message is serialized.
            return HostFrames.sent_from(self.header, self.frames, self.adopted)
        if all(a is not None for a in self.adopted.device_allocations()):
            return self.get(homes)
        # Its data is read as the message is serialized, off the worker's event loop.
        return HostFrames.sent_from(self.header, self.frames, self.adopted)


class DeviceStore(MutableMapping[Key, Any]):
    """A Dask worker's ``data`` that keeps device values under rmm-rs's spill manager.

    ``device_memory_limit``: bytes, a size ("8GB") or a fraction of the device (0.8, "80%"),
    at most the device's memory (a larger one is refused, as in rmm.toml); 0 for no spilling,
    as in dask-cuda (values stay on the device until it is full); None leaves the runtime's
    ``spill.device_memory_limit`` (80% unless configured: dask-cuda's default; dask-cuda's
    None, no spilling, is 0 here). It stays in force across reinitializations.
    ``memory_limit``: host bytes for host values before Dask's host store spills them to
    ``worker_local_directory`` (None: a plain dict). ``disk_directory``: where
    device values go past the pinned host pool (``spill.disk_directory``; by default
    ``<worker_local_directory>/rmm-rs-spill`` when the store starts rmm-rs itself).
    ``send_from_tier``: a spilled value a peer asks for is sent from the tier it is in
    (True, the default); False brings it back to the device first, as Dask's own stores do
    (for comparisons: ``unspilled_to_send_bytes`` of ``spill_statistics()`` counts those
    bytes). ``share_with_peers``: a spilled value an rmm-rs worker of the same host asks for
    is staged in device memory both processes map, and the peer copies it from there (True,
    the default: nothing goes through the connection but a few dozen bytes); False sends its
    bytes through the connection. ``prefetch``: as one of the worker's tasks starts, the
    spilled inputs of its next ``prefetch`` ready tasks are brought back to the device on a
    thread of the store's, so that the worker's event loop finds them there (default 2; 0
    turns it off).

    When rmm-rs is not running yet in the process, the store starts it on ``device`` with one
    worker thread and spilling on, from ``config`` (an rmm.toml path, a dict of settings, or
    None for ./rmm.toml and ``RMM_*``); an ``RMMRsPlugin`` may reinitialize it later, keeping
    the store's values. Running rmm-rs must spill on ``device``.

    dask-cuda's form: ``LocalCUDACluster(data=DeviceStore.factory(device_memory_limit=…))``.
    """

    def __init__(
        self,
        device_memory_limit: "Optional[_Size]" = None,
        memory_limit: "Optional[_Size]" = None,
        worker_local_directory: "Optional[Union[str, os.PathLike[str]]]" = None,
        *,
        config: Any = None,
        disk_directory: "Optional[Union[str, os.PathLike[str]]]" = None,
        device: int = 0,
        send_from_tier: bool = True,
        share_with_peers: bool = True,
        prefetch: int = DEPTH,
    ) -> None:
        self.device_id = int(device)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(
                f"prefetch={prefetch!r}: give how many of a worker's next ready tasks have "
                "their spilled inputs brought back ahead of them, an int of 0 (off) or more"
            )
        self.prefetch = prefetch
        self._prefetcher = None
        self.send_from_tier = bool(send_from_tier)
        self.share_with_peers = bool(share_with_peers)
        self.config = config
        if disk_directory is None and worker_local_directory is not None:
            disk_directory = os.path.join(worker_local_directory, "rmm-rs-spill")
        self.disk_directory = None if disk_directory is None else os.fspath(disk_directory)
        if not rmm_rs.is_initialized():
            rmm_rs.initialize(config, self.settings())
        if self.disk_directory is not None:
            # The store's directory stays its disk tier across reinitializations.
            self._check_spilling()
            _rmm_rs.set_disk_directory(self.disk_directory, self.device_id)
        self.limit = None
        if device_memory_limit is not None:
            self.limit = _rmm_rs.set_device_memory_limit(device_memory_limit, self.device_id)
        else:
            self._check_spilling()
        self._device: Dict[Key, _DeviceEntry] = {}
        # id(value) → its entry, while some key holds it: one object under several keys is
        # adopted once (else each adoption would see the others as users).
        self._by_object: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        # Device address → the spilled value whose data came back there: a value rebuilt
        # from it and stored again (a task returning its input) shares its data.
        self._homes: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._host = self._host_store(memory_limit, worker_local_directory)
        self._lock = threading.RLock()
        self.unspillable: Dict[Key, str] = {}
        self._costs = Tally(_COSTS)
        register_device_serializers()
        _LIVE.append(weakref.ref(self))
        # Made inside a Dask worker's constructor: attach to it once it exists.
        transfer.attach_when_started(self)

    @classmethod
    def factory(
        cls,
        device_memory_limit: "Optional[_Size]" = None,
        memory_limit: "Optional[_Size]" = None,
        **kwargs: Any,
    ) -> "Tuple[type, Dict[str, Any]]":
        """The ``data=`` argument of a Dask worker, ``LocalCluster`` or dask-cuda's
        ``LocalCUDACluster``: ``(DeviceStore, {options})``, made on each worker (with its
        local directory)."""
        return (
            cls,
            {"device_memory_limit": device_memory_limit, "memory_limit": memory_limit, **kwargs},
        )

    def settings(self) -> Dict[str, Any]:
        """The settings this store needs of rmm-rs: its device, one worker thread, spilling
        on (and its disk directory)."""
        s = {"devices": [self.device_id], "workers_per_device": 1, "spill.enabled": True}
        if self.disk_directory is not None:
            s["spill.disk_directory"] = self.disk_directory
        return s

    def _check_spilling(self) -> None:
        if int(self.device_id) not in rmm_rs.spill_statistics():
            raise rmm_rs.RmmError(
                f"device {self.device_id} does not spill: the device store needs spilling on; "
                'start rmm_rs with {"spill": {"enabled": True}} (spill.enabled = true)'
            )

    @staticmethod
    def _host_store(memory_limit: Any, local_directory: Any) -> MutableMapping[Key, Any]:
        if memory_limit is None or local_directory is None:
            return {}
        from dask.utils import parse_bytes
        from distributed.spill import SpillBuffer

        buffer: Any = SpillBuffer(
            os.path.join(local_directory, "storage"), target=parse_bytes(memory_limit)
        )
        return cast(MutableMapping[Key, Any], buffer)

    # The mapping.

    def __setitem__(self, key: Key, value: Any) -> None:
        with self._lock:
            self._discard(key)
            if isinstance(value, HostFrames):
                # Received from a peer: kept as it arrived (see rmm_rs.dask.transfer).
                value = transfer.keep(value, self.device_id)
            if isinstance(value, HostFrames) and value.kept is not None:
                kept = value.kept
                self._device[key] = _DeviceEntry(value.header, value.frames, kept, kept.size)
                return
            entry = None
            if is_device_object(value):
                spilled_by = _cudf_spills(value)
                if spilled_by is None:
                    entry = self._adopt(key, value)
                else:
                    self.unspillable[key] = spilled_by
            if entry is not None:
                self._device[key] = entry
            else:
                self._host[key] = value

    def __getitem__(self, key: Key) -> Any:
        entry = self._device.get(key)
        if entry is None:
            return self._host[key]
        if transfer.sending():
            if self.send_from_tier:
                return entry.to_send(self._homes)
            return entry.get(self._homes, to_send=True, costs=self._costs)
        return entry.get(self._homes, costs=self._costs)

    def __delitem__(self, key: Key) -> None:
        with self._lock:
            if key in self._device:
                del self._device[key]
            else:
                del self._host[key]
            self.unspillable.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._device or key in self._host

    def __iter__(self) -> Iterator[Key]:
        yield from list(self._device)
        yield from list(self._host)

    def __len__(self) -> int:
        return len(self._device) + len(self._host)

    def _discard(self, key: Key) -> None:
        self._device.pop(key, None)
        self.unspillable.pop(key, None)
        if key in self._host:
            del self._host[key]

    def _adopt(self, key: Key, value: Any) -> Optional[_DeviceEntry]:
        """The entry of a device value, or None when Dask cannot serialize it (it then stays
        in the host store as it is: counted nowhere, never spilled, and ``unspillable[key]``
        says why)."""
        prior: Optional[_DeviceEntry] = self._by_object.get(id(value))
        if prior is not None and prior.adopted.value() is value:
            return prior
        start = time.perf_counter()
        try:
            value, header, frames, copied = _own_serialization(value)
        except Exception as e:  # noqa: BLE001 - any failure means "cannot spill"
            self.unspillable[key] = f"{type(value).__name__}: {e}"
            return None
        allocations: List[Tuple[int, int]] = []
        specs: List[Any] = []
        extents: List[Tuple[int, int, int]] = []
        for f in frames:
            if not _is_device_frame(f):
                specs.append(f)
                continue
            ptr, nbytes = _frame_extent(f)
            base, size = _allocation_of(f)
            if not (base <= ptr and ptr + nbytes <= base + size):
                base, size = ptr, nbytes
            extents.append((ptr, nbytes, base))
            for i, (b, _) in enumerate(allocations):
                if b == base:
                    break
            else:
                i = len(allocations)
                allocations.append((base, size))
            specs.append((i, ptr - base, nbytes))
        self._costs.add(
            "copied_on_adopt" if copied else "adopted",
            sum(n for _, n, _ in extents),
            time.perf_counter() - start,
        )
        # The frames view the value's memory: only the value (and what holds the memory it
        # was adopted at) may keep it alive.
        shared = self._shared_entry(header, specs, extents)
        if shared is not None:
            return shared
        keep = _hold(frames)
        del frames
        adopted = _rmm_rs.adopt(value, allocations, self.device_id, keep=keep)
        entry = _DeviceEntry(header, specs, adopted, sum(n for _, n in allocations))
        self._by_object[id(value)] = entry
        return entry

    def _shared_entry(
        self, header: Dict[str, Any], specs: List[Any], extents: List[Any]
    ) -> Optional[_DeviceEntry]:
        """An entry over the data of the spilled value that every device frame lies in (the
        value was rebuilt from it), or None."""
        if not extents:
            return None
        home = self._homes.get(extents[0][2])
        if home is None:
            return None
        now = home.device_allocations()
        device_specs = iter(extents)
        out = []
        for spec in specs:
            if not isinstance(spec, tuple):
                out.append(spec)
                continue
            ptr, nbytes, _ = next(device_specs)
            for i, a in enumerate(now):
                if a is not None and a[0] <= ptr and ptr + nbytes <= a[0] + a[1]:
                    out.append((i, ptr - a[0], nbytes))
                    break
            else:
                return None
        return _DeviceEntry(header, out, home, home.size)

    # Dask's memory manager spills host values through these (a SpillBuffer's).

    @property
    def fast(self) -> Any:
        """Host values in memory (Dask's memory manager evicts from them)."""
        return getattr(self._host, "fast", self._host)

    def evict(self) -> int:
        """Moves the least recently used host value to disk; its bytes, or -1 when the host
        store cannot (a plain dict)."""
        evict = getattr(self._host, "evict", None)
        return evict() if evict is not None else -1

    # Figures and control.

    def tier(self, key: Key) -> str:
        """Where a value is: "device", "host" (pinned host memory), "disk", or "host-store"
        for a host value."""
        entry = self._device.get(key)
        return "host-store" if entry is None else entry.adopted.tier

    def spill(self, key: Key) -> int:
        """Spills one device value now if nothing else holds it; the device bytes freed."""
        return int(self._device[key].adopted.spill())

    def statistics(self) -> Dict[str, Any]:
        """Values and bytes per tier (this store's), the device's spill figures, this
        worker's transfer figures (``rmm_rs.dask.transfer.figures``), and what the store's own
        work cost (``costs``: values adopted as they were, adopted over copies their serializer
        made, and rebuilt from spilled data on use; a count, device bytes and seconds each)."""
        out: Dict[str, Any] = {f"{k}_count": 0 for k in _KINDS}
        out.update({f"{k}_bytes": 0 for k in _KINDS})
        for entry in {id(e.adopted): e for e in list(self._device.values())}.values():
            t = entry.adopted.tier
            out[f"{t}_count"] += 1
            out[f"{t}_bytes"] += entry.nbytes
        out["host_store_count"] = len(self._host)
        out["spill"] = rmm_rs.spill_statistics().get(int(self.device_id), {})
        out["transfer"] = transfer.figures()
        out["costs"] = self._costs.snapshot()
        return out

    def clear(self) -> None:
        """Drops every value (spilled copies and their files go with them)."""
        with self._lock:
            self._device.clear()
            self.unspillable.clear()
            self._host.clear()

    def close(self) -> None:
        """As ``clear``, and closes the host store (and stops bringing values back ahead of
        the worker's tasks)."""
        if self._prefetcher is not None:
            self._prefetcher.close()
        self.clear()
        close = getattr(self._host, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return (
            f"<DeviceStore: {len(self._device)} device values, {len(self._host)} host values, "
            f"device {self.device_id}>"
        )


# Stores alive in this process: their spill files go at exit even if nothing closed them.
_LIVE: List["weakref.ReferenceType[DeviceStore]"] = []


@atexit.register
def _close_all() -> None:
    for ref in _LIVE:
        store = ref()
        if store is None:
            continue
        try:
            store.clear()
        except Exception:  # noqa: BLE001 - at exit, nothing to report to
            pass
