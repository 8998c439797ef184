"""Stage 3: three-pass replay (replaylib.measure.replay), from the trunks, their decode-time states and the
pivots."""
from __future__ import annotations

from ..measure import replay
from ..runtime import outputs
from ..runtime.units import Declared


def inputs(params, out_dir=None) -> dict:
    path = outputs.sampling_dir(params, out_dir)
    return {"trunks": outputs.trunk_table(path), "pivots": outputs.load_pivots(params, out_dir),
            "digests": outputs.state_digests(params, out_dir), "sampling_dir": path}


STAGE = Declared("03_three_pass_replay", replay.KERNEL, inputs)
run, plan, preview = STAGE.run, STAGE.plan, STAGE.preview
