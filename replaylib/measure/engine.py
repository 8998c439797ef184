"""The engine interface shared by the transformers and vLLM engines.

Everything above an engine is engine-blind: sampling asks for trunks, replay hands over
pivot jobs for one pass and gets continuations, probes and an exactness report back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

ARMS = ("actual", "alt")


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
    observed: list | None = None  # forced decoding with an observer: what it returned at every step
    token_logprobs: list | None = None  # each generated token's own raw logprob (vLLM's, which returns no logits)


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

    @staticmethod
    def requests(k: int) -> list[tuple[str, int | str]]:
        """The one request layout of a pivot, the same in every pass and engine: per arm, K sampled
        continuations (kind 0..K-1, the index of its seed), then the greedy probe (kind "probe")."""
        return [(arm, kind) for arm in ARMS for kind in [*range(k), "probe"]]


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
class ResumeReport:
    """What one pass observed of the prefix state it continued from, for one pivot: the records' exactness
    columns. None where the pass or the engine has nothing to say (state_ok: not an exact pass)."""
    state_ok: bool | None = None  # an exact pass resumed the decode-time state as it was produced
    state: str | None = None  # where that state was: saved (transformers), identical or tokens (vLLM), not established
    establishment: int | None = None  # vLLM: which regeneration of the problem's trunks the pass resumed
    cache_hit: bool | None = None  # vLLM: every request found the pivot's blocks in the prefix cache
    min_cached_tokens: int | None = None  # the fewest prefix tokens any of the pivot's requests found cached
    preemptions: int | None = None  # vLLM: requests preempted during the pass (None: unknown)
    first_step_exact: bool | None = None  # the first post-pivot step reproduced the trunk's raw top-k bit for bit
    placed: bool | None = None  # transformers: every row's cache held the state's tensors as placed


@dataclass
class PivotOutput:
    pivot_id: int
    continuations: dict  # arm -> list of K token-id lists
    probe_ids: dict  # arm -> greedy probe token ids
    probe_first_logprob: dict  # arm -> raw logprob of the probe's first token
    resume: ResumeReport = field(default_factory=ResumeReport)


class EngineUnavailable(RuntimeError):
    pass


def uses_plain_prompt(tok) -> bool:
    """A base model: its tokenizer has no chat template (Gemma 3 270M), so its prompts are ``plain_prompt``."""
    return hasattr(tok, "chat_template") and not tok.chat_template


def chat_prompt_ids(tok, question: str, instruction: str, task: str = "gsm8k") -> list[int]:
    """The prompt of a problem as token ids: the model's chat template with one user turn (the question,
    then the instruction) and the generation prompt (docs/protocol.md section 2); a base model without a chat
    template (Gemma 3 270M) gets the few-shot plain prompt of ``plain_prompt`` with the task's worked examples."""
    if uses_plain_prompt(tok):
        return [int(i) for i in tok(plain_prompt(question, instruction, task))["input_ids"]]
    ids = tok.apply_chat_template([{"role": "user", "content": question + instruction}],
                                  add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)]


FEW_SHOT = 3  # worked examples in a plain prompt
ARITH_SHOT_SEED = 1  # the arith task's worked examples: generated from this seed (its test problems from 0)


def few_shot_examples(task: str) -> list[dict]:
    """A plain prompt's worked examples (question, answer in GSM8K's format): the arith task's own, generated
    from ARITH_SHOT_SEED; for every other task the first GSM8K training problems."""
    import json

    from ..core.paths import DATA
    if task == "arith":
        from .arith import generate
        return generate(seed=ARITH_SHOT_SEED, n=FEW_SHOT)
    with open(DATA / "gsm8k" / "train.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(FEW_SHOT))]


def plain_prompt(question: str, instruction: str, task: str = "gsm8k") -> str:
    """A base model's prompt: FEW_SHOT worked examples ("Question: ...", "Solution: ..."), their solutions
    without GSM8K's calculator notes and ending as the instruction asks (within \\boxed{}, or a last line
    "Answer: N"), each followed by a blank line, then the problem with the instruction and "Solution:" for the
    model to go on from. The model's answer ends at a blank line, as the examples' do (``answer_stop_ids``)."""
    import re
    shots = []
    for row in few_shot_examples(task):
        steps, _, answer = row["answer"].rpartition("####")
        steps, answer = re.sub(r"<<[^>]*>>", "", steps).strip(), answer.strip()
        end = f"The final answer is \\boxed{{{answer}}}." if "\\boxed" in instruction else f"Answer: {answer}"
        shots.append(f"Question: {row['question']}{instruction}\nSolution: {steps}\n{end}\n\n")
    return "".join(shots) + f"Question: {question}{instruction}\nSolution:"


def answer_stop_ids(tok) -> set[int]:
    """Where a base model's answer ends: the tokens whose text holds a blank line, the separator of its plain
    prompt's examples (as few-shot evaluations stop a base model's answer); without them it writes the next
    "Question:" and answers that too. Empty for a model with a chat template (its turn ends at its EOS)."""
    if not uses_plain_prompt(tok):
        return set()
    n = len(tok)
    texts = tok.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    return {i for i, text in enumerate(texts) if "\n\n" in text}


class Engine(Protocol):
    """What every engine offers; the stages use nothing else (replaylib.measure.engine_hf, replaylib.measure.engine_vllm).

    A *decode-time state* is whatever lets an engine resume the KV a trunk had while it was decoded:
    the transformers engine returns it from ``sample_trunks`` (problem -> rollout -> tensors; the
    sampling stage saves it with ``replaylib.measure.state.save_state``), the vLLM engine keeps it in its
    prefix cache and returns None (the replay stage re-establishes it). ``problem_state`` hands back the
    engine's own handle of one problem's resident state (``replaylib.measure.state.ResidentState``;
    ``replaylib.measure.engine_vllm.ResidentTrunks``), which only that engine's passes read."""

    name: str
    stop_ids: set
    special_ids: set

    def describe(self) -> dict:
        """What the manifests record about the engine (kind, model, device, dtype, mode, versions)."""

    def prompt_ids(self, question: str, instruction: str, task: str = "gsm8k") -> list[int]:
        """``chat_prompt_ids`` with the engine's tokenizer."""

    def decode(self, ids: list[int]) -> str:
        """Token ids as text (special tokens skipped), for grading."""

    def sample_trunks(self, prompts: dict, n_rollouts: int, seeds: dict, temperature: float, top_p: float,
                      max_new_tokens: int, top_logprobs: int) -> tuple[dict, dict | None]:
        """Trunks by problem (``Trunk``), and the decode-time state by problem or None."""

    def problem_state(self, sampling_dir, problem_id: int, trunks, expected: dict | None = None) -> tuple:
        """In another process than the sampling: (state handle, {rollout: verified}) of one problem,
        from the sampling stage's directory and trunk table (``expected``: its recorded digests)."""

    def resident_state(self, problem_id: int, trunks, produced: dict | None) -> tuple:
        """In the process that sampled (the batch-invariant stage): the same pair from what
        ``sample_trunks`` returned (``produced``)."""

    def run_pass(self, jobs: list, pass_name: str, settings: "PassSettings", state) -> list:
        """One pass over pivot jobs (``PivotOutput`` each, with its exactness report in ``resume``), computed
        by the pass's kind (``replaylib.measure.passes``); a pass the table does not give this engine, or
        of a kind it has no kernel for, is refused in one line."""

    def check_regeneration(self, jobs: list, settings: "PassSettings", state) -> dict:
        """pivot_id -> whether the trunk regenerates from the pivot ({} where the engine has no check)."""

    def layer_profile(self, jobs: list, state) -> list:
        """[ours] Per pivot and layer, where decode-time and re-fed K, V differ (transformers only)."""

    def close(self) -> None:
        """Stop the engine and whatever processes it started."""
