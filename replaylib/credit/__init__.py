"""Counterfactual token credit on your own rollouts (docs/credit.md):

    python -m replaylib.credit ROLLOUTS.jsonl --model SPEC --grader NAME|MODULE:FUNCTION --out DIR
    python -m replaylib.credit export runs/<config> --out rollouts.jsonl

or from Python: ``replaylib.credit.tool.run(path, out, Settings(model=..., grader=...))``.
"""
