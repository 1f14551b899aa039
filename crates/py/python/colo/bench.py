"""`colo bench cluster`: the built-in job's step on 1, 2 and 4 workers.

The same global batch (the built-in 32 prompts × 8 samples unless the
config says otherwise) on each worker count, through the Ray controller:
step time and its split (generation, update, all-reduce, the controller's
own share), the bytes all-reduced per step and the achieved all-reduce
bandwidth against a `memcpy` of the same bytes measured in the same run.
Steps after the first are averaged (the first warms up allocators and
threads).
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from colo.controller import train

SPLIT = [
    ("step", "timing_s/step_wall"),
    ("gen", "timing_s/gen"),
    ("update", "timing_s/update_actor"),
    ("all_reduce", "timing_s/all_reduce"),
    ("wait", "timing_s/all_reduce_wait"),
    ("controller", "timing_s/controller"),
]


def memcpy_gib_s(nbytes, repeats=20):
    """Host memcpy bandwidth for a buffer of `nbytes` (torch's copy_)."""
    n = max(nbytes // 4, 1)
    a, b = torch.rand(n), torch.empty(n)
    b.copy_(a)
    t = time.perf_counter()
    for _ in range(repeats):
        b.copy_(a)
    return nbytes * repeats / (time.perf_counter() - t) / 2**30


def run_config(base, steps, path):
    """The run's config: `base` (or the built-in job) for `steps` steps,
    no evaluation, a checkpoint only at the end."""
    text = open(base).read() if base else ""
    trainer = f"total_steps = {steps}\nval_before_train = false\ntest_freq = -1\nsave_freq = -1\n"
    if "[trainer]" in text:
        text = text.replace("[trainer]\n", "[trainer]\n" + trainer, 1)
    else:
        text += "\n[trainer]\n" + trainer
    with open(path, "w") as f:
        f.write(text)
    return path


def measure(config, workers, steps, out):
    s = train(config, out, workers, log=lambda *_: None)
    rows = s["history"][1:] or s["history"]
    mean = {name: statistics.mean(r[key] for r in rows) for name, key in SPLIT}
    nbytes = rows[-1]["perf/all_reduce_bytes"]
    result = {"workers": workers, "steps_averaged": len(rows), **{f"{k}_s": v for k, v in mean.items()}}
    result["controller_share"] = mean["controller"] / mean["step"]
    result["all_reduce_bytes"] = nbytes
    result["all_reduce_gib_s"] = nbytes / mean["all_reduce"] / 2**30 if mean["all_reduce"] > 0 else None
    result["score_mean_last"] = s["history"][-1]["critic/score/mean"]
    return result


def positive(text):
    """A count of at least 1 (argparse names the flag when this raises)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a positive count")
    return n


def worker_counts(text):
    """Comma-separated positive counts, e.g. `1,2,4`."""
    return [positive(w) for w in text.split(",")]


def config_file(path):
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="colo bench cluster", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=config_file, help="a run config (default: the built-in job)")
    p.add_argument("--workers", type=worker_counts, default=[1, 2, 4], help="worker counts, comma-separated")
    p.add_argument("--steps", type=positive, default=6)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="colo-bench-cluster-") as tmp:
        cfg = run_config(args.config, args.steps, os.path.join(tmp, "run.toml"))
        results = [measure(cfg, w, args.steps, os.path.join(tmp, f"w{w}")) for w in args.workers]
    nbytes = max(r["all_reduce_bytes"] for r in results)
    baseline = memcpy_gib_s(nbytes) if nbytes else None
    load = os.getloadavg()[0]
    for r in results:
        r["memcpy_gib_s"] = baseline
        r["all_reduce_vs_memcpy"] = (
            r["all_reduce_gib_s"] / baseline if r["all_reduce_gib_s"] and baseline else None
        )
        r["load_avg_1m"] = load
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'workers':>7} {'step s':>7} {'gen':>6} {'update':>6} {'allred':>6} {'wait':>6} {'ctrl':>6} {'ctrl %':>6} {'MB/step':>8} {'GiB/s':>6} {'/memcpy':>7}")
    for r in results:
        gib = r["all_reduce_gib_s"]
        ratio = r["all_reduce_vs_memcpy"]
        print(
            f"{r['workers']:>7} {r['step_s']:>7.3f} {r['gen_s']:>6.3f} {r['update_s']:>6.3f} "
            f"{r['all_reduce_s']:>6.3f} {r['wait_s']:>6.3f} {r['controller_s']:>6.3f} {100 * r['controller_share']:>5.1f}% "
            f"{r['all_reduce_bytes'] / 1e6:>8.2f} {gib if gib is None else f'{gib:6.2f}':>6} "
            f"{ratio if ratio is None else f'{ratio:7.3f}':>7}"
        )
    print(f"memcpy {baseline:.2f} GiB/s on {nbytes / 1e6:.2f} MB; load average {load:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
