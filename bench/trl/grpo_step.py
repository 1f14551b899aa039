"""TRL's GRPOTrainer on colo's job: per-step wall times and their phases.

The PyTorch-based peer of issue 36 ("Speed at 0.5 B"): GRPO on a Hugging
Face model directory with colo's default job shape at a given size (4
prompts x 4 samples x 16 new tokens, one optimizer step per RL step,
KL loss x 0.001 against a reference model, exact-match reward on
arithmetic prompts), on the CPU, without vLLM. Run it in bench/trl/.venv
(bench/trl/setup.sh makes it):

    bench/trl/.venv/bin/python bench/trl/grpo_step.py --model DIR

Prints one line per step (wall time and its phases), the mean of the timed
steps (3-5 by default), and last one JSON line with everything. The
phases come from TRL's own profiling contexts (`transformers.generate`,
`_get_per_token_logps_and_entropies`, `_calculate_rewards`,
`_prepare_inputs`, `compute_loss`) and from the Trainer's callbacks:

- generate: `model.generate` of the step's completions
- ref_logps: log-probabilities without gradient (the reference model's; also
  pi_old's where TRL computes them, which it skips when a generation feeds
  exactly one optimizer step, as here)
- reward: the reward function
- prepare_other: the rest of TRL's `_prepare_inputs` (tokenising, decoding,
  advantages, metrics)
- forward: the policy's forward and the loss (`compute_loss`)
- backward: the rest of `training_step` (backward)
- optimizer: gradient clipping and AdamW's step
- other: the step's remainder (data loading, scheduler, zero_grad, logging)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import resource
import sys
import tempfile
import time
import warnings
from collections import defaultdict

# Nothing leaves this machine: the model is a local directory, so the
# Hugging Face libraries have no reason to reach the hub, and no telemetry.
for _key in (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_HUB_DISABLE_TELEMETRY",
    "DO_NOT_TRACK",
):
    os.environ.setdefault(_key, "1")
os.environ.setdefault("WANDB_MODE", "disabled")

PHASES = [
    "generate",
    "ref_logps",
    "reward",
    "prepare_other",
    "forward",
    "backward",
    "optimizer",
    "other",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument(
        "--data",
        help="JSONL of prompts and answers (colo's built-in task writes train.jsonl "
        "so); default: arithmetic prompts made here with --seed",
    )
    p.add_argument("--prompt-key", default="prompt")
    p.add_argument("--answer-key", default="answer")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (colo: data.train_batch_size)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (colo: rollout.n)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="colo: rollout.max_new_tokens")
    p.add_argument("--steps", type=int, default=5, help="RL steps run")
    p.add_argument("--timed-from", type=int, default=3, help="first timed step (1-based); timed: it to --steps")
    p.add_argument("--lr", type=float, default=1e-6, help="colo: actor.lr")
    p.add_argument(
        "--warmup-steps", type=int, default=5, help="linear warmup, then constant (colo: actor.warmup_steps)"
    )
    p.add_argument("--beta", type=float, default=0.001, help="KL loss coefficient (colo: actor.kl_loss_coef)")
    p.add_argument(
        "--dtype",
        choices=["mixed", "bf16", "f32"],
        default="mixed",
        help="mixed: f32 weights under bf16 autocast (TRL's default, colo's trainer.dtype = auto on "
        "bf16 hardware); bf16: bf16 weights; f32: no autocast",
    )
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="TRL's default is on; colo's model.enable_gradient_checkpointing is off, so off here",
    )
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def arithmetic_rows(count: int, seed: int) -> list[dict]:
    """`a+b=` -> `a+b` with operands 0..=99, as colo's built-in task."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


def read_rows(path: str, prompt_key: str, answer_key: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            answer = row
            for part in answer_key.split("."):
                if not isinstance(answer, dict) or part not in answer:
                    raise SystemExit(f"{path}:{line_no}: no field {answer_key!r}")
                answer = answer[part]
            if prompt_key not in row:
                raise SystemExit(f"{path}:{line_no}: no field {prompt_key!r}")
            rows.append({"prompt": row[prompt_key], "answer": str(answer)})
    if not rows:
        raise SystemExit(f"{path}: no rows")
    return rows


def exact_match(completions, answer, **_):
    """colo's `exact_match`: 1 if the trimmed completion equals the trimmed answer."""
    return [1.0 if c.strip() == a.strip() else 0.0 for c, a in zip(completions, answer, strict=True)]


class StepClock:
    """Per-step phase durations, filled by TRL's profiling contexts, a
    wrapped `training_step` and the Trainer's callbacks."""

    def __init__(self):
        self.steps: list[dict] = []
        self.cur: dict = defaultdict(float)
        self.train_begin = None
        self.last_end = None
        self.training_step_end = None

    def profiled(self, name: str, seconds: float, grad: bool):
        # TRL names a context "<trainer class>.<name>".
        name = name.split(".", 1)[1] if name.startswith("GRPOTrainer.") else name
        if name == "transformers.generate":
            self.cur["generate"] += seconds
        elif name == "_get_per_token_logps_and_entropies" and not grad:
            self.cur["ref_logps"] += seconds
        elif name == "_calculate_rewards":
            self.cur["reward"] += seconds
        elif name == "_prepare_inputs":
            self.cur["_prepare_inputs"] += seconds
        elif name == "compute_loss":
            self.cur["forward"] += seconds

    def close_step(self, now: float, begin: float | None):
        c = self.cur
        start = self.last_end if self.last_end is not None else self.train_begin
        step = {k: c.get(k, 0.0) for k in PHASES}
        step["prepare_other"] = max(
            0.0, c["_prepare_inputs"] - c["generate"] - c["ref_logps"] - c["reward"]
        )
        step["backward"] = max(0.0, c["training_step"] - c["_prepare_inputs"] - c["forward"])
        step["wall"] = now - start
        step["begin_to_end"] = now - begin if begin is not None else step["wall"]
        step["other"] = max(0.0, step["wall"] - sum(step[k] for k in PHASES if k != "other"))
        self.steps.append(step)
        self.cur = defaultdict(float)
        self.last_end = now


def install_clock(trainer, clock: StepClock):
    import torch
    import trl.extras.profiling as profiling
    from transformers import TrainerCallback

    context = profiling.ProfilingContext
    original_log = getattr(context, "_untimed_log_metrics", context._log_metrics)

    def log_metrics(self, duration):
        clock.profiled(self.name, duration, torch.is_grad_enabled())
        return original_log(self, duration)

    context._untimed_log_metrics = original_log
    context._log_metrics = log_metrics

    inner_training_step = trainer.training_step

    def training_step(*args, **kwargs):
        t0 = time.perf_counter()
        out = inner_training_step(*args, **kwargs)
        clock.training_step_end = time.perf_counter()
        clock.cur["training_step"] += clock.training_step_end - t0
        return out

    trainer.training_step = training_step

    class Clock(TrainerCallback):
        begin = None

        def on_train_begin(self, args, state, control, **kw):
            clock.train_begin = time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            clock.cur["optimizer"] += time.perf_counter() - clock.training_step_end

        def on_step_end(self, args, state, control, **kw):
            clock.close_step(time.perf_counter(), self.begin)

    trainer.add_callback(Clock())


def versions() -> dict:
    import accelerate
    import datasets
    import torch
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
    }


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor()


def build_trainer(args, rows, out_dir):
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    weights = {"mixed": torch.float32, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=args.dtype != "f32",
        model_init_kwargs={"dtype": weights},
        # One RL step = prompts x n completions = one optimizer step.
        per_device_train_batch_size=args.prompts * args.n,
        gradient_accumulation_steps=1,
        num_generations=args.n,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=args.warmup_steps,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        beta=args.beta,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        gradient_checkpointing=args.gradient_checkpointing,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=exact_match,
        args=config,
        train_dataset=Dataset.from_list(rows),
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer


def summarize(steps: list[dict], first: int) -> dict:
    timed = steps[first - 1 :]
    if not timed:
        return {}
    mean = {k: sum(s[k] for s in timed) / len(timed) for k in ["wall", *PHASES]}
    gen = mean["generate"] + mean["ref_logps"] + mean["reward"] + mean["prepare_other"]
    train = mean["forward"] + mean["backward"] + mean["optimizer"]
    return {"mean": mean, "generation_side_s": gen, "training_side_s": train}


def main(argv=None) -> int:
    args = parse_args(argv)
    # transformers 5 renames gradient_checkpointing, which TRL still sets.
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.timed_from < 1 or args.timed_from > args.steps:
        raise SystemExit(f"--timed-from {args.timed_from} must be in 1..--steps ({args.steps})")
    load_start = os.getloadavg()
    rows = (
        read_rows(args.data, args.prompt_key, args.answer_key)
        if args.data
        else arithmetic_rows(max(1000, args.prompts * args.steps), args.seed)
    )
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        t0 = time.perf_counter()
        trainer = build_trainer(args, rows, out_dir)
        setup_s = time.perf_counter() - t0
        params = sum(p.numel() for p in trainer.model.parameters())
        clock = StepClock()
        install_clock(trainer, clock)
        info = versions()
        print(
            f"trl {info['trl']}, transformers {info['transformers']}, torch {info['torch']}, "
            f"accelerate {info['accelerate']}, datasets {info['datasets']}, python {info['python']}"
        )
        print(
            f"model {args.model}: {params / 1e6:.2f} M parameters, weights {trainer.model.dtype}, "
            f"dtype {args.dtype}, reference model {'yes' if trainer.ref_model is not None else 'no'}, "
            f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}; setup {setup_s:.1f} s"
        )
        print(
            f"job: {args.prompts} prompts x {args.n} samples x {args.max_new_tokens} new tokens, "
            f"{args.steps} steps (timed {args.timed_from}-{args.steps}), lr {args.lr:g}, beta {args.beta:g}, "
            f"torch threads {torch.get_num_threads()}, CPU {cpu_name()} ({os.cpu_count()} cores), "
            f"load {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}"
        )
        sys.stdout.flush()
        trainer.train()
        logged = [h for h in trainer.state.log_history if "reward" in h]
        rewards = [h["reward"] for h in logged]
        lengths = [h.get("completions/mean_length") for h in logged]
    load_end = os.getloadavg()

    for i, s in enumerate(clock.steps, 1):
        parts = ", ".join(f"{k} {s[k]:.2f}" for k in PHASES)
        r = ""
        if i <= len(rewards):
            r = f"; reward {rewards[i - 1]:.3f}, mean completion {lengths[i - 1]:.1f} tokens"
        mark = " (timed)" if i >= args.timed_from else ""
        print(f"step {i}: {s['wall']:.2f} s{mark}: {parts}{r}")
    summary = summarize(clock.steps, args.timed_from)
    if summary:
        m = summary["mean"]
        n = len(clock.steps) - args.timed_from + 1
        walls = [s["wall"] for s in clock.steps[args.timed_from - 1 :]]
        print(
            f"steps {args.timed_from}-{len(clock.steps)} ({n}): mean {m['wall']:.2f} s "
            f"(min {min(walls):.2f}, max {max(walls):.2f}); generation side "
            f"{summary['generation_side_s']:.2f} s (generate {m['generate']:.2f}, ref {m['ref_logps']:.2f}, "
            f"reward+rest {m['reward'] + m['prepare_other']:.2f}), training side "
            f"{summary['training_side_s']:.2f} s (forward {m['forward']:.2f}, backward {m['backward']:.2f}, "
            f"optimizer {m['optimizer']:.2f}), other {m['other']:.2f}"
        )
    peak_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"load average {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} at the end; "
        f"peak RSS {peak_rss_gib:.2f} GiB"
    )
    record = {
        "peer": "trl.GRPOTrainer",
        "versions": info,
        "model": os.path.abspath(args.model),
        "parameters": params,
        "job": {
            "prompts": args.prompts,
            "n": args.n,
            "max_new_tokens": args.max_new_tokens,
            "steps": args.steps,
            "timed_from": args.timed_from,
            "lr": args.lr,
            "warmup_steps": args.warmup_steps,
            "beta": args.beta,
            "dtype": args.dtype,
            "gradient_checkpointing": args.gradient_checkpointing,
            "data": os.path.abspath(args.data) if args.data else f"arithmetic, seed {args.seed}",
        },
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_start": list(load_start),
        "load_end": list(load_end),
        "setup_s": setup_s,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "steps": clock.steps,
        "rewards": rewards,
        "mean_completion_tokens": lengths,
        **summary,
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
