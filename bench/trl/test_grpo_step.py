"""grpo_step.py's checks, on the repository's tiny Qwen2 checkpoint (seconds):

    bench/trl/.venv/bin/python -m unittest discover -s bench/trl -p 'test_*.py'
"""

import contextlib
import io
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import grpo_step  # noqa: E402

TINY = os.path.join(ROOT, "testdata", "tiny-qwen2")
TINY_ARITH = os.path.join(ROOT, "testdata", "tiny-arith", "train.jsonl")


class Pieces(unittest.TestCase):
    def test_exact_match_trims_and_compares_whole_answers(self):
        self.assertEqual(
            grpo_step.exact_match([" 12 ", "12\n", "13", "1 2", "120"], ["12"] * 5),
            [1.0, 1.0, 0.0, 0.0, 0.0],
        )

    def test_arithmetic_rows_are_sums_and_seeded(self):
        rows = grpo_step.arithmetic_rows(50, 7)
        self.assertEqual(rows, grpo_step.arithmetic_rows(50, 7))
        self.assertNotEqual(rows, grpo_step.arithmetic_rows(50, 8))
        for r in rows:
            a, b = r["prompt"].removesuffix("=").split("+")
            self.assertEqual(int(r["answer"]), int(a) + int(b))
            self.assertTrue(0 <= int(a) <= 99 and 0 <= int(b) <= 99)

    def test_read_rows_follows_a_dotted_answer_path(self):
        rows = grpo_step.read_rows(TINY_ARITH, "prompt", "reward_model.ground_truth")
        self.assertEqual(len(rows), 16)
        self.assertEqual(rows[0], {"prompt": "Question: what is 10 + 4? Answer:", "answer": "14"})
        with self.assertRaises(SystemExit):
            grpo_step.read_rows(TINY_ARITH, "prompt", "answer")


class TinyRun(unittest.TestCase):
    def test_three_steps_each_one_optimizer_step_of_all_completions(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            grpo_step.main(["--model", TINY, "--steps", "3", "--timed-from", "2", "--threads", "1"])
        record = json.loads(out.getvalue().strip().splitlines()[-1])
        self.assertEqual(record["peer"], "trl.GRPOTrainer")
        self.assertEqual(record["versions"]["torch"].split("+")[0], "2.11.0")
        self.assertEqual(record["torch_threads"], 1)
        steps = record["steps"]
        self.assertEqual(len(steps), 3)  # one optimizer step per RL step
        self.assertEqual(len(record["rewards"]), 3)
        for s in steps:
            self.assertGreater(s["generate"], 0)
            self.assertGreater(s["ref_logps"], 0)  # beta > 0 loads and runs the reference
            self.assertGreater(s["forward"], 0)
            timed = sum(s[k] for k in grpo_step.PHASES)
            self.assertAlmostEqual(timed, s["wall"], delta=1e-6 + 0.01 * s["wall"])
        mean = record["mean"]["wall"]
        self.assertAlmostEqual(mean, (steps[1]["wall"] + steps[2]["wall"]) / 2, places=9)
        self.assertIn("steps 2-3 (2): mean", out.getvalue())

    def test_beta_zero_has_no_reference_pass(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            grpo_step.main(["--model", TINY, "--steps", "1", "--timed-from", "1", "--beta", "0"])
        record = json.loads(out.getvalue().strip().splitlines()[-1])
        self.assertEqual(record["steps"][0]["ref_logps"], 0)
        self.assertIn("reference model no", out.getvalue())


if __name__ == "__main__":
    unittest.main()
