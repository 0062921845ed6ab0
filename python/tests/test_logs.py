"""RAPIDS RMM's allocation-log functions (``rmm_rs.enable_logging``, ``disable_logging``,
``get_log_filenames``): one CSV file per device named as RMM names it, logging turned on and
off on the running configuration, ``RMM_LOG_FILE`` as the default name, and a clear error
without a name."""

import pytest

import rmm_rs

MIB = 1 << 20


def test_logging_goes_on_and_off_on_the_running_configuration(tmp_path):
    rmm_rs.initialize(None, {"pool": {"enabled": True, "initial_size": "16MiB"}})
    assert rmm_rs.get_log_filenames() == {0: None}
    rmm_rs.enable_logging(str(tmp_path / "mylog.csv"))
    assert rmm_rs.get_log_filenames() == {0: str(tmp_path / "mylog.dev0.csv")}
    assert "PoolMemoryResource" in rmm_rs.describe(), "the running configuration is kept"
    rmm_rs.DeviceBuffer(MIB).free()
    rmm_rs.disable_logging()
    assert rmm_rs.get_log_filenames() == {0: None}
    log = (tmp_path / "mylog.dev0.csv").read_text().splitlines()
    assert log[0].startswith("Thread,Time,Action,Pointer,Size")
    assert any(",allocate," in line and f",{MIB}," in line for line in log[1:]), log
    rmm_rs.disable_logging()  # not logging: nothing happens
    rmm_rs.finalize()
    assert rmm_rs.get_log_filenames() == {}


def test_logging_is_refused_while_device_buffers_are_live(tmp_path):
    rmm_rs.initialize()
    buf = rmm_rs.DeviceBuffer(MIB)
    with pytest.raises(rmm_rs.RmmError, match="live"):
        rmm_rs.enable_logging(str(tmp_path / "mylog.csv"))
    assert rmm_rs.get_log_filenames() == {0: None}, "the old stacks stay"
    buf.free()
    rmm_rs.finalize()


def test_the_name_comes_from_rmm_log_file_or_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("RMM_LOG_FILE", raising=False)
    with pytest.raises(ValueError, match="give log_file_name .or set RMM_LOG_FILE"):
        rmm_rs.enable_logging()
    monkeypatch.setenv("RMM_LOG_FILE", str(tmp_path / "events.log"))
    rmm_rs.enable_logging()  # starts rmm-rs with logging
    assert rmm_rs.get_log_filenames() == {0: str(tmp_path / "events.dev0.log")}
    rmm_rs.finalize()
