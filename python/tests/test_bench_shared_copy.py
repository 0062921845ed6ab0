"""python/bench/shared_copy.py on the simulated device, small: two processes, every way the
receiver takes a value, each value checked by the benchmark itself (it fails when one
differs)."""

import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "shared_copy.py")


def test_the_same_host_benchmark_moves_every_value_intact_each_way(tmp_path):
    env = dict(os.environ)
    env.setdefault("RMM_BACKEND", "sim")
    out = subprocess.run(
        [sys.executable, "-W", "ignore", BENCH, "--block", "64KiB", "--blocks", "3",
         "--rounds", "1", "--ways", "host tier,device,bytes"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "GB/s" in line]
    assert [line.split(":")[0].strip() for line in lines] == ["host tier", "device", "bytes"]
    assert "(landed: host)" in lines[0] and "(landed: device)" in lines[1], out.stdout


def test_an_unknown_way_is_refused_with_the_ones_there_are(tmp_path):
    out = subprocess.run(
        [sys.executable, BENCH, "--ways", "gpu"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    )
    assert out.returncode == 2 and "use host tier, device and/or bytes" in out.stderr
