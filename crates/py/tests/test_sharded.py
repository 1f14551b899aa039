"""Sharded data parallelism on Ray (issue 37): `[cluster] sharding =
"full"` over 2 real worker processes, each keeping half of the actor's
parameters, gradients and AdamW state, every layer's weights all-gathered
and its gradients reduce-scattered through torch.distributed (gloo) —
against 1 unsharded worker with the whole batch, same seeds, 3 steps.

Run: `./x pytest` (or `.venv/bin/python -m unittest discover -s crates/py/tests`).
"""

import json
import math
import os
import shutil
import subprocess
import tempfile
import unittest

import ray

from colo.controller import start_local_ray, train
from test_data_parallel import assert_steps_agree, colo_binary, one_and_two, quiet, write_config


def sharded(path):
    with open(path, "a") as f:
        f.write('\n[cluster]\nsharding = "full"\n')
    return path


def setUpModule():
    start_local_ray(4)


def tearDownModule():
    ray.shutdown()


class ShardedAgainstOne(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-sharded-")
        one = write_config(os.path.join(cls.tmp, "one.toml"))
        two = sharded(write_config(os.path.join(cls.tmp, "two.toml")))
        cls.one, cls.two = one_and_two(cls.tmp, one, two)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_per_step_loss_grad_norm_and_scores_agree(self):
        h1, h2 = self.one["history"], self.two["history"]
        self.assertEqual((len(h1), len(h2)), (3, 3))
        assert_steps_agree(self, h1, h2, "2 sharded workers", exact=("critic/score/mean",))
        self.assertGreater(max(h["actor/grad_norm"] for h in h1), 0.0, "no update did anything")

    def test_final_weights_agree(self):
        p1, p2 = dict(self.one["parameters"]), dict(self.two["parameters"])
        self.assertEqual(p1.keys(), p2.keys())
        worst = max(max(abs(x - y) for x, y in zip(a, p2[n])) for n, a in p1.items())
        # As the replicated test (test_data_parallel.py): 3 AdamW steps of lr 1e-3.
        self.assertLess(worst, 3e-3, f"largest weight difference {worst}")

    def test_gathers_and_reduce_scatters_are_counted(self):
        for record in self.two["history"]:
            keys = [k for k in record if "all_gather" in k or "reduce_scatter" in k]
            self.assertTrue(keys, f"no gather or reduce-scatter figures in {sorted(record)}")
            self.assertTrue(any(record[k] > 0 for k in keys if k.endswith("bytes")), keys)

    def test_each_worker_moves_what_the_plan_says_per_switch(self):
        # `colo plan reshard` of the same config on its 2 workers: colo-train's
        # units (the root, one per layer), each padded to a multiple of 2 and
        # gathered once in the switch to rollout. The records count what the
        # gathers were handed, per call, on every worker (the largest kept).
        cfg = os.path.join(self.tmp, "two-planned.toml")
        with open(os.path.join(self.tmp, "two.toml")) as f:
            text = f.read()
        with open(cfg, "w") as f:
            f.write(text.replace("[cluster]\n", "[cluster]\nworkers = 2\n"))
        r = subprocess.run([colo_binary(), "plan", "reshard", "--json", "--config", cfg], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = json.loads(r.stdout)
        self.assertEqual((plan["workers"], plan["gen_tp"], plan["dtype"]), (2, 1, "f32"), plan)
        for record in self.two["history"]:
            measured = (record["perf/reshard_sent_bytes"], record["perf/reshard_recv_bytes"])
            self.assertEqual(measured, (plan["executed"]["sent_bytes"], plan["executed"]["received_bytes"]))
        # tiny-qwen2's float32 weights, (N - 1)/N of them per worker, up to
        # each unit's padding (3 units, at most 1 element each).
        model = 111_168 * 4
        self.assertEqual(plan["model_bytes"], model)
        self.assertLessEqual(abs(plan["executed"]["received_bytes"] - model / 2), 3 * 4)
        self.assertNotIn("perf/reshard_sent_bytes", self.one["history"][0])
        self.assertNotIn("perf/reshard_recv_bytes", self.one["history"][0])

    def test_the_checkpoint_is_a_whole_model(self):
        step = os.path.join(self.tmp, "two", "checkpoints", "step-3")
        with open(os.path.join(step, "config.json")) as f:
            self.assertIn("num_hidden_layers", json.load(f))
        self.assertTrue(os.path.isfile(os.path.join(step, "model.safetensors")))
        # The optimizer state stays sharded: a file a worker, and their layout.
        for f in ("optimizer_shards.json", "optimizer-rank-0-of-2.safetensors", "optimizer-rank-1-of-2.safetensors"):
            self.assertTrue(os.path.isfile(os.path.join(step, f)), f)
        self.assertFalse(os.path.exists(os.path.join(step, "optimizer.safetensors")))
        leftovers = [f for f in os.listdir(os.path.dirname(step)) if f.startswith(".")]
        self.assertEqual(leftovers, [], "staged shards left beside the checkpoints")


class ShardedResume(unittest.TestCase):
    """A sharded checkpoint is an ordinary one: a sharded 2-worker run
    stopped at step 2 resumes on 1 unsharded worker, on 2 replicated ones
    and on 2 sharded ones, and continues as the run that never stopped."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-sharded-resume-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def config(self, name, steps, shard):
        path = write_config(os.path.join(self.tmp, f"{name}.toml"), total_steps=steps, save_freq=2)
        return sharded(path) if shard else path

    def test_resume_on_other_worker_counts_and_layouts(self):
        whole = train(self.config("whole", 4, True), os.path.join(self.tmp, "whole"), 2, log=quiet)["history"]
        first = os.path.join(self.tmp, "first")
        train(self.config("first", 2, True), first, 2, log=quiet)
        # (1, True): a sharded rank alone, its gathers at world size 1.
        for workers, shard in ((1, False), (1, True), (2, False), (2, True)):
            out = os.path.join(self.tmp, f"resumed-{workers}-{shard}")
            shutil.copytree(first, out)
            cfg = self.config(f"rest-{workers}-{shard}", 4, shard)
            rest = train(cfg, out, workers, resume=True, log=quiet)["history"]
            self.assertEqual(len(rest), 2, f"{workers} workers, sharded {shard}")
            for a, b in zip(rest, whole[2:]):
                self.assertEqual(a["critic/score/mean"], b["critic/score/mean"])
                for key in ("actor/pg_loss", "actor/grad_norm"):
                    self.assertTrue(
                        math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6),
                        f"{workers} workers (sharded {shard}) step {a['training/global_step']} {key}: "
                        f"{a[key]} vs the run that never stopped {b[key]}",
                    )


class CapacityBetweenThePlans(unittest.TestCase):
    """At a capacity between the sharded and the replicated per-worker
    plan, `colo train` refuses the replicated run and the sharded one
    trains in it (every worker's pool holds the capacity: a plan that
    under-counted would run out of memory)."""

    def test_the_sharded_run_trains_where_the_replica_is_refused(self):
        with tempfile.TemporaryDirectory(prefix="colo-sharded-cap-") as tmp:

            def config(sharding, capacity=None):
                path = os.path.join(tmp, f"{sharding}-{capacity}.toml")
                memory = f"[memory]\ncapacity = {capacity}\n" if capacity else ""
                with open(path, "w") as f:
                    f.write(
                        "[model]\nenable_gradient_checkpointing = true\n[rollout]\nmax_kv_tokens = 4096\n"
                        "[trainer]\ntotal_steps = 2\nval_before_train = false\ntest_freq = -1\n"
                        f"{memory}[cluster]\nworkers = 2\nsharding = \"{sharding}\"\n"
                    )
                return path

            def need(path):
                r = subprocess.run([colo_binary(), "plan", "--json", "--config", path], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                plan = json.loads(r.stdout)
                return plan["peak_bytes"] + plan["margin_bytes"]

            full, none = need(config("full")), need(config("none"))
            self.assertLess(full, none)
            capacity = (full + none) // 2

            def run(sharding):
                out = os.path.join(tmp, f"out-{sharding}")
                cmd = [colo_binary(), "train", "--config", config(sharding, capacity), "--out", out]
                return subprocess.run(cmd, capture_output=True, text=True, timeout=300), out

            refused, out = run("none")
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("cannot fit a worker's device", refused.stderr)
            self.assertFalse(os.path.exists(out))
            trained, out = run("full")
            self.assertEqual(trained.returncode, 0, trained.stderr[-3000:])
            with open(os.path.join(out, "metrics.jsonl")) as f:
                records = [json.loads(l) for l in f if "actor/pg_loss" in l]
            self.assertEqual(len(records), 2)
            for r in records:
                self.assertLessEqual(r["memory/peak_device_bytes"], capacity)


if __name__ == "__main__":
    unittest.main()
