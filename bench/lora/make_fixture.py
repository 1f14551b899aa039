"""Makes testdata/lora-peft: random LoRA adapters on the float32 fixture models
saved by PEFT, with PEFT + transformers' reference log-probabilities and
gradients of the adapters, for colo-train's `tests/lora.rs` parity test.

Rerun (from the repository root; bench/trl/.venv has transformers and torch,
`bench/trl/.venv/bin/pip install peft==0.21.0` adds PEFT):

    bench/trl/.venv/bin/python bench/lora/make_fixture.py testdata/lora-peft

For each of testdata/tiny-qwen2 (q/k/v biases, tied embeddings; every
projection, rank 4, alpha 8) and testdata/tiny-llama (untied; q, v and
down projections, rank 2, alpha 6) it writes into OUT/<model>/:

- adapter/: PEFT's `save_pretrained` of the adapter (adapter_config.json,
  adapter_model.safetensors), A and B drawn from N(0, 0.1²) (seed 0), so
  that B is not zero and every adapter changes the output;
- reference.safetensors: `input_ids` (the model fixture's 3×10 batch),
  `logprobs` (3×9, log p(ids[t] | ids[<t]) for t ≥ 1) of the adapted model,
  and `grad.<name>` for every adapter tensor, colo's names
  (`model.layers.0.self_attn.q_proj.lora_A.weight`): the gradient of the
  mean next-token cross-entropy over those 27 tokens;
- reference.json: that loss and the versions that made it.
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CASES = {
    "tiny-qwen2": dict(r=4, lora_alpha=8, target_modules="all-linear"),
    "tiny-llama": dict(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj"]),
}


def colo_name(peft_name):
    """base_model.model.X.lora_A.default.weight -> X.lora_A.weight"""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".default.", ".")


def make(out_root, model_name, lora):
    # Relative, so that the adapters' base_model_name_or_path names no machine's directories.
    src = os.path.join("testdata", model_name)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **lora))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.1)
    model.train()
    out = os.path.join(out_root, model_name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(os.path.join(out, "adapter"))
    os.remove(os.path.join(out, "adapter", "README.md"))  # PEFT's model card template
    ids = load_file(os.path.join(src, "reference.safetensors"))["input_ids"].to(torch.int64)
    logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -logp.mean()
    loss.backward()
    tensors = {"input_ids": ids, "logprobs": logp.detach().contiguous()}
    for n, p in model.named_parameters():
        if "lora_" in n:
            tensors[f"grad.{colo_name(n)}"] = p.grad.detach().contiguous()
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    meta = {
        "loss": loss.item(),
        "lora": {k: v for k, v in lora.items()},
        "note": "logprobs: log p(ids[t] | ids[<t]) for t >= 1 of the adapted model; loss: their negated "
                "mean; grad.<adapter>: its gradient",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(model_name, "adapter tensors", sum("lora_" in n for n, _ in model.named_parameters()), "loss", loss.item())


if __name__ == "__main__":
    out_root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "testdata", "lora-peft"))
    os.chdir(ROOT)
    for name, lora in CASES.items():
        make(out_root, name, lora)
