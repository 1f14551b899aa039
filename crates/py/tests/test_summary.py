"""The closing lines of a run on Ray say what `colo train` says on one
device: the held-out accuracy before and after as percentages (not
`accuracy 0.326`), "1 step", and the files written; a resumed run that had
nothing to do says so and names no file; a run stopped at once between
steps does not say a step was lost."""

import json
import os
import tempfile
import unittest

from colo.controller import StoppedNow, aggregate, step_line, stopped_now_line, summary_lines


def finished(out, **over):
    s = {
        "out": out,
        "steps": 3,
        "total_steps": 3,
        "resumed_from": None,
        "first_accuracy": 0.228,
        "last_accuracy": 0.34,
        "workers": 2,
    }
    s.update(over)
    return s


class Summary(unittest.TestCase):
    def test_accuracy_reads_as_on_one_device(self):
        with tempfile.TemporaryDirectory() as out:
            for name in ("metrics.jsonl", "memory_workers.svg", "config.toml"):
                open(os.path.join(out, name), "w").close()
            os.makedirs(os.path.join(out, "workers", "rank-0"))
            os.makedirs(os.path.join(out, "checkpoints"))
            done, wrote = summary_lines(finished(out))
            self.assertEqual(done, "done: 3 steps on 2 workers; held-out accuracy 22.8% -> 34.0%")
            self.assertEqual(
                wrote,
                f"wrote {out}/metrics.jsonl, {out}/memory_workers.{{svg,png}}, "
                f"{out}/workers/rank-{{0..1}}/ (each worker's timeline and pictures), "
                f"{out}/checkpoints/, {out}/config.toml",
            )
            done, _ = summary_lines(finished(out, steps=1, total_steps=1, last_accuracy=None))
            self.assertEqual(done, "done: 1 step on 2 workers; no held-out set")

    def test_a_resumed_run_reads_its_first_accuracy_back(self):
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "metrics.jsonl"), "w") as f:
                f.write(json.dumps({"training/global_step": 0, "eval/accuracy": 0.125}) + "\n")
            done, _ = summary_lines(finished(out, resumed_from=2, first_accuracy=None))
            self.assertIn("held-out accuracy 12.5% -> 34.0%", done)

    def test_nothing_to_do_writes_nothing(self):
        with tempfile.TemporaryDirectory() as out:
            lines = summary_lines(finished(out, resumed_from=3, last_accuracy=None))
            self.assertEqual(lines, [f"done: nothing to do, the run in {out} is complete (3 of 3 steps)"])


class StoppedAtOnce(unittest.TestCase):
    def test_only_a_step_under_way_is_lost(self):
        resume = "`colo train --out x --resume` continues from it"
        between = stopped_now_line(StoppedNow(23), resume)
        self.assertEqual(between, f"colo train: stopped now; the checkpoint of step 23 is complete, and {resume}")
        during = stopped_now_line(StoppedNow(23, under_way=24), resume)
        self.assertTrue(during.startswith("colo train: stopped now; step 24, under way, is lost; the checkpoint of step 23"), during)
        self.assertEqual(stopped_now_line(StoppedNow(None, 1), resume), "colo train: stopped now; step 1, under way, is lost; no checkpoint was written")


class StepLine(unittest.TestCase):
    def test_a_sharded_steps_line_shows_its_reshard_in_binary_units(self):
        record = {"critic/score/mean": 0.5, "actor/pg_loss": 0.25}
        plain = step_line(2, 3, record, 1.5)
        self.assertEqual(plain, "step 2/3: score 0.500, loss 0.2500, 1.50 s")
        workers = [dict(record, **{"perf/reshard_sent_bytes": 222_336, "perf/reshard_recv_bytes": b}) for b in (222_336, 222_340)]
        merged = aggregate(workers)
        self.assertEqual(merged["perf/reshard_recv_bytes"], 222_340)  # the largest worker's, a whole count
        self.assertEqual(step_line(2, 3, merged, 1.5), plain + ", reshard 217.1 KiB sent / 217.1 KiB received per worker")


if __name__ == "__main__":
    unittest.main()
