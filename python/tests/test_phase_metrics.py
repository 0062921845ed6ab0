"""The multi-GPU benchmark's per-phase figures (python/bench/phase_metrics.py), from a Dask
worker's fine performance metrics and transfer log: no GPU, no cluster."""

import importlib.util
import os
from types import SimpleNamespace

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, name + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pm = _load("phase_metrics")


def _worker(digests, log):
    return SimpleNamespace(digests_total=digests, transfer_incoming_log=log)


def test_seconds_are_summed_per_activity_and_label_over_prefixes_and_spans():
    w = _worker(
        {
            ("execute", "span-1", "add", "thread-cpu", "seconds"): 1.5,
            ("execute", "span-2", "sum", "thread-cpu", "seconds"): 0.5,
            ("execute", "span-1", "add", "thread-cpu", "bytes"): 99.0,  # not seconds
            ("gather-dep", "network", "seconds"): 2.0,
            "latency": 0.25,  # not a tuple
        },
        [
            {"total": 100, "duration": 0.5, "keys": {"a": 100}},
            {"total": 300, "duration": 1.5, "keys": {"b": 100, "c": 200}},
            {"total": 3 << 20, "duration": 0.1, "keys": {"d": 1 << 20, "e": 2 << 20}},
        ],
    )
    f = pm.worker_phase_figures(w)
    assert f["execute/thread-cpu"] == 2.0
    assert f["gather-dep/network"] == 2.0
    assert "latency" not in f and not any("bytes" in k for k in f if "/" in k)
    assert (f["incoming transfers"], f["incoming bytes"]) == (3, 400 + (3 << 20))
    assert f["incoming seconds"] == 2.1
    # Only the transfer of 1 MiB or more is a large one: 2 keys.
    assert (f["incoming large transfers"], f["incoming large keys"]) == (1, 2)


def test_a_phase_is_the_difference_of_two_snapshots_per_worker():
    before = {"w1": {"a/b": 1.0, "incoming transfers": 2.0}}
    after = {"w1": {"a/b": 3.5, "incoming transfers": 5.0, "c/d": 1.0}, "w2": {"a/b": 2.0}}
    d = pm.difference(after, before)
    assert d == {
        "w1": {"a/b": 2.5, "incoming transfers": 3.0, "c/d": 1.0},
        "w2": {"a/b": 2.0},
    }


def test_the_summary_names_the_transfers_and_the_busiest_activities_first():
    per_worker = {
        "w1": {"gather-dep/network": 4.0, "execute/other": 1.0, "tiny/x": 0.001,
               "incoming transfers": 10, "incoming bytes": 10 * 2**30, "incoming seconds": 5},
        "w2": {"gather-dep/network": 2.0, "execute/other": 3.0,
               "incoming transfers": 6, "incoming bytes": 6 * 2**30, "incoming seconds": 3,
               "incoming large transfers": 4, "incoming large keys": 10},
    }
    lines = pm.summary_lines(per_worker)
    assert lines.pop(1) == "incoming transfers of 1 MiB or more: 4, 2.5 keys each"
    assert lines[0].startswith("incoming transfers: 16 carrying 16.00 GiB over 8.00 s summed")
    assert "2.15 GB/s per transfer" in lines[0]
    assert lines[1].startswith("gather-dep/network") and "3.00 s per worker (most 4.00 s)" in lines[1]
    assert lines[2].startswith("execute/other") and "2.00 s per worker (most 3.00 s)" in lines[2]
    assert len(lines) == 3  # the activity under 5 ms per worker is left out
    assert pm.summary_lines({}) == []


def _node(name, line, count, children=()):
    return {
        "count": count,
        "description": {"filename": f"/site/{name}.py", "name": name, "line_number": line},
        "children": {f"{name}:{line}:{i}": c for i, c in enumerate(children)},
    }


def test_the_loop_hotspots_are_the_lines_samples_were_taken_in_busiest_first():
    # 100 samples: 60 in a read, 30 in an unspill under __getitem__ (5 in __getitem__
    # itself), 10 in the loop's own frame.
    profile = {
        "count": 100,
        "description": {"filename": "", "name": "", "line_number": 0},
        "children": {
            "run": _node("run_once", 1, 100, [
                _node("read", 2, 60),
                _node("__getitem__", 3, 30, [_node("unspill", 4, 25)]),
            ]),
        },
    }
    lines = pm.loop_hotspots(profile, interval=0.01, top=3)
    assert lines[0] == "event loops sampled 100 times (1.00 s summed over workers)"
    assert lines[1].split() == ["0.60", "s", "60.0", "%", "read", "(read.py:2)"]
    assert lines[2].split()[:5] == ["0.25", "s", "25.0", "%", "unspill"]
    assert lines[3].split()[:5] == ["0.10", "s", "10.0", "%", "run_once"]
    assert len(lines) == 4
    assert pm.loop_hotspots({"count": 0}, interval=0.01) == []


def test_busy_lines_give_each_workers_compute_share_per_quarter_and_its_transfers():
    # A 4 s phase from t=100: worker a computes 1 s in the first quarter and 0.5 s across the
    # second and third; worker b's one task waited 2 s for its input, then computed 1 s last.
    records = [
        {"worker": "a", "startstops": [{"action": "compute", "start": 100.0, "stop": 101.0}]},
        {"worker": "a", "startstops": [{"action": "compute", "start": 101.75, "stop": 102.25}]},
        {
            "worker": "b",
            "startstops": [
                {"action": "transfer", "start": 101.0, "stop": 103.0},
                {"action": "compute", "start": 103.0, "stop": 104.0},
            ],
        },
        # Outside the phase's workers: a record with no startstops counts nothing.
        {"worker": "a", "startstops": []},
    ]
    lines = pm.busy_lines(records, 100.0, 104.0)
    assert lines == [
        "a: 2 tasks computed 1.50 s (38 % of the phase; by quarter 100 / 25 / 25 / 0 %), "
        "inputs in transfer 0.00 s",
        "b: 1 tasks computed 1.00 s (25 % of the phase; by quarter 0 / 0 / 0 / 100 %), "
        "inputs in transfer 2.00 s",
    ]
    assert pm.busy_lines(records, 104.0, 104.0) == []
    assert pm.busy_lines([], 100.0, 104.0) == []


def test_steal_lines_count_the_phases_stealing_events_by_kind():
    events = [
        (99.0, ("confirm", "k0", "processing", "a", "b", "s0")),  # before the phase
        (100.5, ("confirm", "k1", "processing", "a", "b", "s1")),
        (101.0, ("already-computing", "k2", "executing", "a", "b", "s2")),
        (102.0, ("confirm", "k3", "processing", "b", "c", "s3")),
        (103.0, "not a stealing event"),
    ]
    assert pm.steal_lines(events, 100.0, 104.0) == [
        "work stealing: confirm 2, already-computing 1"
    ]
    assert pm.steal_lines(events, 104.0, 105.0) == []
