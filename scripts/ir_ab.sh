#!/usr/bin/env bash
# Instruction counts of the pool's allocate and deallocate, per call, for two builds of the
# `rmm` command: the same traces through `rmm bench --resources pool` on the unbacked simulated
# device, under valgrind's callgrind (threads run one at a time there, so the counts are the
# work each call does, free of the host's noise and of lock contention).
#
#   scripts/ir_ab.sh OLD_RMM NEW_RMM [SHAPES] [SCALE]
#
# OLD_RMM and NEW_RMM are `rmm` binaries built with debug info (the release profile has it);
# SHAPES defaults to every shape, SCALE to small. Prints Ir per call and new ÷ old per shape.
set -euo pipefail
old=${1:?old rmm binary}
new=${2:?new rmm binary}
shapes=${3:-churn,random,small,mt8,mt16,mt8-shared,mt16-shared}
scale=${4:-small}
command -v valgrind >/dev/null || { echo "ir_ab.sh needs valgrind (callgrind)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
per_call() {
    (cd "$work" && callgrind_annotate --auto=no --tree=caller "$1" 2>/dev/null) | grep -E "\([0-9,]+x\)" -A1 | python3 -c '
import re, sys
lines = sys.stdin.read().split("\n")
total = {"allocate": [0, 0], "deallocate": [0, 0]}
for caller, callee in zip(lines, lines[1:]):
    m = re.match(r"\s*([\d,]+) .*\(([\d,]+)x\)", caller)
    k = re.search(r"PoolMemoryResource as [\w:]*DeviceMemoryResource>::(allocate|deallocate) \[", callee)
    if m and k and "*" in callee:
        t = total[k.group(1)]
        t[0] += int(m.group(1).replace(",", ""))
        t[1] += int(m.group(2).replace(",", ""))
for name, (ir, calls) in total.items():
    print(f"{ir / calls:.1f}" if calls else "nan", end=" ")
'
}
printf '%-12s %28s %28s %14s\n' shape "old Ir/call (alloc, free)" "new Ir/call (alloc, free)" "new ÷ old"
for shape in ${shapes//,/ }; do
    for side in old new; do
        bin=$old; [ "$side" = new ] && bin=$new
        RMM_BACKEND=sim valgrind --tool=callgrind --callgrind-out-file="$work/$side.$shape" \
            "$bin" bench --resources pool --shapes "$shape" --scale "$scale" >/dev/null 2>&1
    done
    read -r oa of <<<"$(per_call "$work/old.$shape")"
    read -r na nf <<<"$(per_call "$work/new.$shape")"
    ratio=$(python3 -c "print(f'{($na + $nf) / ($oa + $of):.3f}')")
    printf '%-12s %28s %28s %14s\n' "$shape" "$oa, $of" "$na, $nf" "$ratio"
done
