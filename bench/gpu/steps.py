"""Per-phase step times of colo runs' metrics.jsonl files (steps 3 on:
steps 1 and 2 pay for CUDA's start-up and kernel compilation), the first
step, the evaluations and the peak device memory, one block per file.

Usage: python3 bench/gpu/steps.py RUN/metrics.jsonl...
"""
import json
import statistics
import sys

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    steps = [r for r in rows if "timing_s/step" in r]
    later = [r for r in steps if r["training/global_step"] >= 3]
    print(f"{path}: {len(steps)} steps, {sum(r['timing_s/step'] for r in steps):.1f} s in steps, "
          f"step 1 {steps[0]['timing_s/step']:.2f} s, "
          f"evaluations {sum(r.get('timing_s/eval', 0) for r in rows):.1f} s, "
          f"peak device {max(r.get('memory/peak_device_bytes', 0) for r in rows) / 2**20:.1f} MiB")
    keys = sorted({k for r in later for k in r if k.startswith("timing_s/")})
    for k in keys:
        v = [r[k] for r in later if k in r]
        print(f"  {k[9:]:20s} mean {statistics.mean(v):.4f}  median {statistics.median(v):.4f}")
    acc = [(r["training/global_step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    if acc:
        print(f"  held-out accuracy {acc[0][1]:.3f} (step {acc[0][0]}) -> {acc[-1][1]:.3f} (step {acc[-1][0]})")
