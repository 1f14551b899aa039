# Decode-shaped products on one CPU thread: F.linear against MKL's packed
# GEMM (torch.ops.mkl._mkl_linear over _mkl_reorder_linear_weight) and oneDNN's
# linear over a reordered weight (torch.ops.mkldnn._linear_pointwise), and
# mm against a pre-transposed weight. Microseconds a call.
#   .venv/bin/python bench/cpu/prepacked_linear.py
import torch, time
torch.set_num_threads(1)
def bench(f, n=300):
    for _ in range(20): f()
    t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e6
for (M,K,N) in [(128,256,384),(128,256,256),(128,256,1408),(128,704,256),(128,256,4096),(64,256,4096),(100,256,704)]:
    x=torch.randn(M,K); W=torch.randn(N,K); b=torch.randn(N)
    base=bench(lambda: torch.nn.functional.linear(x,W))
    r=[f"{M}x{K}x{N}: linear {base:.0f}us"]
    try:
        pw=torch.ops.mkl._mkl_reorder_linear_weight(W, M)
        r.append(f"mkl_packed {bench(lambda: torch.ops.mkl._mkl_linear(x,pw,W,None,M)):.0f}us")
    except Exception as e: r.append(f"mkl err {e}")
    try:
        dw=torch.ops.mkldnn._reorder_linear_weight(W, M)
        r.append(f"onednn {bench(lambda: torch.ops.mkldnn._linear_pointwise(x,dw,None,'none',[],'')):.0f}us")
    except Exception as e: r.append(f"onednn err {str(e)[:200]}")
    Wt=W.t().contiguous()
    r.append(f"mm(x,Wt) {bench(lambda: torch.mm(x,Wt)):.0f}us")
    print(", ".join(r), f"GFLOP/s base {2*M*K*N/base/1e3:.1f}")
