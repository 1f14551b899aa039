"""Single-thread libtorch timings of the 3 M model's decode-sized ops (32 rows) against one 2,200-row product, f32 and bf16: are small products or small ops the cost of a decode step?

Usage: .venv/bin/python bench/qwen2-3m/small_ops.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing import micros  # noqa: E402

torch.set_num_threads(1)
def bench(f, n=2000):
    return micros(f, n, 50)
for dt in (torch.float32, torch.bfloat16):
    x=torch.randn(32,256,dtype=dt); w=torch.randn(688,256,dtype=dt); b=torch.randn(688,dtype=dt)
    w2=torch.randn(1376,256,dtype=dt); w3=torch.randn(256,688,dtype=dt); h=torch.randn(32,688,dtype=dt)
    wq=torch.randn(512,256,dtype=dt)
    print(dt, "linear 32x256->688 %.1f us" % bench(lambda: torch.nn.functional.linear(x,w)),
          "->1376 %.1f" % bench(lambda: torch.nn.functional.linear(x,w2)),
          "688->256 %.1f" % bench(lambda: torch.nn.functional.linear(h,w3)),
          "qkv 256->512 bias %.1f" % bench(lambda: torch.nn.functional.linear(x,wq,None)),
          "add %.1f" % bench(lambda: x+x), "mul %.1f" % bench(lambda: x*x),
          "silu %.1f" % bench(lambda: torch.nn.functional.silu(h)),
          "view %.1f" % bench(lambda: x.view(32,4,64)))
    X=torch.randn(2200,256,dtype=dt); W=torch.randn(688,256,dtype=dt)
    t=bench(lambda: torch.nn.functional.linear(X,W), 200)
    print("  big linear 2200x256x688: %.1f us = %.0f GFLOP/s" % (t, 2*2200*256*688/t/1e3))
