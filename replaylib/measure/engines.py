"""The engines, in one table: a configuration's ``engine`` names one. Adding an engine is a module
implementing ``replaylib.measure.engine.Engine`` and one entry here."""
from __future__ import annotations

import importlib
import importlib.util
import os

from .engine import EngineUnavailable


def _hf(params, invariant: bool, lifecycle):
    from .engine_hf import (
        HFEngine,  # runs in this process alone: no lifecycle to manage
    )
    return HFEngine.from_params(params, invariant=invariant)


def _vllm(params, invariant: bool, lifecycle):
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(f"config '{params.config}': engine 'vllm' needs vLLM 0.22.1 and a GPU; "
                                f"install it (pip install -e '.[vllm]') or set engine: hf")
    from .engine_vllm import VLLMEngine
    return VLLMEngine.from_params(params, invariant=invariant, lifecycle=lifecycle)


ENGINES = {"hf": _hf, "vllm": _vllm}
# a test hook: MODULE:FUNCTION that builds the engine instead (the tests run vLLM configurations on a stand-in)
FACTORY_ENV = "REPLAYLIB_TEST_ENGINE_FACTORY"


def make_engine(params, invariant: bool = False, lifecycle=None):
    """The engine a configuration asks for, with a one-line error when it cannot run here. lifecycle: the
    hook around an engine's start and stop that manages its processes (the run layer passes
    replaylib.runtime.vllm_processes.EngineProcesses; None: the engine's own, which manages none)."""
    hook = os.environ.get(FACTORY_ENV)
    if hook:
        module, _, name = hook.partition(":")
        return getattr(importlib.import_module(module), name)(params, invariant=invariant)
    return ENGINES[params.engine](params, invariant, lifecycle)
