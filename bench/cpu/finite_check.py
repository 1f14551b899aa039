"""How fast a load can check weights for NaN and infinities (colo-model's
`read_safetensors`): `isfinite().all()` against one `sum()`, whose result is
not finite when any element is not, on 256 MiB tensors, two threads; the sum
in float64 too, which finite float32 values cannot overflow (a float32 sum
of values near 3e38 can: a false alarm).

Usage: .venv/bin/python bench/cpu/finite_check.py
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
from timing import micros  # noqa: E402

torch.set_num_threads(2)
MIB = 256
for dt in (torch.float32, torch.bfloat16):
    t = torch.randn(MIB * 2**20 // (4 if dt == torch.float32 else 2)).to(dt)
    for name, f in [
        ("isfinite().all()", lambda: t.isfinite().all().item()),
        ("sum()", lambda: t.sum().item()),
        ("sum(float64)", lambda: t.sum(dtype=torch.float64).item()),
    ]:
        s = micros(f, n=3, warm=1) / 1e6
        print(f"{str(dt):15} {name:17} {s * 1e3:7.1f} ms = {MIB / 1024 / s:5.2f} GiB/s")
for bad in (float("nan"), float("inf"), float("-inf")):
    t = torch.randn(1000)
    t[5] = bad
    assert not t.sum().isfinite(), bad
    assert not t.sum(dtype=torch.float64).isfinite(), bad
big = torch.full((4,), 3e38)
assert not big.sum().isfinite() and big.sum(dtype=torch.float64).isfinite()
