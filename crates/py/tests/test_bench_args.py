"""`colo bench cluster`'s flags are checked by argparse, which names the
flag and exits with status 2, before Ray or a worker starts (they ended in
Python tracebacks); the `[cluster]` keys `--sharding` writes into a run's
config."""

import contextlib
import io
import unittest

from colo.bench import main, set_section


class BenchClusterArgs(unittest.TestCase):
    def refused(self, argv, expected):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
            main(argv)
        self.assertEqual(e.exception.code, 2)
        self.assertIn(expected, err.getvalue())

    def test_bad_flags_are_named(self):
        self.refused(["--workers", "0"], "argument --workers: 0 is not a positive count")
        self.refused(["--workers", "1,,2"], "argument --workers: '' is not a whole number")
        self.refused(["--steps", "-1"], "argument --steps: -1 is not a positive count")
        self.refused(["--config", "/nonexistent.toml"], "argument --config: /nonexistent.toml: no such file")
        self.refused(["--sharding", "fsdp"], "argument --sharding: 'fsdp' is not a sharding; expected none or full")
        self.refused(["--sharding", "none,"], "argument --sharding: '' is not a sharding; expected none or full")
        self.refused(["--sharding", "full,full"], "argument --sharding: 'full' is given twice")


class RunConfig(unittest.TestCase):
    """`--sharding` sets the run's `[cluster]` keys, replacing the
    config's own values of them, keeping its other keys."""

    def test_cluster_keys_are_set_once(self):
        cluster = {"workers": 2, "sharding": '"full"'}
        text = set_section('[cluster]\nworkers = 4  # four\naddress = "auto"\n\n[trainer]\nseed = 1\n', "cluster", cluster)
        self.assertEqual(text, '[cluster]\nworkers = 2\nsharding = "full"\naddress = "auto"\n\n[trainer]\nseed = 1\n')
        self.assertEqual(set_section("[trainer]\nseed = 1\n", "cluster", cluster), '[trainer]\nseed = 1\n\n[cluster]\nworkers = 2\nsharding = "full"\n')
        # A header with a comment; a key of another section of the same name is kept.
        text = set_section('[cluster] # here\nsharding = "none"\n[memory]\nworkers = 3\n', "cluster", cluster)
        self.assertEqual(text, '[cluster] # here\nworkers = 2\nsharding = "full"\n[memory]\nworkers = 3\n')


if __name__ == "__main__":
    unittest.main()
