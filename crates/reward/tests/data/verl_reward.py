# A reward function as a verl user writes it (custom_reward_function.path):
# verl's signature, a print for debugging, a dict result for one data
# source and a plain number for the other, a keyword argument from
# custom_reward_function.reward_kwargs, and a helper module import.
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print(f"scoring {data_source}: {solution_str!r}")  # must not break the protocol
    if data_source == "openai/gsm8k":
        m = re.search(r"#### (-?[0-9.,]+)", solution_str)
        answer = m.group(1).replace(",", "") if m else None
        # verl's math_dapo returns its parsed prediction too: text, not kept.
        return {"score": float(answer == ground_truth) + bonus, "acc": answer == ground_truth, "pred": answer}
    if data_source == "lists":  # a ground truth that is not a string
        return float(solution_str.strip() in ground_truth)
    if data_source == "index":  # reads extra_info
        return float(extra_info["index"])
    if data_source == "raise":
        raise ValueError("cannot score this one")
    if data_source == "text":
        return "high"
    return 0


def other_name(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5
