"""Creating a large pool after a managed stack: rmm-rs's ``rmm_rs.reinitialize`` against RAPIDS
RMM's ``rmm.reinitialize``, each in a process of its own, alternating (ABBA), on one GPU.

    python3 python/bench/reinitialize_pool.py [--gib 64 | --mib 2] [--rounds 4]
        [--vmm auto|true|false] [--sequence]

Each child starts on managed memory (``reinitialize(managed_memory=True)``), allocates and
frees one 1 GiB buffer there (so the managed stack has been used), then times
``reinitialize(pool_allocator=True, initial_pool_size=GIB << 30)`` (the same call on both
sides; rmm-rs takes a settings dict instead only for a ``--vmm`` other than ``auto``): the wall
time of the call and, for rmm-rs, the report of each step (resolve, drain, spill, check, build,
install, unspill) and the pool's chunk source. ``--vmm`` sets ``pool.vmm`` for rmm-rs
(``auto``: mapped chunks where the device supports them; ``false``: one ``cuMemAlloc`` as RMM
does), to tell the virtual memory API's share of the time from the rest. ``--mib 2 --vmm
false`` makes the pool that small, so that the driver's share is small and each side's own
overhead shows. Prints every round, and each side's median and mean.

``--sequence`` (with ``--vmm`` and ``--rmm-rs-growth`` for rmm-rs's pool) instead runs, in one process per side (``--rounds`` processes, ABBA), a user's
sequence three times over: plain device memory → pool of half ``--gib`` → pool of half
``--gib`` again → managed → pool of ``--gib`` → plain, each stack used once (1 GiB allocated and
freed) before the next switch. A process that has switched many times is what a notebook or a
long-lived worker is; a fresh process per switch hides what earlier stacks leave behind. It
prints each switch's median on both sides.

RMM's side needs its wheels (``rmm-cu13``, ``librmm-cu13``) and CuPy or nothing else; a side
whose package is missing is reported as skipped.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

GIB = 1 << 30


def rmm_rs_child(size, vmm):
    import rmm_rs

    rmm_rs.reinitialize(managed_memory=True)
    buf = rmm_rs.DeviceBuffer(GIB)
    del buf
    start = time.perf_counter()
    if vmm == "auto":
        # The very call RMM's side makes (rmm-rs takes RAPIDS RMM's keywords).
        report = rmm_rs.reinitialize(pool_allocator=True, initial_pool_size=size)
    else:
        report = rmm_rs.reinitialize(
            {"pool": {"enabled": True, "initial_size": size, "vmm": vmm}}
        )
    wall = time.perf_counter() - start
    stats = rmm_rs.device_statistics()
    rmm_rs.finalize()
    return {"wall_ms": wall * 1e3, "report": report, "stack": stats[0]["stack"]}


def rmm_child(size):
    import rmm

    rmm.reinitialize(managed_memory=True)
    buf = rmm.DeviceBuffer(size=GIB)
    del buf
    start = time.perf_counter()
    rmm.reinitialize(pool_allocator=True, initial_pool_size=size)
    wall = time.perf_counter() - start
    return {"wall_ms": wall * 1e3}


def sequence_steps(size):
    """The switches of ``--sequence``: (name, RMM's ``reinitialize`` keywords)."""
    half = size // 2
    return [
        ("cuda", {"pool_allocator": False}),
        ("pool half", {"pool_allocator": True, "initial_pool_size": half}),
        ("pool half again", {"pool_allocator": True, "initial_pool_size": half}),
        ("managed", {"managed_memory": True}),
        ("pool", {"pool_allocator": True, "initial_pool_size": size}),
        ("cuda again", {"pool_allocator": False}),
    ]


def as_settings(kwargs, vmm, growth):
    """rmm-rs's settings for RMM's ``reinitialize`` keywords, with ``pool.vmm`` and
    ``pool.growth`` as given (RMM's keywords have neither)."""
    pool = {"enabled": bool(kwargs.get("pool_allocator")),
            "managed": bool(kwargs.get("managed_memory"))}
    if pool["enabled"]:
        pool["initial_size"] = kwargs["initial_pool_size"]
        pool["vmm"] = vmm
        if growth:
            pool["growth"] = growth
    return {"pool": pool}


# The steps of rmm-rs's reinitialize report, in seconds there (see ``rmm_rs.reinitialize``).
REPORT_PHASES = ("resolve", "drain", "spill", "unspill", "check", "build", "install", "total")


def sequence_child(side, size, vmm, growth):
    """Times every switch of three rounds of the sequence, in this process; ms per switch."""
    if side == "rmm-rs":
        import rmm_rs as lib
    else:
        import rmm as lib
    times = {name: [] for name, _ in sequence_steps(size)}
    phases = {name: [] for name, _ in sequence_steps(size)}
    for _ in range(3):
        for name, kwargs in sequence_steps(size):
            start = time.perf_counter()
            if side == "rmm-rs" and (vmm != "auto" or growth):
                report = lib.reinitialize(as_settings(kwargs, vmm, growth))
            else:
                report = lib.reinitialize(**kwargs)
            times[name].append((time.perf_counter() - start) * 1e3)
            if side == "rmm-rs":
                phases[name].append({k: report.get(k, 0.0) * 1e3 for k in REPORT_PHASES})
            buf = lib.DeviceBuffer(size=GIB)
            del buf
    if side == "rmm-rs":
        lib.finalize()
        return {"switches": times, "phases": phases}
    return {"switches": times}


def run_sequence(a, size, shown):
    per_side = {"rmm-rs": {}, "rmm": {}}
    phases = {}
    for r in range(a.rounds):
        for side in ("rmm-rs", "rmm") if r % 2 == 0 else ("rmm", "rmm-rs"):
            res = run_child(side, size, a.vmm, sequence=True, growth=a.rmm_rs_growth)
            if "error" in res:
                print(f"process {r + 1} {side}: skipped ({res['error']})")
                continue
            for name, v in res["switches"].items():
                per_side[side].setdefault(name, []).extend(v)
            for name, v in res.get("phases", {}).items():
                phases.setdefault(name, []).extend(v)
            shown_times = "; ".join(
                f"{n} " + "/".join(f"{t:.2f}" for t in v) for n, v in res["switches"].items()
            )
            print(f"process {r + 1} {side}: {shown_times} ms")
    print(f"\nThe sequence in one process ({shown} pool), median ms per switch:")
    print(f"  {'switch':18} {'rmm-rs':>9} {'rmm':>9}")
    for name, _ in sequence_steps(size):
        cells = []
        for side in ("rmm-rs", "rmm"):
            v = per_side[side].get(name)
            cells.append(f"{statistics.median(v):9.2f}" if v else f"{'skipped':>9}")
        print(f"  {name:18} {cells[0]} {cells[1]}")
    if phases:
        # Where rmm-rs's time goes: its report's steps (the old stack is given back in
        # "build", before the new one is made), median ms per switch.
        print("\nrmm-rs's reinitialize report, median ms per switch:")
        print(f"  {'switch':18} " + " ".join(f"{k:>8}" for k in REPORT_PHASES))
        for name, _ in sequence_steps(size):
            rows = phases.get(name) or []
            if rows:
                cells = " ".join(
                    f"{statistics.median(r[k] for r in rows):8.2f}" for k in REPORT_PHASES
                )
                print(f"  {name:18} {cells}")


def run_child(side, size, vmm, sequence=False, growth=None):
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, "--bytes", str(size), "--vmm", vmm]
        + (["--sequence"] if sequence else [])
        + (["--rmm-rs-growth", growth] if growth else []),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size_arg = p.add_mutually_exclusive_group()
    size_arg.add_argument("--gib", type=int, default=64, help="initial pool size in GiB (64)")
    size_arg.add_argument("--mib", type=int, default=None, help="initial pool size in MiB")
    p.add_argument("--bytes", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=4, help="processes per side (4; even: ABBA)")
    p.add_argument("--vmm", default="auto", choices=["auto", "true", "false"])
    p.add_argument(
        "--sequence",
        action="store_true",
        help="time a sequence of switches in one process (see above) instead of one switch",
    )
    p.add_argument(
        "--rmm-rs-growth",
        default=None,
        help="with --sequence, rmm-rs's pool.growth (the size of the chunks a pool maps, its "
        "initial size included), e.g. 64GiB to map it in one",
    )
    p.add_argument("--child", choices=["rmm-rs", "rmm"], help=argparse.SUPPRESS)
    a = p.parse_args()
    vmm = {"auto": "auto", "true": True, "false": False}[a.vmm]
    size = a.bytes or (a.mib << 20 if a.mib else a.gib * GIB)
    shown = f"{a.mib} MiB" if a.mib else f"{a.gib} GiB"
    if a.child and a.sequence:
        print(json.dumps(sequence_child(a.child, size, vmm, a.rmm_rs_growth)))
        return
    if a.sequence:
        run_sequence(a, size, shown)
        return
    if a.child == "rmm-rs":
        print(json.dumps(rmm_rs_child(size, vmm)))
        return
    if a.child == "rmm":
        print(json.dumps(rmm_child(size)))
        return
    walls = {"rmm-rs": [], "rmm": []}
    for r in range(a.rounds):
        # ABBA: each side follows the other as often, so that what one process leaves the
        # driver to clean up weighs on both alike.
        for side in ("rmm-rs", "rmm") if r % 2 == 0 else ("rmm", "rmm-rs"):
            res = run_child(side, size, a.vmm)
            if "error" in res:
                print(f"round {r + 1} {side}: skipped ({res['error']})")
                continue
            walls[side].append(res["wall_ms"])
            line = f"round {r + 1} {side}: {res['wall_ms']:.2f} ms"
            if "report" in res:
                steps = ("resolve", "drain", "spill", "check", "build", "install", "unspill")
                rep = res["report"]
                parts = [
                    f"{s} {rep[s] * 1e3:.2f}" for s in steps if isinstance(rep.get(s), float)
                ]
                # What the call costs beyond the runtime's own steps (settings, the report).
                outside = res["wall_ms"] - rep["total"] * 1e3
                line += f"  [{', '.join(parts)} ms; outside the steps {outside:.2f} ms; {res['stack']}]"
            print(line)
    print(f"\n{shown} pool after a managed stack, {a.rounds} rounds (pool.vmm = {a.vmm}):")
    for side, v in walls.items():
        if v:
            print(f"  {side:7} median {statistics.median(v):7.2f} ms, mean {statistics.mean(v):7.2f} ms")
        else:
            print(f"  {side:7} skipped")


if __name__ == "__main__":
    main()
