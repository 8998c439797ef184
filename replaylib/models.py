"""Fetch the embedded model."""
from __future__ import annotations

import argparse
import sys

from .measure.models import ModelError, build_tiny_model, fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaylib.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch and convert an embedded model into models_dir()")
    p_fetch.add_argument("name", nargs="?", default="qwen2.5-coder-0.5b-instruct")
    p_fetch.add_argument("--gguf", help="use this pre-assembled GGUF instead of downloading (sha256 checked)")
    p_fetch.add_argument("--keep-gguf", action="store_true", help="keep the assembled GGUF next to the model")
    p_fetch.add_argument("--if-used", metavar="PARAMS.yaml",
                         help="fetch the embedded model this params file uses, and nothing when it uses none")
    p_tiny = sub.add_parser("tiny", help="build a tiny random Qwen2 model for tests")
    p_tiny.add_argument("path")
    p_tiny.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "fetch" and args.if_used:
            from .measure.models import EMBEDDED_PREFIX
            from .runtime.params import load
            model = load(args.if_used).model
            if model.startswith(EMBEDDED_PREFIX):
                print(fetch(model[len(EMBEDDED_PREFIX):], gguf=args.gguf, keep_gguf=args.keep_gguf))
            else:
                print(f"[models] {args.if_used} uses model {model}: no embedded model to fetch", file=sys.stderr)
        elif args.cmd == "fetch":
            print(fetch(args.name, gguf=args.gguf, keep_gguf=args.keep_gguf))
        else:
            print(build_tiny_model(args.path, seed=args.seed))
    except (ModelError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
