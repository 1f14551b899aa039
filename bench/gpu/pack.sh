#!/usr/bin/env bash
# Here (with a Rust toolchain): everything the GPU machine needs to run
# bench/gpu/run.sh, packed into .gpu/ at the repository root (ignored by
# git; carry it to the GPU machine). That machine has PyTorch 2.11 (cu130)
# and Python 3.12 but no Rust, no Ray and no network, and a call may carry
# at most 64 MiB, so:
#   .gpu/colo.xz            colo built with `--features cuda`, debug info stripped
#   .gpu/_colo.abi3.so.xz   colo-py (the Ray workers' module), likewise
#   .gpu/site.tar.xz        ray==2.60.0 for CPython 3.12 and the packages it
#                           needs that the machine lacks (jsonschema & co.),
#                           without Java jars and the libraries colo does
#                           not use (rllib, data, serve, tune, train, llm)
# and the run configs bench/gpu/*.toml travel with the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu
mkdir -p "$out"
cuda=(--features colo-mem/cuda,colo-rl/cuda,colo-train/cuda)
./x cargo build --release -p colo --features cuda
./x cargo build --release -p colo-py "${cuda[@]}"
objcopy --strip-debug target/release/colo "$out/colo"
objcopy --strip-debug target/release/lib_colo.so "$out/_colo.abi3.so"
xz -T2 -6 -f "$out/colo" "$out/_colo.abi3.so"

site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$site/whl" ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py
for w in "$site"/whl/*.whl; do unzip -q -o "$w" -d "$site/py"; done
rm -rf "$site"/py/ray/{jars,rllib,data,serve,tune,train,llm}
strip --strip-unneeded "$site"/py/ray/_raylet.so "$site"/py/ray/core/src/ray/raylet/raylet \
    "$site"/py/ray/core/src/ray/gcs/gcs_server
tar -C "$site/py" -cf - . | xz -T2 -6 >"$out/site.tar.xz"
du -ch "$out"/* | tail -1
