#!/usr/bin/env bash
# The librmm bridge (python/librmm_bridge) on a machine with an NVIDIA GPU and no network:
# RAPIDS RMM's wheels travel from here, the bridge and the C++ librmm client are built there.
# `run` also builds the PyTorch shim (python/torch_bridge, rmm_rs_torch) where python3 imports
# torch and g++ is installed, and runs the PyTorch allocator's tests.
#
#   scripts/gpu_bridge.sh wheels   # here: RMM's wheels (Python 3.12) into .whl-bridge/, and
#                                  # the rmm_rs wheel with Dask's (scripts/gpu.sh wheels) in .whl/
#   scripts/gpu_bridge.sh run      # there: build, GPU tests, benchmarks; logs into $OUT
#
# The GPU call carries .whl and .whl-bridge (both ignored by git):
#   run(carry=[".whl", ".whl-bridge"], command="bash scripts/gpu_bridge.sh run")
#
# Environment of `run`: PYTEST=0 skips the tests, BENCH=0 the benchmarks; ROUNDS (default 5),
# ITERATIONS (C++ allocations per thread and round, default 20000), CALLS (Python calls per
# round, default 20000). Logs: build-torch-shim.txt, pytest-torch.txt besides the bridge's.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
wheels)
    bash scripts/gpu.sh wheels
    rm -rf .whl-bridge
    mkdir -p .whl-bridge
    # RMM 26.10 for CUDA 13 and what it needs at run time, CUDA's runtime headers (used only
    # where the toolkit's are missing), and the build backend with Cython.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl-bridge \
        rmm-cu13==26.10.0 librmm-cu13==26.10.0 rapids-logger==0.3.0 \
        cuda-bindings cuda-pathfinder nvidia-cuda-runtime nvidia-cuda-crt \
        "cython>=3.1" "setuptools>=77" wheel
    du -sh .whl .whl-bridge
    ;;
run)
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    repo=$(pwd)
    site=/tmp/site
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt" || true
    python3 --version | tee -a "$out/gpu.txt"
    cuda_headers=0
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
        if [ -n "$d" ] && [ -f "$d/include/cuda_runtime_api.h" ]; then cuda_headers=1; fi
    done
    wheels=(.whl-bridge/*.whl)
    if [ "$cuda_headers" = 1 ]; then
        # The toolkit's headers: the wheels' CUDA runtime stays out of the process.
        wheels=($(ls .whl-bridge/*.whl | grep -v -e nvidia_cuda_runtime -e nvidia_cuda_crt))
    fi
    if [ -d .whl ]; then wheels+=(.whl/*.whl); fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "${wheels[@]}" 2>&1 | tee "$out/install.txt"
    export PYTHONPATH="$site" PYTHONUNBUFFERED=1
    status=0
    # The bridge, built against the installed RMM wheels.
    if ! python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir \
        --target "$site" --upgrade python/librmm_bridge > "$out/build-bridge.txt" 2>&1; then
        echo "building the bridge FAILED:"; tail -30 "$out/build-bridge.txt"
        exit 1
    fi
    python3 -c "import rmm, rmm_rs_librmm; print('rmm', rmm.__version__, rmm_rs_librmm.RmmRsMemoryResource)" \
        2>&1 | tee -a "$out/build-bridge.txt"
    # The C++ librmm client (tests and benchmark), against the same headers and librmm.so.
    client=/tmp/librmm_client.so
    inc=(-I"$site/librmm/include" -I"$site/librmm/include/rapids" -I"$site/rapids_logger/include")
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "$site/nvidia/cu13"; do
        if [ -n "$d" ] && [ -f "$d/include/cuda_runtime_api.h" ]; then inc+=(-I"$d/include"); break; fi
    done
    g++ -std=c++20 -O2 -shared -fPIC -o "$client" python/librmm_bridge/librmm_client.cpp \
        "${inc[@]}" -L"$site/librmm/lib64" -lrmm 2>&1 | tee "$out/build-client.txt"
    export RMM_BACKEND=cuda LIBRMM_BRIDGE_REQUIRED=1 LIBRMM_BRIDGE_CLIENT="$client"
    # The PyTorch shim, against the installed PyTorch: best effort (without it, its tests
    # skip and install() falls back, warning).
    export TORCH_SHIM_REQUIRED=0
    if ! python3 -c "import torch" > /dev/null 2>&1; then
        echo "torch shim: NOT built: python3 cannot import torch" | tee "$out/build-torch-shim.txt"
    elif ! command -v g++ > /dev/null; then
        echo "torch shim: NOT built: no g++ on PATH" | tee "$out/build-torch-shim.txt"
    elif python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir \
        --target "$site" --upgrade python/torch_bridge > "$out/build-torch-shim.txt" 2>&1 &&
        python3 -c "import torch, rmm_rs_torch; print('torch', torch.__version__, rmm_rs_torch.LIBRARY)" \
            >> "$out/build-torch-shim.txt" 2>&1; then
        TORCH_SHIM_REQUIRED=1
        echo "torch shim: built: $(tail -1 "$out/build-torch-shim.txt")"
    else
        echo "torch shim: building FAILED (its tests skip; log in build-torch-shim.txt):"
        tail -30 "$out/build-torch-shim.txt"
    fi
    if [ "${PYTEST:-1}" = 1 ]; then
        set +e
        (cd /tmp && python3 -m pytest -q -p no:cacheprovider -rs \
            "$repo/python/tests/test_librmm_functions.py" \
            "$repo/python/tests/test_rmm_bridge.py" \
            "$repo/python/tests/test_rmm_bridge_gpu.py" > "$out/pytest-bridge.txt" 2>&1)
        status=$?
        tail -25 "$out/pytest-bridge.txt"
        # PyTorch's allocators: the shim (no GPU needed), install() with and without it, and
        # test_gpu_store.py's PyTorch tests (those need CuPy and the Dask wheels of .whl).
        (cd /tmp && python3 -m pytest -q -p no:cacheprovider -rs \
            "$repo/python/tests/test_torch_install.py" \
            "$repo/python/tests/test_torch_shim.py" \
            "$repo/python/tests/test_torch_allocator_gpu.py" \
            "$repo/python/tests/test_gpu_store.py" -k "torch" > "$out/pytest-torch.txt" 2>&1)
        rc=$?; [ "$rc" = 0 ] || status=$rc
        set -e
        tail -25 "$out/pytest-torch.txt"
    fi
    if [ "${BENCH:-1}" = 1 ]; then
        python3 python/bench/librmm_bridge.py --client "$client" \
            --rounds "${ROUNDS:-5}" --iterations "${ITERATIONS:-20000}" --calls "${CALLS:-20000}" \
            --json "$out/bridge-bench.json" 2>&1 | tee "$out/bridge-bench.txt" || status=1
    fi
    echo "gpu_bridge exit status: $status"
    exit "$status"
    ;;
*)
    echo "usage: $0 wheels|run" >&2
    exit 2
    ;;
esac
