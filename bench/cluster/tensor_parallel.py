"""Tensor-parallel rollout's cost on this machine: the configs/example.toml
job on 2 Ray workers with whole engines (tg = 1) and with
`[rollout] tensor_model_parallel_size = 2`, twice each, steps 2-6
averaged: step and generation seconds, the group's all-reduces.

Run from the repository root after `./x py`:
    .venv/bin/python -W ignore bench/cluster/tensor_parallel.py
"""

import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "crates", "py", "tests"))

from colo.controller import start_local_ray, train  # noqa: E402
from test_data_parallel import write_config  # noqa: E402
from test_tensor_parallel import tensor_parallel  # noqa: E402


def main():
    start_local_ray(4)
    with tempfile.TemporaryDirectory(prefix="colo-bench-tp-") as tmp:
        for rep in range(2):
            for tg in (1, 2):
                cfg = write_config(os.path.join(tmp, f"c{tg}.toml"), total_steps=6)
                if tg > 1:
                    tensor_parallel(cfg, tg)
                h = train(cfg, os.path.join(tmp, f"r{tg}-{rep}"), 2, log=lambda *_: None)["history"][1:]

                def m(k):
                    return statistics.mean(r.get(k, 0.0) for r in h)

                print(
                    f"tg={tg} run={rep + 1} step={m('timing_s/step_wall'):.3f} s gen={m('timing_s/gen'):.3f} s "
                    f"tp_all_reduce={m('timing_s/tp_all_reduce'):.3f} s (+{m('timing_s/tp_all_reduce_wait'):.3f} wait) "
                    f"calls={m('perf/tp_all_reduce_calls'):.0f} MB={m('perf/tp_all_reduce_bytes') / 1e6:.2f} "
                    f"load={os.getloadavg()[0]:.2f}"
                )


if __name__ == "__main__":
    main()
