"""Tensor-parallel rollout on Ray (issue 37, item 2): with
`[rollout] tensor_model_parallel_size = 2` the rollout engines of each
pair of consecutive workers keep half of the attention heads and of the
MLP and generate their prompts together, all-reducing through their own
torch.distributed group (gloo) — the same samples as one worker's engine,
so the run is the data-parallel run, generation and all. Real worker
processes, configs/example.toml on the tiny Qwen2 fixture, float32.

Run: `./x pytest` (or `.venv/bin/python -m unittest discover -s crates/py/tests`).
"""

import os
import shutil
import tempfile
import unittest

import ray

from colo.controller import RunError, start_local_ray, train
from test_data_parallel import assert_steps_agree, quiet, write_config


def tensor_parallel(path, tg, sharding=None):
    with open(path) as f:
        text = f.read()
    text = text.replace("[rollout]\n", f"[rollout]\ntensor_model_parallel_size = {tg}\n", 1)
    if sharding:
        text += f'\n[cluster]\nsharding = "{sharding}"\n'
    with open(path, "w") as f:
        f.write(text)
    return path


def setUpModule():
    start_local_ray(4)


def tearDownModule():
    ray.shutdown()


class TensorParallelAgainstOne(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-tp-")
        cfg = lambda name: write_config(os.path.join(cls.tmp, f"{name}.toml"))  # noqa: E731
        cls.one = train(cfg("one"), os.path.join(cls.tmp, "one"), 1, log=quiet)["history"]
        cls.runs = {
            "2 workers, tg 2": train(tensor_parallel(cfg("tp2"), 2), os.path.join(cls.tmp, "tp2"), 2, log=quiet),
            "2 sharded workers, tg 2": train(
                tensor_parallel(cfg("tp2s"), 2, "full"), os.path.join(cls.tmp, "tp2s"), 2, log=quiet
            ),
            "4 workers, two groups of tg 2": train(
                tensor_parallel(cfg("tp4"), 2), os.path.join(cls.tmp, "tp4"), 4, log=quiet
            ),
        }

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_same_samples_and_updates_as_one_worker(self):
        for name, run in self.runs.items():
            history = run["history"]
            self.assertEqual(len(history), 3, name)
            # The same completions: the split engines compute the one
            # engine's logits.
            assert_steps_agree(self, self.one, history, name, losses=("actor/pg_loss", "actor/grad_norm"))

    def test_the_groups_all_reduce_in_their_own_process_groups(self):
        for name, run in self.runs.items():
            for record in run["history"]:
                self.assertGreater(record["perf/tp_all_reduce_calls"], 0, name)
                self.assertGreater(record["perf/tp_all_reduce_bytes"], 0, name)


class Refusals(unittest.TestCase):
    def test_a_group_size_the_workers_or_heads_cannot_take_is_refused_naming_the_key(self):
        with tempfile.TemporaryDirectory(prefix="colo-tp-bad-") as tmp:
            # 2 workers cannot form groups of 4 (the check before any worker starts).
            cfg = tensor_parallel(write_config(os.path.join(tmp, "a.toml")), 4)
            with self.assertRaises((RunError, ValueError)) as e:
                train(cfg, os.path.join(tmp, "a"), 2, log=quiet)
            self.assertIn("rollout.tensor_model_parallel_size", str(e.exception))
            # tiny-qwen2 has 4 attention heads: groups of 3 cannot split them.
            cfg = write_config(os.path.join(tmp, "b.toml"), train_batch_size=3, ppo_mini_batch_size=3, ppo_micro_batch_size=4)
            cfg = tensor_parallel(cfg, 3)
            with self.assertRaises(RunError) as e:
                train(cfg, os.path.join(tmp, "b"), 3, log=quiet)
            self.assertIn("rollout.tensor_model_parallel_size", str(e.exception))


if __name__ == "__main__":
    unittest.main()
