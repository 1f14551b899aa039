# Sourced by bench/gpu/run.sh and bench/gpu/benches.sh on the GPU machine:
# the library path, the unpacked `colo` in /tmp, and `part`.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/gpu-metrics
export PYTHONUNBUFFERED=1 RUST_BACKTRACE=1
# The binaries' rpath names the build machine's .venv: use this one's torch
# (and the CUDA runtime beside it, which colo links directly).
lib=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH=$lib/lib:$(dirname "$lib")/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
[ -x /tmp/colo ] || [ ! -f .gpu/colo.xz ] || { xz -dc .gpu/colo.xz >/tmp/colo && chmod +x /tmp/colo; }

# part NAME LIMIT_S COMMAND...: its log and metrics into $OUT.
part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    (time timeout "$limit" "$@") >"$OUT/$name.log" 2>&1
    echo "rc=$?" >>"$OUT/$name.log"
    grep -v '^\[' "$OUT/$name.log" | tail -12
    cp "/tmp/$name/metrics.jsonl" "/tmp/gpu-metrics/$name.jsonl" 2>/dev/null || true
}

# bench NAME ARGS...: `colo bench ARGS --device cuda --json`, its JSON object
# (named NAME) appended to $OUT/benches.jsonl, stderr to $OUT/benches.log.
bench() {
    local name=$1
    shift
    echo "== $name: colo bench $* --device cuda" | tee -a "$OUT/benches.log"
    timeout 240 /tmp/colo bench "$@" --device cuda --json 2>>"$OUT/benches.log" |
        python3 -c 'import json,sys; r=json.load(sys.stdin); r["name"]=sys.argv[1]; print(json.dumps(r))' "$name" \
        >>"$OUT/benches.jsonl" || echo "$name failed (rc ${PIPESTATUS[0]})" | tee -a "$OUT/benches.log"
}
