"""Fault injection on the simulated device through the Python and Dask layers (issue 37).

In one process, ``rmm_rs._rmm_rs._sim_inject`` fails one operation at a chosen moment: each
DeviceStore step (spilling to the host tier and to disk, spilling under pressure, reading
values back, a reinitialize) runs once to count the device allocations, copies, host pins and
spill-file writes it makes, then once per operation with exactly that one failing. After each
run every value reads back byte for byte, a step that failed raised an ``RmmError`` (an
``OutOfMemoryError``, also a ``MemoryError``, for memory that was not there), and once the
store is cleared and rmm-rs finalized nothing is left on the device or pinned.

Dask worker processes inherit ``RMM_SIM_FAIL_*`` from their environment, and take
``_sim_inject`` through ``client.run``: a fault on a worker receiving a value from another, in
its spilling and in its reinitialize leaves every value intact, and the error reaches the
client. Left out: a fault inside the (de)serialization of a value in transfer (the sender's
copy off the device, the receiver's allocation when nothing can be spilled, its copy onto the
device). Dask never recovers from a failed transfer of a dependency: the task that needed it
waits forever and the two workers' connection is left out of step (dask/distributed#6705,
#7060), whatever rmm-rs does with the error.
"""

import os
import random
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict, List, Optional

import cloudpickle
import pytest
from clusters import local_cluster
from distributed import Client, wait

import rmm_rs
from rmm_rs import _rmm_rs
from rmm_rs.dask import DeviceStore

# Functions of this module run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIM = os.environ.get("RMM_BACKEND", "sim") == "sim"
needs_sim = pytest.mark.skipif(not SIM, reason="fault injection needs the simulated device")

MIB = 1 << 20
N = 6
# Each fault kind and the count it is numbered by.
KINDS = {"allocation": "allocations", "copy": "copies", "pin": "pins", "file_write": "file_writes"}


def data(n, seed):
    return random.Random(seed).randbytes(n)


def inject(kind: str, n: int) -> None:
    """Fails the ``n``-th operation of ``kind`` from now on device 0 (0: none)."""
    _rmm_rs._sim_inject(kind, n)  # type: ignore[arg-type]  # a kind of KINDS


def clear_faults() -> None:
    for kind in KINDS:
        inject(kind, 0)


def run_python(code, **env):
    """Runs ``code`` in a fresh interpreter on the simulated device, with ``env`` added."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RMM_BACKEND": "sim", **env},
    )


# The hook and the variables.


def test_the_hook_refuses_a_process_not_on_the_simulated_device():
    out = run_python(
        """
        import rmm_rs
        from rmm_rs import _rmm_rs
        for call in (lambda: _rmm_rs._sim_inject("copy", 1), lambda: _rmm_rs._sim_counts()):
            try:
                call()
            except rmm_rs.RmmError as e:
                print(e)
            else:
                raise SystemExit("accepted")
        """,
        RMM_BACKEND="cuda",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout
    # Without a GPU the driver is missing; on a GPU fault injection needs the simulated device.
    for line in lines:
        assert "simulated device" in line or "CUDA" in line, line


@needs_sim
def test_the_hook_refuses_an_unknown_kind_and_device():
    with pytest.raises(rmm_rs.RmmError, match='unknown fault kind "crash": expected "allocation"'):
        _rmm_rs._sim_inject("crash", 1)  # type: ignore[arg-type]
    with pytest.raises(rmm_rs.RmmError, match="device 7"):
        _rmm_rs._sim_inject("copy", 1, device=7)


@needs_sim
def test_the_hook_fails_the_nth_operation_from_now():
    rmm_rs.initialize()
    _rmm_rs._sim_inject("allocation", 2)
    first = rmm_rs.DeviceBuffer.from_bytes(b"first")
    with pytest.raises(rmm_rs.OutOfMemoryError, match="out of memory on device 0"):
        rmm_rs.DeviceBuffer(64)
    assert rmm_rs.DeviceBuffer.from_bytes(b"third").to_bytes() == b"third"
    _rmm_rs._sim_inject("copy", 1)
    with pytest.raises(rmm_rs.RmmError, match="simulated fault: copy on device 0"):
        first.to_bytes()
    assert first.to_bytes() == b"first"
    _rmm_rs._sim_inject("allocations_above", MIB)
    with pytest.raises(MemoryError):
        rmm_rs.DeviceBuffer(MIB + 1)
    rmm_rs.DeviceBuffer(MIB)
    _rmm_rs._sim_inject("allocations_above", 0)
    rmm_rs.DeviceBuffer(MIB + 1)


@needs_sim
def test_the_variables_reach_a_process_that_opens_the_simulated_device():
    out = run_python(
        """
        import rmm_rs
        from rmm_rs import _rmm_rs
        rmm_rs.initialize()
        small = rmm_rs.DeviceBuffer(1 << 20)
        try:
            rmm_rs.DeviceBuffer(3 << 20)
        except MemoryError as e:
            assert isinstance(e, rmm_rs.RmmError) and "out of memory" in str(e), e
        else:
            raise SystemExit("a 3 MiB allocation went through")
        copies = _rmm_rs._sim_counts()["copies"]
        b = rmm_rs.DeviceBuffer.from_bytes(b"x" * 64)
        try:
            b.to_bytes()
        except rmm_rs.RmmError as e:
            assert "simulated fault: copy" in str(e), e
        else:
            raise SystemExit(f"copy {copies + 2} went through")
        assert b.to_bytes() == b"x" * 64
        print("ok", copies)
        """,
        RMM_SIM_FAIL_ALLOCATIONS_ABOVE="2MiB",
        # No copy before the two below: initialize copies nothing.
        RMM_SIM_FAIL_COPY="2",
    )
    assert out.returncode == 0 and out.stdout.split() == ["ok", "0"], (out.stdout, out.stderr)


@needs_sim
def test_the_allocation_pin_and_host_memory_variables_reach_the_process():
    out = run_python(
        """
        import rmm_rs
        from rmm_rs import _rmm_rs

        def refused(error, text, **settings):
            try:
                rmm_rs.initialize(settings)
            except error as e:
                assert text in str(e), e
            else:
                raise SystemExit(f"{settings} started")

        # More pinned memory than the simulated host's 64 MiB: refused before pinning.
        refused(rmm_rs.RmmError, "larger than the 64MiB of host memory this process may use",
                spill={"enabled": True, "host_pool_size": "128MiB"})
        # The first pin fails.
        refused(rmm_rs.OutOfMemoryError, "injected failure of this pin",
                spill={"enabled": True, "host_pool_size": "8MiB"})
        rmm_rs.initialize({"spill": {"enabled": True, "host_pool_size": "8MiB"}})
        assert _rmm_rs._sim_counts()["allocations"] == 0
        # The second device allocation fails.
        first = rmm_rs.DeviceBuffer(64)
        try:
            rmm_rs.DeviceBuffer(64)
        except rmm_rs.OutOfMemoryError:
            pass
        else:
            raise SystemExit("the second allocation went through")
        third = rmm_rs.DeviceBuffer(64)
        print("ok")
        """,
        RMM_SIM_HOST_MEMORY="64MiB",
        RMM_SIM_FAIL_PIN="1",
        RMM_SIM_FAIL_ALLOCATION="2",
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.stdout, out.stderr)


@needs_sim
@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("RMM_SIM_FAIL_COPY", "often", "e.g. 3 or 0:3,1:5"),
        ("RMM_SIM_FAIL_ALLOCATION", "5:1", "device 5 is not one of the 2 simulated devices"),
        ("RMM_SIM_FAIL_PIN", "1:1", "no DEVICE: part"),
        ("RMM_SIM_HOST_MEMORY", "lots", "a positive size"),
        ("RMM_SIM_FAIL_ALOCATION", "1", "check its spelling"),
    ],
)
def test_a_bad_variable_fails_initialize_naming_it(name, value, expected):
    out = run_python(
        """
        import rmm_rs
        try:
            rmm_rs.initialize()
        except rmm_rs.RmmError as e:
            print(e)
        else:
            raise SystemExit("started")
        """,
        RMM_SIM_DEVICES="2",
        **{name: value},
    )
    assert out.returncode == 0, out.stderr
    assert name in out.stdout and value in out.stdout and expected in out.stdout, out.stdout


@needs_sim
def test_a_failed_pin_of_host_memory_is_a_memory_error():
    _rmm_rs._sim_inject("pin", 1)
    with pytest.raises(rmm_rs.OutOfMemoryError, match="injected failure of this pin"):
        rmm_rs.initialize({"spill": {"enabled": True, "host_pool_size": "8MiB"}})
    assert not rmm_rs.is_initialized()
    rmm_rs.initialize({"spill": {"enabled": True, "host_pool_size": "8MiB"}})


# A DeviceStore in this process, each operation of a step failing in turn.


class Scene:
    """A DeviceStore (limit 64 MiB) of N values of 1 MiB that nothing else holds, on the
    device; with a ``disk_directory``, a 2 MiB pinned host pool and a disk tier behind it,
    else a host pool pinned as spilling needs it (nothing ahead)."""

    def __init__(self, disk_directory: Optional[str]):
        spill: Dict[str, Any] = {"enabled": True, "pin_ahead": "none"}
        if disk_directory is None:
            spill["host_pool_size"] = "none"
        else:
            spill.update(host_pool_size="2MiB", disk_directory=disk_directory)
        self.disk_directory = disk_directory
        self.store = DeviceStore(device_memory_limit="64MiB", config={"spill": spill})
        self.expected = {}
        for i in range(N):
            self.store[f"x{i}"] = rmm_rs.DeviceBuffer.from_bytes(data(MIB, i))
            self.expected[f"x{i}"] = data(MIB, i)

    def tiers(self) -> List[str]:
        return [self.store.tier(k) for k in self.expected]

    def check(self, what: str) -> None:
        """Every value reads back byte for byte; the store's figures add up."""
        for k, b in self.expected.items():
            v = self.store[k]
            assert v.to_bytes() == b, f"{what}: {k} ({self.store.tier(k)}) lost its data"
            del v
        stats = self.store.statistics()
        counted = sum(stats[f"{t}_count"] for t in ("device", "host", "disk"))
        held = sum(stats[f"{t}_bytes"] for t in ("device", "host", "disk"))
        n = len(self.expected)
        assert (counted, held) == (n, n * MIB), f"{what}: {stats}"


def failure(e: Exception) -> Exception:
    """``e`` without its traceback, whose frames would keep values alive (a store entry that
    failed to come back, and with it the pinned memory of its spilled data)."""
    return e.with_traceback(None)


def spill_each(s: Scene) -> List[Exception]:
    """Spills every value, one by one (past the host pool on to disk, in the disk scene)."""
    errors: List[Exception] = []
    for k in s.expected:
        try:
            s.store.spill(k)
        except rmm_rs.RmmError as e:
            errors.append(failure(e))
    return errors


def under_pressure(s: Scene) -> List[Exception]:
    """Lowers the limit to 2 MiB: four values spill at once."""
    try:
        _rmm_rs.set_device_memory_limit("2MiB")
    except rmm_rs.RmmError as e:
        return [failure(e)]
    return []


def store_over_the_limit(s: Scene) -> List[Exception]:
    """Stores four values more under a limit of 7 MiB: the store spills the oldest on its
    spill thread, as a Dask worker's does when a task's result arrives."""
    _rmm_rs.set_device_memory_limit("7MiB")
    errors: List[Exception] = []
    for i in range(N, N + 4):
        try:
            s.store[f"x{i}"] = rmm_rs.DeviceBuffer.from_bytes(data(MIB, i))
        except rmm_rs.RmmError as e:
            errors.append(failure(e))
            continue
        s.expected[f"x{i}"] = data(MIB, i)
    s.tiers()  # waits for the spill thread
    return errors


def read_back(s: Scene) -> List[Exception]:
    """Reads every value, spilled ones coming back to the device."""
    errors: List[Exception] = []
    for k, b in s.expected.items():
        try:
            assert s.store[k].to_bytes() == b, f"{k} read back other bytes"
        except rmm_rs.RmmError as e:
            errors.append(failure(e))
    return errors


def reinitialize_into_a_pool(s: Scene) -> List[Exception]:
    """Switches to a pool and a larger pinned host pool, keeping the store's values."""
    spill: Dict[str, Any] = {"enabled": True, "host_pool_size": "8MiB", "pin_ahead": "none"}
    if s.disk_directory is not None:
        spill["disk_directory"] = s.disk_directory
    before = rmm_rs.device_statistics()[0]["stack"]
    try:
        rmm_rs.reinitialize({"spill": spill, "pool": {"enabled": True, "initial_size": "32MiB"}})
    except rmm_rs.RmmError as e:
        # The old configuration is in force, and works.
        assert rmm_rs.device_statistics()[0]["stack"] == before, e
        assert rmm_rs.DeviceBuffer.from_bytes(b"works").to_bytes() == b"works"
        return [failure(e)]
    assert "PoolMemoryResource" in rmm_rs.device_statistics()[0]["stack"]
    return []


def spilled(s: Scene) -> None:
    assert spill_each(s) == []


def pressed(s: Scene) -> None:
    assert under_pressure(s) == []


def fail_each_operation(
    tmp_path,
    disk: bool,
    step: Callable[[Scene], List[Exception]],
    prepare: Optional[Callable[[Scene], None]] = None,
) -> Dict[str, List[Exception]]:
    """Runs ``step`` on a fresh scene (``prepare``d without faults) once to count its
    operations, then once per operation of each kind with exactly that one failing (and once
    past the last). Checks every value after each run, and that nothing is left once the store
    is cleared and rmm-rs finalized. Returns the errors the runs raised, by fault kind."""
    rmm_rs.finalize()
    start = _rmm_rs._sim_counts()
    baseline = (start["live_allocations"], start["pinned_host_bytes"])
    runs = iter(range(1 << 30))

    def run(kind: Optional[str], n: int):
        """The step's errors and operations with the ``n``-th of ``kind`` failing."""
        what = f"{step.__name__}, {kind} {n} failing" if kind else step.__name__
        directory = tmp_path / f"spill-{next(runs)}" if disk else None
        scene = Scene(None if directory is None else str(directory))
        if prepare is not None:
            prepare(scene)
        before = _rmm_rs._sim_counts()
        if kind is not None:
            inject(kind, n)
        try:
            errors = step(scene)
        finally:
            clear_faults()
        after = _rmm_rs._sim_counts()
        for e in errors:
            assert str(e), f"{what}: an error without a message"
        scene.check(what)
        scene.store.clear()
        del scene
        rmm_rs.finalize()
        left = _rmm_rs._sim_counts()
        assert (left["live_allocations"], left["pinned_host_bytes"]) == baseline, what
        if directory is not None:
            assert os.listdir(directory) == [], f"{what}: spill files left"
        return errors, {k: after[c] - before[c] for k, c in KINDS.items()}

    errors, ops = run(None, 0)
    assert errors == [], f"{step.__name__} failed without a fault: {errors}"
    by_kind: Dict[str, List[Exception]] = {}
    for kind in KINDS:
        by_kind[kind] = []
        for n in range(1, ops[kind] + 2):
            errors, seen = run(kind, n)
            if n <= ops[kind]:
                assert seen[kind] >= n, f"{step.__name__}, {kind} {n}: the fault never came"
            by_kind[kind] += errors
    print(step.__name__, "disk" if disk else "host", ops, {k: len(v) for k, v in by_kind.items()})
    return by_kind


@needs_sim
@pytest.mark.parametrize("disk", [False, True], ids=["host-tier", "disk-tier"])
def test_a_fault_in_the_middle_of_spilling_each_value_loses_nothing(tmp_path, disk):
    errors = fail_each_operation(tmp_path, disk, spill_each)
    # A failed copy off the device is the spill's error: the value stays where it was. A pool
    # that fails to pin more host memory tries once more; a failed write of host data to disk
    # (to make room on the host) leaves it there, and the value goes straight to disk.
    assert errors["copy"], "no failed copy made a spill fail"


@needs_sim
@pytest.mark.parametrize("disk", [False, True], ids=["host-tier", "disk-tier"])
def test_a_fault_in_the_middle_of_spilling_under_pressure_loses_nothing(tmp_path, disk):
    fail_each_operation(tmp_path, disk, under_pressure)


@needs_sim
@pytest.mark.parametrize("disk", [False, True], ids=["host-tier", "disk-tier"])
def test_a_fault_in_the_spill_threads_work_loses_nothing(tmp_path, disk):
    errors = fail_each_operation(tmp_path, disk, store_over_the_limit)
    # Only making a new value can fail (its allocation or its copy); the spill thread's
    # failures leave the values it could not move on the device.
    assert all(isinstance(e, MemoryError) for e in errors["allocation"]), errors
    assert errors["pin"] == errors["file_write"] == [], errors


@needs_sim
@pytest.mark.parametrize("disk", [False, True], ids=["host-tier", "disk-tier"])
def test_a_fault_while_reading_spilled_values_back_loses_nothing(tmp_path, disk):
    errors = fail_each_operation(tmp_path, disk, read_back, prepare=spilled)
    # No room on the device for a value coming back is a MemoryError.
    assert errors["allocation"], "no failed allocation made a read fail"
    assert all(isinstance(e, MemoryError) for e in errors["allocation"]), errors["allocation"]
    assert errors["copy"], "no failed copy made a read fail"


@needs_sim
@pytest.mark.parametrize("disk", [False, True], ids=["host-tier", "disk-tier"])
def test_a_fault_in_a_reinitialize_loses_nothing_and_keeps_the_old_configuration(tmp_path, disk):
    errors = fail_each_operation(tmp_path, disk, reinitialize_into_a_pool, prepare=pressed)
    assert errors["allocation"] and errors["pin"], errors
    assert all(isinstance(e, MemoryError) for e in errors["allocation"] + errors["pin"]), errors


# Dask workers: the faults from their environment, or injected through client.run.

SIZE = 4 * MIB
ABOVE = 16 * MIB


def make(i):
    return rmm_rs.DeviceBuffer.from_bytes(data(SIZE, i))


def check(x, i):
    return x.to_bytes() == data(SIZE, i)


def allocate(nbytes):
    return rmm_rs.DeviceBuffer(nbytes).size


def tiers(dask_worker):
    return {k: dask_worker.data.tier(k) for k in dask_worker.data}


def spilled_count(dask_worker):
    return dask_worker.data.statistics()["spill"]["spilled_count"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """Two workers whose DeviceStores (limit 8 MiB, an 8 MiB pinned host pool, disk behind it)
    run on simulated devices that fail allocations above 16 MiB and their first spill-file
    write, as their environment says."""
    if not SIM:
        pytest.skip("fault injection needs the simulated device")
    store = DeviceStore.factory(
        device_memory_limit="8MiB",
        config={"spill": {"enabled": True, "host_pool_size": "8MiB"}},
        disk_directory=str(tmp_path_factory.mktemp("faults-spill")),
    )
    env = {"RMM_SIM_FAIL_ALLOCATIONS_ABOVE": str(ABOVE), "RMM_SIM_FAIL_FILE_WRITE": "1"}
    with local_cluster(data=store, env=env) as c, Client(c) as client:
        yield client


@pytest.fixture(scope="module")
def workers(client):
    return sorted(client.scheduler_info()["workers"])


@pytest.fixture(scope="module")
def results(client, workers):
    """Twelve results of 4 MiB, six on each worker: past the device and host tiers, to disk."""
    futures = [
        client.submit(make, i, key=f"v-{i}", workers=[workers[i % 2]], allow_other_workers=False)
        for i in range(12)
    ]
    wait(futures)
    return futures


def check_all(client, workers, results, *more):
    """Every result (and each ``(future, seed)`` of ``more``), read on the worker that does
    not hold it (a transfer each) and on the one that does: every byte as made."""
    values = list(enumerate(results)) + [(i, f) for f, i in more]
    futures = [
        client.submit(check, f, i, workers=[w], allow_other_workers=False, pure=False)
        for i, f in values
        for w in workers
    ]
    # A guard, not a timing: a transfer that failed in Dask's hands would hang here.
    wait(futures, timeout=120)
    assert client.gather(futures) == [True] * len(futures)


@needs_sim
def test_workers_take_the_faults_from_their_environment(client, workers, results):
    # Allocations above 16 MiB fail on every worker; the error reaches the client as a
    # MemoryError.
    for w in workers:
        big = client.submit(allocate, 2 * ABOVE, workers=[w], allow_other_workers=False)
        with pytest.raises(MemoryError, match="out of memory on device 0"):
            big.result()
        assert client.submit(allocate, ABOVE, workers=[w], pure=False).result() == ABOVE
    # Each worker's first spill-file write failed: the data it was moving stayed where it was
    # and moved on another way; every value reads back.
    on = client.run(tiers)
    assert all("disk" in t.values() for t in on.values()), on
    writes = client.run(lambda: _rmm_rs._sim_counts()["file_writes"])
    assert all(n >= 1 for n in writes.values()), writes
    check_all(client, workers, results)


@needs_sim
def test_a_failed_allocation_for_a_value_arriving_from_another_worker_spills_and_retries(
    client, workers, results
):
    a, b = workers
    f = client.submit(make, 100, workers=[a], allow_other_workers=False)
    # b holds a value new on its device, which it can spill for the arriving one.
    g = client.submit(make, 101, workers=[b], allow_other_workers=False)
    wait([f, g])
    client.run(tiers)  # the workers' spilling is done: nothing moves but the transfer
    before = client.run(spilled_count, workers=[b])[b]
    # The arriving value's allocation on b fails; b spills and tries again.
    client.run(_rmm_rs._sim_inject, "allocation", 1, workers=[b])
    try:
        t = client.submit(check, f, 100, workers=[b], allow_other_workers=False, pure=False)
        assert t.result(timeout=60) is True
    finally:
        client.run(clear_faults)
    assert client.run(spilled_count, workers=[b])[b] > before
    check_all(client, workers, results, (f, 100), (g, 101))


@needs_sim
@pytest.mark.parametrize("kind, n", [("copy", 2), ("copy", 3)])
def test_a_fault_on_a_worker_after_a_value_arrived_loses_nothing(
    client, workers, results, kind, n
):
    # b holds two values new on its device, at its limit. The value arrives (its own copy
    # onto b is the first: a failed (de)serialization of a value in transfer is left out, as
    # Dask never recovers from one, dask/distributed#7060); then b's task reads it and b
    # spills one of the others to make room for it, in either order. A failed copy there is
    # the task's error (an RmmError) or the spill's (the data stays where it was).
    a, b = workers
    i = 200 + 10 * n
    f = client.submit(make, i, workers=[a], allow_other_workers=False)
    held = [client.submit(make, i + j, workers=[b], allow_other_workers=False) for j in (1, 2)]
    wait([f] + held)
    # The workers' spilling is done: b's first copy from now on is the arriving value's.
    client.run(tiers)
    before = client.run(_rmm_rs._sim_counts, workers=[b])[b]
    client.run(_rmm_rs._sim_inject, kind, n, workers=[b])
    try:
        t = client.submit(check, f, i, workers=[b], allow_other_workers=False, pure=False)
        try:
            assert t.result(timeout=60) is True
        except rmm_rs.RmmError as e:
            assert "simulated fault: copy on device 0" in str(e), e
        client.run(tiers, workers=[b])  # b's spilling is done
        after = client.run(_rmm_rs._sim_counts, workers=[b])[b]
    finally:
        client.run(clear_faults)
    assert after[KINDS[kind]] - before[KINDS[kind]] >= n, "the fault never came"
    check_all(client, workers, results, (f, i), (held[0], i + 1), (held[1], i + 2))


def reinitialize_into_a_pool_on_a_worker(host_pool_size):
    return rmm_rs.reinitialize(
        {
            "spill": {"enabled": True, "host_pool_size": host_pool_size},
            "pool": {"enabled": True, "initial_size": "16MiB"},
        }
    )


def stack():
    return rmm_rs.device_statistics()[0]["stack"]


@needs_sim
@pytest.mark.parametrize(
    "kind, error, host_pool_size",
    [
        ("allocation", rmm_rs.OutOfMemoryError, "12MiB"),
        ("pin", rmm_rs.OutOfMemoryError, "16MiB"),
        ("copy", rmm_rs.RmmError, "20MiB"),
    ],
)
def test_a_fault_in_a_workers_reinitialize_is_its_error_and_loses_nothing(
    client, workers, results, kind, error, host_pool_size
):
    # The new pool's allocation, the new host pool's pin, the spill before the switch (of a
    # value new on the device: one read back has its copy on the host still): each run asks
    # for a host pool of a new size.
    a, b = workers
    i = 300 + len(kind)
    f = client.submit(make, i, workers=[a], allow_other_workers=False)
    wait(f)
    old = client.run(stack)
    client.run(_rmm_rs._sim_inject, kind, 1, workers=[a])
    try:
        with pytest.raises(error):
            client.run(reinitialize_into_a_pool_on_a_worker, host_pool_size, workers=[a])
    finally:
        client.run(clear_faults)
    # a keeps its old configuration; every value is intact on both workers.
    assert client.run(stack) == old
    check_all(client, workers, results, (f, i))
    # Without the fault it goes through.
    client.run(reinitialize_into_a_pool_on_a_worker, host_pool_size, workers=[a])
    assert "PoolMemoryResource" in client.run(stack, workers=[a])[a]
    check_all(client, workers, results, (f, i))


# Values between workers (rmm_rs.dask.transfer), in one process: what a worker does with a
# value a peer sends or asks for, with one of its copies failing.


def spilled_value(store, i):
    """A 4 MiB value of ``store`` spilled to its host tier, and what a peer would be sent."""
    from rmm_rs.dask.transfer import HostFrames

    store[f"sent-{i}"] = make(i)
    assert store.spill(f"sent-{i}") == SIZE
    entry: Any = store._device[f"sent-{i}"]
    return HostFrames.sent_from(entry.header, entry.frames, entry.adopted)


@needs_sim
def test_a_failed_copy_onto_the_device_of_a_received_value_keeps_it_all_the_same(caplog):
    from rmm_rs.dask.transfer import HostFrames

    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="64MiB")
    sent = spilled_value(store, 40)
    parts = sent.data()
    host_before = rmm_rs.spill_statistics()[0]["host_bytes"]
    # It fits under the limit: copied into pinned memory, then onto the device, which fails.
    inject("copy", 1)
    with caplog.at_level("WARNING", logger="rmm_rs.dask.transfer"):
        store["got"] = HostFrames(sent.header, sent.frames, parts)
    clear_faults()
    assert "kept on the device" in caplog.text
    # Nothing of the failed attempt is left pinned; the value is on the device, intact.
    assert rmm_rs.spill_statistics()[0]["host_bytes"] == host_before
    assert store.tier("got") == "device"
    assert check(store["got"], 40)
    store.close()


@needs_sim
def test_a_failed_device_copy_for_a_peer_sends_host_frames_instead():
    from distributed.protocol import deserialize, serialize

    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="64MiB")
    sent = spilled_value(store, 41)
    # Over UCX a spilled value goes as device copies; the copy fails: host frames go instead.
    inject("copy", 1)
    try:
        header, frames = serialize(sent, serializers=("cuda",), on_error="raise")
    finally:
        clear_faults()
    assert [len(memoryview(f)) for f in frames] == [SIZE]
    assert check(deserialize(header, frames, deserializers=("cuda",)), 41)
    assert store.tier("sent-41") == "host"
    store.close()
