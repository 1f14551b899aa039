#!/usr/bin/env bash
# There (the GPU machine), after bench/gpu/pack.sh here:
# `bash bench/gpu/graph_mem.sh` with .gpu/ carried. How much memory the
# rollout engine's CUDA graphs hold (tag `cuda_graph`) at several capture
# shapes, against `colo plan --config`'s prediction for the same config:
# issue 9's 3 M-parameter job, one step, with more prompts (rows) and
# longer completions (keys), bf16 and f32; then the built-in model and
# tiny-qwen2 (other widths). One line per run: the largest resident bytes
# of each engine tag in its timeline.jsonl, and the plan's.
source "$(dirname "$0")/lib.sh"
python3 bench/qwen2-3m/make.py /tmp/q3m >/dev/null
base=/tmp/q3m/run.toml
sed -i 's/^total_steps = 10/total_steps = 1\ndevice = "cuda"/' $base
measure() { # NAME CONFIG
    timeout 120 /tmp/colo train --config "$2" --out "/tmp/gm-$1" >"$OUT/gm-$1.log" 2>&1 || echo "$1 failed"
    /tmp/colo plan --config "$2" --json >"/tmp/gm-$1/plan.json" 2>>"$OUT/gm-$1.log"
    python3 - "$1" "/tmp/gm-$1" <<'PY'
import json, sys
name, run = sys.argv[1:]
ev = [json.loads(l) for l in open(f"{run}/timeline.jsonl")]
plan = json.load(open(f"{run}/plan.json"))
gen = next(p for p in plan["phases"] if p["name"] == "generation")["components"]
mib = lambda b: f"{b / 2**20:.1f}"
# The plan calls the engine's weights `rollout_weights`.
component = {"weights": "rollout_weights"}
def tag(t):
    run_b = max(e["per_tag"].get(t, 0) for e in ev)
    plan_b = gen.get(component.get(t, t), 0)
    return f"{t} {mib(run_b)} (plan {mib(plan_b)})"
print(f"{name}: " + ", ".join(tag(t) for t in ("cuda_graph", "kv_cache", "weights")) + " MiB")
PY
}
shape() { # NAME PROMPTS MAX_NEW DTYPE
    sed -e "s/^train_batch_size = 8/train_batch_size = $2/" -e "s/^max_new_tokens = 32/max_new_tokens = $3/" \
        -e "s/^device = \"cuda\"/device = \"cuda\"\ndtype = \"$4\"/" $base >/tmp/q3m/$1.toml
    measure "$1" /tmp/q3m/$1.toml
}
shape r64-s64 8 32 bf16
shape r256-s64 32 32 bf16
shape r64-s512 8 448 bf16
shape r256-s512 32 448 bf16
shape r256-s512-f32 32 448 f32
shape r512-s512 64 448 bf16
printf '[trainer]\ndevice = "cuda"\ntotal_steps = 1\n' >/tmp/builtin1.toml
measure builtin /tmp/builtin1.toml
sed -e 's/^total_steps = 3/total_steps = 1\ndevice = "cuda"/' configs/example.toml >/tmp/tiny1.toml
measure tiny-qwen2 /tmp/tiny1.toml
