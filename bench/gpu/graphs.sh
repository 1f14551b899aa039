#!/usr/bin/env bash
# There (the GPU machine), after bench/gpu/pack.sh here:
# `bash bench/gpu/graphs.sh` with .gpu/ carried. The rollout engine's CUDA
# graphs: `colo gpu-check` (its `graphs` check among the rest; part
# `graphs-check`, so that it does not overwrite run.sh's `gpu-check` log),
# `colo bench rollout` with graphs and with `--enforce-eager` at three loads,
# and issue 9's 3 M-parameter job (whose rollouts replay graphs between
# releases of the KV cache), 20 steps in bf16.
source "$(dirname "$0")/lib.sh"
part graphs-check 200 /tmp/colo gpu-check --out /tmp/graphs-check
for load in "" "--prompts 128" "--prompts 128 --batch 64"; do
    name=$(echo "rollout $load" | tr -d -- '-' | tr ' ' '-')
    bench "$name-graphs" rollout $load
    bench "$name-eager" rollout $load --enforce-eager
done
python3 bench/gpu/benches.py "$OUT/benches.jsonl"
python3 bench/qwen2-3m/make.py /tmp/q3m >/dev/null
sed -i 's/^total_steps = 10/total_steps = 20\ndevice = "cuda"/' /tmp/q3m/run.toml
part q3m-bf16-graphs 60 /tmp/colo train --config /tmp/q3m/run.toml --out /tmp/q3m-bf16-graphs
tar -C /tmp/gpu-metrics -cf "$OUT/metrics.tar" .
python3 bench/gpu/steps.py /tmp/gpu-metrics/*.jsonl
