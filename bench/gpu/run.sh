#!/usr/bin/env bash
# There (the GPU machine, PyTorch 2.11 in its python3), after
# bench/gpu/pack.sh here: `bash bench/gpu/run.sh` with .gpu/ carried.
# Each part's log goes to $OUT (default /tmp/gpu-out), the runs' metrics
# into $OUT/metrics.tar (the device tool brings back 8 files at most).
# Each part has its own time limit; about 120 s in all on an H100.
#   1. colo gpu-check --full   (parity, CUDA pool, OOM, bench colocate,
#                               the built-in job's 100 steps)
#   2. the built-in job, 20 steps on CUDA, in-process
#   3. the same through the Ray controller with 1 worker (NCCL), and 10
#      steps with the actor sharded (`sharding = "full"`: its gathers and
#      reduce-scatters through NCCL at world size 1)
#   4. issue 9's 3 M-parameter job on CUDA, bf16 and f32, 20 steps
source "$(dirname "$0")/lib.sh"
part gpu-check 200 /tmp/colo gpu-check --full --out /tmp/gpu-check
part inproc 60 /tmp/colo train --config bench/gpu/builtin20.toml --out /tmp/inproc

mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site
xz -dc .gpu/_colo.abi3.so.xz >crates/py/python/colo/_colo.abi3.so
export PYTHONPATH=/tmp/site:$PWD/crates/py/python
part ray1 120 python3 -W ignore -m colo.controller --config bench/gpu/ray1.toml \
    --out /tmp/ray1 --workers 1
part ray1-sharded 120 python3 -W ignore -m colo.controller --config bench/gpu/ray1sharded.toml \
    --out /tmp/ray1-sharded --workers 1

python3 bench/qwen2-3m/make.py /tmp/q3m >/dev/null
sed -i 's/^total_steps = 10/total_steps = 20\ndevice = "cuda"/' /tmp/q3m/run.toml
sed 's/^device = "cuda"/device = "cuda"\ndtype = "f32"/' /tmp/q3m/run.toml >/tmp/q3m/f32.toml
part q3m-bf16 60 /tmp/colo train --config /tmp/q3m/run.toml --out /tmp/q3m-bf16
part q3m-f32 60 /tmp/colo train --config /tmp/q3m/f32.toml --out /tmp/q3m-f32
tar -C /tmp/gpu-metrics -cf "$OUT/metrics.tar" .
python3 bench/gpu/steps.py /tmp/gpu-metrics/*.jsonl
