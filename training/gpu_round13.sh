#!/usr/bin/env bash
# Issue 13 on one lent GPU machine (16 cores), about 9.5 minutes in all:
# 1. the CUDA path with the shipped infonet-v2 (bench.gpu_path, 100 s budget; it had only run with infonet-v1);
# 2. rounds 13a and 13b side by side from the shipped weights, 6.5 minutes, 7 data workers each, an EMA snapshot
#    every minute. Bring back $OUT/run-a.tar and run-b.tar; choose with python -m training.select.
set -u
out=${OUT:-/tmp/round13}
mkdir -p "$out/a" "$out/b"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt"
timeout 170 python3 -m bench.gpu_path --budget-s 100 > "$out/gpu_path.log" 2>&1
find bench/results -name "gpu_path_*" -newer "$out/device.txt" -exec cp {} "$out/" \;
for v in a b; do
    python3 -m training.train "training/configs/infonet-v2-round13$v.yaml" --device cuda --max-minutes 6.5 \
        --out "$out/$v" > "$out/$v/train.log" 2>&1 &
done
wait
for v in a b; do tail -2 "$out/$v/train.log"; tar -C "$out" -cf "$out/run-$v.tar" "$v" && rm -rf "${out:?}/$v"; done
ls -la "$out"
