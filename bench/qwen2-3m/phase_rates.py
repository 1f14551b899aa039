"""The 3 M job's phases as FLOP rates and as fractions of a matmul rate.

Usage: python3 bench/qwen2-3m/phase_rates.py RUN/metrics.jsonl MATMUL_GFLOPS

MATMUL_GFLOPS is `colo bench train`'s matmul figure in the run's dtype,
measured in the same window. Reads steps 3 and later (the first two warm
up). FLOPs: 2 N a token forward, 6 N forward + backward, with N the
parameters in matrix products (the tied LM head included: 2.998 M for
make.py's model); tokens a step from verl's perf/throughput x step time,
generated tokens from the mean response length x 64 samples.
"""
import json
import sys

N = 2.998e6
SAMPLES = 64

rows = [json.loads(line) for line in open(sys.argv[1])]
rows = [r for r in rows if "timing_s/step" in r][2:]
matmul = float(sys.argv[2])


def mean(key):
    return sum(r[key] for r in rows) / len(rows)


tokens = sum(r["perf/throughput"] * r["timing_s/step"] for r in rows) / len(rows)
generated = SAMPLES * mean("response_length/mean")
phases = [
    ("ref", 2 * N * tokens, mean("timing_s/ref")),
    ("update", 6 * N * tokens, mean("timing_s/update_actor")),
    ("gen", 2 * N * generated, mean("timing_s/gen")),
]
for name, flop, s in phases:
    rate = flop / s / 1e9
    print(f"{name}: {flop / 1e9:.1f} GFLOP in {s:.3f} s = {rate:.0f} GFLOP/s = {rate / matmul:.2f} of matmul")
total = sum(f for _, f, _ in phases)
print(
    f"tokens/step {tokens:.0f}, generated {generated:.0f}; step {mean('timing_s/step'):.3f} s; "
    f"all at the matmul rate: {total / matmul / 1e9:.3f} s"
)
