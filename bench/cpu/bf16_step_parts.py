"""What a bf16 training step's parts gain over float32 on one CPU thread
(torch 2.11), at the shapes of one lane of colo bench train (2 rows of
256 tokens, hidden 384, MLP 1024, 6 heads of 64 over 2 KV heads, vocab
8192): on AMX the products run ~5x faster in bf16, while attention and
RMSNorm take the same time in both kinds.

1. products: forward, grad-of-input and grad-of-weight, ms and GFLOP/s;
2. causal GQA attention forward + backward: libtorch's SDPA (flash on
   the CPU) against batched products with a float32 softmax;
3. RMSNorm forward + backward: `rms_norm` against `layer_norm` (a fused
   kernel, which RMSNorm is not on the CPU) for scale.

Usage: .venv/bin/python bench/cpu/bf16_step_parts.py
"""
import time
import warnings

warnings.filterwarnings("ignore")
import torch

torch.set_num_threads(1)
F = torch.nn.functional


def ms(f, reps=30):
    for _ in range(3):
        f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps * 1e3


for dt in (torch.bfloat16, torch.float32):
    print(dt)
    for (m, k, n) in [(512, 384, 1024), (512, 1024, 384), (512, 384, 8192), (512, 384, 384)]:
        x, w, g = torch.randn(m, k).to(dt), torch.randn(n, k).to(dt), torch.randn(m, n).to(dt)
        gf = 2 * m * k * n / 1e6
        parts = [("fwd", lambda: F.linear(x, w)), ("dX", lambda: g.mm(w)), ("dW", lambda: g.t().mm(x))]
        print(f"  {m}x{k}x{n}: " + ", ".join(f"{name} {t:.3f} ms {gf / t:.0f} GFLOP/s"
                                            for name, t in ((nm, ms(f)) for nm, f in parts)))
    S = 256
    q0, k0, v0 = torch.randn(2, 6, S, 64).to(dt), torch.randn(2, 2, S, 64).to(dt), torch.randn(2, 2, S, 64).to(dt)
    mask = torch.full((S, S), float("-inf")).triu(1)

    def sdpa():
        q, k, v = [t.clone().requires_grad_() for t in (q0, k0, v0)]
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()

    def products():
        q, k, v = [t.clone().requires_grad_() for t in (q0, k0, v0)]
        s = torch.matmul(q.view(2, 2, 3 * S, 64), k.transpose(-1, -2)) * 64 ** -0.5
        p = (s.view(2, 2, 3, S, S).float() + mask).softmax(-1).to(dt)
        torch.matmul(p.view(2, 2, 3 * S, S), v).sum().backward()

    print(f"  attention fwd+bwd: SDPA {ms(sdpa):.2f} ms, products + f32 softmax {ms(products):.2f} ms")
    x0, w0 = torch.randn(512, 384).to(dt), torch.ones(384).to(dt)

    def norm(f):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        f(x, w).sum().backward()

    rms = ms(lambda: norm(lambda x, w: F.rms_norm(x, (384,), w, 1e-6)), 100)
    ln = ms(lambda: norm(lambda x, w: F.layer_norm(x, (384,), w, None, 1e-6)), 100)
    print(f"  norm fwd+bwd (512x384): rms_norm {rms:.2f} ms, layer_norm {ln:.2f} ms")
