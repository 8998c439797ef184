"""Stage 2: pivot mining (replaylib.measure.mining), from the sampling stage's trunks."""
from __future__ import annotations

import json

from ..measure import mining
from ..runtime import outputs
from ..runtime.units import Declared


def inputs(params, out_dir=None) -> dict:
    path = outputs.sampling_dir(params, out_dir)
    return {"trunks": outputs.trunk_table(path), "engine": json.loads((path / "engine.json").read_text())}


STAGE = Declared("02_pivot_mining", mining.KERNEL, inputs,
                 lambda params, out_dir, unit: outputs.load_pivots(params, out_dir))
run, plan, preview = STAGE.run, STAGE.plan, STAGE.preview
