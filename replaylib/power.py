"""Plan a run's size."""
from __future__ import annotations

import argparse
import sys

from .analysis.power import plan


def _bounded(kind, lo=None, hi=None, lo_open=False):
    """An argparse type: a number of `kind` within [lo, hi] (lo excluded with lo_open), one line otherwise."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if v != v or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            rng = f"{'above' if lo_open else 'at least'} {lo}" if lo is not None else ""
            rng += (" and " if rng and hi is not None else "") + (f"at most {hi}" if hi is not None else "")
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be {rng}")
        return v
    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None) -> int:
    ap = _Parser(prog="python -m replaylib.power", description=__doc__.splitlines()[0])
    ap.add_argument("--excess", type=_bounded(float, -100, 100), default=None,
                    help="target excess in pp (default: the paper's)")
    ap.add_argument("--floor", type=_bounded(float, 0, 100), default=None,
                    help="target floor rate in %% (default: the paper's)")
    ap.add_argument("--problems", type=_bounded(int, 2), nargs="+", default=[10, 20, 40])
    ap.add_argument("--pivots", type=_bounded(int, 1), nargs="+", default=[10, 20, 40],
                    help="common pivots per problem")
    ap.add_argument("--threshold", type=_bounded(float, 0, lo_open=True), default=None,
                    help="clustered t to clear (default: the one a verdict needs at that many problems, Student's "
                         "97.5%% point and at least 2)")
    ap.add_argument("--draws", type=_bounded(int, 1), default=2000)
    ap.add_argument("--seed", type=_bounded(int, 0), default=0)
    args = ap.parse_args(argv)
    table = plan(args.excess, args.floor, args.problems, args.pivots, args.threshold, args.draws, args.seed)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
