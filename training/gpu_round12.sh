#!/usr/bin/env bash
# Issue 13, for the next lent GPU machine (16 cores): round 11's recipe (training/configs/infonet-v2-round11.yaml,
# run on the 2-core CPU in session 11; its mixture error still fell, by 0.0002 a round)
# continued from the shipped infonet-v2 for 8 minutes with 15 data workers, an EMA snapshot every minute.
# Bring back $OUT/run-c.tar; choose with python -m training.select.
set -u
out=${OUT:-/tmp/round12}
mkdir -p "$out/c"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt"
python3 -m training.train training/configs/infonet-v2-round11.yaml --device cuda --workers 15 \
    --init models/infonet-v2.safetensors --max-minutes 8 --snapshot-every-s 60 --out "$out/c" > "$out/c/train.log" 2>&1
tail -3 "$out/c/train.log"
tar -C "$out" -cf "$out/run-c.tar" c && rm -rf "${out:?}/c"
