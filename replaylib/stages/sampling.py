"""Stage 1: sampling trunks (replaylib.measure.sampling: the plan of batches, the unit, the screen)."""
from __future__ import annotations

from ..measure import sampling
from ..runtime.units import Declared

STAGE = Declared("01_sampling", sampling.KERNEL, lambda params, out_dir: {})
run, plan, preview = STAGE.run, STAGE.plan, STAGE.preview
