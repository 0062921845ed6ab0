"""The benchmark scripts' reading of dask-cuda's benchmarks (python/bench/dask_cuda_runs.py)
and the suite's sizes (python/bench/dask_cuda_suite.py): no GPU, no dask-cuda.

The samples are what dask-cuda 26.10's own code writes: ``local_cudf_merge``'s
``pretty_print_results`` (which ends in ``utils.print_throughput_bandwidth``) and its
``create_tidy_results`` saved by ``utils.save_benchmark_data``, run on made-up results of three
runs (7.271 s, 0.456 s and 1234.567 s) on two workers."""

import importlib.util
import json
import os
import sys
import textwrap

import pytest

pytest.importorskip("dask", reason="the benchmark scripts need dask (dask.utils)")

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench")
sys.path.insert(0, os.path.abspath(BENCH))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, name + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runs = _load("dask_cuda_runs")
suite = _load("dask_cuda_suite")

PRINTED = """\
RMM already setup on external cluster, skipping RMM configuration arguments
Merge benchmark
--------------------------------------------------------------------------------
Backend                   | dask
Merge type                | gpu
Rows-per-chunk            | 11100000
Base-chunks               | 34
Other-chunks              | 34
Broadcast                 | default
Protocol                  | tcp
Device(s)                 | 0,1
RMM Pool                  | True
Frac-match                | 0.3
Worker thread(s)          | 1
Data processed            | 11.25 GiB
Number of workers         | 2
================================================================================
Wall clock                | Throughput
--------------------------------------------------------------------------------
7.27 s                    | 1.55 GiB/s
456.00 ms                 | 24.67 GiB/s
20m 34s                   | 9.33 MiB/s
================================================================================
Throughput                | 27.81 MiB/s +/- 22.50 MiB/s
Bandwidth                 | 0.93 GiB/s +/- 0.0 B/s
Wall clock                | 414.10 s +/- 580.17 s
================================================================================
(w1,w2)                   | 25% 50% 75% (total nbytes)
--------------------------------------------------------------------------------
(0,1)                     | 858.31 MiB/s 0.93 GiB/s 1.02 GiB/s (5.59 GiB)
================================================================================
Worker index              | Worker address
--------------------------------------------------------------------------------
0                         | tcp://127.0.0.1:40001
1                         | tcp://127.0.0.1:40002
================================================================================
"""

# The start of the saved BASENAME.json (pandas' to_json of the results table), as written.
SAVED = (
    '{"wallclock":{"0":7.271,"1":0.456,"2":1234.567},"data_processed":{"0":12076800000,'
    '"1":12076800000,"2":12076800000},"dataframe_type":{"0":"cudf","1":"cudf","2":"cudf"},'
    '"num_workers":{"0":2,"1":2,"2":2}}'
)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1.23 s", 1.23),
        ("450.00 ms", 0.45),
        ("123.45 us", 123.45e-6),
        ("20m 34s", 1234.0),
        ("3hr 25m", 3 * 3600 + 25 * 60.0),
        ("14d 6hr", 14 * 86400 + 6 * 3600.0),
        ("tcp://127.0.0.1:40001", None),
        ("(0,1)", None),
    ],
)
def test_times_as_dask_prints_them(text, seconds):
    got = runs.parse_time(text)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


def test_printed_wall_clocks_and_mean():
    durations, mean = runs.parse_wallclocks(PRINTED)
    assert durations == pytest.approx([7.27, 0.456, 1234.0])
    assert mean == pytest.approx(414.10)


def test_saved_wall_clocks(tmp_path):
    base = str(tmp_path / "out")
    assert runs.saved_wallclocks(base) is None
    (tmp_path / "out.json").write_text(SAVED)
    assert runs.saved_wallclocks(base) == [7.271, 0.456, 1234.567]


def _fake(tmp_path, body):
    """A command line shaped as benchmark_command makes it, running `body` instead of a
    benchmark (argv: the fake module's name, --scheduler-file ..., --output-basename B)."""
    script = tmp_path / "fake.py"
    script.write_text(textwrap.dedent(body))
    base = str(tmp_path / "out")
    cmd = [sys.executable, str(script), "dask_cuda.benchmarks.fake", "--scheduler-file", "s",
           "--output-basename", base]
    return cmd, base


def test_a_run_prefers_the_saved_json(tmp_path):
    cmd, base = _fake(tmp_path, f"""
        import sys
        print({PRINTED!r})
        open(sys.argv[-1] + ".json", "w").write({SAVED!r})
    """)
    r = runs.run_benchmark(cmd, base, 60)
    assert r["error"] is None and r["returncode"] == 0
    assert r["wallclocks"] == [7.271, 0.456, 1234.567]
    assert r["wallclocks_from"] == "output-basename json"
    assert r["median_s"] == 7.271 and r["mean_s"] == pytest.approx(414.10)


def test_a_run_falls_back_on_its_output(tmp_path):
    cmd, base = _fake(tmp_path, f"print({PRINTED!r})")
    r = runs.run_benchmark(cmd, base, 60)
    assert r["wallclocks_from"] == "printed output"
    assert r["median_s"] == 7.27


def test_failed_silent_and_slow_runs_say_so(tmp_path):
    cmd, base = _fake(tmp_path, "import sys; sys.exit('boom')")
    r = runs.run_benchmark(cmd, base, 60)
    assert r["error"] == "exit status 1: boom" and r["median_s"] is None
    cmd, base = _fake(tmp_path, "print('nothing')")
    assert runs.run_benchmark(cmd, base, 60)["error"] == "no wall clock found in fake's output"
    cmd, base = _fake(tmp_path, "import time; time.sleep(30)")
    r = runs.run_benchmark(cmd, base, 0.5, timeout_reason=" (--deadline)")
    assert r["error"] == "timed out after 0.5 s (--deadline)"


def test_the_command_line():
    cmd = runs.benchmark_command("dask_cuda.benchmarks.local_cupy", ["--size", "4"], "s.json",
                                 "ucx", ["0", "1"], 3, "out", disable_rmm=True)
    assert cmd[1:] == ["-m", "dask_cuda.benchmarks.local_cupy", "--scheduler-file", "s.json",
                       "--size", "4", "--protocol", "ucx", "--devs", "0,1", "--runs", "3",
                       "--output-basename", "out", "--disable-rmm"]
    cmd = runs.benchmark_command("dask_cuda.benchmarks.read_parquet", ["p"], "s.json", "tcp",
                                 ["0"], 2, "out", False, warmup_runs=0, compat=True)
    assert cmd[1] == "-c" and cmd[3] == "dask_cuda.benchmarks.read_parquet"
    assert cmd[-4:] == ["--warmup-runs", "0", "--output-basename", "out"]


def test_the_launcher_starts_dask_cuda_26_10_s_benchmarks(tmp_path):
    """What read_parquet does (its own --runs on top of the shared one) and what
    local_cupy_map_overlap imports (``cupyx.scipy.ndimage.filters``, gone in CuPy 14; here a
    stand-in CuPy without it)."""
    import subprocess

    pkg = tmp_path / "bench26"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "twice.py").write_text(textwrap.dedent("""
        import argparse, json
        p = argparse.ArgumentParser()
        p.add_argument("--runs", default=3, type=int)
        p.add_argument("--runs", default=3, type=int, help="again")
        print(json.dumps(vars(p.parse_args())))
    """))
    (pkg / "old_cupyx.py").write_text(
        "from cupyx.scipy.ndimage.filters import convolve\nprint(convolve())\n")
    nd = tmp_path / "cupyx" / "scipy" / "ndimage"
    nd.mkdir(parents=True)
    for d in (tmp_path / "cupyx", tmp_path / "cupyx" / "scipy"):
        (d / "__init__.py").write_text("")
    (nd / "__init__.py").write_text("def convolve():\n    return 'convolved'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for module, expected in (
        ("bench26.twice", "conflicting option string: --runs"),
        ("bench26.old_cupyx", "No module named 'cupyx.scipy.ndimage.filters'"),
    ):
        plain = subprocess.run([sys.executable, "-m", module, "--runs", "5"],
                               capture_output=True, text=True, env=env)
        assert plain.returncode != 0 and expected in plain.stderr
    launched = [subprocess.run([sys.executable, "-c", runs.COMPAT_LAUNCHER, module, *argv],
                               capture_output=True, text=True, env=env, check=True).stdout
                for module, argv in (("bench26.twice", ["--runs", "5"]),
                                     ("bench26.old_cupyx", []))]
    assert json.loads(launched[0]) == {"runs": 5}
    assert launched[1].strip() == "convolved"


@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("limit", [6_000_000_000, 10_000_000_000, 1_000_000_000])
def test_every_benchmark_holds_twice_the_limit_per_worker(devices, limit):
    benches = suite.plan(limit, devices, 1.0, "/data")
    assert [b.name for b in benches] == [
        "local_cudf_merge", "local_cudf_shuffle", "local_cudf_groupby",
        "local_cupy:transpose_sum", "local_cupy:dot", "local_cupy:sum", "local_cupy:mean",
        "local_cupy:slice", "local_cupy:fft", "local_cupy:svd", "local_cupy:col_sum",
        "local_cupy:col_mask", "local_cupy:col_gather", "local_cupy_map_overlap",
        "read_parquet"]
    for b in benches:
        assert b.data >= 2 * limit * devices, b.name
        assert b.data <= 3 * limit * devices, b.name  # and not far more (whole blocks)
    half = suite.plan(limit, devices, 0.5, "/data")
    assert all(h.data < b.data for h, b in zip(half, benches))


def test_the_issue_s_local_cupy_arguments_at_6_gb():
    (b,) = suite.select(suite.plan(6_000_000_000, 1, 1.0, "/data"), "local_cupy:transpose_sum")
    assert b.args == ["--operation", "transpose_sum", "--size", "40000", "--chunk-size", "4000"]


def test_choosing_benchmarks():
    benches = suite.plan(6_000_000_000, 1, 1.0, "/data")
    assert [b.name for b in suite.select(benches, "read_parquet,local_cupy:dot")] == [
        "local_cupy:dot", "read_parquet"]
    assert len(suite.select(benches, "local_cupy")) == 10, "a module takes all its rows"
    with pytest.raises(SystemExit, match="unknown nope"):
        suite.select(benches, "local_cupy,nope")


def test_a_run_whose_tasks_failed_is_reported_as_failed():
    # dask-cuda's benchmarks wait for their futures and print a wall clock even when tasks
    # failed (seen with a merge whose tasks raised MemoryError): the cluster's failures count.
    from distributed import Client, LocalCluster

    def boom(x):
        raise ValueError(f"bad partition {x}")

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            runs.watch_failed_tasks(client)
            assert client.submit(sum, [1, 2]).result() == 3
            assert runs.failed_tasks(client) == []
            futures = client.map(boom, [1, 2])
            for f in futures:
                with pytest.raises(ValueError):
                    f.result()
            failed = runs.failed_tasks(client)
            assert len(failed) == 2
            assert all("bad partition" in text for _, text in failed)
            assert runs.failed_tasks(client) == [], "taken once"
            note = runs.failure_note(failed)
            assert note.startswith("2 task(s) failed") and "bad partition" in note


def _stored(i):
    import rmm_rs

    return rmm_rs.DeviceBuffer.from_bytes(bytes([i]) * (1 << 20))


def test_the_store_s_figures_after_a_run():
    # What each rmm-rs run of the suite reports beside its wall clock: the store's spills and
    # unspills summed over the workers, and {} where the workers have no device store.
    from distributed import Client, LocalCluster, wait

    pytest.importorskip("rmm_rs")
    from rmm_rs.dask import DeviceStore

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            assert runs.store_figures(client) == {}
    config = {"spill": {"enabled": True, "host_pool_size": "16MiB"}}
    store = DeviceStore.factory(device_memory_limit="2MiB", config=config)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None, data=store) as c:
        with Client(c) as client:
            futures = client.map(_stored, range(5))
            wait(futures)
            assert client.submit(lambda b: b.size, futures[0]).result() == 1 << 20
            figures = runs.store_figures(client)
            del futures
    assert figures["device_count"] + figures["host_count"] == 5
    assert figures["spilled_bytes"] >= 3 << 20, figures
    assert figures["unspilled_bytes"] >= 1 << 20, figures
    assert figures["adopted_count"] + figures["copied_on_adopt_count"] == 5, figures
    assert figures["rebuilt_count"] >= 1 and figures["rebuilt_seconds"] > 0, figures
    line = runs.store_line(figures)
    assert line.startswith("spilled ") and "unspilled" in line and "device count" in line, line
    assert " s," in line or line.endswith(" s"), line


def test_the_table_with_rmm_rs_beside_cudfs_own_spilling(capsys):
    benches = suite.select(suite.plan(6_000_000_000, 1, 1.0, "/data"), "local_cudf_merge")
    sides = suite.SIDES + (suite.RMM_RS_CUDF_SPILL,)
    times = {"dask-cuda": 9.0, "dask-cuda + enable_cudf_spill": 4.0, "rmm-rs": 2.0,
             "rmm-rs + enable_cudf_spill": 3.0}
    results = [{"benchmark": "local_cudf_merge", "side": name, "error": None, "wallclocks": [t]}
               for name, t in times.items()]
    table = suite.print_table(benches, results, {}, ["header"], 6_000_000_000, sides)
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| benchmark"))
    assert lines[head].count("|") == lines[head + 1].count("|") == len(sides) + 4
    assert "rmm-rs + enable_cudf_spill (s)" in lines[head]
    (row,) = table["rows"]
    assert row["median_s"]["rmm-rs + enable_cudf_spill"] == 3.0
    assert row["ratio"] == "2.00×", "dask-cuda's best against rmm-rs with its own store"


def test_the_store_limited_by_the_pool_alone():
    from dask_cuda_runs import Settings, Side, store_limit

    s = Settings(limit="6GB", pool="12GB", host_limit=0, threads=1, rmm_rs_config={},
                 rmm_rs_libs=[], timeout=60)
    assert store_limit(Side("rmm-rs", "rmm-rs"), s) == "6GB"
    assert store_limit(Side("rmm-rs, store limit = pool", "rmm-rs", limit_at_pool=True), s) == "12GB"
    assert store_limit(Side("x", "rmm-rs", limit_at_pool=True), s._replace(pool=None)) == "6GB"


def test_multi_gpu_turns_work_stealing_on_or_off_only_when_asked():
    # Imported by name: the script registers its module with cloudpickle as it loads.
    multi = importlib.import_module("multi_gpu")
    assert multi.parse_args([]).work_stealing is None
    assert multi.parse_args(["--no-work-stealing"]).work_stealing is False
    assert multi.parse_args(["--work-stealing"]).work_stealing is True
