"""RAPIDS RMM's ``rmm.mr`` over rmm-rs's device stacks.

In RMM a memory resource is an object that allocates, and ``set_current_device_resource``
swaps the object a device allocates from. rmm-rs builds each device's stack itself, from its
configuration, and keeps live spillable data across a change of stack. Here the resource
classes (``PoolMemoryResource(CudaMemoryResource(), initial_pool_size=2**30)`` and the
others below) describe a stack; ``set_current_device_resource(mr)`` rebuilds the current
device's stack to match, with a reinitialize (starting rmm-rs on that device when it is not
running), and ``get_current_device_resource()`` describes the running one. What rmm-rs cannot
build (a binning, fixed-size or arena resource, callbacks, a resource of your own) is refused
with a ``TypeError`` that says what to use instead, and nothing changes. These objects do not
allocate: ``rmm_rs.DeviceBuffer`` and the allocator hooks of ``rmm_rs.allocators`` do, from
the current stack.

rmm-rs's allocation mode (plain, pool, managed, ``cudaMallocAsync``), logging and tracking
are the same on every device it runs; changing one of them through a single device, while
rmm-rs runs on several, is refused (``rmm_rs.reinitialize(overrides=...)`` changes them all).
"""

import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from . import _rmm_rs
from .logs import disable_logging, enable_logging, get_log_filenames
from .reinitialize_hooks import reinitialize

_Size = Union[int, str, None]

__all__ = [
    "CudaAsyncMemoryResource",
    "CudaMemoryResource",
    "DeviceMemoryResource",
    "LimitingResourceAdaptor",
    "LoggingResourceAdaptor",
    "ManagedMemoryResource",
    "PoolMemoryResource",
    "StatisticsResourceAdaptor",
    "TrackingResourceAdaptor",
    "available_device_memory",
    "disable_logging",
    "enable_logging",
    "get_current_device_resource",
    "get_log_filenames",
    "get_per_device_resource",
    "is_initialized",
    "set_current_device_resource",
    "set_per_device_resource",
]


class DeviceMemoryResource:
    """A description of a device stack (RMM's base class of resources)."""

    def get_upstream(self) -> Optional["DeviceMemoryResource"]:
        """The resource under this one (an adaptor's or a pool's upstream), or None."""
        return getattr(self, "upstream_mr", None)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self)))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class CudaMemoryResource(DeviceMemoryResource):
    """Plain ``cuMemAlloc`` (``pool.enabled = false``)."""


class ManagedMemoryResource(DeviceMemoryResource):
    """Managed memory, ``cuMemAllocManaged`` (``pool.managed = true``)."""


class CudaAsyncMemoryResource(DeviceMemoryResource):
    """The driver's stream-ordered pool, ``cuMemAllocAsync`` (``pool.async = true``), primed
    with ``initial_pool_size`` and releasing memory above ``release_threshold``."""

    def __init__(
        self,
        initial_pool_size: _Size = None,
        release_threshold: _Size = None,
        enable_ipc: bool = False,
    ):
        if enable_ipc:
            raise TypeError(
                "CudaAsyncMemoryResource(enable_ipc=True): rmm-rs does not export its pools; "
                "between Dask workers of one machine rmm_rs.dask.DeviceStore shares values "
                "through device memory of its own (share_with_peers=True). Leave enable_ipc "
                "out"
            )
        self.initial_pool_size = initial_pool_size
        self.release_threshold = release_threshold


class PoolMemoryResource(DeviceMemoryResource):
    """rmm-rs's pool (``pool.enabled = true``) over ``upstream_mr``, a
    :class:`CudaMemoryResource` or :class:`ManagedMemoryResource`, from
    ``initial_pool_size`` (None: half the free memory, as RMM) up to ``maximum_pool_size``
    (None: the device)."""

    def __init__(
        self,
        upstream_mr: DeviceMemoryResource,
        initial_pool_size: _Size = None,
        maximum_pool_size: _Size = None,
    ):
        self.upstream_mr = upstream_mr
        self.initial_pool_size = initial_pool_size
        self.maximum_pool_size = maximum_pool_size


class StatisticsResourceAdaptor(DeviceMemoryResource):
    """Counts allocations: every rmm-rs stack has one on top already (see
    ``rmm_rs.statistics``)."""

    def __init__(self, upstream_mr: DeviceMemoryResource):
        self.upstream_mr = upstream_mr


class LoggingResourceAdaptor(DeviceMemoryResource):
    """Logs every allocation and free to ``log_file_name`` (else ``RMM_LOG_FILE``), one CSV file
    per device as RMM names them (``logging.enabled``)."""

    def __init__(self, upstream_mr: DeviceMemoryResource, log_file_name: Optional[str] = None):
        name = log_file_name if log_file_name is not None else os.environ.get("RMM_LOG_FILE")
        if not name:
            raise ValueError(
                "LoggingResourceAdaptor: give log_file_name (or set RMM_LOG_FILE), the file "
                "each device's log is named after"
            )
        self.upstream_mr = upstream_mr
        self.log_file_name = os.fspath(name)


class TrackingResourceAdaptor(DeviceMemoryResource):
    """Keeps every live allocation, with its backtrace when ``capture_stacks``
    (``tracking.enabled``, ``tracking.backtraces``)."""

    def __init__(self, upstream_mr: DeviceMemoryResource, capture_stacks: bool = False):
        self.upstream_mr = upstream_mr
        self.capture_stacks = bool(capture_stacks)


class LimitingResourceAdaptor(DeviceMemoryResource):
    """Fails allocations past ``allocation_limit`` bytes (``limits.device_memory_limit``)."""

    def __init__(self, upstream_mr: DeviceMemoryResource, allocation_limit: _Size):
        self.upstream_mr = upstream_mr
        self.allocation_limit = allocation_limit


# The settings a description stands for.

_REFUSED = (
    "rmm-rs builds each device's stack from its configuration and has no {name}: describe "
    "the stack with CudaMemoryResource, ManagedMemoryResource, CudaAsyncMemoryResource, "
    "PoolMemoryResource and the Statistics, Logging, Tracking and Limiting adaptors (or set "
    "rmm.toml's keys through rmm_rs.reinitialize(overrides=...))"
)


def _settings(mr: DeviceMemoryResource) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``mr`` as (global settings, this device's settings); TypeError for what rmm-rs cannot
    build."""
    glob: Dict[str, Any] = {
        "pool.enabled": False,
        "pool.managed": False,
        "pool.async": False,
        "logging.enabled": False,
        "tracking.enabled": False,
    }
    dev: Dict[str, Any] = {"limits.device_memory_limit": "none"}
    node: Any = mr
    seen_logging = False
    while True:
        if not isinstance(node, DeviceMemoryResource):
            raise TypeError(_REFUSED.format(name=f"{type(node).__name__} ({node!r})"))
        if isinstance(node, StatisticsResourceAdaptor):
            pass
        elif isinstance(node, LoggingResourceAdaptor):
            path = Path(node.log_file_name)
            glob["logging.enabled"] = True
            glob["logging.directory"] = str(path.parent)
            glob["logging.file_name"] = path.name
            seen_logging = True
        elif isinstance(node, TrackingResourceAdaptor):
            glob["tracking.enabled"] = True
            glob["tracking.backtraces"] = node.capture_stacks
        elif isinstance(node, LimitingResourceAdaptor):
            if node.allocation_limit is None:
                raise TypeError(
                    "LimitingResourceAdaptor(allocation_limit=None): give the limit in bytes "
                    "(or a size such as \"8GB\")"
                )
            dev["limits.device_memory_limit"] = node.allocation_limit
        elif isinstance(node, PoolMemoryResource):
            up = node.upstream_mr
            if type(up) not in (CudaMemoryResource, ManagedMemoryResource):
                raise TypeError(
                    f"PoolMemoryResource over {type(up).__name__}: rmm-rs's pool takes "
                    "CudaMemoryResource or ManagedMemoryResource as its upstream"
                )
            glob["pool.enabled"] = True
            glob["pool.managed"] = isinstance(up, ManagedMemoryResource)
            dev["pool.initial_size"] = (
                "auto" if node.initial_pool_size is None else node.initial_pool_size
            )
            dev["pool.maximum_size"] = (
                "none" if node.maximum_pool_size is None else node.maximum_pool_size
            )
            break
        elif type(node) is CudaMemoryResource:
            break
        elif type(node) is ManagedMemoryResource:
            glob["pool.managed"] = True
            break
        elif type(node) is CudaAsyncMemoryResource:
            glob["pool.async"] = True
            # "auto" for an async pool: nothing reserved up front, as in RMM.
            dev["pool.initial_size"] = (
                "auto" if node.initial_pool_size is None else node.initial_pool_size
            )
            dev["pool.release_threshold"] = (
                "none" if node.release_threshold is None else node.release_threshold
            )
            break
        else:
            raise TypeError(_REFUSED.format(name=type(node).__name__))
        node = node.upstream_mr
    if not seen_logging:
        glob.pop("logging.directory", None)
    return glob, dev


def _running_settings(device: int) -> Dict[str, Any]:
    """The per-process settings the running stack of ``device`` stands for."""
    return _settings(get_per_device_resource(device))[0]


def _described(config: Dict[str, Any], dev: Dict[str, Any]) -> DeviceMemoryResource:
    """The description of one device of the resolved configuration ``config``."""
    # The upstream as serde writes rmm_config::UpstreamPlan: "Cuda", "Managed", or
    # {"Async": {...}}; the pool: rmm_config::PoolPlan, or None.
    upstream = dev["upstream"]
    pool = dev["pool"]
    node: DeviceMemoryResource
    if isinstance(upstream, dict) and "Async" in upstream:
        a = upstream["Async"]
        node = CudaAsyncMemoryResource(a["initial_size"], a["release_threshold"])
    else:
        node = ManagedMemoryResource() if upstream == "Managed" else CudaMemoryResource()
    if pool is not None:
        node = PoolMemoryResource(node, pool["initial_size"], pool["maximum_size"])
    if dev["memory_limit"] is not None:
        node = LimitingResourceAdaptor(node, dev["memory_limit"])
    if config["tracking"]:
        node = TrackingResourceAdaptor(node, config["backtraces"])
    if dev["log_file"]:
        # The configured name: the device's log file without its `.devN`.
        path = Path(dev["log_file"])
        suffix = f".dev{dev['ordinal']}"
        stem = path.stem[: -len(suffix)] if path.stem.endswith(suffix) else path.stem
        node = LoggingResourceAdaptor(node, str(path.with_name(stem + path.suffix)))
    return StatisticsResourceAdaptor(node)


# The functions.

def is_initialized() -> bool:
    """True while rmm-rs runs (RMM: whether a resource was set up)."""
    return _rmm_rs.is_initialized()


def available_device_memory() -> Tuple[int, int]:
    """``(free, total)`` bytes of the current device."""
    return _rmm_rs.available_device_memory()


def get_per_device_resource(device: int) -> DeviceMemoryResource:
    """A description of ``device``'s running stack, read from the running configuration (its
    sizes, limit, log file and tracking as they are now): setting it back changes nothing.
    Before rmm-rs runs, :class:`CudaMemoryResource`, as in RMM."""
    device = int(device)
    if not _rmm_rs.is_initialized():
        return CudaMemoryResource()
    config = _rmm_rs.resolved_config()
    found = [d for d in config["devices"] if d["ordinal"] == device]
    if not found:
        running = sorted(d["ordinal"] for d in config["devices"])
        raise ValueError(
            f"device {device} is not one rmm-rs runs on (it runs {running}): name one of "
            "them, or start rmm-rs on it (rmm_rs.reinitialize(devices=[...]))"
        )
    return _described(config, found[0])


def get_current_device_resource() -> DeviceMemoryResource:
    """:func:`get_per_device_resource` of the current device."""
    return get_per_device_resource(_rmm_rs.current_device())


def set_per_device_resource(device: int, mr: DeviceMemoryResource) -> None:
    """Rebuilds ``device``'s stack as ``mr`` describes it (a reinitialize, which keeps live
    spillable data and refuses while device buffers are live; or rmm-rs started on that
    device). Nothing changes when it fails."""
    device = int(device)
    glob, dev = _settings(mr)
    settings = dict(glob)
    settings.update({f"device.{device}.{k}": v for k, v in dev.items()})
    if not _rmm_rs.is_initialized():
        _rmm_rs.initialize(None, {**settings, "devices": [device]})
    else:
        running = _rmm_rs.devices()
        if device not in running:
            raise ValueError(
                f"device {device} is not one rmm-rs runs on (it runs {running}): start it "
                "there first (rmm_rs.reinitialize(devices=[...]))"
            )
        if len(running) > 1:
            now = _running_settings(device)
            changed = sorted(k for k in {*now, *glob} if now.get(k) != glob.get(k))
            if changed:
                raise ValueError(
                    f"set_per_device_resource({device}, {mr!r}) changes {', '.join(changed)}, "
                    f"which rmm-rs keeps the same on every device it runs ({running}): change "
                    "them on all with rmm_rs.reinitialize(overrides={...}), or describe a "
                    "stack that keeps them"
                )
        reinitialize(overrides=settings)


def set_current_device_resource(mr: DeviceMemoryResource) -> None:
    """:func:`set_per_device_resource` on the current device."""
    set_per_device_resource(_rmm_rs.current_device(), mr)
