# Single-thread F.linear against mm with a pre-transposed weight over the
# rows a decode step or a micro-batch has (8-128), for colo's shapes
# (the bench model's and the built-in model's). Microseconds and GFLOP/s.
#   .venv/bin/python bench/cpu/linear_rates.py
import torch, time
torch.set_num_threads(1)
def bench(f, n=200):
    for _ in range(10): f()
    t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e6
for (K,N) in [(256,4096),(256,1408),(256,384),(704,256),(128,102),(128,768),(384,128)]:
  for M in [8,16,32,48,64,96,128]:
    x=torch.randn(M,K); W=torch.randn(N,K)
    Wt=W.t().contiguous()
    a=bench(lambda: torch.nn.functional.linear(x,W)); b=bench(lambda: torch.mm(x,Wt))
    print(f"K{K} N{N} M{M}: linear {a:.0f}us ({2*M*K*N/a/1e3:.0f} GF/s)  mm-Wt {b:.0f}us ({2*M*K*N/b/1e3:.0f})  ratio {a/b:.2f}")
