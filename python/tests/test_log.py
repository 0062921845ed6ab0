"""RMM_LOG: rmm-rs's own log on standard error in a Python process (a Dask worker's log)."""

import os
import subprocess
import sys

SPILL_TWO = """
import rmm_rs
rmm_rs.initialize({"spill": {"enabled": True, "device_memory_limit": "4MiB"}})
values = [rmm_rs.SpillableBuffer(bytes([i]) * (3 << 20)) for i in range(3)]
for i, v in enumerate(values):
    v.unspill()
    assert v.to_bytes() == bytes([i]) * (3 << 20)
print("ok")
"""


def run(log):
    env = dict(os.environ)
    env.pop("RMM_LOG", None)
    if log is not None:
        env["RMM_LOG"] = log
    out = subprocess.run(
        [sys.executable, "-c", SPILL_TWO], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    return out.stderr


def test_rmm_log_shows_each_spill_move_on_standard_error():
    err = run("rmm::spill=debug")
    moves = [line for line in err.splitlines() if "buffer moved" in line]
    # 9 MiB made under a 4 MiB limit, then each brought back: spills and unspills, each logged.
    assert any('from="device" to="host"' in line for line in moves), err
    assert any('from="host" to="device"' in line for line in moves), err


def test_without_rmm_log_nothing_is_logged():
    assert "buffer moved" not in run(None)


def test_a_bad_rmm_log_filter_says_so_and_logs_warnings_only():
    err = run("rmm::spill=loud")
    assert 'RMM_LOG="rmm::spill=loud" is not a log filter' in err
    assert "buffer moved" not in err
