"""One line per run of bench/gpu/benches.sh's JSON (`colo bench train`,
`colo bench rollout` and `colo bench lora` reports, each with the name the
script gave it)."""

import json
import sys


def train(r):
    runs = "; ".join(
        f"{x['dtype']} step {x['step_s'] * 1e3:.1f} ms, model {x['model_gflop_s']:.0f} "
        f"/ matmul {x['matmul_gflop_s']:.0f} GFLOP/s = {x['ratio']:.2f}, "
        f"loss {x['loss_first']:.3f} → {x['loss_last']:.3f}"
        for x in r["runs"]
    )
    speedup = r.get("bf16_speedup")
    tail = f"; bf16 {speedup:.2f}× f32" if speedup else ""
    return f"{r['batch']}×{r['seq']} tokens: {runs}{tail}"


def rollout(r):
    return (
        f"{r['prompts']}×{r['n']} ≤{r['max_new_tokens']} batch {r['batch']}: colo "
        f"{r['tokens_per_s']:.0f} tokens/s ({r['generated_tokens']} in {r['seconds']:.2f} s), "
        f"baseline {r['baseline_tokens_per_s']:.0f} ({r['baseline_generated_tokens']} in "
        f"{r['baseline_seconds']:.2f} s): {r['speedup']:.2f}×"
    )


def lora(r):
    def wins(x):
        load = "{prompts}x{n}x{max_new_tokens}".format(**x["load"])
        if x["break_even_tokens"] is None:
            return f"{load}: the adapters cost nothing at decode, merging never wins"
        return f"{load}: merging wins above {x['break_even_tokens']:.0f} rollout tokens a switch"

    return "; ".join(
        f"rank {k['rank']}: switch merged {k['merged_switch']['seconds'] * 1e3:.1f} ms, adapters only "
        f"{k['adapters_switch']['seconds'] * 1e3:.1f} ms; " + ", ".join(map(wins, k["loads"]))
        for k in r["ranks"]
    )


def summary(r):
    if "ranks" in r:
        return lora(r)
    return train(r) if "runs" in r else rollout(r)


for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        print(line.strip())
        continue
    print(f"{r.get('name', '')}: {summary(r)}")
