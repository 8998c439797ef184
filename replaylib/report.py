"""Command line report of per-pivot records (docs/protocol.md section 4).

    python -m replaylib.report --records FILE [FILE ...] --json OUT.json
    python -m replaylib.report --verify runs/<config>
    python -m replaylib.report --html ROOT/runs/<config>   (the report site: replaylib/display/site.py)

Loads each records file (published JSON, or this package's .parquet / .jsonl), pools
them (``records.pool``: files of different protocols, or a file repeating a
(problem_id, rollout, abs_pos), are refused; records whose key an earlier file holds are
dropped, first kept, with one line on stderr per file that lost some), writes
``stats.summarize()`` as JSON (indent 2) and prints a short summary. Errors: one line
on stderr, exit status 2, and no partial output file; ``--json`` never writes inside a runs/
directory nor over a records file it reads.

``--verify`` re-checks a run directory (``runtime.verify.verify_run``): every finished stage's
outputs, the statistics stage's tables and figures, and every stage's recorded inputs
against its upstream stage's recorded outputs; exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .analysis import records, stats


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m replaylib.report",
                description="Statistics of per-pivot replay records (docs/protocol.md section 4).")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--records", nargs="+", metavar="FILE",
                      help="records files (.json published schema, .parquet, .jsonl), pooled")
    mode.add_argument("--verify", metavar="RUN_DIR",
                      help="re-check a run's output hashes against its stage manifests (runs/<config>)")
    mode.add_argument("--html", metavar="RUN_DIR",
                      help="build the run's report site, site/<config>/index.html beside runs/ (replaylib.display.site)")
    p.add_argument("--json", metavar="OUT.json", help="write the summary here (indent 2)")
    p.add_argument("--keep-flagged", action="store_true",
                   help="keep records with exact_ok == False (excluded by default)")
    return p


def write_json_atomic(obj, path) -> None:
    """Write JSON (no NaN) to a temporary file beside ``path``, then rename it into place."""
    from .core.files import atomic_write_bytes
    atomic_write_bytes(Path(path), (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def pooled_records(files):
    """Load and pool the files; one line on stderr for each file that lost records to an
    earlier file holding the same (problem_id, rollout, abs_pos)."""
    pooled = records.pool([records.load_records(f) for f in files])
    for name, (dropped, total) in pooled.attrs["dropped"].items():
        print(f"report: {name}: {dropped} of its {total} records dropped (an earlier file holds the same "
              f"problem_id, rollout, abs_pos; the first is kept)", file=sys.stderr)
    return pooled


def records_summary(files, exclude_flagged: bool = True) -> dict:
    """Load and pool the files, return ``stats.summarize()`` of the pooled records."""
    return stats.summarize(pooled_records(files), exclude_flagged=exclude_flagged)


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def human_summary(s: dict) -> str:
    """A few lines for the terminal."""
    c, cl, mc, b = s["common"], s["clustered"], s["mcnemar"], s["bias"]
    j = s["jaccard"]["0.5"]
    lines = [
        f"records {s['n_records']} from {s['n_problems']} problems; common set n = {c['n']}"
        + (f"; excluded (not exact) {s['excluded_not_exact']}" if "excluded_not_exact" in s else ""),
        f"refeed disagreement {c['refeed']['flips']}/{c['n']} = {_pct(c['refeed']['rate'])} "
        f"(polarity {c['refeed']['polarity']}); floor {c['floor']['flips']}/{c['n']} = "
        f"{_pct(c['floor']['rate'])} (polarity {c['floor']['polarity']})",
        f"excess {_f(s['excess_pp'], '+.1f')} pp (exact1-conditioned {_f(s['excess_pp_exact1'], '+.1f')}); "
        f"clustered t {_f(cl['t'], '.2f')} over {cl['n_problems']} problems; McNemar z {_f(mc['z'], '.2f')}",
        f"bias {_f(b['mean'], '+.4f')} (t {_f(b['t'], '.3f')}); Jaccard |A|>=0.5: refeed "
        f"{_f(j['refeed'], '.3f')} vs replica {_f(j['replica'], '.3f')} ({j['n_exact1']} selected under exact1)",
    ]
    if s["probes"]:
        p = s["probes"]
        lines.append(f"probes n {p['n']}: divergence refeed {_pct(p['refeed']['divergence_rate'])} vs "
                     f"replica {_pct(p['replica']['divergence_rate'])}; bit-exact refeed "
                     f"{_pct(p['refeed']['bit_exact_rate'])} vs replica {_pct(p['replica']['bit_exact_rate'])}")
    if s["cache"]:
        k = s["cache"]
        lines.append(f"cache verified: exact1 {_pct(k['exact1_ok_rate'])}, exact2 {_pct(k['exact2_ok_rate'])} "
                     f"of {k['n']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.records is not None:
            if args.json and any(Path(args.json).resolve() == Path(f).resolve() for f in args.records):
                raise ValueError(f"--json {args.json} is one of the records files it reads; write the summary "
                                 f"to another file")
            if args.json and "runs" in Path(os.path.abspath(args.json)).parent.parts:
                raise ValueError(f"--json {args.json} is inside a runs/ directory, whose files the stages write and "
                                 f"their manifests record; write the summary elsewhere")
            summary = records_summary(args.records, exclude_flagged=not args.keep_flagged)
            if args.json:
                write_json_atomic(summary, args.json)
            print(human_summary(summary))
        elif args.html is not None:
            from .display import site
            run_dir = Path(os.path.abspath(args.html))
            if not run_dir.is_dir():
                raise ValueError(f"{args.html}: no such run directory; give runs/<config> of an output root")
            if run_dir.parent.name != "runs":  # its tables and figures are beside runs/, under the same root
                raise ValueError(f"{args.html}: not a run directory runs/<config> (its parent is not runs/); put "
                                 f"the run at ROOT/runs/<config>, its tables/ and figures/ beside runs/, and give "
                                 f"that path")
            print(site.build(run_dir.name, run_dir.parent.parent))
        else:
            from .runtime.verify import verify_run
            problems = verify_run(args.verify)
            for line in problems:
                print(line)
            if problems:
                print(f"report: {len(problems)} problem(s) in {args.verify}", file=sys.stderr)
                return 1
            print(f"{args.verify}: every finished stage's outputs, products and inputs match their manifests")
            print("not covered (no manifest records them): each stage's executed notebook, run.log, runner.json "
                  "and progress.json, which the runner writes after the stage; the report site escapes and "
                  "sanitizes what it shows of them")
    except (ValueError, OSError) as e:
        msg = " ".join(str(e).split())
        print(f"report: error: {msg}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
