"""The communicator a `colo._colo.Worker` reduces through: torch.distributed.

The trainer calls `all_reduce_buffers` with its gradient accumulators
(their memory, not copies: writable memoryviews on the CPU, `("cuda",
device, address, elements)` on a GPU) once per optimizer step,
and `all_reduce_values` with a few host numbers (loss denominators, metric
sums). Buffers are packed into one flat tensor per call, like DDP's
gradient buckets, so a step is one all-reduce of all gradient bytes.
"""

import time

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


_TYPESTR = {"float32": "<f4", "float16": "<f2", "float64": "<f8"}


class _CudaBuffer:
    """A device buffer as `torch.as_tensor` reads it without a copy."""

    def __init__(self, address, numel, typestr):
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": typestr,
            "data": (address, False),
            "version": 3,
        }


def holder(buffer, dtype="float32"):
    """The object a tensor over `buffer` keeps alive: the memoryview (CPU),
    or a `__cuda_array_interface__` for `("cuda", device, address,
    elements, dtype)`."""
    if isinstance(buffer, tuple) and buffer[0] == "cuda":
        _, device, address, numel, dtype = buffer
        # No typestr for bf16: its bits as int16, viewed back below.
        typestr = "<i2" if dtype == "bfloat16" else _TYPESTR[dtype]
        h = _CudaBuffer(address, numel, typestr)
        h.device, h.dtype = device, dtype
        return h
    return buffer


def tensor_of(h, dtype="float32"):
    """A flat tensor over a `holder`, sharing its memory."""
    if isinstance(h, _CudaBuffer):
        t = torch.as_tensor(h, device=f"cuda:{h.device}")
        return t.view(torch.bfloat16) if h.dtype == "bfloat16" else t
    return torch.frombuffer(h, dtype=getattr(torch, dtype))


def as_tensor(buffer, dtype="float32"):
    """A flat tensor over a buffer colo hands out, sharing its memory."""
    return tensor_of(holder(buffer, dtype), dtype)


class TorchComm:
    """All-reduces over the default process group, timing what it moves."""

    def __init__(self):
        self.seconds = 0.0
        self.bytes = 0
        self.calls = 0

    def all_reduce_buffers(self, views):
        tensors = [as_tensor(v) for v in views]
        flat = torch.cat(tensors)
        t = time.perf_counter()
        dist.all_reduce(flat)
        self.seconds += time.perf_counter() - t
        self.bytes += flat.numel() * flat.element_size()
        self.calls += 1
        at = 0
        for x in tensors:
            x.copy_(flat[at : at + x.numel()])
            at += x.numel()
        del tensors  # no view of the trainer's memory outlives the call

    def all_reduce_values(self, values, op):
        # NCCL reduces device tensors only; gloo host ones.
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=_OPS[op])
        return t.tolist()

    def take_stats(self):
        """(seconds, bytes, calls) since the last call."""
        out = (self.seconds, self.bytes, self.calls)
        self.seconds, self.bytes, self.calls = 0.0, 0, 0
        return out
