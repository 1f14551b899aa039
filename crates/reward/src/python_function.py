# colo's adapter for `reward.kind = "python"`: serves a verl-style reward
# function (`custom_reward_function.path` / `.name` in verl) over the
# external reward's JSON-lines protocol (crates/reward/src/external.rs).
#
#   python3 -c <this file> PATH NAME KWARGS_JSON
#
# The function is called as verl's reward managers call it:
#   NAME(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **kwargs)
# with the dataset row's `data_source` and `extra_info` ({} when absent) and
# the ground truth as the row holds it (`reward_model.ground_truth`, any JSON
# type), or else the text colo read with `data.answer_key`. It may return a
# number or a dict with a "score" (verl's two forms); a dict's other numbers
# go back with the score as "extra" (verl's reward_extra_info).
#
# The protocol owns file descriptor 1; the user's code gets stderr for its
# prints (Python's and C's), so a debugging print cannot corrupt an answer.
import importlib.util
import json
import math
import os
import sys
import traceback


def fail(message):
    sys.stderr.write(f"colo python reward: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def load(path, name):
    if not os.path.isfile(path):
        fail(f"reward.path: no file {path!r}")
    spec = importlib.util.spec_from_file_location("custom_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module  # as verl names it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        traceback.print_exc()
        fail(f"reward.path: importing {path!r} failed (traceback above)")
    fn = getattr(module, name, None)
    if not callable(fn):
        fail(f"reward.name: {path!r} has no function {name!r}")
    return fn


def score_of(result):
    """The score, and a dict's other entries that are finite numbers (bools
    as 0/1): what verl keeps as `reward_extra_info`; text entries such as
    a parsed prediction are left out."""
    extra = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(f"returned a dict without a 'score' key: {sorted(result)}")
        for key, value in result.items():
            if key == "score" or isinstance(value, (str, bytes)) or value is None:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                extra[str(key)] = number
        result = result["score"]
    if isinstance(result, (str, bytes)) or result is None:
        raise TypeError(f"returned {result!r}; expected a number or a dict with 'score'")
    return float(result), extra


def main():
    path, name, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    fn = load(path, name)
    protocol.write(json.dumps({"ready": name}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        row = req.get("row") or {}
        truth = req["ground_truth"]
        model = row.get("reward_model")
        if isinstance(model, dict) and "ground_truth" in model:
            truth = model["ground_truth"]
        try:
            score, extra = score_of(
                fn(
                    data_source=row.get("data_source"),
                    solution_str=req["completion"],
                    ground_truth=truth,
                    extra_info=row.get("extra_info") or {},
                    **kwargs,
                )
            )
        except BaseException:
            traceback.print_exc()
            fail(f"{name}() failed on sample {req['id']} (traceback above)")
        answer = {"id": req["id"], "score": score}
        if extra:
            answer["extra"] = extra
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()


main()
