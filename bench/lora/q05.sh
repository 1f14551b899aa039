#!/usr/bin/env bash
# LoRA against full fine-tuning on the 0.5 B-shaped job (BENCHMARKS.md,
# "LoRA"): `colo bench real` on init-model's qwen2.5-0.5b and its run.toml,
# then on the same run.toml with [model] lora_rank = 8, lora_alpha = 16,
# target_modules = "all-linear", alternated ROUNDS times (default 2), one run
# at a time (each full run takes ~15 GiB RSS). From the repository root,
# after `./x cargo build --release -p colo`:
#
#     bash bench/lora/q05.sh [OUT_DIR]    # default /tmp/colo-lora-q05
#
# Writes OUT_DIR/{full,lora}-N.json (`colo bench real --json`) and prints
# each run's step, switches, sync and peaks.
set -euo pipefail
colo=${COLO:-target/release/colo}
out=$(realpath -m "${1:-/tmp/colo-lora-q05}")
model=$out/q05
lora=$out/q05lora
mkdir -p "$out"
[ -f "$model/run.toml" ] || "$colo" init-model --preset qwen2.5-0.5b --out "$model"
mkdir -p "$lora"
for f in "$model"/*; do
    [ "$(basename "$f")" = run.toml ] || ln -sf "$f" "$lora/"
done
sed "s|^path = .*|&\nlora_rank = 8\nlora_alpha = 16\ntarget_modules = \"all-linear\"|" \
    "$model/run.toml" >"$lora/run.toml"
for i in $(seq 1 "${ROUNDS:-2}"); do
    for kind in full lora; do
        dir=$model
        [ $kind = lora ] && dir=$lora
        echo "$kind $i: $(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg)" >&2
        "$colo" bench real --model "$dir" --json >"$out/$kind-$i.json"
    done
done
python3 - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/*-[0-9]*.json")):
    d = json.load(open(f)); c, m = d["colo"], d["memory"]
    ph = {p["name"]: p["seconds"] for p in c["phases"]}
    print(f"{f.split('/')[-1]:12} load {c['load_avg_1m_start']:.2f}->{c['load_avg_1m_end']:.2f} "
          f"step {c['step_s']:.2f} s, update {ph['update_actor']:.2f} s, "
          f"train->rollout {ph['switch_to_rollout']:.3f} s (sync {c['sync_s']:.3f}), "
          f"rollout->train {ph['switch_to_train']:.4f} s, "
          f"peak {m['peak_allocated_bytes'] / 2**30:.2f} / {m['peak_mapped_bytes'] / 2**30:.2f} GiB "
          f"(plan {m['plan_peak_bytes'] / 2**30:.2f})")
PY
