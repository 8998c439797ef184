"""Counterfactual token credit on your own rollouts (docs/credit.md):

    python -m replaylib.credit ROLLOUTS.jsonl --model SPEC --grader NAME|MODULE:FUNCTION --out DIR
    python -m replaylib.credit export runs/<config> --out rollouts.jsonl

or from Python: ``Estimator(model=..., grader=...)``, loaded once and called per batch (a training step's
rollouts: replaylib.credit.estimator), ``estimate(batch, model=..., grader=...)`` for one batch, or
``replaylib.credit.tool.run(path, out, Settings(...))`` (the command's files; the summary). In a TRL training
loop: ``replaylib.credit.trl.CreditCallback``.
"""
from __future__ import annotations


def estimate(batch, model=None, grader="gsm8k", out=None, *, tokenizer=None, llm=None, engine=None, **settings):
    """Credit per pivot, as credit.parquet holds it, for one batch: a JSONL path or rollouts in memory (a list of
    rollout dicts, TRL's tensors with their masks, a verl DataProto: replaylib.credit.batches). model, tokenizer,
    llm, engine, grader and settings: as ``Estimator`` takes them. Without ``out`` nothing is written; with it,
    the command's files go there (credit.parquet, summary.json, timing.json, report.html and the shards a rerun
    resumes from)."""
    if out is not None:
        import pandas as pd

        from .tool import Settings, run
        if not isinstance(model, str) or tokenizer is not None or llm is not None:
            from .inputs import BadInput
            raise BadInput("estimate(out=...): give model as a spec (a hub id, a local directory, embedded:NAME, "
                           "tiny:SEED), or leave out out to use a model or LLM in memory")
        run(batch, out, Settings(model=model, grader=grader, **settings), engine=engine)
        return pd.read_parquet(f"{out}/credit.parquet")
    from .estimator import Estimator
    with Estimator(model, grader, tokenizer=tokenizer, llm=llm, engine=engine, **settings) as estimator:
        return estimator(batch)


def __getattr__(name: str):
    if name == "Estimator":  # imported on first use: the command's start-up stays light
        from .estimator import Estimator
        return Estimator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def llm_settings() -> dict:
    """What to pass to vllm.LLM(model, ...) so that an Estimator can use that LLM (llm=...): the forcing logits
    processor, prefix caching, raw logprobs and stats on (replaylib.measure.vllm_given)."""
    from ..measure.vllm_given import llm_settings as settings
    return settings()
