"""Checks a LoRA checkpoint of `colo train` against PEFT: the adapter in
CHECKPOINT/lora_adapter, loaded by PEFT on the starting model it names
(`base_model_name_or_path`), gives the log-probabilities `colo score` gives
on the checkpoint's merged model (CHECKPOINT/model.safetensors), and that
transformers gives on it.

Run by hand (CI has no PEFT), from the repository root:

    ./x cargo build --release -p colo
    bench/trl/.venv/bin/pip install peft==0.21.0      # once
    bench/trl/.venv/bin/python bench/lora/check_checkpoint.py RUN/checkpoints/step-N

Options: --base DIR (another starting model), --colo PATH (the colo binary,
default target/release/colo), --tol X (the largest allowed difference of a
token's log-probability; default 1e-4 for a float32 checkpoint, 2e-2 for
bfloat16, whose merged weights are rounded once more than PEFT's base plus
adapter). Prints each pair's largest difference and exits 1 past --tol.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["12+34=", "What is 7 + 8? Answer:", "The quick brown fox jumps over the lazy dog."]


def logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits.float()
    lp = torch.log_softmax(logits[0, :-1], dim=-1)
    return lp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def colo_score(colo, ckpt, ids):
    out = subprocess.run([colo, "score", "--model", ckpt, "--ids", ",".join(map(str, ids)), "--json"],
                         check=True, capture_output=True, text=True)
    return torch.tensor(json.loads(out.stdout)["logprobs"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint")
    p.add_argument("--base")
    p.add_argument("--colo", default="target/release/colo")
    p.add_argument("--tol", type=float)
    a = p.parse_args()
    adapter = os.path.join(a.checkpoint, "lora_adapter")
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        cfg = json.load(f)
    base_dir = a.base or cfg["base_model_name_or_path"]
    with open(os.path.join(a.checkpoint, "config.json")) as f:
        model_cfg = json.load(f)
    dtype = model_cfg.get("torch_dtype") or model_cfg.get("dtype")
    tol = a.tol if a.tol is not None else (1e-4 if dtype == "float32" else 2e-2)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(a.checkpoint)
    print(f"checkpoint {a.checkpoint} ({dtype}), base {base_dir}, r {cfg['r']}, alpha {cfg['lora_alpha']}, "
          f"targets {cfg['target_modules']}")
    worst = {"peft vs colo score (merged)": 0.0, "peft vs transformers (merged)": 0.0}
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        want = logprobs(peft, ids)
        for name, got in [("peft vs colo score (merged)", colo_score(a.colo, a.checkpoint, ids)),
                          ("peft vs transformers (merged)", logprobs(merged, ids))]:
            worst[name] = max(worst[name], (got - want).abs().max().item())
        with peft.disable_adapter():  # PEFT wrapped `base` in place
            base_gap = (logprobs(peft, ids) - want).abs().max().item()
        print(f"{text!r}: {len(ids)} tokens; the adapter moves log-probs by up to {base_gap:.3g} from the base")
    for name, d in worst.items():
        print(f"{name}: max |Δ log p| = {d:.3g} (tolerance {tol:g})")
    sys.exit(0 if max(worst.values()) <= tol else 1)


if __name__ == "__main__":
    main()
