#!/usr/bin/env bash
# There (the GPU machine): `bash bench/gpu/ab.sh A B` with $AB_DIR/A.xz and
# $AB_DIR/B.xz carried (AB_DIR defaults to .gpu) (two `colo` builds with --features cuda, stripped and
# xz-packed as bench/gpu/pack.sh does): `colo bench rollout` at two loads
# and issue 9's 3 M-parameter job (bf16, 20 steps), the two binaries
# alternated twice on one machine. The JSON reports go to $OUT/ab.jsonl.
source "$(dirname "$0")/lib.sh"
for b in "$@"; do xz -dc "${AB_DIR:-.gpu}/$b.xz" >"/tmp/$b" && chmod +x "/tmp/$b"; done
python3 bench/qwen2-3m/make.py /tmp/q3m >/dev/null
sed -i 's/^total_steps = 10/total_steps = 20\ndevice = "cuda"/' /tmp/q3m/run.toml
for round in 1 2; do
    for b in "$@"; do
        for load in "" "--prompts 128"; do
            /tmp/$b bench rollout --device cuda --json $load |
                python3 -c 'import json,sys; r=json.load(sys.stdin); r["bin"]=sys.argv[1]; print(json.dumps(r))' "$b" |
                tee -a "$OUT/ab.jsonl" | python3 bench/gpu/benches.py /dev/stdin | sed "s/^/$b /"
        done
        /tmp/$b train --config /tmp/q3m/run.toml --out "/tmp/q3m-$b-$round" >/dev/null 2>&1
        echo "$b 3M job:"
        python3 bench/gpu/steps.py "/tmp/q3m-$b-$round/metrics.jsonl" | grep -E "gen |step |update_actor "
    done
done
