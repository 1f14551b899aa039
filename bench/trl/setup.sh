#!/usr/bin/env bash
# TRL (the PyTorch-based peer of issue 36) in a virtual environment of its
# own, bench/trl/.venv, kept out of colo's set-up. torch is not installed
# again: a .pth file puts colo's .venv (made by `./x setup`, torch 2.11) on
# the path, so pip sees torch as installed and resolves the rest around it.
# Rerunnable: it skips what is done.
#
#   ./x setup && bench/trl/setup.sh
#   bench/trl/.venv/bin/python bench/trl/grpo_step.py --model DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$here/.venv
colo_py=$root/.venv/bin/python
TORCH_VERSION=2.11.0

if ! "$colo_py" -c 'import torch' 2>/dev/null; then
    echo "bench/trl: colo's environment ($root/.venv) has no torch: run ./x setup first" >&2
    exit 1
fi
colo_site=$("$colo_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# Same interpreter as colo's venv (a venv made from a venv uses its base).
[ -x "$venv/bin/python" ] || "$colo_py" -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$colo_site" >"$site/colo-torch.pth"

py=("$venv/bin/python" -W ignore -c)
have=$("${py[@]}" 'import torch; print(torch.__version__.split("+")[0])')
if [ "$have" != "$TORCH_VERSION" ]; then
    echo "bench/trl: torch $have in $venv, expected $TORCH_VERSION from colo's .venv" >&2
    exit 1
fi

pip=("$venv/bin/pip" --disable-pip-version-check)
reqs=$here/requirements.txt
constraints=$(mktemp)
plan=$(mktemp)
trap 'rm -f "$constraints" "$plan"' EXIT
echo "torch==$TORCH_VERSION" >"$constraints"

stamp=$venv/.requirements.sha256
want=$(sha256sum "$reqs" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # Never pull a second torch: refuse if pip would install one.
    "${pip[@]}" install --dry-run --quiet --report "$plan" -c "$constraints" -r "$reqs"
    if ! "${py[@]}" 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(any(i["metadata"]["name"].lower()=="torch" for i in r["install"]))' "$plan"; then
        echo "bench/trl: pip would install torch; refusing (colo's torch $TORCH_VERSION should satisfy it)" >&2
        exit 1
    fi
    echo "bench/trl: installing the pinned packages of requirements.txt into $venv" >&2
    "${pip[@]}" install --quiet -c "$constraints" -r "$reqs"
    echo "$want" >"$stamp"
fi

"$venv/bin/python" -W ignore - <<'PY'
import torch, transformers, trl, accelerate, datasets
where = torch.__file__.rsplit("/site-packages/", 1)[0]
print(f"bench/trl: torch {torch.__version__} (from {where}), "
      f"transformers {transformers.__version__}, trl {trl.__version__}, "
      f"accelerate {accelerate.__version__}, datasets {datasets.__version__}")
PY
