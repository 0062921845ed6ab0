"""How fast a value moves between two rmm-rs processes of one host through exportable device
memory, the path Dask workers of one machine use (rmm_rs.dask.transfer), without Dask: the
sender stages spilled values (from its pinned host tier into memory the peer maps), and the
receiver takes them the three ways a worker does: into its pinned host tier (a device full
under its limit), onto its device (room under the limit), and as bytes (a client's way,
``--ways bytes``).

    python python/bench/shared_copy.py --sender 0 --receiver 1 --block 128MiB --blocks 8

Each figure is the best of ``--rounds`` rounds of ``--blocks`` values, in GB/s; every value
received is checked against what was sent (its first and last bytes, and one whole value per
round)."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple


def _parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6,
             "gb": 10**9, "b": 1}
    t = text.strip().lower()
    for suffix, mult in units.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def _pattern(i: int, size: int) -> bytes:
    """Value ``i``'s bytes: cheap to make and different for every value and offset."""
    word = ((i * 0x9E3779B97F4A7C15 + 1) % (1 << 64)).to_bytes(8, "little")
    unit = bytes((b + j) % 256 for j, b in enumerate(word * 512))  # 4 KiB
    return (unit * (size // len(unit) + 1))[:size]


def _receiver(conn: Any, device: int, block: int) -> None:
    """The receiving process: for each round's descriptors, takes them the way the sender
    says and answers with the seconds it took (or an error)."""
    import rmm_rs
    from rmm_rs import _rmm_rs

    rmm_rs.initialize(None, {"devices": [device], "spill.enabled": True})
    full_limit = _rmm_rs.set_device_memory_limit(0, device)
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        how, descriptors, first = msg
        try:
            # A limit below one value: the device is "full", received values go to the host
            # tier; the device's whole memory: they land on the device.
            _rmm_rs.set_device_memory_limit(256 if how == "host tier" else full_limit, device)
            t = time.perf_counter()
            if how == "bytes":
                got: List[Any] = list(_rmm_rs.read_exported(descriptors, device))
            else:
                got = [_rmm_rs.receive_exported([d], device) for d in descriptors]
            seconds = time.perf_counter() - t
            tiers = sorted({g.tier for g in got}) if how != "bytes" else ["bytes"]
            ok = _check(got, first, block, how)
            del got
            conn.send(("done", seconds, tiers, ok))
        except Exception as e:  # noqa: BLE001 - reported to the sender, which stops
            conn.send(("error", f"{type(e).__name__}: {e}", [], False))
    rmm_rs.finalize()


def _check(got: List[Any], first: int, block: int, how: str) -> bool:
    """Every value's first and last 4 KiB, and the first value whole, as sent."""
    for k, g in enumerate(got):
        want = _pattern(first + k, block)
        if how == "bytes":
            data = bytes(g) if k == 0 else bytes(memoryview(g)[:4096]) + bytes(
                memoryview(g)[-4096:])
        else:
            data = _received_bytes(g, block)
        if k == 0 and data != want:
            return False
        if data[:4096] != want[:4096] or data[-4096:] != want[-4096:]:
            return False
    return True


def _visible_devices() -> int:
    """How many devices this process sees (1 where it cannot tell)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, or the simulated device
        return 1


def _received_bytes(value: Any, size: int) -> bytes:
    """The bytes of a received value (one allocation), read where it landed."""
    from rmm_rs import _rmm_rs

    if value.tier != "device":
        parts = value.spilled_bytes()
        if parts is not None:
            return bytes(parts[0])
    view = value.device_frames([(0, 0, size)])[0]
    return _rmm_rs.DeviceBuffer.copy_of_device(view.ptr, size, value.device).to_bytes()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sender", type=int, default=0, help="the sender's device (default 0)")
    p.add_argument("--receiver", type=int, default=None,
                   help="the receiver's device (default: the next one, else the sender's)")
    p.add_argument("--block", default="128MiB", help="bytes of one value (default 128MiB)")
    p.add_argument("--blocks", type=int, default=8, help="values per round (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per way (default 3)")
    p.add_argument("--ways", default="host tier,device",
                   help='which ways the receiver takes the values: "host tier", "device", '
                   '"bytes" (a client\'s: pageable memory, slow), comma-separated (default '
                   '%(default)s)')
    args = p.parse_args(argv)
    block = _parse_size(args.block)
    if block < 8192 or args.blocks < 1 or args.rounds < 1:
        p.error("--block must be at least 8KiB, --blocks and --rounds at least 1")
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in ("host tier", "device", "bytes")]
    if unknown or not ways:
        p.error(f"--ways {args.ways!r}: use host tier, device and/or bytes, comma-separated")

    import rmm_rs
    from rmm_rs import _rmm_rs
    from rmm_rs.dask import DeviceStore
    from rmm_rs.dask.transfer import HostFrames

    receiver = args.receiver
    if receiver is None:
        receiver = args.sender + 1 if args.sender + 1 < _visible_devices() else args.sender
    rmm_rs.initialize(None, {"devices": [args.sender], "spill.enabled": True})
    store = DeviceStore(device_memory_limit=0, device=args.sender)

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_receiver, args=(there, receiver, block), daemon=True)
    child.start()
    status = here.recv()
    if status[0] != "ready":
        print(f"the receiver did not start: {status}", file=sys.stderr)
        return 1
    backend = _rmm_rs.ipc_identity().get("backend")
    print(f"backend {backend}: sender device {args.sender} (pid {os.getpid()}), receiver "
          f"device {receiver} (pid {status[1]}); {args.blocks} values of {block} bytes per "
          f"round, best of {args.rounds}", flush=True)

    results: Dict[str, Tuple[float, float]] = {}
    failed = False
    n = 0
    for how in ways:
        best_stage = best_take = float("inf")
        for _ in range(args.rounds):
            first = n
            keys = []
            for k in range(args.blocks):
                key = f"v{n}"
                n += 1
                store[key] = rmm_rs.DeviceBuffer.from_bytes(_pattern(first + k, block),
                                                            args.sender)
                store.spill(key)
                keys.append(key)
            t = time.perf_counter()
            descriptors: List[bytes] = []
            leases = []
            for key in keys:
                entry: Any = store._device[key]
                sent = HostFrames.sent_from(entry.header, entry.frames, entry.adopted)
                exported = entry.adopted.export(sent.ranges)
                if exported is None:
                    print(f"the sender's exportable memory has no room for {args.blocks} "
                          f"values of {block} bytes: lower --blocks or --block",
                          file=sys.stderr)
                    return 1
                descriptors.extend(exported[0])
                leases.append(exported[1])
            best_stage = min(best_stage, time.perf_counter() - t)
            here.send((how, descriptors, first))
            answer = here.recv()
            for lease in leases:
                lease.release()
            for key in keys:
                del store[key]
            if answer[0] != "done":
                print(f"{how}: {answer[1]}", file=sys.stderr)
                return 1
            _, seconds, tiers, ok = answer
            if not ok:
                print(f"{how}: the values received differ from those sent", file=sys.stderr)
                failed = True
            best_take = min(best_take, seconds)
        results[how] = (best_stage, best_take)
        print(f"{how:10s}: sender staged {args.blocks * block / best_stage / 1e9:7.2f} GB/s, "
              f"receiver took {args.blocks * block / best_take / 1e9:7.2f} GB/s "
              f"(landed: {', '.join(tiers)})", flush=True)
    here.send(None)
    child.join(30)
    store.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
