"""`colo bench cluster`: the built-in job's step on 1, 2 and 4 workers.

The same global batch (the built-in 32 prompts × 8 samples unless the
config says otherwise) on each worker count, through the Ray controller:
step time and its split (generation, update, all-reduce, the controller's
own share), the bytes all-reduced per step and the achieved all-reduce
bandwidth against a `memcpy` of the same bytes measured in the same run.
Steps after the first are averaged (the first warms up allocators and
threads).

`--sharding none,full` runs each worker count replicated (`[cluster]
sharding = "none"`) and sharded (`"full"`: FSDP's semantics, 1/N of the
trainer's state per worker) and adds, per run: the largest worker's peak
memory (allocated and mapped: the controller keeps the largest of the
workers' `memory/peak_*_bytes`; the largest step's here) against `colo
plan --config`'s per-worker `peak_bytes` for the same config, where the
planner gives one (these runs set `[memory] offload_policy = "always"`,
the switch the plan models: with "as_needed" a worker keeps its training
state through generation while the capacity has room); the weight
all-gathers and gradient reduce-scatters per step (bytes, seconds, calls, as `comm_record` counts them); and the
trainer → rollout weight sync's seconds and the bytes each worker sent
and received in its gathers (`perf/reshard_sent_bytes`,
`perf/reshard_recv_bytes`, counted per call) against `colo plan reshard
--config`'s figure for the same config (colo's reshard, and the
3D-HybridEngine's zero-redundancy one for the same layout) and against
the whole model's weight bytes (the run's final checkpoint), which is
what every rank would receive if each gathered the whole model from
elsewhere. The sync's gathers are among the step's all-gathers. A sharded config resolves
activation checkpointing to on (each layer gathered again for its
backward), so its update recomputes every layer's forward. On one worker
`full` is one shard: the sharded trainer keeps its whole state, and its
gathers and reduce-scatters are copies (world size 1).
"""

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
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


def memcpy_gib_s(nbytes, repeats=20, rounds=5):
    """Host memcpy bandwidth for a buffer of `nbytes` (torch's copy_): the
    fastest of `rounds` rounds of `repeats` copies. (One round alone read
    from 0.6 to 95 GiB/s just after the runs: a copy split over the
    intra-op threads waits for the slowest, and a thread that loses its
    core to another process for a time slice costs the round.)"""
    n = max(nbytes // 4, 1)
    a, b = torch.rand(n), torch.empty(n)
    b.copy_(a)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(repeats):
            b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return nbytes * repeats / best / 2**30


def run_config(base, steps, path, sections=None):
    """The run's config: `base` (or the built-in job) for `steps` steps,
    no evaluation, a checkpoint only at the end; `sections` ({section:
    {key: TOML value}}) set in it."""
    text = open(base).read() if base else ""
    trainer = f"total_steps = {steps}\nval_before_train = false\ntest_freq = -1\nsave_freq = -1\n"
    if "[trainer]" in text:
        text = text.replace("[trainer]\n", "[trainer]\n" + trainer, 1)
    else:
        text += "\n[trainer]\n" + trainer
    for section, keys in (sections or {}).items():
        text = set_section(text, section, keys)
    with open(path, "w") as f:
        f.write(text)
    return path


def set_section(text, section, keys):
    """TOML `text` with `keys` ({key: TOML value}) set in `[section]`, which
    is added if missing; the section's earlier lines for those keys are
    dropped."""
    lines = text.split("\n")
    header = re.compile(rf"^\s*\[{re.escape(section)}\]\s*(#.*)?$")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    new = [f"{k} = {v}" for k, v in keys.items()]
    if start is None:
        return text.rstrip("\n") + f"\n\n[{section}]\n" + "\n".join(new) + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    key = re.compile(rf"^\s*({'|'.join(map(re.escape, keys))})\s*=")
    body = [line for line in lines[start + 1 : end] if not key.match(line)]
    return "\n".join(lines[: start + 1] + new + body + lines[end:])


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
    return result, s


# The sharded collectives, as the controller's `comm_record` names them.
SHARD_OPS = ("all_gather", "reduce_scatter")


def sharding_figures(s, out, steps):
    """What `--sharding` adds to a run's result (`s`: `train`'s summary):
    peaks over every step, per-step means over the steps after the first,
    and the weight sync against the whole model (module doc)."""
    rows = s["history"][1:] or s["history"]

    def mean(key):
        return statistics.mean(r.get(key, 0) for r in rows)

    out_figures = {
        "peak_allocated_bytes": max(r["memory/peak_allocated_bytes"] for r in s["history"]),
        "peak_mapped_bytes": max(r["memory/peak_device_bytes"] for r in s["history"]),
    }
    for op in SHARD_OPS:
        out_figures[f"{op}_bytes"] = mean(f"perf/{op}_bytes")
        out_figures[f"{op}_s"] = mean(f"timing_s/{op}")
        out_figures[f"{op}_wait_s"] = mean(f"timing_s/{op}_wait")
        out_figures[f"{op}_calls"] = mean(f"perf/{op}_calls")
    out_figures["sync_s"] = mean("timing_s/update_weights")
    for way in ("sent", "recv"):
        # Every step's switch moves the same bytes: the largest is kept.
        seen = [r[f"perf/reshard_{way}_bytes"] for r in s["history"] if r.get(f"perf/reshard_{way}_bytes") is not None]
        out_figures[f"reshard_{way}_bytes"] = max(seen) if seen else None
    model = model_bytes(os.path.join(out, "checkpoints", f"step-{steps}"))
    out_figures["model_bytes"] = model
    received = out_figures["reshard_recv_bytes"]
    out_figures["reshard_vs_model"] = received / model if received is not None and model else None
    return out_figures


# Bytes per element of the safetensors dtypes a checkpoint's weights have.
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1}


def model_bytes(step_dir):
    """The weight bytes of the checkpoint in `step_dir` (its model*.safetensors
    headers: every tensor's elements × its dtype's size); None without one."""
    files = sorted(glob.glob(os.path.join(step_dir, "model*.safetensors")))
    if not files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            elements = 1
            for d in t["shape"]:
                elements *= d
            total += elements * SAFETENSORS_BYTES[t["dtype"]]
    return total


def colo_binary():
    """The colo binary that plans: $COLO_BIN; else the one that started
    this bench (`colo bench cluster` runs it as a child); else the newest
    build in this checkout; else `colo` on the PATH. None without one."""
    if os.environ.get("COLO_BIN"):
        return os.environ["COLO_BIN"]
    try:
        parent = os.readlink(f"/proc/{os.getppid()}/exe")
        if os.path.basename(parent) == "colo":
            return parent
    except OSError:
        pass
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    built = [os.path.join(root, "target", p, "colo") for p in ("release", "debug")]
    built = [b for b in built if os.path.isfile(b)]
    if built:
        return max(built, key=os.path.getmtime)
    return shutil.which("colo")


def plan_json(args, colo):
    """`colo <args> --json`'s object: (dict, None), or (None, why not)."""
    if colo is None:
        return None, "no colo binary (set COLO_BIN)"
    try:
        r = subprocess.run([colo, *args, "--json"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{colo} {args[0]}: {e}"
    if r.returncode != 0:
        said = (r.stderr.strip().splitlines() or [f"status {r.returncode}"])[-1]
        return None, f"{colo} {' '.join(args[:2])}: {said}"
    try:
        out = json.loads(r.stdout)
    except ValueError:
        out = None
    if not isinstance(out, dict):
        return None, f"{colo} {' '.join(args[:2])} --json: not a JSON object"
    return out, None


def plan_peak(config, colo):
    """`colo plan --config config --json`'s `peak_bytes` (per worker for a
    config with `[cluster] workers`): (bytes, None), or (None, why not)."""
    plan, why = plan_json(["plan", "--config", config], colo)
    if plan is None:
        return None, why
    peak = plan.get("peak_bytes")
    if not isinstance(peak, int):
        return None, f"{colo} plan --json: no peak_bytes"
    return peak, None


def plan_reshard(config, colo):
    """`colo plan reshard --config config --json`'s per-worker bytes of a
    switch: {"sent", "received", "ideal_sent", "ideal_received"} (colo's
    reshard and the zero-redundancy one), or (None, why not)."""
    plan, why = plan_json(["plan", "reshard", "--config", config], colo)
    if plan is None:
        return None, why
    try:
        executed, ideal = plan["executed"], plan["zero_redundancy"]
        return {
            "sent": executed["sent_bytes"],
            "received": executed["received_bytes"],
            "ideal_sent": ideal["sent_bytes"],
            "ideal_received": ideal["received_bytes"],
        }, None
    except (KeyError, TypeError):
        return None, f"{colo} plan reshard --json: no executed / zero_redundancy bytes"


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


SHARDINGS = ("none", "full")


def shardings(text):
    """Comma-separated `[cluster] sharding` values, each once, e.g.
    `none,full`."""
    out = []
    for s in text.split(","):
        if s not in SHARDINGS:
            raise argparse.ArgumentTypeError(f"{s!r} is not a sharding; expected none or full")
        if s in out:
            raise argparse.ArgumentTypeError(f"{s!r} is given twice")
        out.append(s)
    return out


def config_file(path):
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return path


def run_all(args, tmp):
    """Every run the flags ask for: [(result, config path)]. Without
    `--sharding`, the config as given on each worker count; with it, the
    config's `[cluster]` set to each worker count and sharding, planned
    with `colo plan --config` and its figures added."""
    if args.sharding is None:
        cfg = run_config(args.config, args.steps, os.path.join(tmp, "run.toml"))
        return [measure(cfg, w, args.steps, os.path.join(tmp, f"w{w}"))[0] for w in args.workers]
    colo = colo_binary()
    results = []
    for w in args.workers:
        for sharding in args.sharding:
            name = f"w{w}-{sharding}"
            sections = {
                "cluster": {"workers": w, "sharding": json.dumps(sharding)},
                # The plan's choreography: everything offloaded at each
                # switch. ("as_needed" keeps state resident while the
                # capacity has room, so its peak may rise toward the
                # capacity, above the plan.)
                "memory": {"offload_policy": '"always"'},
            }
            cfg = run_config(args.config, args.steps, os.path.join(tmp, f"{name}.toml"), sections)
            out = os.path.join(tmp, name)
            r, s = measure(cfg, w, args.steps, out)
            r["sharding"] = sharding
            r.update(sharding_figures(s, out, args.steps))
            plan, why = plan_peak(cfg, colo)
            r["plan_peak_bytes"], r["plan_error"] = plan, why
            for kind in ("allocated", "mapped"):
                r[f"{kind}_vs_plan"] = (r[f"peak_{kind}_bytes"] - plan) / plan if plan else None
            # A replicated run (or one worker) moves no weights between workers.
            reshard, why = plan_reshard(cfg, colo) if sharding == "full" and w > 1 else (None, None)
            r["plan_reshard"], r["plan_reshard_error"] = reshard, why
            results.append(r)
            shutil.rmtree(out, ignore_errors=True)  # (its checkpoint read for the model bytes)
    return results


def main(argv=None):
    p = argparse.ArgumentParser(prog="colo bench cluster", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=config_file, help="a run config (default: the built-in job)")
    p.add_argument("--workers", type=worker_counts, default=[1, 2, 4], help="worker counts, comma-separated")
    p.add_argument("--steps", type=positive, default=6)
    p.add_argument(
        "--sharding",
        type=shardings,
        help='[cluster] sharding values to run each worker count with, comma-separated (none, full); '
        "adds peak memory against the plan, gathers, reduce-scatters and the weight sync",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="colo-bench-cluster-") as tmp:
        results = run_all(args, tmp)
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
    if args.sharding is None:
        print_split(results)
    else:
        print_split(results, sharded=True)
        print()
        print_sharding(results)
    memcpy = f"memcpy {baseline:.2f} GiB/s on {nbytes / 1e6:.2f} MB" if baseline else "no all-reduce, no memcpy"
    print(f"{memcpy}; load average {load:.2f}")
    return 0


def opt(x, fmt, width):
    """`x` formatted, or "-" for None, right-aligned in `width`."""
    return f"{'-' if x is None else format(x, fmt):>{width}}"


def print_split(results, sharded=False):
    """The step's split and the all-reduce (the table without `--sharding`
    unchanged; with it, a sharding column)."""
    col = f" {'shard':>5}" if sharded else ""
    print(f"{'workers':>7}{col} {'step s':>7} {'gen':>6} {'update':>6} {'allred':>6} {'wait':>6} {'ctrl':>6} {'ctrl %':>6} {'MB/step':>8} {'GiB/s':>6} {'/memcpy':>7}")
    for r in results:
        gib = r["all_reduce_gib_s"]
        ratio = r["all_reduce_vs_memcpy"]
        col = f" {r['sharding']:>5}" if sharded else ""
        print(
            f"{r['workers']:>7}{col} {r['step_s']:>7.3f} {r['gen_s']:>6.3f} {r['update_s']:>6.3f} "
            f"{r['all_reduce_s']:>6.3f} {r['wait_s']:>6.3f} {r['controller_s']:>6.3f} {100 * r['controller_share']:>5.1f}% "
            f"{r['all_reduce_bytes'] / 1e6:>8.2f} {opt(gib, '6.2f', 6)} {opt(ratio, '7.3f', 7)}"
        )


def print_sharding(results):
    """`--sharding`'s figures: the largest worker's peak against the plan;
    the gathers and reduce-scatters a step; the weight sync."""
    mib = 2**20
    print(f"{'workers':>7} {'shard':>5} {'alloc MiB':>9} {'mapped':>7} {'plan':>7} {'alloc/plan':>10} {'mapped/plan':>11}")
    for r in results:
        plan = r["plan_peak_bytes"]
        print(
            f"{r['workers']:>7} {r['sharding']:>5} {r['peak_allocated_bytes'] / mib:>9.2f} "
            f"{r['peak_mapped_bytes'] / mib:>7.2f} {opt(plan and plan / mib, '.2f', 7)} "
            f"{opt(r['allocated_vs_plan'], '+.1%', 10)} {opt(r['mapped_vs_plan'], '+.1%', 11)}"
        )
    errors = sorted({e for r in results for e in (r["plan_error"], r["plan_reshard_error"]) if e})
    for e in errors:
        print(f"no plan: {e}")
    print()
    print(
        f"{'workers':>7} {'shard':>5} {'gather MB':>9} {'s':>6} {'wait':>6} {'calls':>5} "
        f"{'r-s MB':>7} {'s':>6} {'wait':>6} {'calls':>5} {'sync s':>6} {'model MB':>8}"
    )
    for r in results:
        model = r["model_bytes"]
        print(
            f"{r['workers']:>7} {r['sharding']:>5} {r['all_gather_bytes'] / 1e6:>9.2f} {r['all_gather_s']:>6.3f} "
            f"{r['all_gather_wait_s']:>6.3f} {r['all_gather_calls']:>5.0f} {r['reduce_scatter_bytes'] / 1e6:>7.2f} "
            f"{r['reduce_scatter_s']:>6.3f} {r['reduce_scatter_wait_s']:>6.3f} {r['reduce_scatter_calls']:>5.0f} "
            f"{r['sync_s']:>6.3f} {opt(model and model / 1e6, '.3f', 8)}"
        )
    print_reshard(results)


def print_reshard(results):
    """Each sharded run's reshard per worker and switch: the bytes its
    gathers sent and received, against `colo plan reshard`'s for colo's
    reshard (exact bytes) and the 3D-HybridEngine's zero-redundancy one."""
    rows = [r for r in results if r["reshard_recv_bytes"] is not None]
    if not rows:
        return
    print()
    print(
        f"{'workers':>7} {'sent B':>10} {'recv B':>10} {'plan sent':>10} {'plan recv':>10} {'=plan':>5} "
        f"{'ideal recv':>10} {'recv/model':>10}"
    )
    for r in rows:
        plan = r["plan_reshard"] or {}
        measured = (r["reshard_sent_bytes"], r["reshard_recv_bytes"])
        same = "yes" if plan and measured == (plan["sent"], plan["received"]) else ("-" if not plan else "NO")
        print(
            f"{r['workers']:>7} {measured[0]:>10} {measured[1]:>10} {opt(plan.get('sent'), 'd', 10)} "
            f"{opt(plan.get('received'), 'd', 10)} {same:>5} {opt(plan.get('ideal_received'), 'd', 10)} "
            f"{opt(r['reshard_vs_model'], '.3f', 10)}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
