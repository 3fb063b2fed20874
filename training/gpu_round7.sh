#!/usr/bin/env bash
# Issue 13, round 7, for the next lent GPU machine (16 cores): round 6's Huber recipe (training/configs/
# infonet-v2-huber.yaml, run on the 2-core CPU in session 6) for 8 minutes with 15 data workers, with an EMA
# snapshot every minute. Bring back $OUT/run-h.tar; choose with python -m training.select.
set -u
out=${OUT:-/tmp/round7}
mkdir -p "$out/h"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt"
python3 -m training.train training/configs/infonet-v2-huber.yaml --device cuda --workers 15 \
    --max-minutes 8 --snapshot-every-s 60 --out "$out/h" > "$out/h/train.log" 2>&1
tail -3 "$out/h/train.log"
tar -C "$out" -cf "$out/run-h.tar" h && rm -rf "${out:?}/h"
