#!/usr/bin/env bash
# Issue 13, round 3 on one lent GPU machine (16 cores): the gated two-smoother network from v1, 5.5 minutes.
set -u
out=${OUT:-/tmp/round3}
mkdir -p "$out/c"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt"
python3 -m training.train training/configs/infonet-v2-gated.yaml --device cuda --max-minutes 5.5 --out "$out/c" \
    > "$out/c/train.log" 2>&1
tail -3 "$out/c/train.log"
tar -C "$out" -cf "$out/run-c.tar" c && rm -rf "${out:?}/c"
