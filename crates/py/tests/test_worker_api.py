"""The hybrid worker's operations one by one from Python (issue 11): a GRPO
step composed by hand — switch, generate, score, update — on the tiny
Qwen2 fixture, one worker, no Ray. The communicator here is the identity
(one rank has no peer); the torch.distributed one is tested with real
peers in test_data_parallel.py.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import colo
from colo import Worker

from test_data_parallel import ROOT, write_config


class Alone:
    """The communicator of a group of one: every reduction is the identity."""

    def all_reduce_buffers(self, views):
        pass

    def all_reduce_values(self, values, op):
        return values

    def all_gather_buffer(self, shard, full, dtype):
        full[:] = shard  # one rank's shard is the whole

    def reduce_scatter_buffer(self, shard, full, dtype):
        shard[:] = full


def tag(stats, name):
    return next(t for t in stats["tags"] if t["tag"] == name)


class WorkerApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-worker-api-")
        cfg = write_config(os.path.join(cls.tmp, "run.toml"))
        cls.w = Worker(cfg, os.path.join(cls.tmp, "run"), 0, 1, Alone())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_a_grpo_step_composed_by_hand(self):
        w = self.w
        self.assertEqual(w.phase(), "train")
        w.begin_step(5)
        w.to_rollout()
        self.assertEqual(w.phase(), "rollout")
        last = json.loads(w.timeline().splitlines()[-1])
        self.assertEqual(last["step"], 5, "begin_step numbers the timeline's events")
        # Staged colocation: the trainer's state is released while generating.
        stats = json.loads(w.memory())
        self.assertEqual(tag(stats, "train_params")["resident_bytes"], 0)
        self.assertGreater(tag(stats, "weights")["resident_bytes"], 0)

        prompts = [[5, 17, 42, 9], [33, 8, 101]]
        out = w.generate(prompts, n=4, max_new_tokens=8, seed=3)
        self.assertEqual([len(o) for o in out], [4, 4])
        for tokens, logprobs, finish in (c for o in out for c in o):
            self.assertEqual(len(tokens), len(logprobs))
            self.assertIn(finish, ("stop", "length"))
            self.assertTrue(all(lp <= 0.0 for lp in logprobs))
        again = w.generate(prompts, n=4, max_new_tokens=8, seed=3)
        self.assertEqual(out, again, "the same seed draws the same samples")

        w.to_train()
        self.assertEqual(w.phase(), "train")
        events = [json.loads(l) for l in w.timeline().splitlines()]
        moves = [(e["kind"], e["tags"]) for e in events if e["kind"] in ("pause", "resume")]
        self.assertEqual(moves[-2][0], "pause", "the engine sleeps ...")
        self.assertIn("kv_cache", moves[-2][1])
        self.assertEqual(moves[-1][0], "resume", "... and the trainer wakes")
        self.assertIn("train_params", moves[-1][1])
        P = [p for p, o in zip(prompts, out) for _ in o]
        R = [c[0] for o in out for c in o]
        old = w.log_probs(P, R)
        rollout_lp = [c[1] for o in out for c in o]
        worst = max(abs(a - b) for x, y in zip(old, rollout_lp) for a, b in zip(x, y))
        self.assertLess(worst, 1e-3, "trainer and rollout engine agree on the samples")
        ref = w.ref_log_probs(P, R)
        if ref is not None:
            self.assertEqual([len(r) for r in ref], [len(r) for r in R])

        # GRPO advantages: each sample's score standardised in its group.
        rng = random.Random(0)
        scores = [rng.random() for _ in R]
        adv = []
        for g in range(len(prompts)):
            group = scores[4 * g : 4 * g + 4]
            mean = sum(group) / 4
            std = (sum((s - mean) ** 2 for s in group) / 3) ** 0.5
            adv += [[(s - mean) / (std + 1e-6)] * len(R[4 * g + i]) for i, s in enumerate(group)]

        before = w.weights()
        m = json.loads(w.update_policy(P, R, adv, old, ref))
        self.assertGreater(m["grad_norm"], 0.0)
        after = w.weights()
        self.assertNotEqual([v for _, _, v in before], [v for _, _, v in after], "the update moved the weights")
        self.assertNotEqual(w.log_probs(P, R), old)

        # Weights in: back to the starting ones, bit for bit.
        w.load_weights([(name, values) for name, _, values in before])
        self.assertEqual(w.weights(), before)
        self.assertEqual(w.log_probs(P, R), old)

    def test_views_share_the_actors_memory_and_lock_the_phase(self):
        w = self.w
        before = w.weights()
        name, shape, values = before[1]
        with colo.views(w, "weights") as ws:
            self.assertEqual(list(ws[name].shape), shape)
            self.assertEqual(ws[name].flatten().tolist(), values, "the view reads the weights")
            ws[name].mul_(0.0)  # ... and writes them
            with self.assertRaisesRegex(RuntimeError, "to_rollout: 1 view"):
                w.to_rollout()
        self.assertEqual(w.phase(), "train")
        self.assertEqual(w.weights()[1][2], [0.0] * len(values))
        w.load_weights([(n, v) for n, _, v in before])

        with colo.views(w, "optimizer") as opt:
            self.assertIn(f"{name}.exp_avg", opt)
            self.assertIn(f"{name}.exp_avg_sq", opt)

        # A tensor kept past the block: an error, and the worker stays
        # locked until it is dropped and the views are closed.
        with self.assertRaisesRegex(RuntimeError, "still referenced"):
            with colo.views(w, "grads") as gs:
                kept = gs[name]
        with self.assertRaisesRegex(RuntimeError, "view"):
            w.to_rollout()
        with self.assertRaisesRegex(RuntimeError, "close_views: 1 of the views are still referenced"):
            w.close_views()  # `kept` still reads the memory: refused
        self.assertEqual(kept.numel(), len(values))
        del kept, gs
        w.close_views()
        w.to_rollout()
        w.to_train()

        # The block's own exception goes up unchanged: the views close when
        # nothing holds a tensor from them...
        with self.assertRaisesRegex(ValueError, "the block's own error"):
            with colo.views(w, "weights") as ws:
                ws[name].add_(0.0)
                raise ValueError("the block's own error")
        w.to_rollout()
        w.to_train()
        # ... and stay open, said in a note, while something does (it was
        # replaced by "still referenced").
        with self.assertRaises(ValueError) as caught:
            with colo.views(w, "weights") as ws:
                held = ws[name]
                raise ValueError("again")
        notes = "\n".join(getattr(caught.exception, "__notes__", []))
        self.assertIn("a tensor from the block is still referenced", notes)
        with self.assertRaisesRegex(RuntimeError, "view"):
            w.to_rollout()
        del held, ws, caught  # the exception's traceback holds the block's frame
        w.close_views()
        w.to_rollout()
        w.to_train()

        # The raw API: the views close only once nothing references them
        # (a tensor made from one, or the list itself), so none can read
        # memory a phase switch released.
        items = w.open_views("weights")
        t = torch.frombuffer(items[1][3], dtype=torch.float32)
        del items
        with self.assertRaisesRegex(RuntimeError, "still referenced"):
            w.close_views()
        with self.assertRaisesRegex(RuntimeError, "view"):
            w.to_rollout()
        self.assertEqual(t.numel(), len(values))
        del t
        w.close_views()
        w.to_rollout()
        w.to_train()
        with self.assertRaisesRegex(RuntimeError, "no views are open"):
            w.close_views()
        with self.assertRaisesRegex(RuntimeError, "expected \"weights\", \"grads\" or \"optimizer\""):
            w.open_views("moments")

    def test_misuse_is_an_error_naming_what_was_expected(self):
        w = self.w
        with self.assertRaisesRegex(RuntimeError, "one value per response token"):
            w.update_policy([[5, 6]], [[7, 8, 9]], [[0.5]], [[-1.0, -1.0, -1.0]])
        with self.assertRaisesRegex(RuntimeError, "one response per prompt row"):
            w.log_probs([[5, 6]], [])
        name, shape, values = w.weights()[0]
        with self.assertRaisesRegex(RuntimeError, "no parameter"):
            w.load_weights([("not.a.weight", values)])
        with self.assertRaisesRegex(RuntimeError, f"{name}: 1 values for a parameter of shape"):
            w.load_weights([(name, values[:1])])
        with self.assertRaisesRegex(ValueError, "item 0 is str; expected \\(name, values\\)"):
            w.load_weights(["weights"])
        # Rows of token ids and of numbers: the argument, the place, what it
        # was and what was expected, in Python's words (not Rust's types).
        for call, message in (
            (lambda: w.log_probs("5 6", [[7]]), r"prompts: expected a list of token-id lists \(ints ≥ 0\); got '5 6' \(a str\)"),
            (lambda: w.log_probs([[5, 6]], [[7, -1]]), r"responses: .*; row 0, item 1 is -1 \(an int\)"),
            (lambda: w.ref_log_probs([[5], "6"], [[7], [8]]), r"prompts: .*; row 1 is '6' \(a str\)"),
            (lambda: w.update_policy([[5, 6]], [[7]], [["high"]], [[-1.0]]), r"advantages: expected a list of lists of numbers; row 0, item 0 is 'high' \(a str\)"),
            (lambda: w.update_policy([[5, 6]], [[7]], [[0.5]], [[-1.0]], 3), r"ref_log_probs: .*; got 3 \(an int\)"),
            (lambda: w.generate([[5, 6.5]]), r"prompts: .*; row 0, item 1 is 6.5 \(a float\)"),
        ):
            with self.assertRaisesRegex(ValueError, message):
                call()
        w.to_rollout()
        try:
            with self.assertRaisesRegex(RuntimeError, "rollout phase"):
                w.weights()
            for op in (w.log_probs, w.ref_log_probs):
                with self.assertRaisesRegex(RuntimeError, "cannot score samples.*rollout phase"):
                    op([[5, 6]], [[7]])
            with self.assertRaisesRegex(RuntimeError, "cannot update the policy.*rollout phase"):
                w.update_policy([[5, 6]], [[7]], [[0.5]], [[-1.0]])
        finally:
            w.to_train()

    def test_samples_are_checked_against_the_model(self):
        w = self.w
        # tiny-qwen2: 384 tokens, a context of 512.
        with self.assertRaisesRegex(RuntimeError, r"sample 1: response token 2 is 384, outside the vocabulary \(size 384\)"):
            w.log_probs([[5, 6], [5]], [[7], [8, 9, 384]])
        with self.assertRaisesRegex(RuntimeError, "sample 0: prompt token 0 is 1000, outside the vocabulary"):
            w.update_policy([[1000]], [[7]], [[0.5]], [[-1.0]])
        with self.assertRaisesRegex(RuntimeError, r"sample 0: 500 prompt \+ 13 response tokens, more than the model's context \(max_position_embeddings = 512\)"):
            w.log_probs([[5] * 500], [[7] * 13])
        with self.assertRaisesRegex(RuntimeError, "sample 0: the prompt is empty"):
            w.log_probs([[]], [[7]])
        before = w.weights()
        for key, values in (("advantages", [[float("nan")]]), ("old_log_probs", [[float("-inf")]])):
            args = {"advantages": [[0.5]], "old_log_probs": [[-1.0]], key: values}
            with self.assertRaisesRegex(RuntimeError, f"{key}: sample 0, token 0 is (NaN|-inf); expected a finite number"):
                w.update_policy([[5, 6]], [[7]], args["advantages"], args["old_log_probs"])
        with self.assertRaisesRegex(RuntimeError, "ref_log_probs: sample 0, token 0 is inf"):
            w.update_policy([[5, 6]], [[7]], [[0.5]], [[-1.0]], [[float("inf")]])
        self.assertEqual(w.weights(), before, "nothing was trained")

    def test_weights_round_trip_and_are_checked(self):
        w = self.w
        before = w.weights()
        name, shape, values = before[0]
        # weights() gives (name, shape, values): load_weights takes them back.
        w.load_weights([(n, s, [x * 0.5 for x in v]) for n, s, v in before])
        self.assertEqual(w.weights()[0][2], [x * 0.5 for x in values])
        w.load_weights(before)
        self.assertEqual(w.weights(), before)
        bad = list(values)
        bad[3] = float("inf")
        with self.assertRaisesRegex(RuntimeError, f"{name}: value 3 is inf; expected a finite number"):
            w.load_weights([(before[1][0], before[1][2]), (name, bad)])
        with self.assertRaisesRegex(RuntimeError, f"{name} is given twice"):
            w.load_weights([(name, values), (name, values)])
        wrong = list(reversed(shape))
        with self.assertRaisesRegex(RuntimeError, rf"{name}: shape \[{wrong[0]}, {wrong[1]}\] \({len(values)} values\) for a parameter of shape"):
            w.load_weights([(name, wrong, values)])
        self.assertEqual(w.weights(), before, "a refused load writes nothing")

    def test_steps_run_in_order_within_the_schedule(self):
        w = self.w
        with self.assertRaisesRegex(RuntimeError, "begin a step: step 0: RL steps count from 1"):
            w.begin_step(0)
        with self.assertRaisesRegex(RuntimeError, r"step 3: the run has 3 steps \(0 to 2\)"):
            w.step(3)
        with self.assertRaisesRegex(RuntimeError, "step 1: steps run in order, and the next one is 0"):
            w.step(1)


class WorkerLifecycle(unittest.TestCase):
    """What a worker refuses when made and after it finishes."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="colo-worker-life-")
        self.cfg = write_config(os.path.join(self.tmp, "run.toml"))
        self.out = os.path.join(self.tmp, "run")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_arguments_are_checked_when_the_worker_is_made(self):
        with self.assertRaisesRegex(ValueError, "comm: a NoneType has no method all_reduce_buffers"):
            Worker(self.cfg, self.out, 0, 1, None)
        with self.assertRaisesRegex(RuntimeError, "the run directory is empty"):
            Worker(self.cfg, "", 0, 1, Alone())
        with self.assertRaisesRegex(RuntimeError, r"rank 2 of a group of 2 workers: ranks count from 0"):
            Worker(self.cfg, self.out, 2, 2, Alone())
        with self.assertRaisesRegex(RuntimeError, "a directory, not a config file"):
            Worker(self.tmp, self.out, 0, 1, Alone())
        with self.assertRaisesRegex(RuntimeError, "no complete checkpoint of step 2 to resume from"):
            Worker(self.cfg, self.out, 0, 1, Alone(), resume_from=2)
        self.assertFalse(os.path.exists(os.path.join(self.out, "checkpoints")), "refused before writing")

    def test_an_interrupted_step_is_its_own_exception_and_crosses_processes(self):
        # The controller tells a step cut short by the stop request from a
        # failure by this class, after Ray pickled it in a worker.
        import pickle

        from colo._colo import StepInterrupted

        self.assertEqual(StepInterrupted.__module__, "colo._colo")
        self.assertTrue(issubclass(StepInterrupted, RuntimeError))
        back = pickle.loads(pickle.dumps(StepInterrupted("stopped at your request")))
        self.assertIsInstance(back, StepInterrupted)
        self.assertEqual(str(back), "stopped at your request")

    def test_an_interrupted_step_leaves_the_worker_where_the_step_began(self):
        # Dynamic sampling that never finishes (exact match never scores on
        # the random model), asked to stop: the step is cut short, and the
        # worker is back in the training phase with the step's first
        # generation batch next, so the controller can save the last
        # finished step and a resumed run draws this step's batches again.
        from colo._colo import StepInterrupted

        with tempfile.TemporaryDirectory(prefix="colo-worker-int-") as tmp:
            cfg = write_config(os.path.join(tmp, "run.toml"))
            with open(cfg) as f:
                text = f.read().replace('kind = "numeric"', 'kind = "exact_match"')
            with open(cfg, "w") as f:
                f.write(text + "\n[algorithm.filter_groups]\nenable = true\n")
            out = os.path.join(tmp, "run")
            w = Worker(cfg, out, 0, 1, Alone())
            stop = os.path.join(tmp, "stop")
            open(stop, "w").close()
            w.set_stop_file(stop)
            with self.assertRaisesRegex(StepInterrupted, "stopped at your request"):
                w.step(0)
            self.assertEqual(w.phase(), "train")
            w.save(1)
            with open(os.path.join(out, "checkpoints", "step-1", "data_state.json")) as f:
                self.assertEqual(json.load(f)["gen_batches"], 0)

    def test_a_finished_worker_refuses_to_go_on(self):
        w = Worker(self.cfg, self.out, 0, 1, Alone())
        json.loads(w.step(0))
        with self.assertRaisesRegex(RuntimeError, "load the checkpoint: .*step-1"):
            w.load(1)
        w.save(1)
        w.load(1)
        json.loads(w.step(1))
        directory, _ = w.finish()
        for call in (lambda: w.step(2), w.to_rollout, lambda: w.save(2), w.finish):
            with self.assertRaisesRegex(RuntimeError, "the worker has finished"):
                call()
        self.assertEqual(w.phase(), "train", "reading is still allowed")
        # The controller's picture of the workers, into a folder it makes.
        pictures = os.path.join(self.tmp, "pictures", "new")
        colo._colo.draw_workers(pictures, [directory])
        self.assertTrue(os.path.isfile(os.path.join(pictures, "memory_workers.svg")))
        # Tallies no evaluation could give.
        good, bad = ({"all": {"right": r, "score_sum": 1.0, "n": 2}} for r in (1, 5))
        with self.assertRaisesRegex(ValueError, r"eval_record: part 1: right = 5 of n = 2 prompts"):
            colo._colo.eval_record(0, [json.dumps(good), json.dumps(bad)], 0.1)


if __name__ == "__main__":
    unittest.main()


# A worker made in a process of its own, whose stderr (libtorch's and
# Rust's, written to the file descriptor) the test reads.
MAKE_A_WORKER = """
import sys
from colo import Worker
from test_worker_api import Alone
Worker(sys.argv[1], sys.argv[2], 0, 1, Alone())
"""


class Diagnostics(unittest.TestCase):
    """colo's diagnostics reach a Python process's stderr as they reach
    `colo`'s: `colo: warning: ...`, warnings by default, filtered by
    COLO_LOG."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="colo-worker-log-")
        # The fixture with one layer fewer in its config than in its
        # weights: it loads, with a warning naming the unused tensors.
        model = os.path.join(self.tmp, "model")
        shutil.copytree(os.path.join(ROOT, "testdata", "tiny-qwen2"), model)
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
        config["num_hidden_layers"] = 1
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(config, f)
        self.cfg = write_config(os.path.join(self.tmp, "run.toml"))
        with open(self.cfg) as f:
            text = f.read()
        text = text.replace(f'"{ROOT}/testdata/tiny-qwen2"', json.dumps(model))
        self.assertIn(json.dumps(model), text)
        with open(self.cfg, "w") as f:
            f.write(text)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def make(self, out, colo_log):
        env = {k: v for k, v in os.environ.items() if k != "COLO_LOG"}
        if colo_log is not None:
            env["COLO_LOG"] = colo_log
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
        done = subprocess.run(
            [sys.executable, "-c", MAKE_A_WORKER, self.cfg, os.path.join(self.tmp, out)],
            env=env, capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stderr

    def test_a_library_warning_reaches_stderr_unless_filtered(self):
        said = self.make("run", None)
        lines = [l for l in said.splitlines() if "tensors of the checkpoint are not used" in l]
        self.assertEqual(len(lines), 1, said)
        self.assertTrue(lines[0].startswith("colo: warning: "), said)
        self.assertIn("model.layers.1.", lines[0])
        quiet = self.make("quiet", "off")
        self.assertNotIn("not used", quiet)
