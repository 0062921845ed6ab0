"""Moving a device store's values between Dask workers from the tier they are in.

Dask's worker serves a peer's request (its ``get_data`` handler) by reading every key from its
``data``; a spilled device value read that way would be rebuilt on the device (evicting
something else) only to be copied back to host memory to be sent. While a worker whose data
is a :class:`~rmm_rs.dask.DeviceStore` serves such a request, the store hands a spilled value
out as :class:`HostFrames`: its serialization header and the stretches of its allocations
that its frames cover, read where they are as the message is serialized. Over TCP they travel
as host frames read from pinned memory or disk; over UCX as device copies made from the
pinned tier (in memory the device has free: nothing is evicted for them), which cross NVLink
or CUDA IPC while the value stays spilled. A value on the device travels as it is (device frames over UCX, Dask's own
host copy over TCP); over Dask's in-process transport values are handed over as they are.

On the receiving worker (while its ``gather_dep``, or its ``gather`` for a client's
``replicate``, runs), :class:`HostFrames` are kept by the store as they are deserialized: on
the device when they fit under the limit, else in the pinned host tier (or on disk) without
touching the device. Anywhere else (a client, the scheduler, a worker without a device store)
they are rebuilt into the value they stand for.

Between two rmm-rs workers of one host (the usual multi-GPU machine), a spilled value's
bytes do not travel through the connection at all: the sender stages them in device memory
both processes map (CUDA IPC; a memory file on the simulated device), sends descriptors of a
few dozen bytes over TCP or UCX alike, and the receiver copies them straight into its store
(its pinned host tier or its device) before it answers; the sender's memory goes back with
that answer. A worker learns once per peer whether the peer can map its memory (same host,
same backend, its GPU visible there).
"""

import asyncio
import contextvars
import copy
import logging
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from dask.sizeof import sizeof
from distributed.protocol.serialize import deserialize
from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
from distributed.protocol.serialize import dask_deserialize, dask_serialize

import rmm_rs

from .. import _rmm_rs
from .next_use import NextUse
from .prefetch import Prefetcher

logger = logging.getLogger(__name__)

# True while this worker serves a peer's request for data (its get_data handler).
_SENDING: "contextvars.ContextVar[bool]" = contextvars.ContextVar("rmm_rs_sending", default=False)
# The store values being received go into (while this worker's gather_dep runs).
_RECEIVING: "contextvars.ContextVar[Optional[Any]]" = contextvars.ContextVar(
    "rmm_rs_receiving", default=None
)

# While this worker serves a peer that can map its exportable device memory: the leases of the
# memory staged for the message (given back once the peer has answered).
_EXPORTS: "contextvars.ContextVar[Optional[List[Any]]]" = contextvars.ContextVar(
    "rmm_rs_exports", default=None
)

# While this worker reads a peer's answer to its request for data (see _read_then_copy): the
# copies of values the peer shared through its memory, running on the copy threads, each with
# the placeholder it fills.
class _Copying(List[Tuple["HostFrames", "Future[Tuple[str, Any]]"]]):
    """The copies one read of a peer's message started. Once the read is over (``close``), a
    deserialization still running on Dask's offload thread starts no more."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.closed = False

    def start(self, value: "HostFrames", descriptors: List[bytes], device: int) -> bool:
        """Starts copying ``value``'s data on the copy threads; False once closed."""
        with self._lock:
            if self.closed:
                return False
            self.append((value, _copiers().submit(_copy_exported, descriptors, device)))
            return True

    def close(self) -> None:
        """No copy starts from now on: the ones listed are all there will be."""
        with self._lock:
            self.closed = True


_COPIES: "contextvars.ContextVar[Optional[_Copying]]" = contextvars.ContextVar(
    "rmm_rs_copies", default=None
)
_COPIERS: Optional[ThreadPoolExecutor] = None
_COPIERS_LOCK = threading.Lock()

# Values smaller than this go to a peer through the connection even where it could map this
# worker's memory: for them the staging and the receiver's copies cost more than the bytes.
SHARE_FROM = 1 << 20

# A frame of a value: a host frame as it is, or a device frame as (allocation, offset, bytes).
Frame = Union[Tuple[int, int, int], Any]


def sending() -> bool:
    """True while this worker serves a peer's request for data."""
    return _SENDING.get()


class Tally:
    """Counts, bytes and seconds of named kinds of work, shared by threads: what this
    process's sends and receives cost here, and a device store's own work (see
    ``DeviceStore.statistics``)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = tuple(names)
        self._lock = threading.Lock()
        self._values: Dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            for name in self._names:
                self._values[f"{name}_count"] = 0
                self._values[f"{name}_bytes"] = 0
                self._values[f"{name}_seconds"] = 0.0

    def add(self, name: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._values[f"{name}_count"] += 1
            self._values[f"{name}_bytes"] += nbytes
            self._values[f"{name}_seconds"] += seconds

    def snapshot(self) -> Dict[str, float]:
        with self._lock:
            return dict(self._values)


# What this process's sends from a tier and receives cost: the parts of a transfer rmm-rs
# does (reading spilled data for a message, device copies of it, keeping received data); the
# wire is Dask's.
FIGURES = Tally(
    (
        "sent_host_frames",
        "sent_device_copies",
        "sent_exported",
        "received_host_frames",
        "received_exported",
    )
)


def figures() -> Dict[str, float]:
    """This process's transfer figures: per kind (``sent_host_frames``: spilled values sent
    as host frames, read from their tier; ``sent_device_copies``: spilled values sent as
    device copies over UCX; ``sent_exported``: spilled values staged in exportable device
    memory for a peer on the same host; ``received_host_frames`` and ``received_exported``:
    values received those ways and kept by the store), the count, the bytes and the seconds
    rmm-rs spent on them."""
    return FIGURES.snapshot()


class HostFrames:
    """A device value off the device, on its way between workers: the header of its Dask
    "cuda" serialization and its frames (host frames as they are; device frames as
    ``(part, offset, nbytes)`` into its parts, the stretches of its allocations that its
    frames cover), with its data in one of three forms: ``source``, the sender's spilled
    value, read only as the message is serialized (off the worker's event loop), with
    ``ranges`` saying which ``(allocation, offset, nbytes)`` of it each part is; ``parts``,
    the bytes as they arrived; or ``kept``, the receiving store's value that holds them
    already (made as the message was deserialized, off the event loop too)."""

    __slots__ = ("header", "frames", "parts", "source", "ranges", "kept", "exported")

    def __init__(
        self,
        header: Dict[str, Any],
        frames: Sequence[Frame],
        parts: Optional[Sequence[Any]] = None,
        *,
        source: Optional["_rmm_rs.AdoptedValue"] = None,
        ranges: Optional[Sequence[Tuple[int, int, int]]] = None,
        kept: Optional["_rmm_rs.AdoptedValue"] = None,
    ):
        self.header = header
        self.frames = list(frames)
        self.parts = None if parts is None else list(parts)
        self.source = source
        self.ranges = None if ranges is None else list(ranges)
        self.kept = kept
        # Descriptors of its data staged for a peer of this host already (see share_now).
        self.exported: Optional[List[bytes]] = None

    @classmethod
    def sent_from(
        cls, header: Dict[str, Any], frames: Sequence[Frame], source: "_rmm_rs.AdoptedValue"
    ) -> "HostFrames":
        """What a peer is sent of the spilled value ``source`` whose frames are ``frames``
        (device frames as ``(allocation, offset, nbytes)``): one part per allocation its
        frames lie in, covering just their bytes."""
        extents: Dict[int, Tuple[int, int]] = {}
        for f in frames:
            if isinstance(f, tuple):
                i, offset, n = f
                lo, hi = extents.get(i, (offset, offset + n))
                extents[i] = (min(lo, offset), max(hi, offset + n))
        order = {i: j for j, i in enumerate(sorted(extents))}
        ranges = [(i, lo, hi - lo) for i, (lo, hi) in sorted(extents.items())]
        moved = [
            (order[f[0]], f[1] - extents[f[0]][0], f[2]) if isinstance(f, tuple) else f
            for f in frames
        ]
        return cls(header, moved, source=source, ranges=ranges)

    @property
    def nbytes(self) -> int:
        """Bytes of the value's parts."""
        if self.ranges is not None:
            return sum(n for _, _, n in self.ranges)
        if self.kept is not None:
            return self.kept.size
        return sum(memoryview(p).nbytes for p in self.parts or ())

    def data(self) -> List[Any]:
        """The bytes of the value's parts (read from the sender's tier now, for a value being
        sent)."""
        if self.parts is None and self.source is not None:
            parts = self.source.spilled_bytes(self.ranges)
            if parts is None:
                raise rmm_rs.RmmError(
                    "a spilled value was back in its own memory as it was sent: this is a bug"
                )
            return list(parts)
        if self.parts is None:
            raise rmm_rs.RmmError(
                "this value was received into a device store: read it from the store"
            )
        return self.parts

    def rebuild(self, device: int = 0) -> Any:
        """The value itself, its device frames copied onto ``device`` (into rmm-rs buffers:
        the device's current stack where rmm-rs runs in this process)."""
        parts = self.data()
        frames = [
            _rmm_rs.DeviceBuffer.from_bytes(memoryview(parts[f[0]])[f[1] : f[1] + f[2]], device)
            if isinstance(f, tuple)
            else f
            for f in self.frames
        ]
        # Dask's deserialize takes keys out of a collection's header: the value keeps its own.
        return deserialize(copy.deepcopy(self.header), frames, deserializers=("cuda",))

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        frames = [f if isinstance(f, tuple) else bytes(f) for f in self.frames]
        return (_arrived, (self.header, frames, [bytes(p) for p in self.data()]))

    def __repr__(self) -> str:
        return f"<HostFrames: {self.nbytes} bytes>"


def _arrived(header: Dict[str, Any], frames: Sequence[Frame], parts: Sequence[Any]) -> Any:
    """What a received :class:`HostFrames` becomes: where a device store receives it, the
    store's value holding its data (on the device when it fits under the limit, else in the
    host tier); anywhere else, the value it stands for."""
    store = _RECEIVING.get()
    value = HostFrames(header, frames, parts)
    if store is None:
        return value.rebuild()
    return keep(value, store.device_id)


def keep(value: HostFrames, device: int) -> Any:
    """``value``'s data kept by ``device``'s spill manager (on the device when it fits under
    the limit, else in the host tier), as a :class:`HostFrames` whose ``kept`` holds it; when
    it fits nowhere (a full host tier, no disk tier), the value rebuilt on the device, where
    spilling makes what room it can."""
    if value.kept is not None:
        return value
    start = time.perf_counter()
    try:
        kept = _rmm_rs.receive(value.data(), device)
    except rmm_rs.RmmError as e:
        logger.warning("rmm-rs: a received value kept on the device: %s", e)
        return value.rebuild(device)
    FIGURES.add("received_host_frames", kept.size, time.perf_counter() - start)
    return HostFrames(value.header, value.frames, kept=kept)


def _arrived_exported(
    header: Dict[str, Any], frames: Sequence[Frame], descriptors: Sequence[Any]
) -> Any:
    """What a value sent as descriptors of a peer's exportable memory becomes: copied into the
    receiving store (its host tier, or its device when it fits), or rebuilt where no store
    receives it. The peer reuses the memory once this worker answers, so the copy ends before
    the answer: made here, or, while the worker reads the peer's message through a connection
    of its pool, queued on the copy threads and awaited before that read returns (the event
    loop runs meanwhile)."""
    descriptors = [bytes(d) for d in descriptors]
    store = _RECEIVING.get()
    if store is None:
        parts = _rmm_rs.read_exported(descriptors, 0)
        return HostFrames(header, frames, parts).rebuild()
    pending = _COPIES.get()
    if pending is not None:
        # Read off the event loop: the answer to the peer waits for the copy, the loop not.
        value = HostFrames(header, frames)
        if not pending.start(value, descriptors, store.device_id):
            raise _Unreadable("rmm-rs: the read of this message was given up")
        return value
    value = HostFrames(header, frames)
    _fill(value, _copy_exported(descriptors, store.device_id))
    return value


def _copy_exported(descriptors: List[bytes], device: int) -> Tuple[str, Any]:
    """A value's bytes copied from a peer's shared memory on ``device``: ``("kept", value)``
    kept by the device's spill manager (its host tier, or its device when it fits), or
    ``("parts", bytes)`` where the manager could not keep it (a full host tier and no disk),
    to be put on the device as the store takes it.

    Raises :class:`_Unreadable` when the memory cannot be read here."""
    start = time.perf_counter()
    try:
        try:
            kept = _rmm_rs.receive_exported(descriptors, device)
        except rmm_rs.RmmError as e:  # e.g. a full host tier and no disk: onto the device
            logger.warning("rmm-rs: a received value kept on the device: %s", e)
            return "parts", _rmm_rs.read_exported(descriptors, device)
    except rmm_rs.RmmError as e:
        # The peer's memory cannot be read here after all. The message holds no bytes to fall
        # back on: fail it as a connection error, so that Dask closes the connection (the
        # peer stops waiting for an answer on it) and fetches the value again.
        raise _Unreadable(f"rmm-rs: a peer's shared device memory cannot be read: {e}") from e
    FIGURES.add("received_exported", kept.size, time.perf_counter() - start)
    return "kept", kept


def _fill(value: HostFrames, copied: Tuple[str, Any]) -> None:
    """``value`` given the data ``_copy_exported`` made for it."""
    how, data = copied
    if how == "kept":
        value.kept = data
    else:
        value.parts = list(data)


def _copiers() -> ThreadPoolExecutor:
    """The threads that copy values peers shared into this worker's store."""
    global _COPIERS
    with _COPIERS_LOCK:
        if _COPIERS is None:
            _COPIERS = ThreadPoolExecutor(2, thread_name_prefix="rmm-rs-receive")
        return _COPIERS


def _reading_copies_off_the_loop(comm: Any) -> Any:
    """``comm`` (a connection of the worker's pool) with its ``read`` replaced by one that,
    while the worker receives into its store, has values shared through a peer's memory
    copied on the copy threads and returns once they are copied: the worker answers the peer
    (which then reuses that memory) only after, and its event loop runs meanwhile."""
    if getattr(comm, "_rmm_rs_reads", False):
        return comm
    read = comm.read

    async def read_then_copy(*args: Any, **kwargs: Any) -> Any:
        if _RECEIVING.get() is None:
            return await read(*args, **kwargs)
        pending = _Copying()
        token = _COPIES.set(pending)
        try:
            msg = await read(*args, **kwargs)
        except BaseException as e:
            # No copy may outlive the read: the peer reuses its memory once the connection
            # closes. A message cut short leaves the connection unusable: it is aborted.
            pending.close()
            await _settle(pending)
            if pending and not isinstance(e, OSError):
                _abort(comm)
            raise
        finally:
            _COPIES.reset(token)
        pending.close()
        results = await _settle(pending)
        for (value, _), result in zip(pending, results):
            if isinstance(result, BaseException):
                _abort(comm)
                raise result
            _fill(value, result)
        return msg

    comm.read = read_then_copy
    comm._rmm_rs_reads = True
    return comm


class _Unreadable(OSError):
    """A value sent through shared device memory that this worker cannot read: an OSError,
    which Dask treats as a failed connection (closed, not reused)."""


def sharing() -> bool:
    """True while this worker serves a peer that maps its exportable device memory."""
    return _EXPORTS.get() is not None


def share_now(header: Dict[str, Any], frames: Sequence[Frame], source: Any) -> Optional[HostFrames]:
    """For a peer that maps this worker's exportable memory: the value ``source`` (an
    adopted value in its own memory, whose Dask "cuda" serialization is ``header`` and
    ``frames``) staged there now (a copy on the device, quick), as what the peer is sent;
    None for any other peer, for a value under ``SHARE_FROM`` bytes, or when that memory has
    no room now (send the value then)."""
    leases = _EXPORTS.get()
    if leases is None:
        return None
    x = HostFrames.sent_from(header, frames, source)
    if x.nbytes < SHARE_FROM:
        return None
    start = time.perf_counter()
    try:
        exported = source.export(x.ranges)
    except rmm_rs.RmmError as e:
        logger.debug("rmm-rs: sending a value through the connection: %s", e)
        return None
    if exported is None:
        return None
    x.exported, lease = exported
    leases.append(lease)
    FIGURES.add("sent_exported", x.nbytes, time.perf_counter() - start)
    return x


def _exported(x: HostFrames) -> Optional[Tuple[Dict[str, Any], List[Any]]]:
    """``x``'s message as descriptors of exportable device memory: staged already
    (``share_now``), or now while this worker serves a peer that can map it and the memory
    has room; else None."""
    descriptors = x.exported
    if descriptors is None:
        leases = _EXPORTS.get()
        if leases is None or x.source is None or x.nbytes < SHARE_FROM:
            return None
        start = time.perf_counter()
        try:
            exported = x.source.export(x.ranges)
        except rmm_rs.RmmError as e:
            logger.debug("rmm-rs: sending a spilled value through the connection: %s", e)
            return None
        if exported is None:  # no room in the exportable memory now
            return None
        descriptors, lease = exported
        leases.append(lease)
        FIGURES.add("sent_exported", x.nbytes, time.perf_counter() - start)
    layout = [list(f) if isinstance(f, tuple) else None for f in x.frames]
    host = [f for f in x.frames if not isinstance(f, tuple)]
    header = {"value": x.header, "layout": layout, "parts": len(descriptors), "exported": True}
    return header, [*host, *descriptors]


def _serialize_host_frames(x: HostFrames) -> Tuple[Dict[str, Any], List[Any]]:
    exported = _exported(x)
    if exported is not None:
        return exported
    start = time.perf_counter()
    parts = x.data()
    if x.source is not None:
        FIGURES.add("sent_host_frames", x.nbytes, time.perf_counter() - start)
    layout = [list(f) if isinstance(f, tuple) else None for f in x.frames]
    host = [f for f in x.frames if not isinstance(f, tuple)]
    header = {"value": x.header, "layout": layout, "parts": len(parts)}
    return header, [*host, *parts]


def _deserialize_host_frames(header: Dict[str, Any], frames: List[Any]) -> Any:
    n_host = sum(1 for f in header["layout"] if f is None)
    host, parts = iter(frames[:n_host]), frames[n_host:]
    if len(parts) != header["parts"]:
        raise rmm_rs.RmmError(
            f"a value sent from host memory arrived with {len(parts)} allocation(s) where its "
            f"header says {header['parts']}: the message was cut or garbled in transit"
        )
    # Host frames are small (a value's metadata) and views of the whole message: copied,
    # so that the value keeps nothing else of the message alive.
    value_frames = [bytes(next(host)) if f is None else tuple(f) for f in header["layout"]]
    if header.get("exported"):
        return _arrived_exported(header["value"], value_frames, parts)
    return _arrived(header["value"], value_frames, parts)


def _cuda_serialize_host_frames(x: HostFrames) -> Tuple[Dict[str, Any], List[Any]]:
    """Over a connection that carries device memory (UCX): the value's device frames as
    device copies made straight from its tier (the value stays where it is, and nothing else
    leaves the device for them), so that they move device to device (NVLink, CUDA IPC)
    rather than through the connection's host transport. Host frames where the device has
    no room for the copies."""
    if x.source is None:
        return _serialize_host_frames(x)
    exported = _exported(x)
    if exported is not None:
        return exported
    start = time.perf_counter()
    try:
        copies = x.source.device_copies(x.ranges)
        if copies is None:  # no memory free on the device for them: host frames
            return _serialize_host_frames(x)
        frames = [_device_frame(f, copies) for f in x.frames]
    except rmm_rs.RmmError as e:
        # A failed serialization would fail the whole message, and the peer's gather_dep
        # with it (dask/distributed#6705): host frames instead.
        logger.debug("rmm-rs: sending a spilled value as host frames: %s", e)
        return _serialize_host_frames(x)
    FIGURES.add("sent_device_copies", x.nbytes, time.perf_counter() - start)
    return {"value": x.header, "device": True}, frames


def _device_frame(frame: Frame, copies: List[Any]) -> Any:
    """A frame of a value sent as device copies: a host frame as it is; a device frame as
    its part's copy, or a copy of its range of it."""
    if not isinstance(frame, tuple):
        return frame
    i, offset, n = frame
    part = copies[i]
    if offset == 0 and n == part.size:
        return part
    return _rmm_rs.DeviceBuffer.copy_of_device(part.ptr + offset, n, part.device)


def _cuda_deserialize_host_frames(header: Dict[str, Any], frames: List[Any]) -> Any:
    if header.get("device"):
        # Device frames (received into rmm-rs buffers over UCX): the value itself, which a
        # device store adopts where it landed.
        return deserialize(header["value"], frames, deserializers=("cuda",))
    return _deserialize_host_frames(header, frames)


dask_serialize.register(HostFrames)(_serialize_host_frames)
dask_deserialize.register(HostFrames)(_deserialize_host_frames)
cuda_serialize.register(HostFrames)(_cuda_serialize_host_frames)
cuda_deserialize.register(HostFrames)(_cuda_deserialize_host_frames)


@sizeof.register(HostFrames)
def _sizeof_host_frames(x: HostFrames) -> int:
    return x.nbytes


def attach(worker: Any, store: Any) -> bool:
    """Has ``worker`` (whose ``data`` is ``store``) send spilled values from their tier and
    hand received ones to ``store`` as they are: wraps its ``get_data`` and ``gather``
    handlers and its ``gather_dep``. Idempotent; a second store replaces the first. Returns
    True when it attached now."""
    if getattr(worker, "_rmm_rs_store", None) is store:
        return False
    originals = getattr(worker, "_rmm_rs_originals", None)
    if originals is None:
        originals = (
            worker.handlers.get("get_data"),
            worker.handlers.get("gather"),
            getattr(worker, "gather_dep", None),
        )
    serve, gather, gather_dep = originals
    if serve is None or gather_dep is None:
        logger.warning(
            "rmm-rs: this %s has no get_data handler or gather_dep: spilled values are "
            "brought back to the device to be sent (upgrade distributed)",
            type(worker).__name__,
        )
        return False

    async def get_data(comm: Any, **kwargs: Any) -> Any:
        # An in-process comm hands the objects over as they are: nothing to read for it.
        in_process = _carries_objects(comm)
        token = _SENDING.set(not in_process)
        who = kwargs.get("who")
        leases: Optional[List[Any]] = None
        if (
            not in_process
            and who
            and getattr(store, "share_with_peers", False)
            and await _peer_maps_exports(worker, store, who)
        ):
            leases = []
        exports = _EXPORTS.set(leases)
        try:
            # Returns once the peer has answered: it has copied what was exported for it.
            return await serve(comm, **kwargs)
        finally:
            _EXPORTS.reset(exports)
            _SENDING.reset(token)
            for lease in leases or ():
                lease.release()

    async def receiving(call: Any, *args: Any, **kwargs: Any) -> Any:
        token = _RECEIVING.set(store)
        try:
            return await call(*args, **kwargs)
        finally:
            _RECEIVING.reset(token)

    async def gather_dep_into_store(*args: Any, **kwargs: Any) -> Any:
        # The worker's comms are up by now: over UCX, device frames land in rmm-rs.
        try:
            receive_device_frames_into_rmm_rs(store.device_id)
        except Exception as e:  # noqa: BLE001 - an unknown distributed-ucxx: its own buffers
            logger.warning("rmm-rs: UCX receives stay in distributed-ucxx's buffers: %s", e)
        return await receiving(gather_dep, *args, **kwargs)

    worker.handlers["get_data"] = get_data
    device = int(store.device_id)

    def identity(probe: Optional[bytes] = None) -> Dict[str, Any]:
        return _identity(probe, device)

    worker.handlers[_IDENTITY_OP] = identity
    if gather is not None:  # a client's replicate or rebalance

        async def gather_into_store(*args: Any, **kwargs: Any) -> Any:
            return await receiving(gather, *args, **kwargs)

        worker.handlers["gather"] = gather_into_store
    worker.gather_dep = gather_dep_into_store
    _batch_transfers(worker, store)
    _copy_received_off_the_loop(worker)
    _forget_peers_that_leave(worker)
    _install_prefetcher(worker, store)
    _install_next_use(worker, store)
    worker._rmm_rs_originals = originals
    worker._rmm_rs_store = store
    metrics = getattr(worker, "metrics", None)
    if isinstance(metrics, dict):
        metrics["rmm-rs-transfer"] = lambda w: _worker_metrics(store)
    return True


# Dask's default bound on the bytes of the values one transfer message asks a peer for.
_DASK_MESSAGE_BYTES = 50_000_000
# The bound a worker sharing memory with its peers asks for instead: those values cross as
# descriptors, their bytes copied peer to peer, so each message costs a round trip and not
# its bytes; one message then takes up to this many bytes of the values a peer has ready.
# A quarter of the sender's export arena (4 GiB): three peers' messages at once fit there; a
# value past a full arena goes as device copies or host frames, several times slower.
SHARED_MESSAGE_BYTES = 1_000_000_000


def _batch_transfers(worker: Any, store: Any) -> None:
    """Lets ``worker`` ask a peer for many values per message
    (``distributed.worker.transfer.message-bytes-limit`` raised to
    :data:`SHARED_MESSAGE_BYTES`) when ``store`` shares values with peers of its host, unless
    that setting was changed from Dask's default. Dask asks one peer for one message at a
    time, so with one value per message a worker gets one value per round trip from each
    peer."""
    import dask
    from dask.utils import parse_bytes

    state = getattr(worker, "state", None)
    if state is None or not getattr(store, "share_with_peers", False):
        return
    configured = dask.config.get("distributed.worker.transfer.message-bytes-limit", None)
    try:
        default = configured is None or parse_bytes(configured) == _DASK_MESSAGE_BYTES
    except (TypeError, ValueError):
        default = False
    if default and getattr(state, "transfer_message_bytes_limit", None) is not None:
        state.transfer_message_bytes_limit = max(
            state.transfer_message_bytes_limit, SHARED_MESSAGE_BYTES
        )


async def _settle(pending: _Copying) -> List[Any]:
    """Every copy of ``pending`` ended (each one's result or exception, in order). A
    cancellation meanwhile is raised once they have: a copy cannot be stopped, and none may
    read a peer's memory after the read that started it is over."""
    if not pending:
        return []
    waiting = asyncio.gather(
        *(asyncio.wrap_future(f) for _, f in pending), return_exceptions=True
    )
    cancelled: Optional[BaseException] = None
    while not waiting.done():
        try:
            await asyncio.shield(waiting)
        except asyncio.CancelledError as e:
            cancelled = e
    if cancelled is not None:
        raise cancelled
    return list(waiting.result())


def _abort(comm: Any) -> None:
    """Closes ``comm`` at once: the peer stops waiting for an answer on it, and the worker's
    pool does not reuse it."""
    abort = getattr(comm, "abort", None)
    if abort is not None:
        try:
            abort()
        except Exception as e:  # noqa: BLE001 - it is going away either way
            logger.debug("rmm-rs: aborting a connection: %s", e)


# Seconds after a peer leaves the cluster at which the worker unmaps the memory of peers that
# are gone (the process of one that has just left may still be shutting down).
_FORGET_AFTER_S = (5.0, 60.0)


def _forget_gone_peers() -> None:
    """Unmaps the exported memory of peer processes that are gone."""
    try:
        n = _rmm_rs.forget_gone_peers()
    except Exception as e:  # noqa: BLE001 - kept mapped until the next peer's is mapped
        logger.debug("rmm-rs: unmapping gone peers' memory: %s", e)
        return
    if n:
        logger.debug("rmm-rs: unmapped the memory of %d gone peer arena(s)", n)


def _forget_peers_that_leave(worker: Any) -> None:
    """Has ``worker`` unmap the memory of peers that leave the cluster (its ``remove-worker``
    handler wrapped): else a scaled-down cluster's gone workers keep their arenas mapped here
    until another peer's is mapped. Once per worker."""
    handlers = getattr(worker, "stream_handlers", None)
    if not isinstance(handlers, dict):
        return
    remove = handlers.get("remove-worker")
    if remove is None or getattr(remove, "_rmm_rs", False):
        return

    def remove_worker(*args: Any, **kwargs: Any) -> Any:
        out = remove(*args, **kwargs)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return out
        for delay in _FORGET_AFTER_S:
            loop.call_later(delay, _forget_gone_peers)
        return out

    remove_worker._rmm_rs = True  # type: ignore[attr-defined]
    handlers["remove-worker"] = remove_worker


def _copy_received_off_the_loop(worker: Any) -> None:
    """Has the connections ``worker`` opens to fetch data copy what peers share through their
    memory off its event loop (``_reading_copies_off_the_loop``). Once per worker."""
    pool: Any = getattr(worker, "rpc", None)
    connect = getattr(pool, "connect", None)
    if connect is None or getattr(connect, "_rmm_rs", False):
        return

    async def connect_copying_off_the_loop(*args: Any, **kwargs: Any) -> Any:
        return _reading_copies_off_the_loop(await connect(*args, **kwargs))

    connect_copying_off_the_loop._rmm_rs = True  # type: ignore[attr-defined]
    pool.connect = connect_copying_off_the_loop


def _install_prefetcher(worker: Any, store: Any) -> None:
    """Has ``store`` bring the spilled inputs of ``worker``'s next tasks back to the device
    ahead of them (``rmm_rs.dask.prefetch``), replacing an earlier store's prefetcher."""
    plugins = getattr(worker, "plugins", None)
    if not isinstance(plugins, dict):
        return
    old = plugins.pop(Prefetcher.name, None)
    if old is not None:
        old.close()
    depth = int(getattr(store, "prefetch", 0))
    if depth > 0:
        prefetcher = Prefetcher(store, depth)
        prefetcher.setup(worker)
        plugins[Prefetcher.name] = prefetcher
        store._prefetcher = prefetcher


def _install_next_use(worker: Any, store: Any) -> None:
    """Has ``store`` spill the values ``worker``'s tasks read furthest ahead first
    (``rmm_rs.dask.next_use``), replacing an earlier store's."""
    plugins = getattr(worker, "plugins", None)
    if isinstance(plugins, dict):
        plugin = NextUse(store)
        plugin.setup(worker)
        plugins[NextUse.name] = plugin


# The handler a peer calls to learn whether this worker can map its exportable memory.
_IDENTITY_OP = "rmm_rs_ipc_identity"
# The bytes a worker stages for that check, which the peer reads back through its mapping.
_PROBE = bytes(range(256))
# How long a "cannot map" answer is kept before the peer is asked again (a busy peer may not
# have answered in time).
_RETRY_AFTER_S = 60.0


def _identity(probe: Optional[bytes] = None, device: int = 0) -> Dict[str, Any]:
    """This worker's host, PID namespace, backend and visible devices; with ``probe`` (a
    peer's descriptor of staged bytes), the bytes this worker read through it on ``device``
    (see ``_peer_maps_exports``)."""
    try:
        out = dict(_rmm_rs.ipc_identity())
    except Exception as e:  # noqa: BLE001 - no runtime here: it maps nothing
        return {"error": f"{type(e).__name__}: {e}"}
    if probe is not None:
        try:
            out["probe"] = _rmm_rs.read_exported([bytes(probe)], device)[0]
        except Exception as e:  # noqa: BLE001 - the answer says it cannot
            out["probe_error"] = f"{type(e).__name__}: {e}"
    return out


async def _peer_maps_exports(worker: Any, store: Any, who: str) -> bool:
    """Whether the worker at ``who`` can map this worker's exportable device memory: an
    rmm-rs worker (it answers the identity call) on the same host and in the same PID
    namespace, with the same backend, that sees this worker's GPU, and that read back the
    bytes this worker staged for it. A yes is kept for the peer; a no (or no answer within
    5 s) for a minute, then the peer is asked again."""
    known: Dict[str, Tuple[bool, float]] = worker.__dict__.setdefault(
        "_rmm_rs_peers_map_exports", {}
    )
    now = time.monotonic()
    if who in known:
        ok, since = known[who]
        if ok or now - since < _RETRY_AFTER_S:
            return ok
    ok = False
    lease = None
    try:
        mine = _identity()
        device = int(store.device_id)
        staged = _rmm_rs.export_bytes(_PROBE, device)
        if staged is not None and "error" not in mine and mine.get("host"):
            descriptor, lease = staged
            call = getattr(worker.rpc(who), _IDENTITY_OP)(probe=descriptor)
            theirs = await asyncio.wait_for(call, 5)
            ok = (
                theirs.get("host") == mine["host"]
                and theirs.get("pid_namespace") == mine.get("pid_namespace")
                and theirs.get("backend") == mine.get("backend")
                and mine["devices"][device] in theirs.get("devices", ())
                and theirs.get("probe") == _PROBE
            )
    except Exception as e:  # noqa: BLE001 - an older or foreign peer: bytes it is
        logger.debug("rmm-rs: %s cannot map this worker's memory: %s", who, e)
    finally:
        if lease is not None:
            lease.release()
    known[who] = (ok, now)
    return ok


def _carries_objects(comm: Any) -> bool:
    """True for Dask's in-process comm, which passes objects without serializing them."""
    try:
        from distributed.comm.inproc import InProc
    except ImportError:
        return False
    return isinstance(comm, InProc)


def receive_device_frames_into_rmm_rs(device: int) -> bool:
    """Has distributed-ucxx (``protocol="ucx"``) receive device frames into rmm-rs buffers
    on ``device`` (it uses RAPIDS RMM's ``DeviceBuffer``, outside rmm-rs's stack and limit,
    or fails without RMM): a value received over UCX is then adopted by the store where it
    landed, without a copy. True when distributed-ucxx is loaded in this process."""
    comm: Any = sys.modules.get("distributed_ucxx.ucxx")
    if comm is None:
        return False
    if getattr(comm.device_array, "_rmm_rs_device", None) == device:
        return True

    def device_array(n: int) -> Any:
        return _rmm_rs.DeviceBuffer(n, device)

    device_array._rmm_rs_device = device  # type: ignore[attr-defined]

    if getattr(comm, "ucxx", None) is not None:  # initialized: its allocator is chosen
        comm.device_array = device_array
        return True
    # Not yet: it chooses its allocator as it initializes; ours replaces it right after.
    init_once = comm.init_once
    if getattr(init_once, "_rmm_rs", False):
        return True

    def init_then_use_rmm_rs() -> None:
        init_once()
        comm.device_array = device_array

    init_then_use_rmm_rs._rmm_rs = True  # type: ignore[attr-defined]
    comm.init_once = init_then_use_rmm_rs
    return True


def attach_when_started(store: Any) -> None:
    """Attaches ``store`` to the Dask worker whose data it is, once that worker is made: the
    store is built inside ``Worker.__init__``, and the worker's own event loop runs the
    attachment right after it (before the worker serves or gathers anything). Without a
    running loop (a store made outside a worker) nothing happens."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    loop.call_soon(attach_to_its_worker, store)


def attach_to_its_worker(store: Any) -> bool:
    """Attaches ``store`` to the Dask worker of this process whose ``data`` it is, if any."""
    from distributed import Worker

    for worker in list(Worker._instances):
        if getattr(worker, "data", None) is store:
            return attach(worker, store)
    return False


def _worker_metrics(store: Any) -> Dict[str, float]:
    spill = rmm_rs.spill_statistics(wait=False).get(int(store.device_id), {})
    keys = (
        "unspilled_to_send_bytes",
        "received_on_device_bytes",
        "received_off_device_bytes",
        "spilled_bytes",
        "spilled_without_copy_bytes",
        "unspilled_bytes",
        "host_bytes",
        "disk_bytes",
    )
    out: Dict[str, float] = {k: int(spill.get(k, 0)) for k in keys}
    out["exported_held_bytes"] = _rmm_rs.exported_bytes(int(store.device_id))
    out["export_arena_bytes"] = _rmm_rs.export_arena_bytes(int(store.device_id))
    out.update(FIGURES.snapshot())
    return out
