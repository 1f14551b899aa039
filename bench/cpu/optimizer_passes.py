"""The optimizer step's passes over colo bench train's 12.6 M parameters
(hidden 384, 6 layers, vocab 8192), on 1 and 2 libtorch threads (torch 2.11):

1. AdamW as the element-wise ops colo's trainer used before fused AdamW
   (decay, lerp, lerp of g², sqrt, scale, shift, addcdiv, then the
   bf16 copy of the master), against libtorch's `_fused_adamw_` with and
   without that copy;
2. adding two lanes' bf16 gradients into float32 accumulators, and the
   global gradient norm in float64 against per-tensor float32 norms.

Usage: .venv/bin/python bench/cpu/optimizer_passes.py
"""
import time
import warnings

warnings.filterwarnings("ignore")
import torch

SIZES = [8192 * 384] + [384 * 384, 384, 128 * 384, 128, 128 * 384, 128, 384 * 384,
                        1024 * 384, 1024 * 384, 384 * 1024, 384, 384] * 6 + [384]


def timed(name, f, reps=10):
    f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    print(f"  {name}: {(time.perf_counter() - t) / reps * 1e3:.1f} ms")


for threads in (1, 2):
    torch.set_num_threads(threads)
    print(f"{threads} thread(s)")
    P = [torch.randn(n) for n in SIZES]
    G = [torch.randn(n) for n in SIZES]
    M = [torch.zeros(n) for n in SIZES]
    V = [torch.zeros(n) for n in SIZES]
    B = [p.bfloat16() for p in P]
    steps = [torch.tensor(1.0) for _ in SIZES]

    def ops():
        with torch.no_grad():
            for p, g, m, v, b in zip(P, G, M, V, B):
                p.mul_(1 - 1e-5)
                m.lerp_(g, 0.1)
                v.lerp_(g.square(), 0.001)
                d = v.sqrt()
                d.mul_(-1.0)
                d.add_(-1e-8)
                p.addcdiv_(m, d)
                b.copy_(p)

    def fused(copy=True):
        torch._fused_adamw_(P, G, M, V, [], steps, lr=1e-3, beta1=0.9, beta2=0.999,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
        if copy:
            for p, b in zip(P, B):
                b.copy_(p)

    timed("AdamW as element-wise ops + bf16 copy", ops)
    timed("fused AdamW + bf16 copy", fused)
    timed("fused AdamW", lambda: fused(False))

    A = [torch.zeros(n) for n in SIZES]
    G1 = [torch.randn(n).bfloat16() for n in SIZES]
    G2 = [torch.randn(n).bfloat16() for n in SIZES]
    timed("copy bf16 gradients into f32", lambda: [a.copy_(g) for a, g in zip(A, G1)])
    timed("add bf16 gradients into f32", lambda: [a.add_(g) for a, g in zip(A, G2)])
    timed("norm in float64", lambda: torch.stack([a.norm(2, dtype=torch.float64) for a in A]).norm().item())
    timed("per-tensor norms in float32", lambda: torch.stack([a.norm(2) for a in A]).norm().item())
