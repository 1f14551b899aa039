#!/usr/bin/env bash
# There (the GPU machine), after bench/gpu/pack.sh here:
# `bash bench/gpu/benches.sh` with .gpu/ carried. `colo bench train` and
# `colo bench rollout` on CUDA, each at its defaults (the CPU's sizes) and at
# sizes that give a GPU work; `colo bench lora` (LoRA merged at the switch
# against applied at decode, issue 38) at its defaults. One JSON object a run, named, in
# $OUT/benches.jsonl; stderr in $OUT/benches.log; a summary at the end.
source "$(dirname "$0")/lib.sh"
bench train-default train
bench train-64x256 train --batch 64 --micro-batch 16
bench train-16x1024 train --batch 16 --seq 1024 --micro-batch 4
bench train-94m-64x256 train --hidden 1024 --layers 8 --batch 64 --micro-batch 16
bench rollout-default rollout
bench rollout-128p rollout --prompts 128
bench rollout-128p-b64 rollout --prompts 128 --batch 64
bench lora-default lora
python3 bench/gpu/benches.py "$OUT/benches.jsonl"
