"""Stage 2: pivot mining (docs/protocol.md section 3.2).

A generated token is a pivot when its raw top-1 minus top-2 logprob is below the margin
threshold. The paper's paged-cache engine also needs the pivot's absolute position within
`boundary_slack` tokens past a multiple of the block size (16); block_size 1 lifts that
filter, since this package's engine resumes at any token. The alternative is the most
likely top-k token other than the sampled one; pivots whose alternative (or sampled
token) is EOS or special are skipped; at most P per rollout, earliest first.
`pivot_window` (not in the paper) keeps only pivots among a trunk's last N tokens, so that
short continuations of a scaled-down run can still reach the answer.
"""
from __future__ import annotations

import pandas as pd

from ..core.files import atomic_save
from ..measure.mining import NoPivots, mine, no_pivot_message, token_margins
from ..runtime.outputs import load_sampling
from ..runtime.params import Params
from ..runtime.rundir import StageDir

STAGE = "02_pivot_mining"


def run(params: Params, out_dir=None) -> pd.DataFrame:
    """Mine pivots from the sampling stage's kept trunks; writes pivots.parquet and margins.parquet."""
    stage = StageDir(params, STAGE, out_dir).begin()
    trunks, engine_info, _ = load_sampling(params, out_dir)
    pivots = mine(trunks, params, set(engine_info["special_ids"]))
    if pivots.empty:  # a confident model: nothing to replay, and the later stages would measure nothing
        raise NoPivots(no_pivot_message(params, STAGE))
    margins = pd.DataFrame([{"problem_id": t.problem_id, "rollout": t.rollout, "margin": m}
                            for t in trunks.itertuples(index=False) for m in token_margins(t._asdict())])
    atomic_save(stage.file("pivots.parquet"), lambda tmp: pivots.to_parquet(tmp, index=False))
    atomic_save(stage.file("margins.parquet"), lambda tmp: margins.to_parquet(tmp, index=False))
    stage.finish(["pivots.parquet", "margins.parquet"], {"n_pivots": len(pivots)})
    return pivots

