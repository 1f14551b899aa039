"""Decode- and micro-batch-shaped products on one CPU thread (torch 2.11),
for colo's shapes (the rollout bench model's and the built-in model's):

1. `F.linear` against `mm` with a pre-transposed weight, over the rows a
   decode step or a micro-batch has (8-128): microseconds and GFLOP/s;
2. `F.linear` against pre-packed weights: MKL's packed GEMM
   (`torch.ops.mkl._mkl_linear` over `_mkl_reorder_linear_weight`) and
   oneDNN's linear over a reordered weight (`torch.ops.mkldnn._linear_pointwise`).

Usage: .venv/bin/python bench/cpu/linear_shapes.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing import micros  # noqa: E402

torch.set_num_threads(1)

print("1. linear against mm with a pre-transposed weight")
for (K, N) in [(256, 4096), (256, 1408), (256, 384), (704, 256), (128, 102), (128, 768), (384, 128)]:
    for M in [8, 16, 32, 48, 64, 96, 128]:
        x = torch.randn(M, K)
        W = torch.randn(N, K)
        Wt = W.t().contiguous()
        a = micros(lambda: torch.nn.functional.linear(x, W))
        b = micros(lambda: torch.mm(x, Wt))
        gf = lambda us: 2 * M * K * N / us / 1e3
        print(f"K{K} N{N} M{M}: linear {a:.0f}us ({gf(a):.0f} GF/s)  mm-Wt {b:.0f}us ({gf(b):.0f})  ratio {a / b:.2f}")

print("2. linear against pre-packed weights")
for (M, K, N) in [(128, 256, 384), (128, 256, 256), (128, 256, 1408), (128, 704, 256), (128, 256, 4096), (64, 256, 4096), (100, 256, 704)]:
    x = torch.randn(M, K)
    W = torch.randn(N, K)
    base = micros(lambda: torch.nn.functional.linear(x, W), 300, 20)
    r = [f"{M}x{K}x{N}: linear {base:.0f}us"]
    try:
        pw = torch.ops.mkl._mkl_reorder_linear_weight(W, M)
        r.append(f"mkl_packed {micros(lambda: torch.ops.mkl._mkl_linear(x, pw, W, None, M), 300, 20):.0f}us")
    except Exception as e:
        r.append(f"mkl err {e}")
    try:
        dw = torch.ops.mkldnn._reorder_linear_weight(W, M)
        r.append(f"onednn {micros(lambda: torch.ops.mkldnn._linear_pointwise(x, dw, None, 'none', [], ''), 300, 20):.0f}us")
    except Exception as e:
        r.append(f"onednn err {str(e)[:200]}")
    print(", ".join(r))
