"""Stage 1: sampling trunks (replaylib.measure.sampling: the plan of batches, the unit, the screen)."""
from __future__ import annotations

from ..measure import sampling
from ..runtime import outputs
from ..runtime.units import Declared


def finished_rows(params, out_dir, unit):
    """A finished stage's trunks of one batch, as the batch's unit made them (before the screen marked them)."""
    trunks = outputs.trunk_table(outputs.sampling_dir(params, out_dir))
    batch = [pid for pid, _, _ in unit.args[0]]
    return trunks[trunks.problem_id.isin(batch)].drop(columns="kept").reset_index(drop=True)


STAGE = Declared("01_sampling", sampling.KERNEL, lambda params, out_dir: {}, finished_rows)
run, plan, preview = STAGE.run, STAGE.plan, STAGE.preview
