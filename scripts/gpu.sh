#!/usr/bin/env bash
# Runs the test suite (and, later, benchmarks and examples) on a machine with an NVIDIA GPU
# that has the driver but no Rust toolchain.
#
#   scripts/gpu.sh build   # here: archive the test binaries and release binaries into .gpu/
#   scripts/gpu.sh run     # there: run everything with RMM_BACKEND=cuda, logs into $OUT (or ./gpu-out)
#   scripts/gpu.sh multi   # there, on several GPUs: tests, runtime benchmark, demo on all (issue 15)
#   scripts/gpu.sh wheels  # here: the rmm_rs wheel and Dask's, dask-cuda's wheels into .whl/
#   scripts/gpu.sh ucx-wheels  # here: UCX for Dask and RAPIDS RMM (Python 3.12) into .whl-ucx/
#   scripts/gpu.sh python  # there: the Python tests (CuPy, PyTorch, Dask) and benchmarks
#   scripts/gpu.sh cudf-wheels  # here: cuDF 26.10 (CUDA 13) into .whl-cudf/, in call-sized slices
#   scripts/gpu.sh cudf-join    # there: the carried slices joined, checked and installed
#
# Environment of `run`: TEST_THREADS (default 4); BENCH=0 skips examples and benchmarks;
# BENCHES="runtime allocators" runs only those benchmarks (default: all); TESTS=0 skips tests.
# Environment of `python`: PYTEST=0 skips the tests, BENCH=0 the single-GPU benchmarks;
# BENCH_MULTI=1 adds python/bench/multi_gpu.py (several GPUs: dask-cuda's cluster against
# rmm-rs's over TCP and UCX, with dask-cuda's local_cupy; after python/bench/shared_copy.py,
# the same-host path between two GPUs alone), MULTI_ARGS its extra options;
# BENCH_SUITE=1 adds python/bench/dask_cuda_suite.py (dask-cuda's whole benchmark suite against
# dask-cuda's clusters, with and without enable_cudf_spill, and rmm-rs's), SUITE_ARGS its options.
#
# .gpu/ is ignored by git; carry it to the GPU machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."

# The nextest binary, from the compressed copy when only that was carried.
nextest() {
    if ! [ -x .gpu/cargo-nextest ] && [ -f .gpu/cargo-nextest.gz ]; then
        gunzip -kf .gpu/cargo-nextest.gz && chmod +x .gpu/cargo-nextest
    fi
    .gpu/cargo-nextest "$@"
}

case "${1:-}" in
build)
    mkdir -p .gpu/bin
    # The strongest compression (about 23 MB rather than 59 at the default level): the
    # archive, cargo-nextest and the tree travel in one call of at most 64 MiB.
    cargo nextest archive --workspace --exclude xtask --cargo-profile gpu-test \
        --archive-file .gpu/tests.tar.zst --zstd-level 19
    cp "$(command -v cargo-nextest)" .gpu/cargo-nextest
    strip .gpu/cargo-nextest
    # 18 MB as it is, about 7 MB compressed: carry the .gz with the archive in one call.
    gzip -kf .gpu/cargo-nextest
    cargo build --release --bins --examples
    target="${CARGO_TARGET_DIR:-target}"
    cp "$target/release/rmm" .gpu/bin/
    for e in examples/*.rs; do n=$(basename "$e" .rs); cp "$target/release/examples/$n" .gpu/bin/; done
    # Benchmarks (harness = false): one executable each, named after the bench.
    cargo bench --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        shutil.copy(m["executable"], ".gpu/bin/bench-" + m["target"]["name"])
'
    strip .gpu/bin/*
    du -sh .gpu .gpu/*
    ;;
run)
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    export RMM_BACKEND=cuda
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.txt" || true
    .gpu/bin/rmm info 2>&1 | tee "$out/info.txt"
    status=0
    if [ "${TESTS:-1}" = 1 ]; then
        set +e
        nextest nextest run --archive-file .gpu/tests.tar.zst --workspace-remap . \
            --no-fail-fast --test-threads "${TEST_THREADS:-4}" 2>&1 | tee "$out/tests.txt"
        status=${PIPESTATUS[0]}
        set -e
    fi
    echo "tests exit status: $status"
    if [ "${BENCH:-1}" = 1 ]; then
        # Every example `build` copied: the binaries of .gpu/bin named after an examples/*.rs
        # (not the rmm binary, not the bench-* executables), each with its output in
        # $out/example-NAME.txt. A failed or missing example makes the exit status non-zero.
        failed=0
        for src in examples/*.rs; do
            name=$(basename "$src" .rs)
            e=.gpu/bin/$name
            if ! [ -f "$e" ] || ! [ -x "$e" ]; then
                echo "example $name: FAILED (not in .gpu/bin: run '$0 build' first)"
                failed=$((failed + 1))
                continue
            fi
            rc=0
            "$e" > "$out/example-$name.txt" 2>&1 || rc=$?
            if [ "$rc" = 0 ]; then
                echo "example $name: ok"
            else
                echo "example $name: FAILED (exit $rc)"
                failed=$((failed + 1))
            fi
        done
        if [ "$failed" -gt 0 ]; then
            echo "examples: $failed failed (output in $out/example-*.txt)"
            if [ "$status" = 0 ]; then status=1; fi
        fi
        for b in .gpu/bin/bench-*; do
            name=$(basename "$b"); name=${name#bench-}
            if [ -n "${BENCHES:-}" ] && ! [[ " $BENCHES " == *" $name "* ]]; then continue; fi
            echo "== $(basename "$b")"
            "$b" 2>&1 | tee "$out/$(basename "$b").txt" | tail -30
        done
    fi
    exit "$status"
    ;;
multi)
    # Issue 15's one call on a machine with several GPUs (nvidia-h200-x4, or -x2 when that is
    # what is lent), after `build`: the whole test suite with every GPU visible, the runtime
    # benchmark (start-up and reinitialize on 1, 2, 4 … devices, with and without live
    # spillable data), and `rmm demo --size large` on all devices. Logs in $OUT.
    #   run(kind="nvidia-h200-x4", carry=[".gpu"], command="bash scripts/gpu.sh multi")
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    export RMM_BACKEND=cuda
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$out/gpu.txt" || true
    nvidia-smi topo -m > "$out/topology.txt" 2>&1 || true
    nproc | tee "$out/cores.txt"
    status=0
    set +e
    nextest nextest run --archive-file .gpu/tests.tar.zst --workspace-remap . \
        --no-fail-fast --test-threads "${TEST_THREADS:-8}" > "$out/tests.txt" 2>&1
    rc=$?; [ "$rc" = 0 ] || status=$rc
    grep -E "^\s+FAIL|Summary" "$out/tests.txt" | tail -20
    RMM_BENCH_VERBOSE=1 .gpu/bin/bench-runtime > "$out/bench-runtime.txt" 2>&1
    rc=$?; [ "$rc" = 0 ] || status=$rc
    cat "$out/bench-runtime.txt"
    RMM_DEVICES=all RMM_WORKERS_PER_DEVICE=4 .gpu/bin/rmm demo --size large \
        --plot "$out/demo-large.png" > "$out/demo-large.txt" 2>&1
    rc=$?; [ "$rc" = 0 ] || status=$rc
    tail -30 "$out/demo-large.txt"
    set -e
    echo "multi exit status: $status"
    exit "$status"
    ;;
wheels)
    # The GPU machine has CuPy, PyTorch and Numba but no Dask: dask-cuda 26.10 and the Dask
    # it pins travel as wheels, with the rmm_rs wheel built here.
    mkdir -p .whl
    rm -f .whl/rmm_rs-*.whl
    python3 -m pip install -q maturin
    python3 -m maturin build --quiet -m python/Cargo.toml -o .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl \
        dask==2026.7.1 distributed==2026.7.1 dask-cuda==26.10.0 rapids-dask-dependency==26.10.0 \
        partd locket tblib tornado zict
    du -sh .whl
    ;;
ucx-wheels)
    # UCX for Dask (protocol="ucx": distributed-ucxx) and RAPIDS RMM (dask-cuda's
    # rmm_pool_size, and the device buffers UCX receives into), for python/bench/multi_gpu.py;
    # with nvtx, which dask-cuda's benchmarks (local_cupy, multi_gpu.py --suite) import.
    # What each needs at run time (Requires-Dist), and where it comes from there:
    #   distributed-ucxx-cu13: pyyaml (the GPU image), rapids-dask-dependency (.whl), ucxx-cu13
    #   ucxx-cu13: cuda-core, numpy, nvidia-ml-py (the image), libucxx-cu13, rmm-cu13
    #   libucxx-cu13: librmm-cu13, libucx-cu13 (>=1.19,<1.22)
    #   libucx-cu13, rapids-logger, nvtx: nothing
    #   rmm-cu13: cuda-bindings >=13.0.1,<14 (the image's), librmm-cu13, numpy (the image)
    #   librmm-cu13: rapids-logger 0.3.*
    # 57 MB (libucx-cu13 alone is 42 MB): with the working tree that is most of what one call
    # carries (64 MiB), so .whl-ucx travels in a call of its own, and the warm machine keeps
    # it (an ignored path stays there between calls) for the `python` call that carries .whl:
    #   run(kind="nvidia-h100-x4", carry=[".whl-ucx"], command="du -sh .whl-ucx")
    #   run(carry=[".whl"], command="PYTEST=0 BENCH=0 BENCH_MULTI=1 bash scripts/gpu.sh python")
    rm -rf .whl-ucx
    mkdir -p .whl-ucx
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d .whl-ucx \
        "distributed-ucxx-cu13==0.52.*" "ucxx-cu13==0.52.*" "libucxx-cu13==0.52.*" \
        "libucx-cu13<1.22" "rmm-cu13==26.10.*" "librmm-cu13==26.10.*" rapids-logger nvtx
    # What the wheels ask for at run time, to compare with the comment above.
    python3 - .whl-ucx/*.whl <<'PY'
import sys, zipfile
for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        needs = [l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines()
                 if l.startswith("Requires-Dist:") and "extra ==" not in l]
    print(f"{path.rsplit('/', 1)[-1]}: {', '.join(needs) or '-'}")
PY
    du -sh .whl-ucx
    ;;
python)
    # After `wheels` here: carry .whl (and .whl-ucx, after `ucx-wheels`, in a call before).
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    repo=$(pwd)
    wheels=(.whl/*.whl)
    if [ -d .whl-ucx ]; then wheels+=(.whl-ucx/*.whl); fi
    # cuDF's, once `cudf-join` has left them whole and checked in .whl-cudf.
    if compgen -G ".whl-cudf/*.whl" > /dev/null; then wheels+=(.whl-cudf/*.whl); fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "${wheels[@]}"
    export PYTHONPATH=/tmp/site RMM_BACKEND=cuda PYTHONUNBUFFERED=1
    status=0
    if [ "${PYTEST:-1}" = 1 ]; then
        set +e
        (cd /tmp && python3 -m pytest -q -p no:cacheprovider -rs "$repo/python/tests" \
            > "$out/pytest.txt" 2>&1)
        status=$?
        set -e
        tail -15 "$out/pytest.txt"
    fi
    if [ "${BENCH:-1}" = 1 ]; then
        python3 python/bench/device_store.py --json "$out/device_store.json" 2>"$out/bench-device-store.err" \
            | tee "$out/bench-device-store.txt" || status=1
        python3 python/bench/allocators.py --calls 20000 --rounds 6 2>&1 \
            | tee "$out/bench-python-allocators.txt" || status=1
    fi
    if [ "${BENCH_MULTI:-0}" = 1 ]; then
        # Every visible GPU, one worker each: dask-cuda's cluster against rmm-rs's, TCP and UCX
        # (UCX is skipped, saying why, without .whl-ucx), and dask-cuda's local_cupy against
        # both. MULTI_ARGS adds options, e.g. MULTI_ARGS="--per-worker 8GiB --repeats 1".
        read -r -a multi_args <<< "${MULTI_ARGS:-}"
        # The same-host path alone first (device 0 to device 1): its rate bounds the rest.
        python3 python/bench/shared_copy.py --sender 0 --receiver 1 2>&1 \
            | tee "$out/bench-shared-copy.txt" || status=1
        python3 python/bench/multi_gpu.py --protocol tcp,ucx --suite \
            --json "$out/multi_gpu.json" ${multi_args[@]+"${multi_args[@]}"} 2>&1 \
            | tee "$out/bench-multi-gpu.txt" || status=1
    fi
    if [ "${BENCH_SUITE:-0}" = 1 ]; then
        # Every visible GPU; the benchmarks that need what is not installed (cuDF) are listed
        # as skipped. SUITE_ARGS adds options, e.g. SUITE_ARGS="--benchmarks local_cupy
        # --deadline 420".
        read -r -a suite_args <<< "${SUITE_ARGS:-}"
        python3 python/bench/dask_cuda_suite.py --json "$out/dask_cuda_suite.json" \
            ${suite_args[@]+"${suite_args[@]}"} 2>&1 \
            | tee "$out/bench-dask-cuda-suite.txt" || status=1
    fi
    exit "$status"
    ;;
cudf-wheels)
    # cuDF 26.10 for CUDA 13 (issue 40): cudf-cu13, pylibcudf-cu13, libcudf-cu13 (about 300 MB),
    # dask-cudf-cu13 and, followed through their Requires-Dist, what neither the GPU image nor
    # .whl and .whl-ucx provide, into .whl-cudf/ (each wheel's needs printed, and where each
    # comes from). Then .whl-cudf-slices/1..N: the wheels over 60 MiB split into 55 MiB pieces
    # (split -b 55M -d), the rest packed in with them, each directory one call's worth with the
    # tree (under 60 MiB), the manifest (sha256 of every wheel and piece) in the first. Prints
    # the calls, back to back while the machine is warm, the last one running `cudf-join`.
    python3 scripts/cudf_wheels.py download .whl-cudf
    python3 scripts/cudf_wheels.py slice .whl-cudf .whl-cudf-slices
    ;;
cudf-join)
    # After the calls `cudf-wheels` printed: every carried slice moved into .whl-cudf-parts,
    # each wheel joined and checked against the manifest into .whl-cudf (what is missing or
    # wrong is named, with the calls that carry it again, and nothing is installed). Then all
    # of them, with .whl and .whl-ucx when they are there, installed into $SITE (/tmp/site, as
    # `python` does), every requirement checked against what Python sees there, and cuDF
    # imported (CUDF_IMPORT=0 skips that). Safe to run again: whole wheels are not joined twice.
    site="${SITE:-/tmp/site}"
    python3 scripts/cudf_wheels.py join .whl-cudf-slices .whl-cudf-parts .whl-cudf
    wheels=(.whl-cudf/*.whl)
    for d in .whl .whl-ucx; do
        if compgen -G "$d/*.whl" > /dev/null; then wheels+=("$d"/*.whl); fi
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "${wheels[@]}"
    echo "installed into $site: ${#wheels[@]} wheels"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    python3 scripts/cudf_wheels.py check .whl-cudf
    if [ "${CUDF_IMPORT:-1}" = 1 ]; then
        python3 -c 'import cudf, dask_cudf, pylibcudf, rmm
print("cudf", cudf.__version__, "from", cudf.__file__)
print(cudf.DataFrame({"a": [1, 2, 3]}).a.sum())'
    fi
    ;;
*)
    echo "usage: $0 build|run|multi|wheels|ucx-wheels|python|cudf-wheels|cudf-join" >&2
    exit 2
    ;;
esac
