"""Counterfactual token credit on your own rollouts (docs/credit.md):

    python -m replaylib.credit ROLLOUTS.jsonl --model SPEC --grader NAME|MODULE:FUNCTION --out DIR
    python -m replaylib.credit export runs/<config> --out rollouts.jsonl

or from Python: ``estimate(rollouts, model=..., grader=...)`` (the frame of credit.parquet), or
``replaylib.credit.tool.run(path, out, Settings(...))`` (the summary).
"""
from __future__ import annotations


def estimate(rollouts, model: str, grader: str = "gsm8k", out=None, engine=None, **options):
    """Credit per pivot, as credit.parquet holds it, for rollouts given as a JSONL path or as a batch read in
    memory: a list of rollout dicts, a mapping of per-row tensors or arrays (TRL's), a verl DataProto
    (replaylib.credit.batches; the fields of docs/credit.md). options: the settings of ``tool.Settings`` (k, margin,
    passes, max_cont_tokens, device, seed, ...); out: where credit.parquet, summary.json, report.html and
    the shards go (a new temporary directory when None); engine: an engine already loaded, reused."""
    import tempfile
    from pathlib import Path

    import pandas as pd

    from .tool import Settings, run
    work = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="replaylib-credit-"))
    run(rollouts, work, Settings(model=model, grader=grader, **options), engine=engine)
    return pd.read_parquet(work / "credit.parquet")
