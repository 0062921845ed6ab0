"""Safe by default: no device memory made of host memory unless asked for, pinned host memory
taken for need and given back, failures that stop cleanly."""

import os
import subprocess
import sys
import textwrap

import rmm_rs


def run_python(code, env=None):
    """Runs `code` in a fresh interpreter with `env` (this process's environment by default)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def without_backend():
    env = dict(os.environ)
    env.pop("RMM_BACKEND", None)
    return env


def test_asking_for_no_backend_gives_the_gpu_or_an_error_naming_the_simulated_device():
    out = run_python(
        r"""
        import rmm_rs
        try:
            rmm_rs.initialize()
        except rmm_rs.RmmError as e:
            print("REFUSED:", e)
            assert not rmm_rs.is_initialized()
            try:
                rmm_rs.DeviceBuffer(10)
            except rmm_rs.RmmError as e2:
                print("BUFFER REFUSED:", e2)
            else:
                raise SystemExit("a DeviceBuffer without a device")
        else:
            print("STARTED ON:", rmm_rs.report()["backend"])
            print("DESCRIBED:", rmm_rs.describe())
        """,
        env=without_backend(),
    )
    assert out.returncode == 0, out.stderr
    if "STARTED ON:" in out.stdout:
        # A machine with a GPU: that is what asking for nothing gives.
        assert "STARTED ON: cuda" in out.stdout, out.stdout
        assert "simulated" not in out.stdout, out.stdout
        return
    assert "REFUSED: " in out.stdout, out.stdout
    assert "RMM_BACKEND=sim" in out.stdout, out.stdout
    assert "no CUDA driver found" in out.stdout or "sees no GPU" in out.stdout, out.stdout
    assert "BUFFER REFUSED:" in out.stdout, out.stdout


def test_the_simulated_device_says_so_where_it_publishes_a_pointer():
    env = dict(os.environ, RMM_BACKEND="sim")
    out = run_python(
        r"""
        import warnings
        import rmm_rs

        rmm_rs.initialize()
        assert rmm_rs.report()["backend"].startswith("sim"), rmm_rs.report()["backend"]
        assert "simulated device" in rmm_rs.describe(), rmm_rs.describe()
        buf = rmm_rs.DeviceBuffer(10)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            buf.__cuda_array_interface__
            buf.__cuda_array_interface__
            buf.ptr
        said = [w for w in caught if issubclass(w.category, rmm_rs.SimulatedDeviceWarning)]
        assert len(said) == 1, [str(w.message) for w in caught]
        message = str(said[0].message)
        assert "DeviceBuffer.__cuda_array_interface__" in message, message
        assert "host memory" in message and "RMM_BACKEND" in message, message
        print("OK")
        """,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


def test_an_allocator_installed_before_the_runtime_on_the_simulated_device_is_named():
    env = dict(os.environ, RMM_BACKEND="sim")
    out = run_python(
        r"""
        import warnings
        import rmm_rs
        from rmm_rs import _rmm_rs

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _rmm_rs.cupy_functions()     # what rmm_rs.allocators.cupy.install() takes
            assert not caught, "no backend chosen yet"
            rmm_rs.initialize()
        said = [w for w in caught if issubclass(w.category, rmm_rs.SimulatedDeviceWarning)]
        assert len(said) == 1, [str(w.message) for w in caught]
        assert "the CuPy allocator" in str(said[0].message), str(said[0].message)
        print("OK")
        """,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


def test_a_warning_made_an_error_stops_the_start_and_leaves_nothing_running():
    env = dict(os.environ, RMM_BACKEND="sim")
    out = run_python(
        r"""
        import warnings
        import rmm_rs
        from rmm_rs import _rmm_rs

        warnings.simplefilter("error", rmm_rs.SimulatedDeviceWarning)
        _rmm_rs.cupy_functions()
        try:
            rmm_rs.initialize()
        except rmm_rs.SimulatedDeviceWarning:
            pass
        else:
            raise SystemExit("started")
        assert not rmm_rs.is_initialized()
        print("OK")
        """,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


def test_a_reinitialize_that_would_turn_a_device_stores_spilling_off_keeps_it_and_says_so():
    from rmm_rs.dask import DeviceStore

    MIB = 1 << 20
    store = DeviceStore(device_memory_limit="8MiB", config={"spill": {"enabled": True}})
    for i in range(8):
        store[f"x{i}"] = rmm_rs.DeviceBuffer.from_bytes(bytes([i]) * (2 * MIB))
    # The form that keeps the settings in force (the README's Dask snippet) changes only
    # what it names.
    report = rmm_rs.reinitialize(overrides={"pool.enabled": True, "pool.initial_size": "64MiB"})
    assert not any("spilling stays on" in n for n in report["notes"]), report
    assert "PoolMemoryResource" in rmm_rs.describe()
    # The whole configuration replaced by one without spilling (what that snippet did before
    # it used `overrides=`): spilling stays, and the report says why.
    report = rmm_rs.reinitialize({"pool": {"enabled": False}})
    assert any(n.startswith("spilling stays on on device 0") for n in report["notes"]), report
    stats = rmm_rs.spill_statistics()[0]
    assert stats["limit"] == 8 * MIB
    for i in range(8, 12):
        store[f"x{i}"] = rmm_rs.DeviceBuffer.from_bytes(bytes([i]) * (2 * MIB))
    assert rmm_rs.spill_statistics()[0]["tracked_bytes"] <= 8 * MIB
    for i in range(12):
        assert store[f"x{i}"].to_bytes() == bytes([i]) * (2 * MIB)


def test_spilling_on_with_defaults_pins_nothing_before_something_spills():
    # The reproducer: with spilling on, one small buffer used to have the whole spill
    # limit's worth (up to 16 GiB) pinned ahead within seconds, kept after finalize.
    out = run_python(
        r"""
        import time
        import rmm_rs

        def rss():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
            raise SystemExit("no VmRSS")

        before = rss()
        rmm_rs.initialize({"spill": {"enabled": True}})
        k = rmm_rs.SpillableBuffer(b"x" * 21)
        time.sleep(1.0)
        pinned = rmm_rs.spill_statistics()[0]["host_pool_bytes"]
        grew = rss() - before
        assert pinned == 0, pinned
        assert grew < 256 << 20, f"resident memory grew by {grew} bytes"
        rmm_rs.finalize()
        assert k.to_bytes() == b"x" * 21
        # Spilled at finalize: what stays pinned is the chunk that holds it, at most 32 MiB.
        grew = rss() - before
        assert grew < 256 << 20, f"resident memory grew by {grew} bytes after finalize"
        print("OK")
        """,
        env=dict(os.environ, RMM_BACKEND="sim", RMM_SIM_MEMORY="8GiB"),
    )
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout
