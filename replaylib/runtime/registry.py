"""The stages, in one table: every other module (parameters and keys, the runner, run directories,
the report site, the notebooks' parameters cells, campaigns) reads them here.

Adding a stage is one entry: its directory name (the notebook is notebooks/<name>.ipynb), its declaration
(replaylib/stages/<driver>.py), its kernel (the module whose ``KERNEL`` holds its plan, unit and assemble
functions, whose declaration every unit's record of what it used holds), the stages whose keys are
in its key (``key_upstream``), the stages whose files it reads (``data_upstream``), whether it starts an
engine (its notebook then declares where the engines run) and the short names the runner accepts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    driver: str
    kernel: str
    key_upstream: tuple = ()
    data_upstream: tuple = ()
    engine: bool = False
    aliases: tuple = ()
    figures: tuple = ()  # figures its notebook draws for display (figures/<config>/<name>.*), not products


REGISTRY = (
    Stage("01_sampling", "sampling", "replaylib.measure.sampling", engine=True, aliases=("sampling",)),
    Stage("02_pivot_mining", "pivots", "replaylib.measure.mining", ("01_sampling",), ("01_sampling",),
          aliases=("pivots", "pivot_mining"), figures=("figS1_margins",)),
    Stage("03_three_pass_replay", "replay", "replaylib.measure.replay", ("01_sampling", "02_pivot_mining"),
          ("01_sampling", "02_pivot_mining"), engine=True, aliases=("replay",)),
    Stage("04_statistics", "statistics", "replaylib.analysis.products", ("03_three_pass_replay", "05_batch_invariant"),
          ("03_three_pass_replay", "05_batch_invariant"), aliases=("statistics", "stats")),
    # stage 05 reruns sampling, mining and the passes itself: it reads only stage 01's problem list
    Stage("05_batch_invariant", "invariant", "replaylib.measure.invariant",
          ("01_sampling", "02_pivot_mining", "03_three_pass_replay"), ("01_sampling",), engine=True,
          aliases=("invariant", "batch_invariant")),
)
# campaigns' statistics: a notebook of its own over several configurations' records (replaylib.campaign)
CAMPAIGN = Stage("06_campaign", "campaign_statistics", "replaylib.analysis.live_vs_published")

BY_NAME = {s.name: s for s in REGISTRY}
STAGES = [s.name for s in REGISTRY]
UPSTREAM = {s.name: list(s.key_upstream) for s in REGISTRY}
DATA_UPSTREAM = {s.name: list(s.data_upstream) for s in REGISTRY}
# the order stages run in: the statistics summarise the batch-invariant confirmation too
RUN_ORDER = ["01_sampling", "02_pivot_mining", "03_three_pass_replay", "05_batch_invariant", "04_statistics"]
EXECUTOR_STAGES = [s.name for s in REGISTRY if s.engine]
ALIASES = {alias: s.name for s in REGISTRY for alias in (*s.aliases, s.name[:2], str(int(s.name[:2])))}
NOTEBOOKS = STAGES + [CAMPAIGN.name]


def stage(name: str) -> Stage:
    return CAMPAIGN if name == CAMPAIGN.name else BY_NAME[name]
