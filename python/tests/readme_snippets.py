"""The README's ```python blocks, and (run as a script) those of them that need nothing but
rmm_rs run one by one: what `scripts/install_check.sh` runs from a clean install. No test
dependency is imported here, so that a bare virtual environment can run it.

    python python/tests/readme_snippets.py README.md
"""

import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional


def python_snippets(readme: Path) -> List[str]:
    """The README's ```python blocks, in order."""
    blocks: List[str] = []
    current: Optional[List[str]] = None
    for line in readme.read_text().splitlines():
        if current is None and line.strip() == "```python":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def run_rmm_rs_only(readme: Path) -> int:
    """Runs each snippet that imports nothing but rmm_rs and the standard library, in a
    process of its own (the others are named as skipped); 1 when one fails or none ran."""
    ran = 0
    for i, code in enumerate(python_snippets(readme), 1):
        imported = {
            m.split(".")[0] for m in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, re.M)
        }
        others = sorted(imported - {"rmm_rs"} - set(sys.stdlib_module_names))
        if others:
            print(f"README snippet {i}: skipped here, it needs {', '.join(others)}")
            continue
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"README snippet {i} failed:\n{code}\n{done.stderr}", file=sys.stderr)
            return 1
        print(f"README snippet {i}: ran")
        ran += 1
    if ran == 0:
        print("no README snippet ran: the README has no rmm_rs-only snippet", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_rmm_rs_only(Path(sys.argv[1])))
