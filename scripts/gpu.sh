#!/usr/bin/env bash
# Runs the test suite (and, later, benchmarks and examples) on a machine with an NVIDIA GPU
# that has the driver but no Rust toolchain.
#
#   scripts/gpu.sh build   # here: archive the test binaries and release binaries into .gpu/
#   scripts/gpu.sh run     # there: run everything with RMM_BACKEND=cuda, logs into $OUT (or ./gpu-out)
#
# .gpu/ is ignored by git; carry it to the GPU machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
build)
    mkdir -p .gpu/bin
    cargo nextest archive --workspace --cargo-profile gpu-test --archive-file .gpu/tests.tar.zst
    cp "$(command -v cargo-nextest)" .gpu/cargo-nextest
    cargo build --release --bins
    for b in rmm; do cp "target/release/$b" .gpu/bin/ && strip ".gpu/bin/$b"; done
    du -sh .gpu .gpu/*
    ;;
run)
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    export RMM_BACKEND=cuda
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.txt" || true
    .gpu/bin/rmm info 2>&1 | tee "$out/info.txt"
    set +e
    .gpu/cargo-nextest nextest run --archive-file .gpu/tests.tar.zst --workspace-remap . \
        --no-fail-fast --test-threads "${TEST_THREADS:-4}" 2>&1 | tee "$out/tests.txt"
    status=${PIPESTATUS[0]}
    set -e
    echo "tests exit status: $status"
    exit "$status"
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
