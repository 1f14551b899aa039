"""The communicator a `colo._colo.Worker` reduces through: torch.distributed.

Every buffer is the trainer's memory, not a copy: a writable memoryview
of its bytes on the CPU, `("cuda", device, address, elements, dtype)` on a
GPU; the tensors made over it here live for one call. A replicated trainer
calls `all_reduce_buffers` with its gradient accumulators once per
optimizer step, and `all_reduce_values` with a few host numbers (loss
denominators, metric sums). Buffers are packed into one flat tensor per
call, like DDP's gradient buckets, so a step is one all-reduce of all
gradient bytes. A sharded trainer (FSDP's semantics) gathers each unit's
weights from the ranks' shards with `all_gather_buffer` and hands back
its gradients' sum, each rank its part, with `reduce_scatter_buffer`:
torch.distributed's `all_gather_into_tensor` and `reduce_scatter_tensor`,
written in place.
"""

import os
import time

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


_TYPESTR = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int64": "<i8"}
# The dtypes colo hands buffers of.
_DTYPES = ("float32", "bfloat16", "float16", "float64")


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


# The operations `take_stats` reports, each as (seconds, bytes, calls).
OPS = ("all_reduce", "all_gather", "reduce_scatter")


class TorchComm:
    """Collectives over the default process group, timing and counting
    what each kind moves.

    The seconds are the host's time inside the torch.distributed call: the
    transfer with gloo; with NCCL, whose collectives run on a stream of
    their own, the time until the transfer is queued. gloo's worker thread
    drops a finished collective's tensors up to a few milliseconds after
    the call returns; it touches none of their memory after.
    """

    def __init__(self):
        self._stats = {op: [0.0, 0, 0] for op in OPS}
        self._exit_in_gather = None

    def exit_in_gather(self, k):
        """A fault for tests (the controller's `fault` with `how =
        "exit_in_gather"`): this process ends, `os._exit(1)`, inside its
        `k`-th `all_gather_buffer` call from now (1 = the next), before
        the collective starts, so its peers are left waiting in theirs."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"exit_in_gather: k = {k!r}; expected a call count of at least 1")
        self._exit_in_gather = k

    def exit_pending(self):
        """Gathers left before an armed `exit_in_gather` fires; None when
        none is armed."""
        return self._exit_in_gather

    def _count(self, op, seconds, nbytes):
        s = self._stats[op]
        s[0] += seconds
        s[1] += nbytes
        s[2] += 1

    def all_reduce_buffers(self, views):
        """Sums float32 buffers over the ranks, in place, through one flat
        copy of them all. Counted: the flat tensor's bytes."""
        tensors = []
        try:
            tensors = [as_tensor(v) for v in views]
            flat = torch.cat(tensors)
            t = time.perf_counter()
            dist.all_reduce(flat)
            self._count("all_reduce", time.perf_counter() - t, flat.numel() * flat.element_size())
            at = 0
            for x in tensors:
                x.copy_(flat[at : at + x.numel()])
                at += x.numel()
        finally:
            tensors = None  # no view of the trainer's memory outlives the call

    def all_gather_buffer(self, shard, full, dtype="float32"):
        """Fills `full` with every rank's `shard`, in rank order
        (`all_gather_into_tensor`), in place. Counted: `full`'s bytes."""
        if self._exit_in_gather is not None:
            self._exit_in_gather -= 1
            if self._exit_in_gather == 0:
                os._exit(1)  # the injected fault: a worker killed during a gather
        self._shards("all_gather", shard, full, dtype)

    def reduce_scatter_buffer(self, shard, full, dtype="float32"):
        """Sums `full` over the ranks and writes this rank's part of it
        (part `rank` of `world` equal parts) into `shard`
        (`reduce_scatter_tensor`), in place. Counted: `full`'s bytes."""
        self._shards("reduce_scatter", shard, full, dtype)

    def _shards(self, op, shard, full, dtype):
        if dtype not in _DTYPES:
            raise ValueError(f"{op}_buffer: dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
        s = f = None
        try:
            # Tensors over the caller's memory: the collective writes into it.
            s, f = as_tensor(shard, dtype), as_tensor(full, dtype)
            world = dist.get_world_size()
            if f.numel() != world * s.numel():
                raise ValueError(
                    f"{op}_buffer: full has {f.numel()} {dtype} elements; expected {world} ranks x "
                    f"{s.numel()} (the shard's)"
                )
            t = time.perf_counter()
            if op == "all_gather":
                dist.all_gather_into_tensor(f, s)
            else:
                dist.reduce_scatter_tensor(s, f, op=dist.ReduceOp.SUM)
            self._count(op, time.perf_counter() - t, f.numel() * f.element_size())
        finally:
            # No view of the trainer's memory outlives the call, not even in
            # an exception's traceback.
            s = f = None

    def all_reduce_values(self, values, op):
        # NCCL reduces device tensors only; gloo host ones.
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=_OPS[op])
        return t.tolist()

    def take_stats(self):
        """{op: (seconds, bytes, calls)} for each of `OPS` since the last
        call."""
        out = {op: tuple(s) for op, s in self._stats.items()}
        self._stats = {op: [0.0, 0, 0] for op in OPS}
        return out


class GroupComm:
    """A tensor-parallel rollout group's communicator
    (`rollout.tensor_model_parallel_size`): `all_reduce_buffer` sums one
    buffer of the engine's (its attention output and down projections'
    partial sums, in the model's dtype; its small agreements in int64 and
    float64) over the group's process group, in place, timed and counted
    as `take_stats()`'s (seconds, bytes, calls)."""

    DTYPES = _DTYPES + ("int64",)

    def __init__(self, group):
        self.group = group
        self._stats = [0.0, 0, 0]

    def all_reduce_buffer(self, buffer, dtype):
        if dtype not in self.DTYPES:
            raise ValueError(f"all_reduce_buffer: dtype {dtype!r}; expected one of {', '.join(self.DTYPES)}")
        t = None
        try:
            t = as_tensor(buffer, dtype)
            start = time.perf_counter()
            dist.all_reduce(t, group=self.group)
            self._stats[0] += time.perf_counter() - start
            self._stats[1] += t.numel() * t.element_size()
            self._stats[2] += 1
        finally:
            t = None  # no view of the engine's memory outlives the call

    def take_stats(self):
        out = tuple(self._stats)
        self._stats = [0.0, 0, 0]
        return out
