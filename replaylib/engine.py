"""The engine interface shared by the transformers and vLLM engines.

Everything above an engine is engine-blind: sampling asks for trunks, replay hands over
pivot jobs for one pass and gets continuations, probes and an exactness report back.
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass, field

ARMS = ("actual", "alt")


def stable_seed(*parts) -> int:
    """A 31-bit seed from what it identifies (problem, rollout, position, arm, k), never call order."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def trunk_seed(problem_id: int, rollout: int) -> int:
    return stable_seed(problem_id, "trunk", rollout)


def continuation_seed(problem_id: int, rollout: int, abs_pos: int, arm: str, k: int) -> int:
    return stable_seed(problem_id, rollout, abs_pos, arm, k)


@dataclass
class Trunk:
    problem_id: int
    rollout: int
    seed: int
    prompt_ids: list[int]
    gen_ids: list[int]
    topk_ids: list[list[int]]  # raw (pre-temperature) top-k token ids of every generated step
    topk_logprobs: list[list[float]]
    finish_reason: str  # "eos", "answer" or "length"


@dataclass
class PivotJob:
    """One pivot of one trunk: both arms, K sampled continuations and one greedy probe each."""
    pivot_id: int
    problem_id: int
    rollout: int
    gen_index: int
    prompt_ids: list[int]
    gen_prefix: list[int]  # the trunk's tokens before the pivot
    forced: dict  # arm -> token id placed at the pivot
    seeds: dict  # arm -> list of K seeds
    trunk_next: tuple | None = None  # the trunk's raw top-k (ids, logprobs) at gen_index + 1
    trunk_rest: list | None = None  # the trunk's tokens after the pivot
    trunk_seed: int | None = None  # the trunk's own sampling seed

    @property
    def abs_pos(self) -> int:
        return len(self.prompt_ids) + self.gen_index

    def prefix_ids(self, arm: str) -> list[int]:
        return self.prompt_ids + self.gen_prefix + [self.forced[arm]]


@dataclass
class PassSettings:
    k: int
    temperature: float
    top_p: float
    max_tokens: int
    probe_tokens: int
    stop_at_answer: bool
    task: str
    verify_regeneration: bool = False  # exact passes also continue the actual arm with the trunk's seed
    trunk_temperature: float = 0.7
    trunk_top_p: float = 0.95
    submission: str = "stock"  # vLLM multiprocess: stock (LLM.generate) or synchronized (all queued, then stepped)


@dataclass
class PivotOutput:
    pivot_id: int
    continuations: dict  # arm -> list of K token-id lists
    probe_ids: dict  # arm -> greedy probe token ids
    probe_first_logprob: dict  # arm -> raw logprob of the probe's first token
    resume: dict = field(default_factory=dict)  # exactness report of this pass for this pivot


class EngineUnavailable(RuntimeError):
    pass


def make_engine(params, invariant: bool = False):
    """The engine a configuration asks for, with a one-line error when it cannot run here."""
    if params.engine == "hf":
        from .engine_hf import HFEngine
        return HFEngine.from_params(params, invariant=invariant)
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(f"config '{params.config}': engine 'vllm' needs vLLM 0.22.1 and a GPU; "
                                f"install it (pip install -e '.[vllm]') or set engine: hf")
    from .engine_vllm import VLLMEngine
    return VLLMEngine.from_params(params, invariant=invariant)
