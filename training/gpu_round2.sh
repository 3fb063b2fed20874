#!/usr/bin/env bash
# Issue 13, round 2 on one lent GPU machine (16 cores): two 7-minute fine-tunes side by side, sharing the
# cores for data (7 workers each): A from v2 (round 1) at lr 1e-4, B from v1 at lr 2e-4; same data config.
# Each run's folder comes back as one tar (the device returns at most 8 files).
set -u
out=${OUT:-/tmp/round2}
mkdir -p "$out/a" "$out/b"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt"
cfg=training/configs/infonet-v2-round2.yaml
python3 -m training.train $cfg --device cuda --max-minutes 7 --workers 7 --out "$out/a" > "$out/a/train.log" 2>&1 &
python3 -m training.train $cfg --device cuda --max-minutes 7 --workers 7 \
    --init models/infonet-v1.safetensors --lr 0.0002 --out "$out/b" > "$out/b/train.log" 2>&1 &
wait
for r in a b; do tail -3 "$out/$r/train.log"; tar -C "$out" -cf "$out/run-$r.tar" "$r" && rm -rf "${out:?}/$r"; done
ls -la "$out"
