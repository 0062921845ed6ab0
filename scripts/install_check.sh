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
RMM_BACKEND=sim RMM_SIM_MEMORY=16GiB "$scratch/venv/bin/python" - "$repo/README.md" <<'EOF'
import re
import subprocess
import sys

blocks, current = [], None
for line in open(sys.argv[1]).read().splitlines():
    if current is None and line.strip() == "```python":
        current = []
    elif current is not None and line.strip() == "```":
        blocks.append("\n".join(current) + "\n")
        current = None
    elif current is not None:
        current.append(line)

ran = 0
for i, code in enumerate(blocks, 1):
    imported = {m.split(".")[0] for m in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, re.M)}
    others = sorted(imported - {"rmm_rs"} - set(sys.stdlib_module_names))
    if others:
        print(f"README snippet {i}: skipped here, it needs {', '.join(others)}")
        continue
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"README snippet {i} failed from a clean install:\n{code}\n{done.stderr}")
    print(f"README snippet {i}: ran")
    ran += 1
if ran == 0:
    sys.exit("no README snippet ran: the README has no rmm_rs-only Python snippet any more")
EOF
echo "install check: pip install ./python into a clean environment, README snippets ran"
