"""RAPIDS RMM's ``rmm.mr`` names over rmm-rs's stacks (rmm_rs.mr): each description builds the
stack it names and reads back as set; what rmm-rs cannot build is refused and changes nothing;
a setting rmm-rs keeps the same on every device is not changed through one; the names and
parameters are RMM's (checked against RAPIDS RMM where it is installed)."""

import importlib.util
import inspect
from typing import List

import pytest

import rmm_rs
from rmm_rs import mr

GIB = 1 << 30


def stack(device=0):
    """The device's running stack, without the layer spilling adds (an out-of-memory
    allocation spills and retries): rmm-rs keeps it, whatever stack is described."""
    s = {d["device"]: d["stack"] for d in rmm_rs.report()["devices"]}[device]
    return s.replace("FailureCallbackResourceAdaptor > ", "")


def test_before_rmm_rs_runs_the_device_has_cuda_memory_and_setting_a_resource_starts_it():
    assert not mr.is_initialized()
    assert mr.get_current_device_resource() == mr.CudaMemoryResource()
    free, total = mr.available_device_memory()
    assert 0 < free <= total
    mr.set_current_device_resource(
        mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=64 << 20)
    )
    assert mr.is_initialized() and rmm_rs.devices() == [0]
    assert stack() == "StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource"
    assert rmm_rs.report()["devices"][0]["reserved_bytes"] == 64 << 20


@pytest.mark.parametrize(
    "description, expected",
    [
        (lambda: mr.CudaMemoryResource(), "StatisticsResourceAdaptor > CudaMemoryResource"),
        (lambda: mr.ManagedMemoryResource(), "StatisticsResourceAdaptor > ManagedMemoryResource"),
        (
            lambda: mr.CudaAsyncMemoryResource(initial_pool_size=64 << 20, release_threshold=GIB),
            "StatisticsResourceAdaptor > CudaAsyncMemoryResource",
        ),
        (
            lambda: mr.PoolMemoryResource(mr.ManagedMemoryResource(), 64 << 20, GIB),
            "StatisticsResourceAdaptor > PoolMemoryResource > ManagedMemoryResource",
        ),
        (
            lambda: mr.StatisticsResourceAdaptor(
                mr.TrackingResourceAdaptor(
                    mr.LimitingResourceAdaptor(
                        mr.PoolMemoryResource(mr.CudaMemoryResource(), 64 << 20), GIB
                    )
                )
            ),
            "StatisticsResourceAdaptor > TrackingResourceAdaptor > LimitingResourceAdaptor > "
            "PoolMemoryResource > CudaMemoryResource",
        ),
    ],
    ids=["cuda", "managed", "async", "pool-over-managed", "adaptors"],
)
def test_each_description_builds_its_stack_and_reads_back_as_set(description, expected):
    rmm_rs.initialize(
        None, {"pool.enabled": True, "pool.initial_size": "32MiB", "spill.enabled": True}
    )
    # Spillable data lives through the change, as through any reinitialize.
    kept = rmm_rs.SpillableBuffer(b"kept" * 1024)
    wanted = description()
    mr.set_current_device_resource(wanted)
    assert stack() == expected
    # Read back from the running configuration: the same stack, the same sizes.
    got = mr.get_current_device_resource()
    assert isinstance(got, mr.StatisticsResourceAdaptor)
    assert mr._settings(got) == mr._settings(wanted)
    assert kept.to_bytes() == b"kept" * 1024
    # A stack changed behind this module's back is read from the stack itself.
    rmm_rs.reinitialize(
        None,
        {
            "pool.enabled": True,
            "pool.managed": False,
            "pool.async": False,
            "tracking.enabled": False,
            "device.0.limits.device_memory_limit": "none",
            "device.0.pool.initial_size": "32MiB",
            "device.0.pool.maximum_size": "none",
        },
    )
    assert mr.get_current_device_resource() == mr.StatisticsResourceAdaptor(
        mr.PoolMemoryResource(mr.CudaMemoryResource(), 32 << 20)
    )


def test_setting_back_what_was_read_changes_nothing(tmp_path):
    # RMM's usual pattern: wrap the current resource and set it back.
    rmm_rs.initialize(
        None,
        {
            "pool.enabled": True,
            "device.0.pool.initial_size": "64MiB",
            "device.0.pool.maximum_size": "1GiB",
            "limits.device_memory_limit": "512MiB",
            "logging.enabled": True,
            "logging.directory": str(tmp_path),
        },
    )
    before = rmm_rs.describe()
    logs = mr.get_log_filenames()
    current = mr.get_current_device_resource()
    mr.set_current_device_resource(mr.StatisticsResourceAdaptor(current))
    assert rmm_rs.describe() == before
    assert mr.get_log_filenames() == logs == {0: str(tmp_path / "rmm_log.dev0.csv")}


def test_an_async_resource_reserves_nothing_unless_asked_after_a_sized_pool():
    mr.set_current_device_resource(
        mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=64 << 20)
    )
    mr.set_current_device_resource(mr.CudaAsyncMemoryResource())
    got = mr.get_current_device_resource().get_upstream()
    assert got == mr.CudaAsyncMemoryResource(), got


def test_reinitialize_hooks_run_before_a_resource_is_set():
    calls: List[str] = []
    rmm_rs.register_reinitialize_hook(calls.append, "hook")
    try:
        rmm_rs.initialize(None, {})
        mr.set_current_device_resource(mr.ManagedMemoryResource())
        assert calls == ["hook"]
    finally:
        rmm_rs.unregister_reinitialize_hook(calls.append)


def test_a_limit_and_tracking_reach_the_configuration():
    mr.set_current_device_resource(
        mr.TrackingResourceAdaptor(
            mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), 64 << 20), capture_stacks=True
        )
    )
    with pytest.raises(rmm_rs.OutOfMemoryError):
        rmm_rs.DeviceBuffer(128 << 20)
    b = rmm_rs.DeviceBuffer(1 << 20)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] >= 1 << 20
    del b


class NotRmmRs(mr.DeviceMemoryResource):
    """A resource of the user's own."""


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (lambda: NotRmmRs(), TypeError, "has no NotRmmRs"),
        (lambda: object(), TypeError, "has no object"),
        (
            lambda: mr.PoolMemoryResource(mr.CudaAsyncMemoryResource()),
            TypeError,
            "CudaMemoryResource or ManagedMemoryResource as its upstream",
        ),
        (lambda: mr.PoolMemoryResource(mr.CudaMemoryResource(), "lots"), rmm_rs.RmmError, "lots"),
        (
            lambda: mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), None),
            TypeError,
            "allocation_limit=None",
        ),
    ],
    ids=["own-class", "not-a-resource", "pool-over-async", "bad-size", "no-limit"],
)
def test_what_rmm_rs_cannot_build_is_refused_and_nothing_changes(bad, error, words):
    rmm_rs.initialize(None, {"pool.enabled": True, "pool.initial_size": "32MiB"})
    before = rmm_rs.describe()
    with pytest.raises(error, match=words):
        mr.set_current_device_resource(bad())
    assert rmm_rs.describe() == before


def test_refused_constructions_say_what_to_do():
    with pytest.raises(TypeError, match="share_with_peers"):
        mr.CudaAsyncMemoryResource(enable_ipc=True)
    with pytest.raises(ValueError, match="RMM_LOG_FILE"):
        mr.LoggingResourceAdaptor(mr.CudaMemoryResource())


def test_logging_through_a_description_uses_rmms_file_names(tmp_path):
    log = tmp_path / "mylog.csv"
    mr.set_current_device_resource(mr.LoggingResourceAdaptor(mr.CudaMemoryResource(), str(log)))
    assert mr.get_log_filenames() == {0: str(tmp_path / "mylog.dev0.csv")}
    mr.set_current_device_resource(mr.CudaMemoryResource())
    assert mr.get_log_filenames() == {0: None}


def test_with_several_devices_only_per_device_settings_change_through_one():
    rmm_rs.initialize(None, {"devices": [0, 1], "pool.enabled": True, "pool.initial_size": "32MiB"})
    with pytest.raises(ValueError, match="pool.enabled") as e:
        mr.set_per_device_resource(1, mr.CudaMemoryResource())
    assert "reinitialize(overrides=" in str(e.value)
    # The same kind of stack with other sizes: device 1 only.
    mr.set_per_device_resource(1, mr.PoolMemoryResource(mr.CudaMemoryResource(), 64 << 20))
    reserved = {d["device"]: d["reserved_bytes"] for d in rmm_rs.report()["devices"]}
    assert reserved == {0: 32 << 20, 1: 64 << 20}
    with pytest.raises(ValueError, match="not one rmm-rs runs on"):
        mr.set_per_device_resource(5, mr.CudaMemoryResource())
    with pytest.raises(ValueError, match="not one rmm-rs runs on"):
        mr.get_per_device_resource(5)
    # Logging's file name is the process's too.
    rmm_rs.reinitialize(overrides={"logging.enabled": True, "logging.file_name": "a.csv"})
    with pytest.raises(ValueError, match="logging.file_name"):
        mr.set_per_device_resource(
            1,
            mr.LoggingResourceAdaptor(
                mr.PoolMemoryResource(mr.CudaMemoryResource(), 64 << 20), "b.csv"
            ),
        )


def test_a_buffer_on_the_current_device_by_default():
    rmm_rs.initialize(None, {"devices": [0, 1]})
    assert rmm_rs._rmm_rs.current_device() == 0  # no CUDA context on the simulated device
    assert rmm_rs.DeviceBuffer(16).device == 0
    assert rmm_rs.DeviceBuffer(16, 1).device == 1
    assert rmm_rs.DeviceBuffer.from_bytes(b"x").device == 0


RMM = importlib.util.find_spec("rmm") is not None

# RMM's parameters of each class this module mirrors (as its docstrings give them).
SIGNATURES = {
    "PoolMemoryResource": ["upstream_mr", "initial_pool_size", "maximum_pool_size"],
    "LoggingResourceAdaptor": ["upstream_mr", "log_file_name"],
    "TrackingResourceAdaptor": ["upstream_mr", "capture_stacks"],
    "LimitingResourceAdaptor": ["upstream_mr", "allocation_limit"],
    "StatisticsResourceAdaptor": ["upstream_mr"],
    "CudaAsyncMemoryResource": ["initial_pool_size", "release_threshold", "enable_ipc"],
}


@pytest.mark.skipif(not RMM, reason="RAPIDS RMM (rmm-cu13) is not installed")
def test_the_names_and_parameters_are_rmms():
    import rmm.mr as rmm_mr

    for name in mr.__all__:
        assert hasattr(rmm_mr, name), f"rmm.mr has no {name}"
    for name, params in SIGNATURES.items():
        ours = list(inspect.signature(getattr(mr, name)).parameters)
        assert ours == params, (name, ours)
        doc = (getattr(rmm_mr, name).__doc__ or "") + (getattr(rmm_mr, name).__init__.__doc__ or "")
        for p in params:
            assert p in doc, f"RMM's {name} does not document {p}"
