set -x
export RMM_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
date -u > $OUT/date.txt
RMM_WORKERS_PER_DEVICE=4 RMM_LOG='rmm::spill::copy=trace,rmm::spill=debug,rmm_allocator::resource::pinned_host_pool=debug' timeout 150 .gpu/bin/rmm demo --size large --json > $OUT/demo4_trace.json 2> $OUT/demo4_trace.log
RMM_WORKERS_PER_DEVICE=4 timeout 150 .gpu/bin/rmm demo --size large --plot $OUT/timeline-large-4w.png > $OUT/demo4.txt 2>&1
RMM_WORKERS_PER_DEVICE=4 timeout 150 .gpu/bin/rmm demo --size large > $OUT/demo4b.txt 2>&1
mkdir -p $OUT/bridge $OUT/bridge1
PYTEST=0 OUT=$OUT/bridge timeout 200 bash scripts/gpu_bridge.sh run > $OUT/bridge.txt 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 python/librmm_bridge/bench/bridge_bench.py --client /tmp/librmm_client.so --threads 1 --rounds 3 --no-torch > $OUT/bridge1/bench.txt 2>&1
date -u >> $OUT/date.txt
