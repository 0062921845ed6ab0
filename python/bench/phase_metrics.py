"""Where a phase's time goes on each Dask worker, from distributed's own fine performance
metrics (``Worker.digests_total``) and its transfer log: the seconds each activity took
(``execute/thread-noncpu``, ``gather-dep/network``, ``get-data/serialize``…), and the
incoming transfers' count, bytes and summed durations. The same figures for either side, so
that a slow phase can be pinned on the task, the spilling, the serialization or the wire."""

import os
from typing import Any, Dict, List

GiB = 1 << 30
# Transfers of at least this many bytes carry data blocks (not a reduction's partial results).
LARGE = 1 << 20


def worker_phase_figures(dask_worker: Any) -> Dict[str, float]:
    """This worker's cumulative figures: ``ACTIVITY/LABEL`` seconds (summed over task
    prefixes and spans), and ``incoming transfers`` / ``incoming bytes`` / ``incoming
    seconds`` from its transfer log, with the count of transfers of ``LARGE`` bytes or more
    and the keys they carried (``incoming large transfers`` / ``incoming large keys``)."""
    out: Dict[str, float] = {}
    for key, value in list(getattr(dask_worker, "digests_total", {}).items()):
        if isinstance(key, tuple) and len(key) >= 3 and key[-1] == "seconds":
            name = f"{key[0]}/{key[-2]}"
            out[name] = out.get(name, 0.0) + float(value)
    log = list(getattr(dask_worker, "transfer_incoming_log", ()))
    out["incoming transfers"] = float(len(log))
    out["incoming bytes"] = float(sum(e.get("total", 0) for e in log))
    out["incoming seconds"] = float(sum(e.get("duration", 0.0) for e in log))
    large = [e for e in log if e.get("total", 0) >= LARGE]
    out["incoming large transfers"] = float(len(large))
    out["incoming large keys"] = float(sum(len(e.get("keys", ())) for e in large))
    return out


def difference(
    after: Dict[str, Dict[str, float]], before: Dict[str, Dict[str, float]]
) -> Dict[str, Dict[str, float]]:
    """Per worker, ``after - before`` (a phase's own figures from two snapshots)."""
    return {
        w: {k: v - before.get(w, {}).get(k, 0.0) for k, v in figures.items()}
        for w, figures in after.items()
    }


def summary_lines(per_worker: Dict[str, Dict[str, float]], top: int = 8) -> List[str]:
    """The phase's figures as text: the incoming transfers summed over the workers (count,
    GiB, summed seconds, and the rate that gives), then the ``top`` activities by seconds
    per worker (the mean over workers, and the largest)."""
    if not per_worker:
        return []
    n = len(per_worker)
    count = sum(f.get("incoming transfers", 0.0) for f in per_worker.values())
    nbytes = sum(f.get("incoming bytes", 0.0) for f in per_worker.values())
    seconds = sum(f.get("incoming seconds", 0.0) for f in per_worker.values())
    rate = f", {nbytes / seconds / 1e9:.2f} GB/s per transfer" if seconds > 0 else ""
    lines = [
        f"incoming transfers: {int(count)} carrying {nbytes / GiB:.2f} GiB over "
        f"{seconds:.2f} s summed{rate}"
    ]
    large = sum(f.get("incoming large transfers", 0.0) for f in per_worker.values())
    if large:
        keys = sum(f.get("incoming large keys", 0.0) for f in per_worker.values())
        lines.append(
            f"incoming transfers of 1 MiB or more: {int(large)}, {keys / large:.1f} keys each"
        )
    names = {
        k for f in per_worker.values() for k in f if not k.startswith("incoming ")
    }
    rows = []
    for name in names:
        values = [f.get(name, 0.0) for f in per_worker.values()]
        rows.append((sum(values) / n, max(values), name))
    rows.sort(reverse=True)
    for mean, most, name in rows[:top]:
        if mean < 0.005:
            break
        lines.append(f"{name:32s} {mean:8.2f} s per worker (most {most:.2f} s)")
    return lines


def loop_hotspots(profile: Dict[str, Any], interval: float, top: int = 10) -> List[str]:
    """Where the workers' event loops spent a phase, from the statistical profile Dask keeps
    of each worker's event loop (``client.profile(server=True, start=…, stop=…)``, merged over
    the workers): the ``top`` lines by samples taken in them (not in what they called), each
    with its seconds summed over the workers (samples × ``interval``) and share of all
    samples. Dask leaves out the samples taken while a loop waits in its selector, so the
    samples are the loops' busy time. (Dask does not profile event loops on Python 3.11.)"""
    own: Dict[str, int] = {}

    def walk(node: Dict[str, Any]) -> None:
        children = node.get("children", {}) or {}
        below = sum(int(c.get("count", 0)) for c in children.values())
        here = int(node.get("count", 0)) - below
        d = node.get("description") or {}
        if here > 0 and d.get("name"):
            where = f"{os.path.basename(str(d.get('filename', '')))}:{d.get('line_number', '?')}"
            name = f"{d['name']} ({where})"
            own[name] = own.get(name, 0) + here
        for c in children.values():
            walk(c)

    walk(profile)
    total = int(profile.get("count", 0))
    if total <= 0:
        return []
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:top]
    lines = [f"event loops sampled {total} times ({total * interval:.2f} s summed over workers)"]
    for name, n in rows:
        lines.append(f"{n * interval:8.2f} s {100 * n / total:5.1f} %  {name}")
    return lines


def busy_lines(records: List[Dict[str, Any]], start: float, stop: float) -> List[str]:
    """How the phase ``[start, stop]`` (wall-clock seconds) kept each worker's task threads
    busy, from Dask's task stream (``client.get_task_stream(start=…)``): per worker, the
    seconds its tasks computed and their share of the phase, then that share in each quarter
    of the phase (a worker waiting for its inputs idles early; a straggler, late), and the
    seconds its tasks' inputs spent in transfer to it."""
    span = stop - start
    if span <= 0 or not records:
        return []
    quarters = [(start + span * q / 4, start + span * (q + 1) / 4) for q in range(4)]
    per: Dict[str, Dict[str, Any]] = {}
    for r in records:
        w = per.setdefault(str(r.get("worker")), {"compute": 0.0, "transfer": 0.0,
                                                  "tasks": 0, "q": [0.0] * 4})
        for s in r.get("startstops", ()):
            a, b = float(s["start"]), float(s["stop"])
            if s.get("action") == "compute":
                w["compute"] += b - a
                w["tasks"] += 1
                for i, (lo, hi) in enumerate(quarters):
                    w["q"][i] += max(0.0, min(b, hi) - max(a, lo))
            elif s.get("action") == "transfer":
                w["transfer"] += b - a
    lines = []
    for name, w in sorted(per.items()):
        q = " / ".join(f"{100 * x / (span / 4):.0f}" for x in w["q"])
        lines.append(
            f"{name}: {w['tasks']} tasks computed {w['compute']:.2f} s "
            f"({100 * w['compute'] / span:.0f} % of the phase; by quarter {q} %), "
            f"inputs in transfer {w['transfer']:.2f} s"
        )
    return lines


def steal_lines(events: List[Any], start: float, stop: float) -> List[str]:
    """What Dask's work stealing did in the phase ``[start, stop]``, from the scheduler's
    ``stealing`` events (``client.get_events("stealing")``: ``(time, (kind, key, …))``): the
    count of each kind (``confirm``: a task moved to another worker, whose inputs then travel
    there and whose gathers on the first worker are cancelled; ``already-computing``: too late
    to move). Empty when nothing was stolen."""
    counts: Dict[str, int] = {}
    for when, msg in events:
        if start <= float(when) <= stop and isinstance(msg, (tuple, list)) and msg:
            counts[str(msg[0])] = counts.get(str(msg[0]), 0) + 1
    if not counts:
        return []
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return [f"work stealing: {kinds}"]
