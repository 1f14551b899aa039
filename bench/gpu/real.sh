#!/usr/bin/env bash
# There (the GPU machine, PyTorch 2.11 in its python3), after
# bench/gpu/pack.sh here: `bash bench/gpu/real.sh` with .gpu/ carried.
# Issue 36, item 6, in about 3-5 minutes on one H100/H200 (each part under
# `timeout`; parts 1-4 at most 9 minutes, part 5 only within the first 8):
#   1. `colo init-model --preset qwen2.5-1.5b`: the published shape, random
#      bf16 weights, the small tokenizer;
#   2. `colo bench real --model DIR --device cuda`: GRPO full fine-tuning on
#      the built-in task, bf16, 64 prompts x 8 samples x 256 new tokens (the
#      first job of JOBS that `colo plan --config` says fits the GPU), 5
#      steps: 1-2 warm up (PTX and cuBLAS's first use), 3-5 timed; then, in
#      the same process, the weight sync against a device-to-device copy,
#      decode steps against the weights over that copy's bandwidth, and the
#      update's FLOP/s against a bf16 matmul;
#   3. `colo bench rollout --model DIR --device cuda`: decode tokens/s of
#      colo's rollout engine (paged KV cache, continuous batching, CUDA
#      graphs) against a static batch on the same kernels (transformers'
#      way: a contiguous cache, a batch running until its longest sample
#      stops), both on the same weights in f32, 64 prompts x 8 samples x
#      256 new tokens (no stop ids), 256 sequences a batch;
#   4. `colo bench mem --device cuda`: pause and resume of colo-mem's CUDA
#      backend against pageable and pinned device-host copies;
#   5. issue 38's Qwen2.5-7B-shaped LoRA run (rank 8, alpha 16, all-linear:
#      the base frozen, the reference the base with the adapters off),
#      `colo bench real` on 16 prompts x 8 samples x 128 new tokens, 4
#      steps (3-4 timed), when parts 1-4 left it at least 200 s of the
#      8 minutes (init-model writes 15 GB of weights first).
# The reports go to $OUT (real.json, rollout.json, mem.json, lora7b.json,
# their logs); the summary (bench/gpu/real.py) is printed at the end.
source "$(dirname "$0")/lib.sh"
model=/tmp/q15
rm -rf "$model"
echo "== init-model qwen2.5-1.5b"
(time timeout 90 /tmp/colo init-model --preset qwen2.5-1.5b --out "$model") >"$OUT/init-model.log" 2>&1
echo "rc=$?" >>"$OUT/init-model.log"
tail -4 "$OUT/init-model.log"

# job PROMPTS N MAX_NEW: the run config bench real reads from the model's
# directory (its KV cache sized for every sample at full length).
job() {
    cat >"$model/run.toml" <<TOML
# bench/gpu/real.sh: $1 prompts x $2 samples x $3 new tokens on CUDA, bf16.
[data]
train_batch_size = $1
max_prompt_length = 64

[data.builtin]
val_size = 16

[model]
path = "$model"

[rollout]
n = $2
max_new_tokens = $3
max_kv_tokens = $(($1 * $2 * (64 + $3)))

[actor]
ppo_mini_batch_size = $1

[trainer]
total_steps = 5
val_before_train = false
test_freq = -1
save_freq = -1
device = "cuda"
dtype = "bf16"
TOML
}
for j in "64 8 256" "32 8 256" "16 8 256" "8 8 128"; do
    job $j
    if ! timeout 60 /tmp/colo plan --config "$model/run.toml" --json >"$OUT/plan.json" 2>>"$OUT/plan.log"; then
        echo "colo plan failed (see $OUT/plan.log): $j (prompts, samples, new tokens) runs unchecked"
        break
    fi
    python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["fits"] else 1)' "$OUT/plan.json" && break
    echo "plan check: $j (prompts, samples, new tokens) does not fit the GPU" | tee -a "$OUT/plan.log"
done
echo "== bench real: $j (prompts, samples, new tokens)"
cp "$model/run.toml" "$OUT/run.toml"
(time timeout 300 /tmp/colo bench real --model "$model" --device cuda --json >"$OUT/real.json") 2>"$OUT/real.log"
echo "rc=$?" >>"$OUT/real.log"
grep -v '^\[' "$OUT/real.log" | tail -6

# No stop ids: every sample decodes all 256 tokens, so that the figure is
# decode at a full batch on both sides, the same whatever the random weights
# draw (with stop ids, how often they are drawn depends on the weights: 900 of
# the 151,936 ended a 0.5B-shaped model's completions after 23 tokens on
# average, 150 never within 64).
echo "== bench rollout --model: 64 prompts x 8 samples x 256 new tokens, f32"
(time timeout 90 /tmp/colo bench rollout --model "$model" --device cuda --prompts 64 --n 8 \
    --max-new-tokens 256 --batch 256 --stop-tokens 0 --json >"$OUT/rollout.json") 2>"$OUT/rollout.log"
echo "rc=$?" >>"$OUT/rollout.log"
tail -4 "$OUT/rollout.log"

echo "== bench mem --device cuda"
timeout 45 /tmp/colo bench mem --device cuda --json >"$OUT/mem.json" 2>"$OUT/mem.log" || echo "bench mem failed (rc $?)" | tee -a "$OUT/mem.log"
rm -rf "$model"

left=$((480 - SECONDS))
if [ "$left" -ge 200 ]; then
    model=/tmp/q7
    rm -rf "$model"
    echo "== init-model qwen2.5-7b, then bench real with LoRA ($left s left)"
    (time timeout 120 /tmp/colo init-model --preset qwen2.5-7b --out "$model") >"$OUT/lora7b.log" 2>&1
    job 16 8 128
    sed -i "s|^path = .*|&\nlora_rank = 8\nlora_alpha = 16\ntarget_modules = \"all-linear\"|" "$model/run.toml"
    cp "$model/run.toml" "$OUT/lora7b.toml"
    timeout 60 /tmp/colo plan --config "$model/run.toml" >>"$OUT/lora7b.log" 2>&1
    left=$((480 - SECONDS))
    (time timeout "$left" /tmp/colo bench real --model "$model" --device cuda --steps 4 --json \
        >"$OUT/lora7b.json") 2>>"$OUT/lora7b.log"
    echo "rc=$?" >>"$OUT/lora7b.log"
    grep -v '^\[' "$OUT/lora7b.log" | tail -6
    rm -rf "$model"
else
    echo "== LoRA 7B skipped: $left s of the 8 minutes left" | tee "$OUT/lora7b.log"
fi
python3 bench/gpu/real.py "$OUT/real.json" "$OUT/mem.json" "$OUT/rollout.json" "$OUT/lora7b.json"
