"""The summary of bench/gpu/real.sh: `colo bench real --json`'s report,
`colo bench mem --device cuda --json`'s and `colo bench rollout --model DIR
--json`'s, against issue 36's goals on a GPU.

Usage: python3 bench/gpu/real.py REAL.json [MEM.json [ROLLOUT.json [LORA.json]]]
(LORA.json: `colo bench real --json` of the Qwen2.5-7B-shaped LoRA job.)
"""
import json
import sys

GIB = 2**30


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"{path}: no report ({e})")
        return None


def real(r):
    m, j, c = r["model"], r["job"], r["colo"]
    print(f"{m['name']}: {m['parameters'] / 1e9:.2f} B parameters, {m['dtype']}; "
          f"{j['prompts']} prompts x {j['n']} samples x {j['max_new_tokens']} new tokens on "
          f"{j['device']}, colocation {j['colocation']} ({j['offload_policy']}); "
          f"steps {j['timed_from']}-{j['steps']} timed")
    print(f"step: mean {c['step_s']:.3f} s (min {c['step_min_s']:.3f}, max {c['step_max_s']:.3f}); "
          f"every step {', '.join(f'{s:.2f}' for s in c['steps_s'])} s")
    for p in c["phases"]:
        print(f"  {p['name']:18s} {p['seconds']:8.3f} s {100 * p['share']:6.1f}%")
    print(f"switches: {100 * c['switches_share']:.1f}% of a step (goal <= 5%)")
    s = r["sync"]
    print(f"weight sync: {s['bytes'] / GIB:.2f} GiB in {1e3 * s['seconds']:.1f} ms (goal <= 50 ms) = "
          f"{s['gib_s']:.1f} GiB/s; {s['memcpy']} {s['memcpy_gib_s']:.1f} GiB/s: "
          f"{s['vs_memcpy']:.2f}x")
    d = r["decode"]
    print(f"decode: {d['rows']} rows, {d['steps']} steps timed, {1e3 * d['step_s']:.2f} ms a step "
          f"({d['rows'] / d['step_s']:.0f} tokens/s, {d['cuda_graphs']} CUDA graphs); bound "
          f"{d['weight_bytes_read'] / GIB:.2f} GiB / {d['bandwidth_gib_s']:.0f} GiB/s = "
          f"{1e3 * d['bound_s']:.2f} ms: {d['vs_bound']:.2f}x the bound (goal <= 1.5)")
    f = r["flops"]
    ref = f"; reference {f['ref_flop_s'] / 1e12:.1f} TFLOP/s" if f.get("ref_flop_s") else ""
    mm = f["matmul"]
    print(f"training: update {f['update_flop_s'] / 1e12:.1f} TFLOP/s (model FLOPs, "
          f"{f['tokens']['per_step']:.0f} tokens a step){ref}; {mm['dtype']} matmul "
          f"[{mm['m']} x {mm['k']}] @ [{mm['k']} x {mm['n']}] {mm['flop_s'] / 1e12:.1f} TFLOP/s: "
          f"update {f['update_vs_matmul']:.2f}x (goal >= 0.5)")
    mem = r["memory"]
    if mem.get("plan_peak_bytes"):
        print(f"plan: predicted peak {mem['plan_peak_bytes'] / GIB:.2f} GiB ({mem['plan_peak_phase']}); "
              f"measured allocated {mem['peak_allocated_bytes'] / GIB:.2f} GiB "
              f"({100 * mem['allocated_vs_plan']:+.1f}%), mapped {mem['peak_mapped_bytes'] / GIB:.2f} "
              f"GiB ({100 * mem['mapped_vs_plan']:+.1f}%) (goal within 10%)")
    else:
        print(f"plan: none ({mem.get('plan_error')})")
    print(f"bench real took {r['seconds']:.0f} s (colo's run {c['run_s']:.0f} s)")


def mem(r):
    print(f"pause/resume ({r['size_mib']} MiB, {r['copy_threads']} copy threads): pause "
          f"{r['pause_backup_gib_s']:.1f} GiB/s, resume {r['resume_backup_gib_s']:.1f} GiB/s "
          f"(goal >= 20 each way); device-host copies pageable {r['d2h_pageable_gib_s']:.1f} / "
          f"{r['h2d_pageable_gib_s']:.1f}, pinned {r['d2h_pinned_gib_s']:.1f} / "
          f"{r['h2d_pinned_gib_s']:.1f} GiB/s (d2h / h2d); released {r['released_fraction']:.3f}, "
          f"bit-exact {r['restored_bit_exact']}")


def count(n):
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def rollout(r):
    samples = r["prompts"] * r["n"]
    graphs = f", {r['cuda_graphs']} CUDA graphs" if r["device"] == "cuda" else ""
    print(f"decode against a static batch: {r['model']} ({count(r['model_parameters'])} "
          f"parameters, {r['dtype']}) on {r['device']}, {r['prompts']} prompts x {r['n']} samples x "
          f"<= {r['max_new_tokens']} new tokens, {r['batch']} sequences a batch; mean completion "
          f"{r['generated_tokens'] / samples:.0f} tokens")
    print(f"  colo-rollout {r['generated_tokens']:8d} tokens in {r['seconds']:7.2f} s = "
          f"{r['tokens_per_s']:9.0f} tokens/s (peak KV {r['kv_peak_bytes'] / GIB:.2f} GiB{graphs})")
    print(f"  static batch {r['baseline_generated_tokens']:8d} tokens in {r['baseline_seconds']:7.2f} s = "
          f"{r['baseline_tokens_per_s']:9.0f} tokens/s (peak KV {r['baseline_kv_peak_bytes'] / GIB:.2f} GiB)")
    print(f"  colo / static batch: {r['speedup']:.2f}x")


if __name__ == "__main__":
    for path, summary in zip(sys.argv[1:], [real, mem, rollout, real]):
        r = load(path)
        if r:
            summary(r)
