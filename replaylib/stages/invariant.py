"""Stage 5: batch-invariant confirmation (replaylib.measure.invariant), on the first problems the sampling
stage kept."""
from __future__ import annotations

import json

from ..measure import invariant
from ..runtime import outputs
from ..runtime.units import Declared


def inputs(params, out_dir=None) -> dict:
    return {"problems": json.loads((outputs.sampling_dir(params, out_dir) / "problems.json").read_text())}


STAGE = Declared("05_batch_invariant", invariant.KERNEL, inputs,
                 lambda params, out_dir, unit: outputs.invariant_table(params, out_dir))
run, plan, preview = STAGE.run, STAGE.plan, STAGE.preview
