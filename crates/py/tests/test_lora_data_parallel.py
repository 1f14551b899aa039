"""LoRA on data-parallel Ray workers (issue 38): the configs/example.toml
job on the tiny Qwen2 fixture, float32, `[model] lora_rank = 4` on
all-linear, 2 workers × 2 prompts against 1 worker × 4 prompts, same
seeds, 3 steps. Only the adapters train, so only their gradients are
all-reduced and only they are compared between the workers.

Run: `./x pytest lora` (or `.venv/bin/python -m unittest discover -s
crates/py/tests -k lora`).
"""

import json
import os
import shutil
import tempfile
import unittest

import ray

from colo.controller import RunError, start_local_ray, train
from test_data_parallel import ROOT, assert_steps_agree, one_and_two, quiet, write_config

RANK = 4
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_config(path, **overrides):
    """write_config's job with `[model] lora_rank = 4` (lora_alpha and
    target_modules at their defaults: 16, all-linear)."""
    write_config(path, **overrides)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("[model]\n", f"[model]\nlora_rank = {RANK}\n", 1))
    return path


def fixture_sizes():
    """(adapter parameters at rank 4 on all-linear, every parameter of the
    model) of testdata/tiny-qwen2, from its config.json."""
    with open(os.path.join(ROOT, "testdata", "tiny-qwen2", "config.json")) as f:
        c = json.load(f)
    h, i, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    shapes = {  # (in, out) of each projection
        "q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }
    adapters = layers * sum(RANK * (a + b) for a, b in shapes.values())
    per_layer = sum(a * b for a, b in shapes.values()) + (h + 2 * kv) + 2 * h  # + q/k/v biases, 2 norms
    embed = c["vocab_size"] * h * (1 if c["tie_word_embeddings"] else 2)
    return adapters, layers * per_layer + embed + h


def setUpModule():
    start_local_ray(4)


def tearDownModule():
    ray.shutdown()


class LoraDataParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="colo-lora-dp-")
        cls.cfg = lora_config(os.path.join(cls.tmp, "run.toml"))
        cls.one, cls.two = one_and_two(cls.tmp, cls.cfg, cls.cfg)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_per_step_loss_grad_norm_and_scores_agree(self):
        h1, h2 = self.one["history"], self.two["history"]
        self.assertEqual((len(h1), len(h2)), (3, 3))
        assert_steps_agree(self, h1, h2, "2 workers")
        self.assertGreater(max(h["actor/grad_norm"] for h in h1), 0.0, "no update did anything")

    def test_only_the_adapters_gradients_are_all_reduced(self):
        adapters, model = fixture_sizes()
        self.assertEqual(adapters, 8960)  # 2 layers × rank 4 × Σ(in + out)
        for record in self.two["history"]:
            # One mini-batch per step: one all-reduce of every adapter's
            # float32 gradient, none of the frozen weights'.
            self.assertEqual(record["perf/all_reduce_bytes"], 4 * adapters, record["training/global_step"])
        self.assertLess(4 * adapters, 4 * model / 5, "the adapters are a small part of the model")

    def test_the_trained_weights_are_the_adapters_and_agree(self):
        p1, p2 = dict(self.one["parameters"]), dict(self.two["parameters"])
        names = {f"model.layers.{l}.{'self_attn' if p in PROJECTIONS[:4] else 'mlp'}.{p}.lora_{ab}.weight"
                 for l in range(2) for p in PROJECTIONS for ab in "AB"}
        self.assertEqual(set(p1), names)
        self.assertEqual(set(p2), names)
        self.assertEqual(sum(len(v) for v in p1.values()), fixture_sizes()[0])
        # B starts at zero (PEFT's initialisation): the updates moved it.
        self.assertTrue(any(any(x != 0.0 for x in v) for n, v in p1.items() if "lora_B" in n))
        worst = max(max(abs(x - y) for x, y in zip(a, p2[n])) for n, a in p1.items())
        # As test_data_parallel.py: 3 AdamW steps of lr 1e-3.
        self.assertLess(worst, 3e-3, f"largest adapter difference {worst}")

    def test_the_checkpoint_holds_the_adapter_in_peft_format(self):
        d = os.path.join(self.tmp, "two", "checkpoints", "step-3", "lora_adapter")
        with open(os.path.join(d, "adapter_config.json")) as f:
            c = json.load(f)
        self.assertEqual((c["r"], c["peft_type"]), (RANK, "LORA"))
        self.assertTrue(os.path.isfile(os.path.join(d, "adapter_model.safetensors")))

    def test_a_worker_whose_adapters_drift_stops_the_run(self):
        # The digest covers the adapters: one nudged on rank 1 is seen.
        with self.assertRaisesRegex(RunError, r"^step 2: the workers' weights differ"):
            train(self.cfg, os.path.join(self.tmp, "drift"), 2,
                  fault={"rank": 1, "step": 1, "how": "drift"}, digest_every=1, log=quiet)


if __name__ == "__main__":
    unittest.main()
