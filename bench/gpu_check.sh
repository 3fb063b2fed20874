#!/usr/bin/env bash
# The lent-GPU check of the CUDA path, one call: bench.gpu_path (variants at 1,024 channels, then 256 / 1,024 /
# 4,096 channels with the fastest variant within 0.005 nats of the CPU path). Result files land in $OUT.
# Carry bench/cache (the Table 2 windows, python -m bench.gpu_path --dry-run writes them).
set -u -o pipefail
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} STREAMCORR_BENCH_RESULTS=$out
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/device.txt"
timeout "${GPU_CHECK_S:-470}" python3 -m bench.gpu_path --budget-s "${GPU_BUDGET_S:-330}" "$@" 2>&1 | tee "$out/gpu_path.log"
status=$?
cat "$out/device.txt"
exit $status
