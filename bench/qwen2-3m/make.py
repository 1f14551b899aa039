"""Make the "user's own model" job of issue 9: a randomly initialised 3 M-parameter
Qwen2 (hidden 256, 4 layers) as a Hugging Face directory, arithmetic prompts as JSONL,
and a run config (8 prompts x 8 samples, <= 32 new tokens, default capacity "auto").

Needs only torch (the project's .venv); the tokenizer is testdata/tiny-qwen2's.
Usage: .venv/bin/python bench/qwen2-3m/make.py OUT_DIR   then   colo train --config OUT_DIR/run.toml
"""
import json, os, random, shutil, struct, sys

import warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch

out = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
tok_dir = os.path.join(here, "..", "..", "testdata", "tiny-qwen2")
model_dir = os.path.join(out, "model")
os.makedirs(model_dir, exist_ok=True)

H, L, I, HEADS, KV, V = 256, 4, 688, 4, 2, 384
config = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
    "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": V,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "torch_dtype": "float32",
}
json.dump(config, open(os.path.join(model_dir, "config.json"), "w"), indent=2)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(os.path.join(tok_dir, f), model_dir)

g = torch.Generator().manual_seed(0)
def normal(*shape):
    return torch.randn(*shape, generator=g) * 0.02
hd = H // HEADS
tensors = {"model.embed_tokens.weight": normal(V, H), "model.norm.weight": torch.ones(H)}
for i in range(L):
    p = f"model.layers.{i}."
    tensors.update({
        p + "input_layernorm.weight": torch.ones(H),
        p + "post_attention_layernorm.weight": torch.ones(H),
        p + "self_attn.q_proj.weight": normal(H, H), p + "self_attn.q_proj.bias": torch.zeros(H),
        p + "self_attn.k_proj.weight": normal(KV * hd, H), p + "self_attn.k_proj.bias": torch.zeros(KV * hd),
        p + "self_attn.v_proj.weight": normal(KV * hd, H), p + "self_attn.v_proj.bias": torch.zeros(KV * hd),
        p + "self_attn.o_proj.weight": normal(H, H),
        p + "mlp.gate_proj.weight": normal(I, H), p + "mlp.up_proj.weight": normal(I, H),
        p + "mlp.down_proj.weight": normal(H, I),
    })

# safetensors by hand (the format is an 8-byte header length, a JSON header, raw bytes),
# so that the script needs nothing beyond torch.
header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    t = tensors[name].contiguous()
    b = bytes(t.view(torch.uint8).reshape(-1).tolist()) if t.numel() else b""
    header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(model_dir, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(f"{sum(t.numel() for t in tensors.values()) / 1e6:.2f} M parameters in {model_dir}")

rng = random.Random(0)
def rows(n):
    for _ in range(n):
        a, b = rng.randrange(60), rng.randrange(60)
        yield {"prompt": f"Question: what is {a} + {b}? Answer:", "answer": str(a + b)}
for name, n in (("train.jsonl", 512), ("val.jsonl", 64)):
    with open(os.path.join(out, name), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows(n))

with open(os.path.join(out, "run.toml"), "w") as f:
    f.write(f"""# issue 9's user-model job: 3 M-parameter Qwen2, 8 prompts x 8 samples, <= 32 new tokens,
# default capacity ("auto": the machine's memory) and KV budget.
[data]
train_files = "{out}/train.jsonl"
val_files = "{out}/val.jsonl"
train_batch_size = 8
max_prompt_length = 32

[model]
path = "{model_dir}"

[rollout]
n = 8
max_new_tokens = 32

[actor]
ppo_mini_batch_size = 8

[trainer]
total_steps = 10
test_freq = -1
save_freq = -1
val_before_train = false
out_dir = "{out}/run"
""")
