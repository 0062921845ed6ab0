#!/usr/bin/env bash
# The package as a user installs it: `pip install ./python` into a new, clean virtual
# environment, then every README Python snippet that needs nothing but rmm_rs, run verbatim
# from a directory outside the repository on the simulated device. CI runs it after the tests
# (whose wheel build it reuses); the snippets that need Dask or CuPy run in `cargo xtask test`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet ./python
mkdir "$scratch/work"
cd "$scratch/work"
RMM_BACKEND=sim RMM_SIM_MEMORY=16GiB "$scratch/venv/bin/python" \
    "$repo/python/tests/readme_snippets.py" "$repo/README.md"
echo "install check: pip install ./python into a clean environment, README snippets ran"
