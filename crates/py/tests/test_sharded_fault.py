"""A worker killed during a gather (issue 37): a sharded 2-worker run,
a checkpoint every step, whose rank 1 ends its process (`os._exit(1)`)
inside an all-gather of step 2 — the controller's fault `how =
"exit_in_gather"`, armed in colo.comm.TorchComm, with rank 0 left in the
same collective. The run stops with an error naming the worker and the
step; resumed from the last checkpoint it gives the steps left as the
run that never stopped.

Of the step's 8 all-gathers on the fixture (3 units: the root and 2
decoder layers), the weight sync makes the first 3 and the update the
other 5; the 7th is in the update's backward, a layer's weights gathered
again after its forward.

Run: `./x pytest` (or `.venv/bin/python -m unittest discover -s crates/py/tests`).
"""

import json
import math
import os
import shutil
import tempfile
import time
import unittest

import ray

from colo.controller import RunError, start_local_ray, train
from test_data_parallel import quiet, write_config
from test_sharded import sharded

FAULT = {"rank": 1, "step": 1, "how": "exit_in_gather", "gather": 7}  # step 1 is the second


def setUpModule():
    start_local_ray(4)


def tearDownModule():
    ray.shutdown()


class KilledDuringAGather(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-sharded-fault-")
        cls.cfg = sharded(write_config(os.path.join(cls.tmp, "run.toml"), save_freq=1, total_steps=4))
        cls.whole = train(cls.cfg, os.path.join(cls.tmp, "whole"), 2, keep_parameters=True, log=quiet)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_run_stops_naming_the_worker_and_the_step_and_resume_is_exact(self):
        out = os.path.join(self.tmp, "cut")
        t = time.monotonic()
        with self.assertRaises(RunError) as e:
            train(self.cfg, out, 2, fault=FAULT, step_timeout=30, log=quiet)
        took = time.monotonic() - t
        text = str(e.exception)
        # The dead worker first; rank 0's failed gather after it, as its echo.
        self.assertTrue(text.startswith("step 2: worker 1 died"), text)
        self.assertIn("then worker 0 failed", text)
        self.assertIn("all_gather_buffer", text)
        self.assertLess(took, 30, "rank 0 did not hang in its gather")
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))), ["step-1"], "no partial checkpoint")

        s = train(self.cfg, out, 2, resume=True, keep_parameters=True, log=quiet)
        self.assertEqual(s["resumed_from"], 1)
        rest = self.whole["history"][1:]
        self.assertEqual([r["training/global_step"] for r in s["history"]], [2, 3, 4])
        for a, b in zip(rest, s["history"]):
            step = a["training/global_step"]
            self.assertEqual(a["critic/score/mean"], b["critic/score/mean"], f"step {step}")
            for key in ("actor/pg_loss", "actor/grad_norm"):
                self.assertTrue(
                    math.isclose(a[key], b[key], rel_tol=1e-6, abs_tol=1e-12),
                    f"step {step} {key}: uninterrupted {a[key]} vs resumed {b[key]}",
                )
        # The step the fault cut short updated something: the comparison
        # is not of zeros alone.
        self.assertNotEqual(rest[0]["actor/pg_loss"], 0.0)
        self.assertGreater(rest[0]["actor/grad_norm"], 0.0)
        p1, p2 = dict(self.whole["parameters"]), dict(s["parameters"])
        self.assertEqual(p1.keys(), p2.keys())
        worst = max(max(abs(x - y) for x, y in zip(a, p2[n])) for n, a in p1.items())
        self.assertLessEqual(worst, 1e-6, f"largest weight difference {worst}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(l)["training/global_step"] for l in f if "actor/pg_loss" in l]
        self.assertEqual(steps, [1, 2, 3, 4], "each step recorded once")

    def test_a_replicated_run_has_no_gather_to_die_in(self):
        cfg = write_config(os.path.join(self.tmp, "replicated.toml"), total_steps=1)
        with self.assertRaisesRegex(
            RunError,
            r"^step 1: worker 1 failed: fault exit_in_gather: gather 1 of step 1 asked for, but the step made 0",
        ):
            train(cfg, os.path.join(self.tmp, "replicated"), 2, fault={"rank": 1, "step": 0, "how": "exit_in_gather"}, log=quiet)


if __name__ == "__main__":
    unittest.main()
