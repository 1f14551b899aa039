"""`colo bench cluster`'s flags are checked by argparse, which names the
flag and exits with status 2, before Ray or a worker starts (they ended in
Python tracebacks)."""

import contextlib
import io
import unittest

from colo.bench import main


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


if __name__ == "__main__":
    unittest.main()
