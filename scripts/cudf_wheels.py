#!/usr/bin/env python3
"""cuDF 26.10 for CUDA 13 on the GPU machine (issue 40), in pieces a call can carry.

A call carries at most 64 MiB (the tracked tree, about 4 MiB, with it) and libcudf's wheel
alone is about 300 MB, so the wheels travel split into slices, one directory a call, back to
back while the machine is warm (it keeps ignored files between calls for about 30 s), and are
joined there. scripts/gpu.sh runs this:

  cudf_wheels.py download DEST          here: the wheels and what they need into DEST
  cudf_wheels.py slice DEST SLICES      here: DEST in directories SLICES/1..N, one call each
  cudf_wheels.py join SLICES PARTS DEST there: SLICES/*/ moved into PARTS, joined, checked
                                        against the manifest into DEST (only whole, verified
                                        wheels ever reach DEST)
  cudf_wheels.py check DEST             there: every requirement of DEST's wheels (the extras
                                        they ask of others too) against what Python sees

`download` follows Requires-Dist (no lines of the wheel's own extras; a requirement's own
extras, such as numba-cuda-mlir[cu13], are followed for the wheels carried) and fetches only
what neither the GPU image nor the .whl/.whl-ucx sets provide. What the image holds is
the device machines' documented list (read 2026-11-17), without versions: `check`
reads the versions there.
"""
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections import defaultdict

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # here packaging may be only pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

MIB = 1 << 20
ROOTS = ["cudf-cu13==26.10.*", "pylibcudf-cu13==26.10.*", "libcudf-cu13==26.10.*",
         "dask-cudf-cu13==26.10.*"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "any"]
# The GPU machine's Python, for the markers of Requires-Dist.
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "os_name": "posix",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# The image's Python packages, as documented for the device machines (read 2026-11-17).
IMAGE = set("""
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
    prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
    statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
    torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
    typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
# What scripts/gpu.sh's `wheels` (.whl) and `ucx-wheels` (.whl-ucx) carry.
SETS = {
    ".whl": {"dask", "distributed", "dask-cuda", "rapids-dask-dependency", "partd", "locket",
             "tblib", "tornado", "zict"},
    ".whl-ucx": {"distributed-ucxx-cu13", "ucxx-cu13", "libucxx-cu13", "libucx-cu13",
                 "rmm-cu13", "librmm-cu13", "rapids-logger", "nvtx"},
}
# Carried although the image has them: cuDF 26.10 pins pandas>=3.0,<3.1, the image's version
# is not known here, and pandas 3.1 is out; libcudf asks for nvidia-nvjitlink>=13.3, the image
# has 13.0 (read 2026-11-28); the image's NumPy (2.5) lacks np.row_stack, which numba-cuda
# (every version cuDF accepts) calls as cuDF imports it. CUDF_CARRY_ANYWAY="" carries none.
CARRY_ANYWAY = set(os.environ.get("CUDF_CARRY_ANYWAY", "pandas nvidia-nvjitlink numpy").split())
# Bounds beyond the wheels' own Requires-Dist, for what is carried: NumPy before 2.5 (above).
CONSTRAINTS = {"numpy": SpecifierSet("<2.5")}
SLICE = "55M"  # split -b: the largest piece
DIR_MAX = 60 * MIB  # a slice directory at most; with the tree, a call stays under 64 MiB
MANIFEST = "MANIFEST"


def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def where_provided(name):
    if name in CARRY_ANYWAY:
        return None
    if name in IMAGE:
        return "the image"
    for label, names in SETS.items():
        if name in names:
            return label
    return None


def wheel_name_version(filename):
    parts = filename[:-len(".whl")].split("-")
    return canon(parts[0]), Version(parts[1])


def metadata_lines(path):
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist()
                    if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return z.read(meta).decode().splitlines()


def requires(path):
    return [Requirement(line.split(":", 1)[1].strip())
            for line in metadata_lines(path) if line.startswith("Requires-Dist:")]


def applies(req, extra):
    """Whether req is needed when `extra` is asked for ("" = none) and not without it."""
    if req.marker is None:
        return extra == ""
    on = req.marker.evaluate(dict(MARKER_ENV, extra=extra))
    if extra == "":
        return on
    return on and not req.marker.evaluate(dict(MARKER_ENV, extra=""))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def download(dest):
    """Fetch ROOTS and, round by round, what they need that nothing else provides."""
    os.makedirs(dest, exist_ok=True)
    asked = defaultdict(list)      # name -> [(requirement, who asked)]
    have = {}                      # name -> wheel file carried
    extras = defaultdict(set)      # name -> extras asked of it
    done = defaultdict(set)        # name -> extras ("" = none) whose requirements were followed
    pending = [(Requirement(r), "(cuDF)") for r in ROOTS]
    while pending:
        fetch = {}
        for req, who in pending:
            name = canon(req.name)
            asked[name].append((req, who))
            if where_provided(name):
                continue
            extras[name] |= set(req.extras)
            if name not in have:
                fetch[name] = (fetch.get(name, SpecifierSet()) & req.specifier
                               & CONSTRAINTS.get(name, SpecifierSet()))
        pending = []
        if fetch:
            specs = [name + str(spec) for name, spec in sorted(fetch.items())]
            print("pip download:", " ".join(specs), flush=True)
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                   "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
            for p in PLATFORMS:
                cmd += ["--platform", p]
            if subprocess.run(cmd + ["-d", dest] + specs).returncode != 0:
                fail(f"pip download failed for {' '.join(specs)}")
            for name, spec in fetch.items():
                found = []
                for f in os.listdir(dest):
                    if f.endswith(".whl"):
                        n, v = wheel_name_version(f)
                        if n == name and spec.contains(v, prereleases=True):
                            found.append((v, f))
                if not found:
                    fail(f"no wheel of {name}{spec} in {dest} after pip download")
                have[name] = os.path.join(dest, max(found)[1])
        for name, path in sorted(have.items()):
            for extra in ({""} | extras[name]) - done[name]:
                done[name].add(extra)
                for req in requires(path):
                    if applies(req, extra):
                        pending.append((req, name + (f"[{extra}]" if extra else "")))
    # Every specifier asked of a carried wheel holds for the version carried.
    for name, path in have.items():
        version = wheel_name_version(os.path.basename(path))[1]
        for req, who in asked[name]:
            if not req.specifier.contains(version, prereleases=True):
                fail(f"{who} asks for {req}, but {os.path.basename(path)} was carried")
    carried = {os.path.basename(p) for p in have.values()}
    for f in sorted(os.listdir(dest)):
        if f.endswith(".whl") and f not in carried:
            print(f"removed (not needed now): {f}")
            os.remove(os.path.join(dest, f))

    print("\nWhat each wheel asks for at run time (Requires-Dist, no extras of its own):")
    for path in sorted(have.values()):
        needs = [str(r) for r in requires(path) if applies(r, "")]
        print(f"  {os.path.basename(path)}: {', '.join(needs) or '-'}")
    print("\nEach requirement, and where it comes from on the GPU machine:")
    for name in sorted(asked):
        specs = sorted({str(r.specifier) for r, _ in asked[name] if str(r.specifier)})
        ex = sorted({e for r, _ in asked[name] for e in r.extras})
        who = sorted({w for _, w in asked[name]})
        what = name + (f"[{','.join(ex)}]" if ex else "") + (" " + " ".join(specs) if specs else "")
        src = where_provided(name)
        if src is None:
            src = f"carried: {os.path.basename(have[name])}"
            if name in CARRY_ANYWAY:
                src += " (the image has it, at a version not known here)"
        elif ex and src == "the image":
            src += " (its extras: `cudf-join` checks them there)"
        print(f"  {what}  <- {', '.join(who)}\n      {src}")
    total = sum(os.path.getsize(p) for p in have.values())
    print(f"\n{len(have)} wheels, {total / MIB:.1f} MiB in {dest}/")


def tree_bytes():
    """The working tree a call carries: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sum(os.path.getsize(p) for p in out.decode().split("\0") if os.path.isfile(p))


def slice_wheels(dest, slices):
    """Split each wheel over the limit into 55 MiB pieces and pack the pieces and the other
    wheels into directories (first fit, largest first), each one call's worth."""
    tree = tree_bytes()
    limit = min(DIR_MAX, 64 * MIB - tree - MIB)
    if 55 * MIB >= limit:
        fail(f"the tree is {tree / MIB:.1f} MiB: a 55 MiB slice no longer fits in a call")
    subprocess.run(["rm", "-rf", slices], check=True)
    tmp = os.path.join(slices, ".split")
    os.makedirs(tmp)
    wheels = sorted(f for f in os.listdir(dest) if f.endswith(".whl"))
    if not wheels:
        fail(f"no wheels in {dest}: run `scripts/gpu.sh cudf-wheels` first")
    pieces = []                    # (bytes, piece, wheel, path)
    for w in wheels:
        path = os.path.join(dest, w)
        if os.path.getsize(path) > limit:
            subprocess.run(["split", "-b", SLICE, "-d", path, os.path.join(tmp, w + ".part.")],
                           check=True)
            for p in sorted(f for f in os.listdir(tmp) if f.startswith(w + ".part.")):
                pieces.append((os.path.getsize(os.path.join(tmp, p)), p, w,
                               os.path.join(tmp, p)))
        else:
            pieces.append((os.path.getsize(path), w, w, path))
    dirs = [[64 * 1024, []]]       # [bytes used, pieces]: the first keeps room for the manifest
    for piece in sorted(pieces, key=lambda p: (-p[0], p[1])):
        for d in dirs:
            if d[0] + piece[0] <= limit:
                break
        else:
            d = [0, []]
            dirs.append(d)
        d[0] += piece[0]
        d[1].append(piece)
    lines = ["# scripts/gpu.sh cudf-wheels: each wheel, then each piece and its slice directory",
             "# wheel SHA256 BYTES NAME PIECES", "# piece SHA256 BYTES NAME WHEEL SLICE"]
    for w in wheels:
        path = os.path.join(dest, w)
        n = sum(1 for p in pieces if p[2] == w)
        lines.append(f"wheel {sha256(path)} {os.path.getsize(path)} {w} {n}")
    for i, (_, ps) in enumerate(dirs, 1):
        os.makedirs(os.path.join(slices, str(i)))
        for size, p, w, path in sorted(ps, key=lambda p: p[1]):
            target = os.path.join(slices, str(i), p)
            if path.startswith(tmp):
                os.rename(path, target)
            else:
                try:
                    os.link(path, target)
                except OSError:
                    subprocess.run(["cp", path, target], check=True)
            lines.append(f"piece {sha256(target)} {size} {p} {w} {i}")
    with open(os.path.join(slices, "1", MANIFEST), "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rmdir(tmp)

    print(f"\nSlice directories (at most {limit / MIB:.2f} MiB each: the tree is "
          f"{tree / MIB:.2f} MiB of a call's 64 MiB):")
    for i in range(1, len(dirs) + 1):
        d = os.path.join(slices, str(i))
        files = sorted(os.listdir(d))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        print(f"  {d}/  {size / MIB:6.2f} MiB  {', '.join(files)}")
        if size > limit:
            fail(f"{d} is {size} bytes, over {limit}")
    # .whl-ucx (rmm-cu13, librmm-cu13: cuDF needs them) is 57 MB, a call of its own; .whl
    # (Dask, rapids-dask-dependency) rides with the last slice when they fit together.
    last = len(dirs)
    last_size = sum(p[0] for p in dirs[-1][1]) + (64 * 1024 if last == 1 else 0)
    whl = sum(os.path.getsize(os.path.join(".whl", f)) for f in os.listdir(".whl")
              if f.endswith(".whl")) if os.path.isdir(".whl") else None
    with_whl = whl is not None and last_size + whl <= limit
    print("\nThe calls, back to back (a warm machine keeps ignored files for about 30 s after "
          "each call),\nafter `scripts/gpu.sh wheels` and `ucx-wheels` here; the last one "
          "joins and installs:")
    print('  run(carry=[".whl-ucx"], command="du -sh .whl-ucx")')
    if not with_whl:
        print('  run(carry=[".whl"], command="du -sh .whl")')
    for i in range(1, last):
        print(f'  run(carry=["{slices}/{i}"], command="du -sh {slices}/{i}")')
    carry = f'"{slices}/{last}"' + (', ".whl"' if with_whl else "")
    print(f'  run(carry=[{carry}], command="bash scripts/gpu.sh cudf-join")')


def join(slices, parts, dest):
    """Move what the calls carried into PARTS, join and check each wheel into DEST."""
    os.makedirs(parts, exist_ok=True)
    os.makedirs(dest, exist_ok=True)
    if os.path.isdir(slices):
        for d in sorted(os.listdir(slices), key=lambda s: (len(s), s)):
            src = os.path.join(slices, d)
            if not os.path.isdir(src):
                continue
            moved = sorted(os.listdir(src))
            for f in moved:
                os.replace(os.path.join(src, f), os.path.join(parts, f))
            if moved:
                print(f"{src}: {len(moved)} file(s) moved into {parts}/")
    manifest = os.path.join(parts, MANIFEST)
    if not os.path.isfile(manifest):
        fail(f"no {MANIFEST} in {parts}/: it travels in {slices}/1; carry it:\n"
             f'  run(carry=["{slices}/1"], command="bash scripts/gpu.sh cudf-join")')
    wheels, pieces = {}, defaultdict(list)
    with open(manifest) as f:
        for line in f:
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if fields[0] == "wheel":
                wheels[fields[3]] = (fields[1], int(fields[2]), int(fields[4]))
            elif fields[0] == "piece":
                pieces[fields[4]].append((fields[3], fields[1], int(fields[2]), fields[5]))
    problems, recarry = [], set()
    for w, (digest, size, n) in sorted(wheels.items()):
        final = os.path.join(dest, w)
        if os.path.isfile(final) and os.path.getsize(final) == size and sha256(final) == digest:
            print(f"ok   {w} (joined before)")
            continue
        ps = sorted(pieces[w])
        if len(ps) != n:
            fail(f"{manifest} lists {len(ps)} of the {n} pieces of {w}: "
                 "make the slices again here (scripts/gpu.sh cudf-wheels)")
        bad = []
        for p, pdigest, psize, where in ps:
            path = os.path.join(parts, p)
            if not os.path.isfile(path):
                bad.append((p, where, "missing"))
            elif os.path.getsize(path) != psize or sha256(path) != pdigest:
                bad.append((p, where, f"wrong ({os.path.getsize(path)} bytes, "
                                      f"{psize} expected, or its sha256 differs)"))
        if bad:
            for p, where, why in bad:
                problems.append(f"{w}: piece {p} is {why}; it travels in {slices}/{where}")
                recarry.add(where)
            continue
        tmp = os.path.join(dest, f".{w}.joining")
        with open(tmp, "wb") as out:   # cat part.00 part.01 ... > wheel
            for p, *_ in ps:
                with open(os.path.join(parts, p), "rb") as f:
                    while chunk := f.read(4 * MIB):
                        out.write(chunk)
        if sha256(tmp) != digest:
            os.remove(tmp)
            problems.append(f"{w}: its pieces check but the joined wheel does not: "
                            "make the slices again here (scripts/gpu.sh cudf-wheels)")
            continue
        os.replace(tmp, final)
        for p, *_ in ps:
            os.remove(os.path.join(parts, p))
        print(f"ok   {w} ({n} piece{'s' if n > 1 else ''}, sha256 checked)")
    for f in sorted(os.listdir(dest)):
        if f.endswith(".whl") and f not in wheels:
            print(f"removed {dest}/{f}: not in {MANIFEST}")
            os.remove(os.path.join(dest, f))
    if problems:
        print("\n".join(["", "NOT JOINED (nothing installed):"] + problems), file=sys.stderr)
        if recarry:
            order = sorted(recarry, key=int)
            print("Carry these again, back to back, the last with the join:", file=sys.stderr)
            for i, where in enumerate(order):
                cmd = ("bash scripts/gpu.sh cudf-join" if i == len(order) - 1
                       else f"du -sh {slices}/{where}")
                print(f'  run(carry=["{slices}/{where}"], command="{cmd}")', file=sys.stderr)
        sys.exit(1)
    print(f"{len(wheels)} wheels whole and checked in {dest}/")


def show(req):
    return f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}" \
        f"{req.specifier}"


def check(dest):
    """Every requirement of DEST's wheels, followed through what is installed (with the extras
    asked of each), against the distributions this Python sees, PYTHONPATH first. It fails on
    one that a wheel of DEST asks for plainly and nothing provides. Reported only: a version
    outside what is asked (the image's numba, say: cuDF 26.10 pins numba<0.65, whose numba needs
    numpy<2.5, and the image has numpy 2.5); one missing that only an extra asks for
    (cupy-cuda13x[ctk]'s CUDA wheels, for which the image's own CUDA toolkit may stand in), or
    that a package from elsewhere asks for (rapids-dask-dependency's bokeh, Dask's dashboard)."""
    from importlib.metadata import distributions
    installed = {}
    for dist in distributions():
        if dist.metadata["Name"]:
            installed.setdefault(canon(dist.metadata["Name"]), dist)
    carried = set()
    todo = []                      # (requirement, who asked, reached through an extra)
    for f in sorted(os.listdir(dest)):
        if f.endswith(".whl"):
            name = wheel_name_version(f)[0]
            carried.add(name)
            todo += [(r, name, False) for r in requires(os.path.join(dest, f)) if applies(r, "")]
    fatal, notes, seen, followed = set(), set(), set(), set()
    while todo:
        req, who, via_extra = todo.pop()
        name = canon(req.name)
        key = (name, str(req.specifier), tuple(sorted(req.extras)), who, via_extra)
        if key in seen:
            continue
        seen.add(key)
        dist = installed.get(name)
        if dist is None:
            if via_extra:
                notes.add(f"missing, asked only through an extra: {show(req)} (by {who})")
            elif canon(who.split("[")[0]) not in carried:
                notes.add(f"missing, asked by a package cuDF's wheels do not carry: {show(req)} "
                          f"(by {who})")
            else:
                fatal.add(f"MISSING: {show(req)} (asked by {who})")
            continue
        if not req.specifier.contains(Version(dist.version), prereleases=True):
            notes.add(f"version outside what is asked: {show(req)} (by {who}): "
                      f"{dist.version} is there")
        reqs = [Requirement(s) for s in (dist.requires or [])]
        for extra in {""} | set(req.extras):
            if (name, extra, via_extra) not in followed:
                followed.add((name, extra, via_extra))
                asker = name + (f"[{extra}]" if extra else "")
                todo += [(r, asker, via_extra or extra != "") for r in reqs if applies(r, extra)]
    print(f"requirements of {dest}'s wheels, followed through what is installed: "
          f"{len({k[0] for k in seen})} distributions")
    for line in sorted(notes) + sorted(fatal):
        print(f"  {line}")
    if fatal:
        print(f"{len(fatal)} requirement(s) of cuDF's wheels missing: carry them as wheels",
              file=sys.stderr)
        sys.exit(1)
    print("every requirement of cuDF's wheels is there")


if __name__ == "__main__":
    commands = {"download": download, "slice": slice_wheels, "join": join, "check": check}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        fail(f"usage: {sys.argv[0]} download DEST | slice DEST SLICES | join SLICES PARTS DEST "
             "| check DEST")
    commands[sys.argv[1]](*sys.argv[2:])
