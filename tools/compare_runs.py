"""Compare two output roots stage by stage: python tools/compare_runs.py ROOT_A ROOT_B [CONFIG ...]

Every data file of every stage present under both roots' runs/<config>/<stage>/ (not the
executed notebooks, logs, manifests, engine descriptions, runner and progress files, which name
times and places) is
compared: equal bytes, else (Parquet) equal frames, else the columns that differ and in how many
rows. Prints one line per file and a last line `identical=<n>/<m>`; exits 1 unless every file compared is
identical. Use it to hold a rerun, another executor or another machine against a run (decode-time states are
compared tensor for tensor: their safetensors headers list the digests in no fixed order).
"""
import argparse
import hashlib
import sys
from pathlib import Path

import pandas as pd

SKIP_SUFFIXES = {".ipynb", ".log", ".lock"}
SKIP_NAMES = {"manifest.json", "engine.json", "resume.json", "DONE", "run.log", "runner.json", "progress.json"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare_file(a: Path, b: Path) -> str:
    if digest(a) == digest(b):
        return "identical (bytes)"
    if a.suffix == ".safetensors":  # the header's digests come in no fixed order: compare what they hold
        from safetensors import safe_open
        with safe_open(str(a), "pt") as x, safe_open(str(b), "pt") as y:
            same = (x.metadata() == y.metadata() and sorted(x.keys()) == sorted(y.keys())
                    and all(x.get_tensor(k).equal(y.get_tensor(k)) for k in x.keys()))
        return "identical (tensors and digests)" if same else "DIFFERENT (tensors)"
    if a.suffix != ".parquet":
        return "DIFFERENT (bytes)"
    fa, fb = pd.read_parquet(a), pd.read_parquet(b)
    if fa.equals(fb):
        return "identical (frames; the files differ in metadata only)"
    if fa.shape != fb.shape or list(fa.columns) != list(fb.columns):
        return f"DIFFERENT (shape {fa.shape} vs {fb.shape})"
    cols = [f"{c}: {int((fa[c].astype(str) != fb[c].astype(str)).sum())} rows"
            for c in fa.columns if not fa[c].astype(str).equals(fb[c].astype(str))]
    return "DIFFERENT (" + "; ".join(cols) + ")"


def main(a: str, b: str, configs: list[str]) -> int:
    ra, rb = Path(a) / "runs", Path(b) / "runs"
    names = configs or sorted(p.name for p in ra.iterdir() if p.is_dir() and (rb / p.name).is_dir()
                              and not p.name.startswith((".", "campaign-")))
    same = total = 0
    for name in names:
        for fa in sorted((ra / name).rglob("*")):
            if not fa.is_file() or fa.suffix in SKIP_SUFFIXES or fa.name in SKIP_NAMES:
                continue
            rel = fa.relative_to(ra)
            fb = rb / rel
            if not fb.is_file():
                print(f"{rel}: only under {a}")
                continue
            verdict = compare_file(fa, fb)
            total += 1
            same += verdict.startswith("identical")
            print(f"{rel}: {verdict}")
    print(f"identical={same}/{total}")
    return 0 if total and same == total else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python tools/compare_runs.py", description=__doc__.splitlines()[0])
    ap.add_argument("root_a", help="an output root (holding runs/)")
    ap.add_argument("root_b", help="another output root")
    ap.add_argument("configs", nargs="*", help="configurations to compare (default: every one under both)")
    args = ap.parse_args()
    sys.exit(main(args.root_a, args.root_b, args.configs))
