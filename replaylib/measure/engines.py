"""The engines, in one table: a configuration's ``engine`` names one. Adding an engine is a module
implementing ``replaylib.measure.engine.Engine`` and one entry here: how it is built, and the pass
kinds its ``run_pass`` computes (``replaylib.measure.passes``: an engine runs every pass of its kinds
and refuses the others)."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from . import passes


@dataclass(frozen=True)
class EngineEntry:
    module: str  # the module of its class (imported when an engine is made, not before: it may need torch)
    cls: str  # its class, with from_params(params, invariant=, lifecycle=)
    kinds: tuple  # the pass kinds its run_pass computes
    lacks: str = ""  # why it has no kernel for the other kinds


ENGINES = {
    "hf": EngineEntry("replaylib.measure.engine_hf", "HFEngine", ("exact", "refeed", "serial", "block", "xrefeed",
                                                                  "xdecode")),
    "vllm": EngineEntry("replaylib.measure.engine_vllm", "VLLMEngine", ("exact", "refeed", "serial"),
                        "its exact passes are block-granular resumes already, and its APIs cannot place a given "
                        "KV state into its prefix cache"),
}
# a test hook: MODULE:FUNCTION that builds the engine instead (the tests run vLLM configurations on a stand-in)
FACTORY_ENV = "REPLAYLIB_TEST_ENGINE_FACTORY"


def runs(engine: str, pass_name: str) -> bool:
    """Whether an engine has the kernel of a pass's kind."""
    return passes.get(pass_name).kind in ENGINES[engine].kinds


def pass_kind(engine: str, pass_name: str) -> str:
    """The kernel a pass runs on an engine, refused in one line where the engine has none for it."""
    kind = passes.get(pass_name).kind
    if kind not in ENGINES[engine].kinds:
        others = [e for e in ENGINES if runs(e, pass_name)]
        raise ValueError(f"pass '{pass_name}' is of kind '{kind}', which engine {engine} has no kernel for "
                         f"({ENGINES[engine].lacks or 'replaylib/measure/engines.py lists its kinds'}); leave it out "
                         f"of passes" + (f" or set engine: {' or '.join(others)}" if others else ""))
    return kind


def make_engine(params, invariant: bool = False, lifecycle=None, forcing: bool = False):
    """The engine a configuration asks for, with a one-line error when it cannot run here. lifecycle: the
    hook around an engine's start and stop that manages its processes (the run layer passes
    replaylib.runtime.vllm_processes.EngineProcesses; None: the engine's own, which manages none).
    forcing: able to force given responses through its decode (force_trunks: the credit tool's engine)."""
    hook = os.environ.get(FACTORY_ENV)
    if hook:
        module, _, name = hook.partition(":")
        return getattr(importlib.import_module(module), name)(params, invariant=invariant, forcing=forcing)
    entry = ENGINES[params.engine]
    return getattr(importlib.import_module(entry.module), entry.cls).from_params(params, invariant=invariant,
                                                                                 lifecycle=lifecycle, forcing=forcing)
