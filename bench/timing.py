"""The one timing helper of colo's Python micro-benchmarks (bench/*/*.py):
mean microseconds of a call after a warm-up."""
import time


def micros(f, n=200, warm=10):
    for _ in range(warm):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6
