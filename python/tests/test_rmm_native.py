"""What an RMM or dask-cuda user reaches for: RAPIDS RMM's reinitialize keywords,
OutOfMemoryError, DeviceBuffer's RMM methods, statistics keyed by device number, and the
subpackages reachable from ``import rmm_rs``."""

import pickle
import subprocess
import sys

import pytest

import rmm_rs

MIB = 1 << 20


# 1. RAPIDS RMM's reinitialize keywords


def test_reinitialize_takes_rapids_rmms_keywords():
    rmm_rs.reinitialize(pool_allocator=True, initial_pool_size=32 * MIB, maximum_pool_size="64MiB")
    stats = rmm_rs.device_statistics()[0]
    assert "PoolMemoryResource" in stats["stack"]
    assert stats["reserved_bytes"] == 32 * MIB
    rmm_rs.reinitialize(pool_allocator=False, devices=0)
    assert "PoolMemoryResource" not in rmm_rs.device_statistics()[0]["stack"]
    assert rmm_rs.devices() == [0]


def test_initialize_takes_rapids_rmms_keywords_and_logging(tmp_path):
    rmm_rs.initialize(
        pool_allocator=True,
        initial_pool_size=16 * MIB,
        logging=True,
        log_file_name=str(tmp_path / "mylog.csv"),
    )
    assert "LoggingResourceAdaptor" in rmm_rs.describe()
    assert str(tmp_path) in rmm_rs.describe()
    assert rmm_rs.device_statistics()[0]["reserved_bytes"] == 16 * MIB
    rmm_rs.DeviceBuffer(MIB).free()
    rmm_rs.finalize()
    # RMM's naming: ".dev<N>" before the extension.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mylog.dev0.csv"]
    assert (tmp_path / "mylog.dev0.csv").read_text().startswith("Thread,Time,Action,Pointer,Size")


@pytest.mark.parametrize("name", ["mylog.csv", "mylog", "archive.tar.gz", ".hidden", "a.b.c"])
def test_log_files_are_named_as_rmm_names_them(tmp_path, name):
    rmm_rs.initialize(logging=True, log_file_name=str(tmp_path / name))
    rmm_rs.finalize()
    (made,) = [p.name for p in tmp_path.iterdir()]
    try:
        import importlib

        rmm_names = importlib.import_module("rmm.pylibrmm.memory_resource._memory_resource")
    except Exception:  # noqa: BLE001 - without RAPIDS RMM: its documented rule
        import os

        stem, ext = os.path.splitext(name)
        assert made == f"{stem}.dev0{ext}"
    else:
        assert made == rmm_names._append_id(name, 0)


def test_managed_memory_keyword_is_pool_managed():
    rmm_rs.initialize(managed_memory=True)
    assert "Managed" in rmm_rs.describe()


@pytest.mark.parametrize("call", [rmm_rs.initialize, rmm_rs.reinitialize])
def test_mixing_the_keyword_form_with_a_config_is_an_error(call):
    with pytest.raises(rmm_rs.RmmError, match="cannot be combined with config or overrides"):
        call({"pool": {"enabled": True}}, pool_allocator=True)
    with pytest.raises(rmm_rs.RmmError, match="cannot be combined"):
        call(overrides={"pool.enabled": True}, initial_pool_size=MIB)
    assert not rmm_rs.is_initialized()


def test_bad_rmm_keywords_name_the_value_and_the_remedy():
    with pytest.raises(rmm_rs.RmmError, match=r"unknown keyword argument pool_size=.*the keywords"):
        rmm_rs.reinitialize(pool_size=MIB)  # type: ignore[call-arg]
    with pytest.raises(rmm_rs.RmmError, match="needs pool_allocator=True"):
        rmm_rs.reinitialize(initial_pool_size=MIB)
    with pytest.raises(rmm_rs.RmmError, match="needs logging=True"):
        rmm_rs.reinitialize(log_file_name="x.txt")
    with pytest.raises(rmm_rs.RmmError, match="pool_allocator='yes': expected True or False"):
        rmm_rs.reinitialize(pool_allocator="yes")  # type: ignore[arg-type]
    with pytest.raises(rmm_rs.RmmError, match=r"taken by keyword here: reinitialize\(pool_allocator=True"):
        rmm_rs.reinitialize(True)  # type: ignore[arg-type]
    with pytest.raises(rmm_rs.RmmError, match="initial_size"):
        rmm_rs.reinitialize(pool_allocator=True, initial_pool_size="lots")
    assert not rmm_rs.is_initialized()


# 2. OutOfMemoryError


def test_out_of_memory_is_a_memory_error_that_pickles():
    assert issubclass(rmm_rs.OutOfMemoryError, rmm_rs.RmmError)
    assert issubclass(rmm_rs.OutOfMemoryError, MemoryError)
    assert rmm_rs.OutOfMemoryError.__module__ == "rmm_rs"
    rmm_rs.initialize({"limits": {"device_memory_limit": "8MiB"}, "spill": {"enabled": True}})
    with pytest.raises(MemoryError) as info:
        rmm_rs.DeviceBuffer(16 * MIB)
    err = info.value
    assert type(err) is rmm_rs.OutOfMemoryError
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is rmm_rs.OutOfMemoryError and str(back) == str(err)
    with pytest.raises(rmm_rs.OutOfMemoryError):
        rmm_rs.DeviceBuffer.from_bytes(bytes(16 * MIB))
    with pytest.raises(rmm_rs.OutOfMemoryError):
        rmm_rs.SpillableBuffer(bytes(16 * MIB))


def test_an_allocation_larger_than_the_device_is_out_of_memory():
    rmm_rs.initialize({})
    with pytest.raises(rmm_rs.OutOfMemoryError, match="out of memory"):
        rmm_rs.DeviceBuffer(1 << 40)


def test_other_failures_stay_plain_rmm_errors():
    with pytest.raises(rmm_rs.RmmError) as info:
        rmm_rs.initialize({"pool": {"enabled": "maybe"}})
    assert not isinstance(info.value, MemoryError)


# 4. statistics keyed by device number


def test_statistics_are_keyed_by_device_number():
    rmm_rs.initialize({"spill": {"enabled": True}})
    assert list(rmm_rs.device_statistics()) == [0]
    assert list(rmm_rs.spill_statistics()) == [0]
    assert rmm_rs.device_statistics()[0]["device"] == 0


# 5. subpackages and describe()


def test_subpackages_are_reachable_without_importing_cupy_torch_or_distributed():
    code = (
        "import sys, rmm_rs\n"
        "assert rmm_rs.allocators.cupy.install and rmm_rs.allocators.torch.install\n"
        "assert 'cupy' not in sys.modules and 'torch' not in sys.modules\n"
        "assert 'distributed' not in sys.modules\n"
        "assert rmm_rs.dask.RMMRsPlugin\n"
        "assert 'distributed' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_describe_shows_the_running_stack():
    assert "PoolMemoryResource" not in rmm_rs.describe()
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "16MiB"}})
    text = rmm_rs.describe()
    # On the simulated device the line says so: "device 0 (simulated device: …): …".
    assert text.startswith("device 0") and "PoolMemoryResource" in text
    assert text.split(": ")[0] in ("device 0", "device 0 (simulated device")
    assert "PoolMemoryResource" not in rmm_rs.describe({})


# 6. type stubs


def test_the_stubs_ship_and_cover_every_export():
    import ast
    import importlib.resources

    from rmm_rs import _rmm_rs

    files = importlib.resources.files("rmm_rs")
    assert files.joinpath("py.typed").is_file()
    tree = ast.parse(files.joinpath("_rmm_rs.pyi").read_text())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            members = set()
            if isinstance(node, ast.ClassDef):
                members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            stubbed[node.name] = members
    exported = [n for n in dir(_rmm_rs) if not n.startswith("_")]
    missing = [n for n in exported if n not in stubbed]
    assert not missing, f"not in _rmm_rs.pyi: {missing}"
    for name in exported:
        obj = getattr(_rmm_rs, name)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            own = [m for m in vars(obj) if not m.startswith("_") or m == "__cuda_array_interface__"]
            absent = [m for m in own if m not in stubbed[name]]
            assert not absent, f"{name} members not in _rmm_rs.pyi: {absent}"


# 7. RAPIDS RMM's environment variables


def test_rapids_rmms_environment_variables_do_not_stop_rmm_rs(tmp_path):
    import os

    env = dict(os.environ, RMM_DEBUG_LOG_FILE=str(tmp_path / "rmm.log"))
    code = "import rmm_rs; rmm_rs.validate_config(); rmm_rs.initialize(); rmm_rs.finalize()"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)
    env = dict(os.environ, RMM_DEBUG_LOG_FILES="x")
    bad = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "unknown setting debug_log_files" in bad.stderr
