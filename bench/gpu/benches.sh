#!/usr/bin/env bash
# There (the GPU machine), after bench/gpu/pack.sh here:
# `bash bench/gpu/benches.sh` with .gpu/ carried. `colo bench train` and
# `colo bench rollout` on CUDA, each at its defaults (the CPU's sizes) and at
# sizes that give a GPU work. One JSON object a run, named, in
# $OUT/benches.jsonl; stderr in $OUT/benches.log; a summary at the end.
source "$(dirname "$0")/lib.sh"
bench() {
    local name=$1
    shift
    echo "== $name: colo bench $* --device cuda" | tee -a "$OUT/benches.log"
    timeout 240 /tmp/colo bench "$@" --device cuda --json 2>>"$OUT/benches.log" |
        python3 -c 'import json,sys; r=json.load(sys.stdin); r["name"]=sys.argv[1]; print(json.dumps(r))' "$name" \
        >>"$OUT/benches.jsonl" || echo "$name failed (rc ${PIPESTATUS[0]})" | tee -a "$OUT/benches.log"
}
bench train-default train
bench train-64x256 train --batch 64 --micro-batch 16
bench train-16x1024 train --batch 16 --seq 1024 --micro-batch 4
bench train-94m-64x256 train --hidden 1024 --layers 8 --batch 64 --micro-batch 16
bench rollout-default rollout
bench rollout-128p rollout --prompts 128
bench rollout-128p-b64 rollout --prompts 128 --batch 64
python3 bench/gpu/benches.py "$OUT/benches.jsonl"
