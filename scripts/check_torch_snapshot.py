"""Opens an rmm-rs PyTorch memory snapshot with PyTorch's own viewer code.

    python3 scripts/check_torch_snapshot.py snapshot.pickle [out_dir]

Loads the pickle, renders it with torch.cuda._memory_viz (trace_plot and segment_plot) into
HTML files in out_dir, and prints what it found; exits non-zero if PyTorch cannot read it.
"""

import os
import pickle
import sys

from torch.cuda import _memory_viz


def main() -> int:
    path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "."
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    traces = snapshot["device_traces"]
    actions = {}
    for trace in traces:
        for entry in trace:
            actions[entry["action"]] = actions.get(entry["action"], 0) + 1
    print(f"{path}: {len(snapshot['segments'])} segments, {len(traces)} device trace(s)")
    print("actions:", dict(sorted(actions.items())))
    for name, render in [("trace_plot", _memory_viz.trace_plot), ("segment_plot", _memory_viz.segment_plot)]:
        html = render(snapshot)
        target = os.path.join(out, f"{os.path.basename(path)}.{name}.html")
        with open(target, "w") as f:
            f.write(html)
        print(f"{name}: {len(html)} bytes of HTML -> {target}")
    # The textual summaries PyTorch offers, as a further check that every field parses.
    print(_memory_viz.segsum(snapshot)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
