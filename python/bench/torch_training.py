"""PyTorch training on four allocators, in one run (issue 39): how much device memory each
reserves for the same live set, and at what step time.

Workloads (``--model``): ``gpt2``, a GPT-2-size decoder from ``transformers``' ``GPT2Config``
(12 layers, 768 wide, 12 heads, vocabulary 50257, 1024 positions; random init, nothing
downloaded), AdamW (lr 1e-4), bf16 autocast, batch 8, each step a new random sequence length
in [64, 1024] (the pattern that fragments caching allocators); ``vision``, torchvision's
ResNet-50 (random init) on random images of a new side in [128, 384] (a multiple of 32) each
step, batch 32, cross-entropy on random labels, SGD with momentum (skipped, saying why, where
torchvision does not import); ``both``. Lengths, sides, inputs and the model's init come from
``--seed``, so every allocator sees the same steps and should see the same losses.

Allocators (``--modes``), each run in a fresh process of this script, in alternating order
over ``--repeats``:

* ``torch``: PyTorch's caching allocator (``PYTORCH_CUDA_ALLOC_CONF`` unset).
* ``expandable``: the same with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
* ``rmm-rs``: ``rmm_rs.allocators.torch.install()`` before any CUDA allocation, rmm-rs's pool
  from ``--rmm-rs-pool-initial``, with ``pool.max_overhead`` set to ``--rmm-rs-max-overhead``
  (5 % unless given; the setting itself defaults to "none").
* ``rmm-rs-mempool``: model, optimizer and loop inside
  ``with rmm_rs.allocators.torch.use_mem_pool():`` (PyTorch's ``use_mem_pool`` over
  ``mem_pool()``, backward on the calling thread so that it allocates from rmm-rs too), over a
  pool that starts at and grows by ``--rmm-rs-mempool-growth`` (2 MiB): PyTorch caches its
  segments itself, so rmm-rs's pool only follows them (what the README advises for this route).

Both rmm-rs modes start rmm-rs (``rmm_rs.initialize({"devices": [d], "pool": {"enabled": True,
"initial_size": ..., "max_overhead": ...}})``, with ``growth`` too under the MemPool) after the
baseline below is read, so the pool counts as used memory.

After every step (synchronized) the device's used memory is read from NVML (``pynvml``;
without it ``torch.cuda.mem_get_info``); its maximum less the used memory measured once the
CUDA context exists and before any allocation is "peak device memory used" (net; raw beside
it). Live peak and reserved at peak: ``torch.cuda.max_memory_allocated/reserved`` for the
PyTorch modes and the MemPool route (whose rmm-rs pool size goes to the JSON as well); for
``rmm-rs``, ``rmm_rs.allocators.torch.max_memory_allocated`` (the statistics adaptor's peak,
sizes as requested) and ``max_memory_reserved`` (the pool's peak size).
Median step time skips the first 5 steps. The loss sums of all runs must agree to ``--rtol``
(a difference is a warning).

``--log DIR`` also runs the ``rmm-rs`` mode once more for ``--log-steps`` steps with rmm-rs's
allocation log on (RMM's CSV, ``DIR/<model>/rmm_log.dev<N>.csv``), for
``rmm replay LOG --simulate-capacity 141GiB --pool-initial 1GiB``; its row is marked "logged".

    python3 python/bench/torch_training.py [--model gpt2|vision|both] [--steps 80]
        [--modes torch,expandable,rmm-rs,rmm-rs-mempool] [--repeats 2] [--log DIR] [--json F]

Needs one GPU, PyTorch, transformers (gpt2), torchvision (vision) and the rmm_rs wheel (the
shim ``rmm_rs_torch`` too, for ``install()`` to raise on out of memory).
"""

import argparse
import contextlib
import datetime
import gc
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

GIB = 1 << 30
MODES = ("torch", "expandable", "rmm-rs", "rmm-rs-mempool")
NAMES = {
    "torch": "PyTorch's caching allocator",
    "expandable": "PyTorch, `expandable_segments:True`",
    "rmm-rs": "rmm-rs process-wide (`install()`)",
    "rmm-rs-mempool": "PyTorch over rmm-rs (`rmm_rs.allocators.torch.use_mem_pool()`)",
}
WARMUP = 5
VISION_SIDES = (128, 384)


class DeviceMemory:
    """The device's used memory: NVML's figure (what nvidia-smi shows), or total − free from
    ``torch.cuda.mem_get_info`` where pynvml does not work."""

    def __init__(self, torch: Any, device: int) -> None:
        self.torch, self.device, self.nvml, self.handle = torch, device, None, None
        try:
            import pynvml

            pynvml.nvmlInit()
            try:  # CUDA_VISIBLE_DEVICES may renumber the devices
                index = torch.cuda._get_nvml_device_index(device)
            except Exception:
                index = device
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nvml = pynvml
            self.source = f"NVML (device index {index})"
        except Exception as e:
            self.source = f"torch.cuda.mem_get_info (pynvml: {type(e).__name__}: {e})"

    def used(self) -> int:
        """Bytes in use on the whole device now."""
        if self.nvml is not None:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(total - free)


def workload(torch: Any, args: argparse.Namespace) -> Tuple[Any, Any, Callable, Callable]:
    """The model on the device, its optimizer, a function giving each step's inputs (and the
    sequence length or image side), and the loss of those inputs."""
    dev = f"cuda:{args.device}"
    steps, gen = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257,
                            n_positions=1024)
        model = GPT2LMHeadModel(config).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = args.batch or 8

        def next_batch() -> Tuple[Any, int]:
            n = steps.randint(args.min_len, args.max_len)
            return torch.randint(0, config.vocab_size, (batch, n), generator=gen).to(dev), n

        def loss_of(inputs: Any) -> Any:
            return model(inputs, labels=inputs).loss
    else:
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        batch = args.batch or 32

        def next_batch() -> Tuple[Any, int]:
            side = 32 * steps.randint(VISION_SIDES[0] // 32, VISION_SIDES[1] // 32)
            x = torch.randn((batch, 3, side, side), generator=gen)
            y = torch.randint(0, 1000, (batch,), generator=gen)
            return (x.to(dev), y.to(dev)), side

        def loss_of(inputs: Any) -> Any:
            return torch.nn.functional.cross_entropy(model(inputs[0]), inputs[1])
    model.train()
    return model, opt, next_batch, loss_of


def train(torch: Any, args: argparse.Namespace, memory: DeviceMemory, steps: int
          ) -> Dict[str, Any]:
    """Builds the workload, runs `steps` steps, and returns step times, losses and the
    highest device memory used (NVML) read after each step."""
    torch.manual_seed(args.seed)
    model, opt, next_batch, loss_of = workload(torch, args)
    peak_used = memory.used()
    times: List[float] = []
    losses: List[float] = []
    sizes: List[int] = []  # sequence lengths or image sides
    for _ in range(steps):
        inputs, size = next_batch()
        torch.cuda.synchronize(args.device)
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
        torch.cuda.synchronize(args.device)
        times.append(time.perf_counter() - start)
        sizes.append(size)
        del loss, inputs
        peak_used = max(peak_used, memory.used())
    del model, opt, next_batch, loss_of
    gc.collect()
    torch.cuda.synchronize(args.device)
    timed = times[WARMUP:] or times
    return {"steps": steps, "median_step_ms": statistics.median(timed) * 1e3,
            "step_ms": [t * 1e3 for t in times], "sizes": sizes, "losses": losses,
            "loss_sum": sum(losses), "final_loss": losses[-1] if losses else None,
            "peak_used_raw": peak_used}


def versions(*dists: str) -> Dict[str, Optional[str]]:
    """The installed version of each distribution, None where it is not installed."""
    from importlib import metadata

    out: Dict[str, Optional[str]] = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = None
    return out


def child(args: argparse.Namespace) -> int:
    """One allocator mode in this (fresh) process: prints its figures as one JSON line, the
    last line of standard output."""
    mode, device = args.mode, args.device
    out: Dict[str, Any] = {"mode": mode, "model": args.model, "logged": bool(args.log),
                           "notes": []}
    if args.model == "vision":
        try:
            import torchvision  # noqa: F401
        except Exception as e:
            print(json.dumps({"skipped": f"torchvision does not import: {type(e).__name__}: {e}"}))
            return 0
    import torch

    pool_settings: Dict[str, Any] = {"enabled": True, "initial_size": args.rmm_rs_pool_initial,
                                     "max_overhead": args.rmm_rs_max_overhead}
    if mode == "rmm-rs-mempool":
        # PyTorch's caching allocator keeps its segments: rmm-rs's pool only follows them.
        step = args.rmm_rs_mempool_growth
        pool_settings.update(initial_size=step, growth=step)
    rmm_config: Dict[str, Any] = {"devices": [device], "pool": pool_settings}
    if args.log:
        os.makedirs(args.log, exist_ok=True)
        rmm_config["logging"] = {"enabled": True, "directory": os.path.abspath(args.log)}
    if mode.startswith("rmm-rs"):
        import rmm_rs
        from rmm_rs.allocators import torch as rmm_torch

        if mode == "rmm-rs":
            out["rmm_rs_torch_shim"] = rmm_torch.shim_error() or "ok"
            rmm_torch.install()  # before PyTorch's first CUDA allocation
    torch.cuda.set_device(device)
    torch.cuda.synchronize(device)  # the CUDA context exists; nothing is allocated yet
    memory = DeviceMemory(torch, device)
    out["memory_source"] = memory.source
    base = memory.used()
    pool_ctx: Any = contextlib.nullcontext()
    pool = None  # the MemPool, kept to the end of the process
    if mode.startswith("rmm-rs"):
        rmm_rs.initialize(rmm_config)
        if mode == "rmm-rs-mempool":
            pool = rmm_torch.mem_pool()
            pool_ctx = rmm_torch.use_mem_pool(pool)  # backward on this thread: on rmm-rs too
    with pool_ctx:
        run = train(torch, args, memory, args.log_steps if args.log else args.steps)
    out.update(run)
    out["base_used"] = base
    out["peak_used_net"] = run["peak_used_raw"] - base
    if mode == "rmm-rs":
        stats = rmm_rs.device_statistics()[device]
        out["live_peak"] = rmm_torch.max_memory_allocated(device)
        out["reserved_peak"] = rmm_torch.max_memory_reserved(device)
        out["rmm_rs_pool"], out["rmm_rs_stack"] = stats["pool"], stats["stack"]
        out["notes"].append("live and reserved peaks: rmm_rs.allocators.torch's "
                            "max_memory_allocated (sizes as requested) and max_memory_reserved")
    else:
        out["live_peak"] = torch.cuda.max_memory_allocated(device)
        out["reserved_peak"] = torch.cuda.max_memory_reserved(device)
        ms = torch.cuda.memory_stats(device)
        out["num_alloc_retries"] = ms.get("num_alloc_retries")
        out["num_ooms"] = ms.get("num_ooms")
        if mode == "rmm-rs-mempool":
            stats = rmm_rs.device_statistics()[device]
            out["rmm_rs_reserved_peak"] = rmm_torch.max_memory_reserved(device)
            out["rmm_rs_live_peak"] = rmm_torch.max_memory_allocated(device)
            out["rmm_rs_pool"], out["rmm_rs_stack"] = stats["pool"], stats["stack"]
    if args.log:
        rmm_rs.finalize()  # flushes the log (PyTorch's leftovers stay valid, as leaks)
        logs = os.path.join(os.path.abspath(args.log), "rmm_log.dev*.csv")
        out["log_files"] = sorted(glob.glob(logs))
    out["gpu"] = torch.cuda.get_device_name(device)
    out["versions"] = {**versions("transformers", "torchvision", "rmm-rs", "rmm-rs-torch",
                                 "nvidia-ml-py"), "torch": torch.__version__}
    print(json.dumps(out), flush=True)
    return 0


def last_json(text: str) -> Optional[Dict[str, Any]]:
    """The last line of `text` that is a JSON object, or None."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def run_child(args: argparse.Namespace, model: str, mode: str, repeat: int,
              log: Optional[str] = None) -> Dict[str, Any]:
    """Runs one mode in a fresh process of this script and returns its figures, or its error
    with the tail of its standard error."""
    cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--model", model,
           "--device", str(args.device), "--steps", str(args.steps), "--seed", str(args.seed),
           "--min-len", str(args.min_len), "--max-len", str(args.max_len),
           "--rmm-rs-pool-initial", args.rmm_rs_pool_initial,
           "--rmm-rs-max-overhead", args.rmm_rs_max_overhead, "--log-steps", str(args.log_steps)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    if log:
        cmd += ["--log", log]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    base = {"model": model, "mode": mode, "repeat": repeat, "error": None}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-3000:]
        return {**base, "error": f"timed out after {args.timeout:g} s",
                "stderr_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    result = last_json(done.stdout)
    if done.returncode != 0 or result is None:
        why = f"exit status {done.returncode}" + ("" if result else ", no JSON line")
        return {**base, **(result or {}), "error": why, "stderr_tail": done.stderr[-3000:]}
    return {**base, **result}


def gib(n: Optional[float]) -> str:
    """Bytes as GiB with 2 decimals, or n/a."""
    return "n/a" if n is None else f"{n / GIB:.2f}"


def span(values: List[Optional[float]], fmt: Callable[[Optional[float]], str]) -> str:
    """One value, or the lowest–highest of several, formatted."""
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    lo, hi = fmt(min(known)), fmt(max(known))
    return lo if lo == hi else f"{lo}–{hi}"


def print_table(model: str, runs: List[Dict[str, Any]], modes: List[str],
                skipped: Optional[str]) -> None:
    """The Markdown table of one model: a row per mode (the spread over repeats), and the
    logged run's row."""
    print(f"\n| model | allocator | median step (ms) | peak device memory used (GiB, net of "
          "context; raw) | live peak (GiB) | reserved at peak (GiB) | reserved ÷ live | "
          "loss sum |")
    print("|---|---|---|---|---|---|---|---|")
    if skipped:
        print(f"| {model} | all | skipped: {skipped} | | | | | |")
        return
    rows = [(NAMES[m], [r for r in runs if r["mode"] == m and not r["logged"]]) for m in modes]
    rows += [(f"{NAMES[r['mode']]}, logged", [r]) for r in runs if r["logged"]]
    for name, group in rows:
        good = [r for r in group if not r["error"]]
        if not good:
            if group:
                print(f"| {model} | {name} | failed | | | | | |")
            continue

        def col(key: str, fmt: Callable[[Optional[float]], str] = gib) -> str:
            return span([r.get(key) for r in good], fmt)

        ratio = [r["reserved_peak"] / r["live_peak"]
                 if r.get("reserved_peak") and r.get("live_peak") else None for r in good]
        cells = [model, name, col("median_step_ms", lambda v: f"{v:.0f}"),
                 f"{col('peak_used_net')} ({col('peak_used_raw')})", col("live_peak"),
                 col("reserved_peak"), span(ratio, lambda v: f"{v:.2f}"),
                 col("loss_sum", lambda v: f"{v:.4f}")]
        if good[0]["logged"]:
            cells[1] += f", {good[0]['steps']} steps"
        print("| " + " | ".join(cells) + " |")


def print_run(r: Dict[str, Any]) -> None:
    """One run's figures as a line (its error and standard error's tail when it failed)."""
    what = f"{r['model']} {r['mode']} " + ("logged" if r["logged"] else f"repeat {r['repeat']}")
    if r["error"]:
        print(f"{what}: FAILED ({r['error']})\n{r.get('stderr_tail', '')}", flush=True)
        return
    print(f"{what}: median {r['median_step_ms']:.1f} ms, peak used {gib(r['peak_used_net'])} "
          f"GiB net, live {gib(r['live_peak'])} GiB, reserved {gib(r['reserved_peak'])} GiB, "
          f"loss sum {r['loss_sum']:.4f}, final loss {r['final_loss']:.4f}", flush=True)
    if r.get("rmm_rs_torch_shim", "ok") != "ok":
        print(f"  without the shim rmm_rs_torch: {r['rmm_rs_torch_shim']}")
    if r.get("rmm_rs_reserved_peak"):
        print(f"  rmm-rs's pool under the MemPool: {gib(r['rmm_rs_reserved_peak'])} GiB "
              f"reserved, {gib(r['rmm_rs_live_peak'])} GiB live peak")


def check_losses(runs: List[Dict[str, Any]], rtol: float) -> List[str]:
    """Each good, unlogged run's loss sum against the first of its model: the mismatches."""
    reference: Dict[str, Dict[str, Any]] = {}
    bad = []
    for r in runs:
        if r["error"] or r["logged"]:
            continue
        ref = reference.setdefault(r["model"], r)
        a, b = ref["loss_sum"], r["loss_sum"]
        if abs(a - b) > rtol * max(abs(a), abs(b)):
            bad.append(f"{r['model']} {r['mode']} repeat {r['repeat']}: loss sum {b:.6f}, "
                       f"{ref['mode']}'s {a:.6f} (differ by more than {rtol:g} relative)")
    return bad


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default="gpt2", choices=("gpt2", "vision", "both"))
    p.add_argument("--modes", default=",".join(MODES), help="a subset of " + ",".join(MODES))
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode (order alternates)")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=None, help="default: 8 (gpt2), 32 (vision)")
    p.add_argument("--min-len", type=int, default=64, help="shortest sequence (gpt2)")
    p.add_argument("--max-len", type=int, default=1024, help="longest sequence (gpt2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--rmm-rs-pool-initial", default="1GiB", help="rmm-rs's pool.initial_size")
    p.add_argument("--rmm-rs-max-overhead", default="5%",
                   help='rmm-rs\'s pool.max_overhead ("none": no footprint limit)')
    p.add_argument("--rmm-rs-mempool-growth", default="2MiB",
                   help="rmm-rs's pool.initial_size and pool.growth under the MemPool")
    p.add_argument("--log", default=None, metavar="DIR",
                   help="also run rmm-rs once with its allocation log written under DIR")
    p.add_argument("--log-steps", type=int, default=30, help="steps of the logged run")
    p.add_argument("--rtol", type=float, default=2e-2, help="loss sums must agree to this")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--mode", default=None, choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= args.min_len <= args.max_len <= 1024:
        p.error("need 1 <= --min-len <= --max-len <= 1024 (GPT-2's positions)")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Runs every model's modes in fresh processes, prints the tables, writes the JSON; exit
    status 1 when a child failed."""
    args = parse_args(argv)
    if args.mode:
        return child(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: unknown mode {m!r}; use some of {','.join(MODES)}")
    models = ["gpt2", "vision"] if args.model == "both" else [args.model]
    results: Dict[str, Any] = {"date": datetime.date.today().isoformat(), "args": vars(args),
                               "runs": [], "skipped": {}, "gpu": None}
    runs: List[Dict[str, Any]] = results["runs"]
    try:
        for model in models:
            for repeat in range(args.repeats):
                order = modes if repeat % 2 == 0 else modes[::-1]
                for mode in order:
                    if model in results["skipped"]:
                        break
                    r = run_child(args, model, mode, repeat)
                    if "skipped" in r:
                        results["skipped"][model] = r["skipped"]
                        print(f"{model}: skipped: {r['skipped']}")
                        break
                    r.setdefault("logged", False)
                    runs.append(r)
                    print_run(r)
                    results["gpu"] = results["gpu"] or r.get("gpu")
            if args.log and model not in results["skipped"]:
                r = run_child(args, model, "rmm-rs", 0, os.path.join(args.log, model))
                r["logged"] = True
                runs.append(r)
                print_run(r)
                if not r["error"] and not r.get("log_files"):
                    print(f"{model}: WARNING: no rmm_log.dev*.csv under {args.log}/{model}")
                for path in r.get("log_files", []):
                    print(f"{model}: allocation log {path} ({os.path.getsize(path)} bytes); "
                          f"replay: rmm replay {path} --simulate-capacity 141GiB "
                          "--pool-initial 1GiB")
        first = next((r for r in runs if not r["error"]), {})
        print(f"\n## {results['gpu'] or 'GPU'}, {results['date']}: {args.steps} steps, "
              f"repeats {args.repeats}, PyTorch {first.get('versions', {}).get('torch')}, "
              f"device memory from {first.get('memory_source')}")
        for model in models:
            print_table(model, [r for r in runs if r["model"] == model], modes,
                        results["skipped"].get(model))
        bad = check_losses(runs, args.rtol)
        results["loss_mismatches"] = bad
        for line in bad:
            print(f"WARNING: {line}")
        if first and not bad:
            print(f"\nloss sums: every good run agrees to a relative {args.rtol:g}")
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)
    failed = [r for r in runs if r["error"]]
    if failed:
        print(f"FAILED: {len(failed)} run(s); see above")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
