"""Data-parallel colo on Ray (issue 11), on this machine's CPU: real Ray
actors in separate processes, gradients all-reduced through
torch.distributed (gloo), the configs/example.toml job on the tiny Qwen2
fixture.

Run: `./x pytest` (or `.venv/bin/python -m unittest discover -s crates/py/tests`).
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import ray

from colo.controller import RunError, on_this_machine, start_local_ray, train

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def write_config(path, **overrides):
    """configs/example.toml with absolute fixture paths, one mini-batch per
    step (so 2 workers × 2 prompts is exactly 1 worker × 4), offloads at
    every switch, float32, and overrides
    (key = raw TOML value, in the [trainer] or [actor] section)."""
    with open(os.path.join(ROOT, "configs", "example.toml")) as f:
        text = f.read()
    text = text.replace('"testdata/', f'"{ROOT}/testdata/')
    text = re.sub(r"ppo_mini_batch_size = \d+", "ppo_mini_batch_size = 4", text)
    # Every switch gives up all the offload flags allow, so the tests see the
    # staged choreography whatever the room (the default, as_needed, keeps
    # what fits: crates/rl/tests/worker.rs).
    text = text.replace("[memory]\n", '[memory]\noffload_policy = "always"\n')
    # The tolerances are float32's (`auto` is bf16 on some CPUs).
    text = text.replace("[trainer]\n", '[trainer]\ndtype = "f32"\n')
    for key, value in overrides.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        if n == 0:
            text = text.replace("[trainer]\n", f"[trainer]\n{key} = {value}\n")
    with open(path, "w") as f:
        f.write(text)
    return path


def setUpModule():
    # Logical CPUs: four one-CPU workers fit on this 2-core machine. On
    # 127.0.0.1 alone, as a run without cluster.address starts it.
    start_local_ray(4)


def tearDownModule():
    ray.shutdown()


def quiet(*_):
    pass


def one_and_two(tmp, one, two):
    """Config `one` on 1 worker and `two` on 2 (the workers' weight digests
    compared after every step: the controller stops a run whose workers
    differ), into `tmp/one` and `tmp/two`, weights kept: their summaries."""
    return (
        train(one, os.path.join(tmp, "one"), 1, keep_parameters=True, log=quiet),
        train(two, os.path.join(tmp, "two"), 2, keep_parameters=True, digest_every=1, log=quiet),
    )


LOSSES = ("actor/pg_loss", "actor/grad_norm", "actor/entropy")
SAME_SAMPLES = ("critic/score/mean", "response_length/mean")


def assert_steps_agree(case, one, other, label, losses=LOSSES, exact=SAME_SAMPLES):
    """Each step of `other` against `one` (1 worker): the `exact` keys
    equal (the same samples: seeds are per run, step and prompt), the
    `losses` within float32 summation order (1e-4 relative)."""
    for step, (a, b) in enumerate(zip(one, other), 1):
        for key in exact:
            case.assertEqual(a[key], b[key], f"{label}, step {step}")
        for key in losses:
            case.assertTrue(
                math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6),
                f"step {step} {key}: 1 worker {a[key]} vs {label} {b[key]}",
            )


class Bf16(unittest.TestCase):
    """bf16 mixed precision, the default where the device multiplies bf16
    natively (`trainer.dtype = "auto"`): two workers keep identical weights
    (the controller compares digests every step and stops the run if they
    differ) and the checkpoint is written in bf16."""

    def test_two_bf16_workers_stay_identical(self):
        tmp = tempfile.mkdtemp(prefix="colo-dp-bf16-")
        try:
            cfg = write_config(os.path.join(tmp, "run.toml"), dtype='"bf16"', total_steps=2)
            r = train(cfg, os.path.join(tmp, "run"), 2, digest_every=1, log=quiet)
            self.assertEqual(len(r["history"]), 2)
            with open(os.path.join(tmp, "run", "checkpoints", "step-2", "config.json")) as f:
                self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Equivalence(unittest.TestCase):
    """2 workers × 2 prompts against 1 worker × 4 prompts, same seeds, 3
    steps. They differ only in the order of float sums: the all-reduce
    adds two partial gradients where one device adds micro-batches."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-dp-")
        cfg = write_config(os.path.join(cls.tmp, "run.toml"))
        cls.one = train(cfg, os.path.join(cls.tmp, "one"), 1, keep_parameters=True, log=quiet)
        # The same run, its generations dumped (verl's rollout_data_dir and
        # validation_data_dir).
        dumps = os.path.join(cls.tmp, "dumps")
        cfg = write_config(
            os.path.join(cls.tmp, "dumps.toml"),
            rollout_data_dir=json.dumps(os.path.join(dumps, "train")),
            validation_data_dir=json.dumps(os.path.join(dumps, "val")),
        )
        cls.two = train(cfg, os.path.join(cls.tmp, "two"), 2, keep_parameters=True, log=quiet)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_per_step_loss_grad_norm_and_scores_agree(self):
        h1, h2 = self.one["history"], self.two["history"]
        self.assertEqual(len(h1), 3)
        self.assertEqual(len(h2), 3)
        assert_steps_agree(self, h1, h2, "2 workers")
        # A step whose groups all scored alike has no advantage (and at
        # step 1 no KL): at least one of the three must have moved.
        self.assertGreater(max(h["actor/grad_norm"] for h in h1), 0.0, "no update did anything")

    def test_final_weights_agree(self):
        p1, p2 = dict(self.one["parameters"]), dict(self.two["parameters"])
        self.assertEqual(p1.keys(), p2.keys())
        worst = 0.0
        for name, a in p1.items():
            b = p2[name]
            worst = max(worst, max(abs(x - y) for x, y in zip(a, b)))
        # Three AdamW steps of lr 1e-3: a parameter moves by up to ~3e-3;
        # rounding-level gradient differences move it by far less, except
        # where the gradient itself is rounding noise (Adam's normalisation
        # turns noise into a step of ~lr): bounded by 3 steps × lr.
        self.assertLess(worst, 3e-3, f"largest weight difference {worst}")
        close = sum(
            1 for name, a in p1.items() if max(abs(x - y) for x, y in zip(a, p2[name])) < 1e-5
        )
        self.assertGreater(close / len(p1), 0.9, "most tensors agree to 1e-5")

    def test_each_worker_dumps_its_share_of_the_generations(self):
        inputs = set()
        for rank in (0, 1):
            d = os.path.join(self.tmp, "dumps", "train", f"rank-{rank}")
            self.assertEqual(sorted(os.listdir(d)), ["1.jsonl", "2.jsonl", "3.jsonl"])
            with open(os.path.join(d, "1.jsonl")) as f:
                rows = [json.loads(l) for l in f]
            self.assertEqual(len(rows), 2 * 4, "2 of the step's 4 prompts, 4 samples each")
            self.assertEqual({r["step"] for r in rows}, {1})
            inputs |= {r["input"] for r in rows}
            v = os.path.join(self.tmp, "dumps", "val", f"rank-{rank}")
            self.assertEqual(sorted(os.listdir(v)), ["0.jsonl", "3.jsonl"])
        self.assertEqual(len(inputs), 4, "the ranks' shares are the step's 4 prompts")

    def test_one_timeline_and_picture_per_worker(self):
        dirs = self.two["worker_dirs"]
        self.assertEqual(len(dirs), 2)
        for rank, d in enumerate(dirs):
            self.assertTrue(d.endswith(f"rank-{rank}"), d)
            with open(os.path.join(d, "timeline.jsonl")) as f:
                events = [json.loads(l) for l in f]
            # Multi-stage awake on every worker, as on one device: the
            # serving weights wake, the trainer's copy is freed, and only
            # then the KV cache wakes; every step.
            moves = [
                (e["kind"], tuple(e["tags"]))
                for e in events
                if e["kind"] in ("pause", "resume")
            ]
            stage = [
                ("resume", ("weights",)),
                ("pause", ("train_params",)),
                ("resume", ("kv_cache",)),
            ]
            runs = sum(1 for i in range(len(moves)) if moves[i : i + 3] == stage)
            self.assertGreaterEqual(runs, 3, f"rank {rank}: {moves}")
            gen = [e for e in events if e["phase"] == "generate"]
            self.assertTrue(gen, "generation is in the timeline")
            self.assertTrue(
                all(e["per_tag"].get("train_params", 0) == 0 for e in gen),
                "the trainer's weights are released while generating",
            )
            self.assertTrue(os.path.isfile(os.path.join(d, "memory_timeline.svg")))
        for ext in ("svg", "png"):
            path = os.path.join(self.two["out"], f"memory_workers.{ext}")
            self.assertGreater(os.path.getsize(path), 1000, path)
        with open(os.path.join(self.two["out"], "memory_workers.svg")) as f:
            svg = f.read()
        self.assertIn("worker 0", svg)
        self.assertIn("worker 1", svg)

    def test_metrics_have_verl_names_and_the_controller_share(self):
        with open(os.path.join(self.two["out"], "metrics.jsonl")) as f:
            records = [json.loads(l) for l in f]
        steps = [r for r in records if "actor/pg_loss" in r]
        self.assertEqual([r["training/global_step"] for r in steps], [1, 2, 3])
        for r in steps:
            self.assertIn("timing_s/gen", r)
            self.assertGreater(r["perf/all_reduce_bytes"], 0)
            self.assertGreaterEqual(r["timing_s/controller"], 0.0)
        evals = [r for r in records if "eval/accuracy" in r]
        self.assertEqual([r["training/global_step"] for r in evals], [0, 3])
        self.assertTrue(all(r["eval/n_samples"] == 4 for r in evals), evals)
        # The workers' shares add up per data_source too (the fixture's rows
        # all name "tiny-arith").
        for r in evals:
            by = r["eval/by_data_source"]
            self.assertEqual(list(by), ["tiny-arith"], r)
            self.assertEqual(by["tiny-arith"]["n_samples"], 4, r)
            self.assertEqual(by["tiny-arith"]["accuracy"], r["eval/accuracy"], r)
        self.assertTrue(os.path.isdir(os.path.join(self.two["out"], "checkpoints", "step-3")))


def colo_binary():
    """The colo binary the tests run: $COLO_BIN, else the newest build."""
    if os.environ.get("COLO_BIN"):
        return os.environ["COLO_BIN"]
    built = [os.path.join(ROOT, "target", p, "colo") for p in ("debug", "release")]
    built = [b for b in built if os.path.isfile(b)]
    if not built:
        raise AssertionError("no colo binary: build it first (./x test does)")
    return max(built, key=os.path.getmtime)


class CommandLine(unittest.TestCase):
    def test_colo_train_with_a_cluster_section_runs_on_ray(self):
        """Without held-out data (no val_files), too: the run does not
        evaluate."""
        with tempfile.TemporaryDirectory(prefix="colo-dp-cli-") as tmp:
            cfg = write_config(os.path.join(tmp, "run.toml"))
            with open(cfg) as f:
                text = re.sub(r"^val_files = .*\n", "", f.read(), flags=re.M)
            with open(cfg, "w") as f:
                f.write(text + '\n[cluster]\nlayout = "1-1-2"\n')
            out = os.path.join(tmp, "run")
            r = subprocess.run(
                [colo_binary(), "train", "--config", cfg, "--out", out],
                capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn("done: 3 steps on 2 workers; no held-out set", r.stdout)
            self.assertEqual(sorted(os.listdir(os.path.join(out, "workers"))), ["rank-0", "rank-1"])
            with open(os.path.join(out, "config.toml")) as f:  # the resolved configuration, once
                self.assertIn("[cluster]", f.read())
            with open(os.path.join(out, "metrics.jsonl")) as f:
                records = [json.loads(l) for l in f]
            self.assertEqual([r["training/global_step"] for r in records], [1, 2, 3])
            self.assertTrue(all("actor/pg_loss" in r for r in records), "steps only, no evaluation")


class Interrupt(unittest.TestCase):
    """Ctrl-C of `colo train` on Ray, as on one device: the first stops the
    run after the step under way with a checkpoint of it (status 130, the
    command that resumes said), the second at once; no process of the run
    is left behind. The signal goes to `colo` alone, as `kill -INT` sends
    it: colo passes it on to its controller, whose process group keeps the
    terminal's from Ray's processes."""

    def launch(self, tmp, steps, extra="", reward="numeric"):
        cfg = write_config(os.path.join(tmp, "run.toml"), total_steps=steps, test_freq=0)
        with open(cfg) as f:
            text = f.read().replace('kind = "numeric"', f'kind = "{reward}"')
        with open(cfg, "w") as f:
            f.write(text + extra + '\n[cluster]\nlayout = "1-1-2"\n')
        out = os.path.join(tmp, "run")
        proc = subprocess.Popen(
            [colo_binary(), "train", "--config", cfg, "--out", out],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        return cfg, out, proc

    def start(self, tmp, steps):
        cfg, out, proc = self.launch(tmp, steps)
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.monotonic() + 300
        while not (os.path.exists(metrics) and "pg_loss" in open(metrics).read()):
            self.assertIsNone(proc.poll(), "the run ended before its first step")
            self.assertLess(time.monotonic(), deadline, "no step in 300 s")
            time.sleep(0.1)
        return cfg, out, proc

    def steps(self, out):
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [json.loads(l)["training/global_step"] for l in f if "pg_loss" in l]

    def assert_nothing_left(self, out):
        left = subprocess.run(["pgrep", "-f", f"colo.controller .*--out {out}"], capture_output=True, text=True)
        self.assertEqual(left.stdout, "", "the controller outlived colo")

    def test_ctrl_c_stops_after_the_step_with_a_checkpoint_and_resume_continues(self):
        with tempfile.TemporaryDirectory(prefix="colo-dp-int-") as tmp:
            cfg, out, proc = self.start(tmp, 1000)
            proc.send_signal(2)
            _, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 130, err[-3000:])
            k = len(self.steps(out))
            self.assertEqual(self.steps(out), list(range(1, k + 1)))
            self.assertIn(f"stopped at your request after step {k} of 1000", err)
            self.assertIn(f"--out {out} --resume` continues from it", err)
            self.assertTrue(os.path.isfile(os.path.join(out, "checkpoints", f"step-{k}", "model.safetensors")))
            self.assert_nothing_left(out)

            write_config(cfg, total_steps=k + 1, test_freq=0)
            with open(cfg, "a") as f:
                f.write('\n[cluster]\nlayout = "1-1-2"\n')
            r = subprocess.run(
                [colo_binary(), "train", "--config", cfg, "--out", out, "--resume"],
                capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertEqual(self.steps(out), list(range(1, k + 2)))

    def test_ctrl_c_while_starting_stops_cleanly_and_leaves_the_directory_reusable(self):
        with tempfile.TemporaryDirectory(prefix="colo-dp-int0-") as tmp:
            cfg, out, proc = self.launch(tmp, 1000)
            time.sleep(1.0)  # the controller is still importing torch and Ray
            proc.send_signal(2)
            _, err = proc.communicate(timeout=180)
            self.assertEqual(proc.returncode, 130, err[-3000:])
            self.assertIn("stopped at your request before its first step; nothing was trained", err)
            self.assertNotIn("Traceback", err)
            self.assert_nothing_left(out)
            write_config(cfg, total_steps=1, test_freq=0)
            with open(cfg, "a") as f:
                f.write('\n[cluster]\nlayout = "1-1-2"\n')
            r = subprocess.run([colo_binary(), "train", "--config", cfg, "--out", out], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])

    def test_ctrl_c_ends_a_step_whose_dynamic_sampling_never_finishes(self):
        """No group ever varies (exact match never scores on the random
        model) and there is no batch limit: the workers stop drawing
        together when asked."""
        extra = '\n[algorithm.filter_groups]\nenable = true\n'
        with tempfile.TemporaryDirectory(prefix="colo-dp-int-ds-") as tmp:
            _, out, proc = self.launch(tmp, 5, extra, reward="exact_match")
            # The controller opens metrics.jsonl once the workers are set
            # up; the first step starts right after the first evaluation.
            metrics = os.path.join(out, "metrics.jsonl")
            deadline = time.monotonic() + 300
            while not (os.path.exists(metrics) and "eval/accuracy" in open(metrics).read()):
                self.assertIsNone(proc.poll(), "the run ended on its own")
                self.assertLess(time.monotonic(), deadline, "no evaluation in 300 s")
                time.sleep(0.1)
            time.sleep(2)  # drawing batch after batch
            proc.send_signal(2)
            _, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 130, err[-3000:])
            self.assertIn("during step 1, which could not finish", err)
            self.assert_nothing_left(out)

    def test_a_second_ctrl_c_stops_at_once(self):
        with tempfile.TemporaryDirectory(prefix="colo-dp-int2-") as tmp:
            _, out, proc = self.start(tmp, 1000)
            proc.send_signal(2)
            time.sleep(0.01)
            proc.send_signal(2)
            _, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 130, err[-3000:])
            # (The step under way may end between the two: then the run
            # stops as after one.)
            self.assertTrue("stopped now" in err or "stopped at your request" in err, err[-3000:])
            self.assertNotIn("Traceback", err)
            self.assert_nothing_left(out)


class InterruptApi(unittest.TestCase):
    def test_sigint_stops_a_run_of_the_python_api_after_the_step(self):
        """`train` called from Python (its main thread): SIGINT writes a
        stop file of the process's own, the run stops after the step under
        way with a checkpoint, and the file is gone afterwards."""
        with tempfile.TemporaryDirectory(prefix="colo-dp-api-int-") as tmp:
            cfg = write_config(os.path.join(tmp, "run.toml"), total_steps=1000, test_freq=0)
            out = os.path.join(tmp, "run")
            metrics = os.path.join(out, "metrics.jsonl")

            def interrupt_after_a_step():
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    if os.path.exists(metrics) and "pg_loss" in open(metrics).read():
                        break
                    time.sleep(0.1)
                os.kill(os.getpid(), signal.SIGINT)

            thread = threading.Thread(target=interrupt_after_a_step)
            thread.start()
            s = train(cfg, out, 2, log=quiet)
            thread.join()
            k = s["stopped"]
            self.assertIsNotNone(k)
            self.assertGreater(k, 0)
            self.assertEqual(s["checkpoint"], k)
            self.assertTrue(os.path.isdir(os.path.join(out, "checkpoints", f"step-{k}")))
            self.assertEqual([f for f in os.listdir(out) if f.startswith(".colo-stop")], [])


MULTI_NODE = """
import json, sys
import ray
from ray.cluster_utils import Cluster
from colo.controller import on_this_machine, train

with on_this_machine():  # both nodes on 127.0.0.1
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
try:
    s = train(sys.argv[1], sys.argv[2], 2, log=lambda *_: None)
    print(json.dumps({"nodes": s["nodes"], "steps": s["steps"]}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


class MultiNode(unittest.TestCase):
    def test_one_placement_group_per_node(self):
        """Two one-CPU nodes (two raylets on this machine, Ray's own test
        cluster): the two workers land one per node and train together."""
        with tempfile.TemporaryDirectory(prefix="colo-dp-nodes-") as tmp:
            cfg = write_config(os.path.join(tmp, "run.toml"))
            r = subprocess.run(
                [sys.executable, "-W", "ignore", "-c", MULTI_NODE, cfg, os.path.join(tmp, "run")],
                capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            s = json.loads(r.stdout.strip().splitlines()[-1])
            self.assertEqual(s["steps"], 3)
            self.assertEqual(len(set(s["nodes"])), 2, f"workers on nodes {s['nodes']}")


DS_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    varies = int(ground_truth) % 2 == 0
    return float(sum(map(ord, solution_str)) % 2) if varies else 1.0
"""


class DynamicSampling(unittest.TestCase):
    """DAPO's dynamic sampling on two workers: each keeps the groups of its
    share of every generation batch whose score varies, the workers draw
    the same batches until both have their share, and a resumed run draws
    what the uninterrupted one did. The reward varies only for prompts
    with an even answer (the parity of the completion's characters), so
    a step needs more than one batch."""

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="colo-dp-ds-")
        cls.whole = cls.train_run(cls, "whole", 4)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.base, ignore_errors=True)

    def train_run(self, name, steps, resume=False, dumps=None, log=quiet):
        reward = os.path.join(self.base, "reward.py")
        with open(reward, "w") as f:
            f.write(DS_REWARD)
        cfg = write_config(os.path.join(self.base, f"{name}-{steps}.toml"), total_steps=steps, save_freq=1, test_freq=0)
        with open(cfg) as f:
            text = f.read()
        text = text.replace('kind = "numeric"', f'kind = "python"\npath = "{reward}"')
        text = text.replace("train_batch_size = 4", "train_batch_size = 4\ngen_batch_size = 4")
        if dumps:
            text = text.replace("[trainer]\n", f'[trainer]\nrollout_data_dir = "{dumps}"\n')
        text += '\n[algorithm.filter_groups]\nenable = true\nmetric = "score"\nmax_num_gen_batches = 0\n'
        with open(cfg, "w") as f:
            f.write(text)
        out = os.path.join(self.base, name)
        train(cfg, out, 2, resume=resume, log=log)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [json.loads(l) for l in f if "actor/pg_loss" in l]

    def data_state(self, name, step):
        with open(os.path.join(self.base, name, "checkpoints", f"step-{step}", "data_state.json")) as f:
            return json.load(f)["gen_batches"]

    def test_every_trained_group_varies_on_every_worker(self):
        dumps = os.path.join(self.base, "dumps")
        self.train_run("dumped", 2, dumps=dumps)
        for rank in (0, 1):
            rows = []
            for step in (1, 2):
                with open(os.path.join(dumps, f"rank-{rank}", f"{step}.jsonl")) as f:
                    rows += [json.loads(l) for l in f]
            self.assertEqual(len(rows), 2 * 2 * 4, "2 steps × this worker's 2 prompts × 4 samples")
            groups = {}
            for r in rows:
                groups.setdefault((r["step"], r["input"]), []).append(r["score"])
            for (step, prompt), scores in groups.items():
                self.assertEqual(len(set(scores)), 2, f"rank {rank} step {step}: {prompt!r} {scores}")

    def test_batches_are_counted_and_a_resumed_run_draws_the_same(self):
        drawn = [r["train/num_gen_batches"] for r in self.whole]
        self.assertTrue(all(n >= 1 for n in drawn), drawn)
        self.assertGreater(sum(drawn), 4, f"some step drew more than one batch: {drawn}")
        self.assertEqual(self.data_state("whole", 4), sum(drawn))
        self.train_run("resumed", 2)
        said = []
        resumed = self.train_run("resumed", 4, resume=True, log=said.append)
        # The changed keys are named, as `colo train --resume` names them.
        self.assertTrue(any("trainer.total_steps: 2 → 4" in line for line in said), said)
        self.assertEqual(self.data_state("resumed", 4), sum(drawn))
        for a, b in zip(self.whole, resumed):
            for key in ("train/num_gen_batches", "critic/score/mean", "actor/pg_loss"):
                self.assertEqual(a[key], b[key], f"step {a['training/global_step']} {key}")


class Faults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="colo-dp-fault-")
        cfg = write_config(os.path.join(cls.base, "run.toml"), save_freq=1)
        cls.uninterrupted = train(cfg, os.path.join(cls.base, "whole"), 2, keep_parameters=True, log=quiet)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.base, ignore_errors=True)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="colo-dp-fault-", dir=self.base)
        self.cfg = write_config(os.path.join(self.tmp, "run.toml"), save_freq=1)

    def check_stops_then_resumes(self, how, message):
        out = os.path.join(self.tmp, "run")
        t = time.monotonic()
        with self.assertRaises(RunError) as e:
            train(self.cfg, out, 2, fault={"rank": 1, "step": 2, "how": how}, step_timeout=60, log=quiet)
        took = time.monotonic() - t
        text = str(e.exception)
        self.assertTrue(text.startswith(f"step 3: {message}"), text)
        self.assertLess(took, 90, "the run stopped in bounded time")
        ckpts = sorted(os.listdir(os.path.join(out, "checkpoints")))
        self.assertEqual(ckpts, ["step-1", "step-2"], "no partial checkpoint")
        s = train(self.cfg, out, 2, resume=True, keep_parameters=True, log=quiet)
        self.assertEqual(s["resumed_from"], 2)
        # Exact: weights, optimizer state and sampling seeds come back.
        self.assertEqual(s["parameters"], self.uninterrupted["parameters"], "resume is exact")
        self.assertEqual(s["history"][-1]["actor/pg_loss"], self.uninterrupted["history"][-1]["actor/pg_loss"])
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(l)["training/global_step"] for l in f if "actor/pg_loss" in l]
        self.assertEqual(steps, [1, 2, 3], "each step recorded once")
        for rank in (0, 1):
            with open(os.path.join(out, "workers", f"rank-{rank}", "metrics.jsonl")) as f:
                steps = [json.loads(l)["training/global_step"] for l in f if "actor/pg_loss" in l]
            self.assertEqual(steps, [1, 2, 3], f"rank {rank}'s own records, kept and cut back")
            # Its memory timeline too: steps 1-2 of the stopped run (appended
            # step by step, a killed process included), then the resumed one.
            with open(os.path.join(out, "workers", f"rank-{rank}", "timeline.jsonl")) as f:
                events = [json.loads(l) for l in f]
            steps = [e["step"] for e in events]
            self.assertEqual(steps, sorted(steps), f"rank {rank}: steps in order, none repeated")
            self.assertTrue({1, 2, 3} <= set(steps), f"rank {rank}: {sorted(set(steps))}")
            times = [e["t_s"] for e in events]
            self.assertEqual(times, sorted(times), f"rank {rank}: one run in time")

    def test_a_killed_worker_stops_the_run_naming_it_and_resume_continues(self):
        self.check_stops_then_resumes("exit", "worker 1 died")

    def test_workers_whose_weights_drift_apart_stop_the_run(self):
        with self.assertRaisesRegex(RunError, r"^step 2: the workers' weights differ"):
            train(self.cfg, os.path.join(self.tmp, "drift"), 2, fault={"rank": 1, "step": 1, "how": "drift"}, digest_every=1, log=quiet)

    def test_resume_refuses_a_checkpoint_beyond_the_run(self):
        out = os.path.join(self.tmp, "run")
        train(self.cfg, out, 2, log=quiet)
        short = write_config(os.path.join(self.tmp, "short.toml"), save_freq=1, total_steps=2)
        with self.assertRaisesRegex(RunError, r"checkpoint is at step 3, beyond trainer.total_steps = 2"):
            train(short, out, 2, resume=True, log=quiet)
        with self.assertRaisesRegex(RunError, r"already holds a run \(checkpoints/step-3, step-2, step-1; 3 steps and 2 evaluations in metrics.jsonl\): --resume continues it"):
            train(self.cfg, out, 2, log=quiet)
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))), ["step-1", "step-2", "step-3"])

    def test_a_worker_that_raises_stops_the_run_naming_it(self):
        self.check_stops_then_resumes("raise", "worker 1 failed: injected failure")


class BadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="colo-dp-bad-")
        self.cfg = write_config(os.path.join(self.tmp, "run.toml"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_more_workers_than_the_cluster_has(self):
        cfg = write_config(os.path.join(self.tmp, "eight.toml"), train_batch_size=8, ppo_mini_batch_size=8)
        with self.assertRaisesRegex(RunError, r"workers = 8 needs 8 CPU slots; the Ray cluster has 4"):
            train(cfg, os.path.join(self.tmp, "a"), 8, log=quiet)

    def test_a_batch_that_does_not_divide(self):
        with self.assertRaisesRegex(RunError, r"train_batch_size = 4 prompts cannot be split evenly over cluster.workers = 3"):
            train(self.cfg, os.path.join(self.tmp, "b"), 3, log=quiet)

    def test_an_unreachable_address(self):
        r = subprocess.run(
            [sys.executable, "-m", "colo.controller", "--config", self.cfg, "--out",
             os.path.join(self.tmp, "c"), "--workers", "1", "--address", "127.0.0.1:1"],
            capture_output=True, text=True, timeout=60,
        )
        self.assertEqual(r.returncode, 1, r.stderr[-2000:])
        self.assertIn("no Ray cluster reachable", r.stderr)


if __name__ == "__main__":
    unittest.main()
