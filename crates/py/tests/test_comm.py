"""colo.comm.TorchComm's collectives between two real processes
(torch.multiprocessing, gloo on the loopback interface, meeting through a
FileStore, as the controller's local runs do): the sharded trainer's
all-gather and reduce-scatter on memoryviews of float32 and bf16 bytes,
as colo-py hands them over, the values checked exactly against what
`struct` decodes; the stats per operation; no tensor over the buffers
left once a call returns, even one that raised (a tensor over a view
holds a reference to it); and the controller's step record of the stats.
"""

import json
import os
import shutil
import struct
import sys
import tempfile
import time
import traceback
import unittest
from datetime import timedelta

import torch.multiprocessing as mp

WORLD = 2


def f32(values):
    """A writable memoryview of float32 bytes, as colo-py makes one."""
    return memoryview(bytearray(struct.pack(f"<{len(values)}f", *values)))


def floats(view):
    return list(struct.unpack(f"<{len(view) // 4}f", view))


def bf16(values):
    """A writable memoryview of bf16 bytes (the high half of each float32;
    the values are exact in bf16)."""
    bits = []
    for v in values:
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        assert u & 0xFFFF == 0, f"{v} is not exact in bf16"
        bits.append(u >> 16)
    return memoryview(bytearray(struct.pack(f"<{len(bits)}H", *bits)))


def bf16s(view):
    halves = struct.unpack(f"<{len(view) // 2}H", view)
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]


def gather_shard(rank):
    return [rank * 10 + 0.5, -rank - 0.25, 3.0e5 + rank]


def bf16_shard(rank):
    return [1.5 + rank, -256.0 * (rank + 1)]


def scatter_full(rank):
    return [(rank + 1) * (i + 1) + 0.125 * rank for i in range(2 * 3)]


def refs(*views):
    """The views' reference counts: a tensor made over a view
    (`torch.frombuffer`) holds a reference to it until the tensor goes."""
    return [sys.getrefcount(v) for v in views]


def let_go(count, before):
    """Whether `count()` (the views' `refs`) is back to `before` within a
    second. gloo's worker thread drops its finished work's tensors just
    after the waiting call returns (seen a few milliseconds later; it
    touches none of their memory after), so a count taken at once can be
    one too many; a tensor the communicator kept stays."""
    deadline = time.monotonic() + 1.0
    while count() != before and time.monotonic() < deadline:
        time.sleep(0.001)
    return count() == before


def _rank(rank, tmp):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from colo.comm import TorchComm

    store = dist.FileStore(os.path.join(tmp, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    comm = TorchComm()
    out = {}
    try:
        shard, full = f32(gather_shard(rank)), f32([-1.0] * 6)
        before = refs(shard, full)
        comm.all_gather_buffer(shard, full, "float32")
        out["gather_f32_released"] = let_go(lambda: refs(shard, full), before)
        out["gather_f32"] = floats(full)
        out["gather_f32_shard"] = floats(shard)

        shard, full = bf16(bf16_shard(rank)), bf16([-1.0] * 4)
        before = refs(shard, full)
        comm.all_gather_buffer(shard, full, "bfloat16")
        out["gather_bf16_released"] = let_go(lambda: refs(shard, full), before)
        out["gather_bf16"] = bf16s(full)

        shard, full = f32([99.0] * 3), f32(scatter_full(rank))
        before = refs(shard, full)
        comm.reduce_scatter_buffer(shard, full, "float32")
        out["scatter_f32_released"] = let_go(lambda: refs(shard, full), before)
        out["scatter_f32"] = floats(shard)

        grads = f32([rank + 1.0, 2.0])
        before = refs(grads)
        comm.all_reduce_buffers([grads])
        out["all_reduce_released"] = let_go(lambda: refs(grads), before)
        out["all_reduce"] = floats(grads)

        out["stats"] = comm.take_stats()
        out["stats_again"] = comm.take_stats()

        # Refused before any transfer (the peer refuses too, so neither
        # waits): a full that is not world x shard, a dtype colo has no
        # buffers of. The exception's traceback holds no tensor over the
        # buffers in its frames.
        try:
            comm.all_gather_buffer(f32([1.0]), f32([0.0] * 3), "float32")
        except ValueError as e:
            out["wrong_size"] = str(e)
            out["wrong_size_tensors"] = [
                f"{frame.f_code.co_name}: {name}"
                for frame, _ in traceback.walk_tb(e.__traceback__)
                for name, value in frame.f_locals.items()
                if isinstance(value, torch.Tensor)
            ]
        try:
            comm.reduce_scatter_buffer(f32([1.0]), f32([1.0, 2.0]), "int8")
        except ValueError as e:
            out["wrong_dtype"] = str(e)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


class TorchCommCollectives(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tmp = tempfile.mkdtemp(prefix="colo-comm-")
        try:
            mp.start_processes(_rank, args=(tmp,), nprocs=WORLD, start_method="spawn")
            cls.out = []
            for rank in range(WORLD):
                with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                    cls.out.append(json.load(f))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_all_gather_fills_full_with_the_shards_in_rank_order(self):
        f32_want = [x for r in range(WORLD) for x in struct.unpack("<3f", struct.pack("<3f", *gather_shard(r)))]
        bf16_want = [x for r in range(WORLD) for x in bf16_shard(r)]
        for rank, out in enumerate(self.out):
            self.assertEqual(out["gather_f32"], f32_want, f"rank {rank}")
            self.assertEqual(out["gather_f32_shard"], f32_want[3 * rank : 3 * rank + 3], f"rank {rank}'s shard kept")
            self.assertEqual(out["gather_bf16"], bf16_want, f"rank {rank}")

    def test_reduce_scatter_leaves_each_rank_its_part_of_the_sum(self):
        total = [sum(col) for col in zip(*(scatter_full(r) for r in range(WORLD)))]
        for rank, out in enumerate(self.out):
            self.assertEqual(out["scatter_f32"], total[3 * rank : 3 * rank + 3], f"rank {rank}")
            self.assertEqual(out["all_reduce"], [3.0, 4.0], f"rank {rank}")

    def test_no_tensor_over_the_buffers_outlives_a_call(self):
        for rank, out in enumerate(self.out):
            for key in [k for k in out if k.endswith("_released")]:
                self.assertIs(out[key], True, f"rank {rank}, {key}")
            self.assertEqual(out["wrong_size_tensors"], [], f"rank {rank}: tensors in a refused call's traceback")

    def test_stats_count_each_operation_apart_and_reset(self):
        for rank, out in enumerate(self.out):
            stats = out["stats"]
            self.assertEqual(sorted(stats), ["all_gather", "all_reduce", "reduce_scatter"])
            # (seconds, bytes, calls): bytes are the full buffers'.
            self.assertEqual(stats["all_gather"][1:], [6 * 4 + 4 * 2, 2], f"rank {rank}")
            self.assertEqual(stats["reduce_scatter"][1:], [6 * 4, 1], f"rank {rank}")
            self.assertEqual(stats["all_reduce"][1:], [2 * 4, 1], f"rank {rank}")
            for op, (seconds, _, _) in stats.items():
                self.assertGreater(seconds, 0.0, f"rank {rank}, {op}")
            self.assertEqual(
                out["stats_again"], {op: [0.0, 0, 0] for op in stats}, "take_stats starts the count again"
            )

    def test_bad_input_is_refused_naming_what_was_expected(self):
        for out in self.out:
            self.assertEqual(
                out["wrong_size"],
                "all_gather_buffer: full has 3 float32 elements; expected 2 ranks x 1 (the shard's)",
            )
            self.assertEqual(
                out["wrong_dtype"],
                "reduce_scatter_buffer: dtype 'int8'; expected one of float32, bfloat16, float16, float64",
            )


class StepRecord(unittest.TestCase):
    """The controller's step record from the workers' `take_stats`."""

    def test_sharded_figures_appear_only_where_there_were_some(self):
        from colo.controller import comm_record

        replicas = [
            {"all_reduce": (0.5, 800, 1), "all_gather": (0.0, 0, 0), "reduce_scatter": (0.0, 0, 0)},
            {"all_reduce": (0.25, 800, 1), "all_gather": (0.0, 0, 0), "reduce_scatter": (0.0, 0, 0)},
        ]
        record = {}
        comm_record(record, replicas)
        self.assertEqual(
            record,
            {"timing_s/all_reduce": 0.25, "timing_s/all_reduce_wait": 0.25, "perf/all_reduce_bytes": 800},
        )
        sharded = [
            {"all_reduce": (0.0, 0, 0), "all_gather": (2.0, 4096, 12), "reduce_scatter": (1.0, 2048, 4)},
            {"all_reduce": (0.0, 0, 0), "all_gather": (1.5, 4096, 12), "reduce_scatter": (1.25, 2048, 4)},
        ]
        record = {}
        comm_record(record, sharded)
        self.assertEqual(
            record,
            {
                "timing_s/all_reduce": 0.0,
                "timing_s/all_reduce_wait": 0.0,
                "perf/all_reduce_bytes": 0,
                "timing_s/all_gather": 1.5,
                "timing_s/all_gather_wait": 0.5,
                "perf/all_gather_bytes": 4096,
                "perf/all_gather_calls": 12,
                "timing_s/reduce_scatter": 1.0,
                "timing_s/reduce_scatter_wait": 0.25,
                "perf/reduce_scatter_bytes": 2048,
                "perf/reduce_scatter_calls": 4,
            },
        )


if __name__ == "__main__":
    unittest.main()
