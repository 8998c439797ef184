"""Parameters: one typed schema, YAML files under params/, validation, per-stage hashes.

Every parameter belongs to the stage that first uses it. A stage's key is a hash of its
own parameters and its upstream stages' keys, so a change reruns exactly the stages it
invalidates. Defaults are the embedded CPU configuration (params/embedded.yaml).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..core.text import short
from ..measure import engines
from ..measure import passes as pass_table
from .registry import DATA_UPSTREAM, EXECUTOR_STAGES, STAGES, UPSTREAM

BOXED_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
PAPER_INSTRUCTION = ("\n\nReason step by step. End your response with one final line in exactly this "
                     "format:\nAnswer: <number>")
CHOICES = {
    "task": ["gsm8k", "math500", "arith"],
    "engine": list(engines.ENGINES),
    "device": ["cpu", "cuda", "auto"],
    "dtype": ["bfloat16", "float32", "float16"],
    "records": ["run", "published"],
    "pass_order": ["fixed", "shuffled"],
    "executor": ["local", "ray"],
    "prefix_precision": ["native", "float32"],
    "trunk_prefill": ["batched", "alone"],
    "vllm_serving": ["multiprocess", "inprocess"],
    "pass_submission": ["stock", "synchronized"],
}
# where a stage's units of work run: owned by no stage, so in no stage key (results never depend on it);
# the stages that start engines declare them in their notebooks
EXECUTOR_KEYS = ["executor", "shared_engine", "ray_address", "ray_workers", "gpus_per_worker", "vllm_headroom_gib",
                 "vllm_memory_wait_s"]


def task_data_sha256(task: str) -> str:
    """sha256 of a task's data file (replaylib.measure.data.TASKS), read again only when the file changes."""
    from ..measure.data import TASKS
    path = TASKS[task][0]
    try:
        st = path.stat()
    except OSError:
        return "missing"
    return _sha256_cached(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _sha256_cached(path: str, mtime_ns: int, size: int) -> str:
    from ..core.files import sha256_file
    return sha256_file(path)


def _p(stage: str, default, doc: str, lo=None, hi=None, above=None, why=None):
    """A parameter of a stage: its default, its meaning and its range (lo <= value <= hi; above < value);
    why: what the upper bound protects (a value that allocates)."""
    return field(default=default, metadata={"stage": stage, "doc": doc, "lo": lo, "hi": hi, "above": above,
                                            "why": why})


# upper bounds of values that size an allocation: a mistyped one would take the machine's memory
TOKENS_WHY = "a sequence's KV state grows with it; 32768 is the paper's models' context length"
ROWS_WHY = "the engine decodes that many rows in one batch"
MIN_TEMPERATURE = 1e-5  # positive temperatures below it are greedy in all but name (and overflow far below)


def _l(stage: str, default: list, doc: str):
    return field(default_factory=lambda: list(default), metadata={"stage": stage, "doc": doc})


@dataclass
class Params:
    # --- 01 sampling: model, engine, task, trunks
    config: str = _p("run", "embedded", "run name: outputs go to runs/<config>/, figures/<config>/, tables/<config>/")
    # --- where the work runs (replaylib/runtime/executor.py): in no stage key
    executor: str = _p("executor", "local", "local (one engine, units in order) or ray (engines on Ray actors)")
    shared_engine: bool = _p("executor", True, "local vLLM under the runner or a campaign: one engine per model and "
                                               "settings, in a process of its own, serves every stage that needs it "
                                               "(it loads and compiles once); false: each stage starts its own in its "
                                               "process, as a notebook run alone does")
    ray_address: str = _p("executor", "", "ray: empty starts a local Ray instance; auto or HOST:PORT joins a cluster "
                                          "(whose workers then run this package's code and exchange pickled data: "
                                          "join only clusters you trust; a received run's params.json never sets it)")
    ray_workers: int = _p("executor", 1, "ray: engines (actors) to start, each loaded once", lo=1, hi=256,
                          why="each worker loads a model of its own")
    gpus_per_worker: float = _p("executor", 1.0, "ray: GPUs per engine on CUDA (at most 1: an engine uses one GPU; "
                                                  "fractions let engines share one)", above=0)
    task: str = _p("01_sampling", "gsm8k", "task family: gsm8k, math500, or arith (word problems for small models)")
    model: str = _p("01_sampling", "embedded:qwen2.5-coder-0.5b-instruct",
                    "embedded:NAME, tiny[:SEED] (tiny-llama[:SEED], tiny-gemma3[:SEED]: the other families), a local "
                    "model directory, or a hub id (GPU users)")
    engine: str = _p("01_sampling", "hf", "hf (transformers, any device) or vllm (GPU)")
    device: str = _p("01_sampling", "cpu", "cpu, cuda or auto")
    dtype: str = _p("01_sampling", "bfloat16", "model dtype (the paper ran bfloat16)")
    instruction: str = _p("01_sampling", BOXED_INSTRUCTION, "appended to the question in the user turn")
    problem_start: int = _p("01_sampling", 0, "first problem index scanned", lo=0)
    n_problems: int = _p("01_sampling", 3, "problems kept", lo=1)
    screen_mixed: bool = _p("01_sampling", True, "keep a problem only if its trunk accuracy is neither 0 nor 1")
    scan_limit: int = _p("01_sampling", 8, "give up screening after this many problems scanned", lo=1)
    n_rollouts: int = _p("01_sampling", 3, "trunks per problem", lo=1, hi=1024, why=ROWS_WHY)
    temperature: float = _p("01_sampling", 0.7, "trunk sampling temperature", lo=0)
    top_p: float = _p("01_sampling", 0.95, "trunk nucleus sampling", above=0, hi=1)
    max_trunk_tokens: int = _p("01_sampling", 320, "trunk length limit", lo=1, hi=32768, why=TOKENS_WHY)
    top_logprobs: int = _p("01_sampling", 5, "raw top-k logprobs kept per generated token", lo=2, hi=20)
    max_batch_rows: int = _p("01_sampling", 128, "largest batch the transformers engine runs at once (on a CPU a "
                                                        "decode step costs about as much for 16 rows as for 1, so fill it)", lo=1,
                             hi=4096, why=ROWS_WHY)
    trunk_prefill: str = _p("01_sampling", "batched",
                            "[ours] batched (a batch's prompts left-padded to one length and prefilled together, as a "
                            "sampler batches them) or alone (each prompt prefilled in a forward pass of its own, then "
                            "decoded in the same batches): the prompt-batching control (hf only)")
    gpu_memory_utilization: float = _p("01_sampling", 0.92, "vLLM: share of GPU memory for weights and KV blocks", above=0, hi=1)
    max_model_len: int = _p("01_sampling", 4096, "vLLM: context length", lo=16)
    attention_backend: str = _p("01_sampling", "", "vLLM attention backend (empty: the engine default)")
    invariant_attention_backend: str = _p("01_sampling", "TRITON_ATTN",
                                          "vLLM attention backend in batch-invariant mode (FA3 is not invariant)")
    enforce_eager: bool = _p("01_sampling", False, "vLLM: no CUDA graphs or torch.compile")
    kv_cache_gib: float = _p("01_sampling", 0.0,
                             "vLLM: a KV cache of this many GiB, fixed (0: what gpu_memory_utilization leaves after "
                             "vLLM profiles the free memory); fixed, an engine start measures no free memory, so "
                             "engines of several stages can start side by side on one GPU", lo=0)
    vllm_headroom_gib: float = _p("executor", 0.0,
                                  "vLLM with a fixed kv_cache_gib: GPU memory asked for beyond the weights and the "
                                  "cache (CUDA context, activations, CUDA graphs, sampler buffers; 0: 1.5 GiB and the "
                                  "sampler's buffers for the model's vocabulary); the engine asks for that share of "
                                  "the card, not gpu_memory_utilization's", lo=0, hi=1024)
    vllm_memory_wait_s: float = _p("executor", 300.0,
                                   "vLLM with a fixed kv_cache_gib: how long a start waits for the memory it needs to "
                                   "be free on the GPU (others' engines stopping) before it refuses", lo=0, hi=86400)
    vllm_serving: str = _p("01_sampling", "multiprocess",
                           "vLLM: multiprocess (vLLM's default and the paper's: the engine core runs in a process of "
                           "its own and starts stepping while a call's requests still arrive) or inprocess (one "
                           "process: identical calls run in identical batches); it changes the numerics")
    # --- 02 pivot mining
    margin_threshold: float = _p("02_pivot_mining", 1.0, "pivot if top1 - top2 logprob < this", lo=0)
    block_size: int = _p("02_pivot_mining", 1, "1: any token (exact resume anywhere); 16: the paper's paged-cache filter", lo=1)
    boundary_slack: int = _p("02_pivot_mining", 2, "with block_size above 1, abs_pos mod block_size must be at most this", lo=0)
    max_pivots_per_rollout: int = _p("02_pivot_mining", 3, "earliest pivots first", lo=1)
    min_rollout_tokens: int = _p("02_pivot_mining", 16, "rollouts shorter than this are skipped", lo=1)
    pivot_window: int = _p("02_pivot_mining", 64, "only pivots among the last N generated tokens (0: anywhere)", lo=0)
    # --- 03 three-pass replay
    k: int = _p("03_three_pass_replay", 4, "sampled continuations per arm", lo=1, hi=256,
                why="every pass decodes 2K continuations of a pivot side by side; the paper used at most 16")
    cont_temperature: float = _p("03_three_pass_replay", 0.7, "continuation temperature (0 for greedy)", lo=0)
    cont_top_p: float = _p("03_three_pass_replay", 0.95, "continuation nucleus sampling", above=0, hi=1)
    max_cont_tokens: int = _p("03_three_pass_replay", 32, "continuation length limit", lo=1, hi=32768, why=TOKENS_WHY)
    probe_tokens: int = _p("03_three_pass_replay", 32, "greedy probe length", lo=1, hi=32768, why=TOKENS_WHY)
    stop_at_answer: bool = _p("03_three_pass_replay", True, "stop a continuation once its final answer is complete")
    passes: list = _l("03_three_pass_replay", pass_table.required(),
                      ", ".join(pass_table.required()) + ", optionally "
                      + ", ".join(p for p in pass_table.PASSES if p not in pass_table.required()))
    pass_order: str = _p("03_three_pass_replay", "fixed", "fixed (as listed) or shuffled (seeded per problem)")
    pass_submission: str = _p("03_three_pass_replay", "stock",
                              "[ours] vLLM multiprocess only: stock (one LLM.generate per pass call, as the paper's "
                              "harness ran) or synchronized (the call's requests are all queued before the engine "
                              "core's first step: the in-process engine's batching, as a control of what makes the "
                              "replica floor)")
    verify_regeneration: bool = _p("03_three_pass_replay", True,
                                   "exact1 also continues the actual arm with the trunk's own seed and checks it")
    prefix_precision: str = _p("03_three_pass_replay", "native",
                               "[ours] native, or float32: re-fed prefix states (refeed, refeed2, serial, "
                               "xplant_refeed_kv's prefix) prefilled by a float32 copy of the model and rounded "
                               "to dtype; exact passes, xplant_decode_kv and every decode step unchanged (hf only)")
    layer_profile: bool = _p("03_three_pass_replay", False,
                             "[ours] write layer_profile.parquet: per pivot and layer, max |decode-time - re-fed| "
                             "of K and V (hf only)")
    # --- 04 statistics
    records: str = _p("04_statistics", "run", "run: this run's records; published: the paper's seven runs")
    bootstrap_draws: int = _p("04_statistics", 2000, "bootstrap resamples of problems for the CIs", lo=1, hi=100_000,
                              why="the bootstrap holds every draw's resample in memory; the paper drew 2000")
    # --- 05 batch-invariant confirmation
    invariant_problems: int = _p("05_batch_invariant", 1, "problems (the first sampled ones) rerun in invariant mode", lo=1)
    invariant_rollouts: int = _p("05_batch_invariant", 1, "trunks per problem in invariant mode", lo=1)
    invariant_pivots: int = _p("05_batch_invariant", 1, "pivots per problem (earliest) replayed in invariant mode", lo=1)
    invariant_max_cont_tokens: int = _p("05_batch_invariant", 16, "continuation limit in invariant mode", lo=1,
                                        hi=32768, why=TOKENS_WHY)
    invariant_max_trunk_tokens: int = _p("05_batch_invariant", 160, "trunk length limit in invariant mode (0 means "
                                                                     "max_trunk_tokens, as in the paper)", lo=0,
                                         hi=32768, why=TOKENS_WHY)
    # --- display only: in no stage's key, so changing it reruns nothing (rerun a stage with --force to redraw it)
    example_pivot: int = _p("display", -1, "row of the replay records shown in the worked examples (-1: the first "
                                            "where refeed changed the sign of A, else the first)", lo=-1)

    # ------------------------------------------------------------------
    def __repr__(self) -> str:
        """config and the values that differ from the defaults (every field is a screenful in a notebook)."""
        default = Params()
        shown = [f.name for f in dataclasses.fields(self)
                 if f.name == "config" or getattr(self, f.name) != getattr(default, f.name)]
        return f"Params({', '.join(f'{k}={getattr(self, k)!r}' for k in shown)})"

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def display_keys(cls) -> list[str]:
        """Parameters that change what the notebooks show, not what the stages compute."""
        return [f.name for f in dataclasses.fields(cls) if f.metadata["stage"] == "display"]

    def data_upstream(self, stage: str) -> list[str]:
        if stage == "04_statistics" and self.records == "published":
            return []
        return DATA_UPSTREAM[stage]

    def reading(self, stages) -> set[str]:
        """The stages named and every stage whose data they read, transitively."""
        closure, todo = set(), list(stages)
        while todo:
            stage = todo.pop()
            if stage not in closure:
                closure.add(stage)
                todo += self.data_upstream(stage)
        return closure

    @classmethod
    def keys_for(cls, stage: str) -> list[str]:
        """Parameters a stage depends on: its own and all its upstream stages'."""
        wanted, todo = set(), [stage]
        while todo:
            s = todo.pop()
            wanted.add(s)
            todo += UPSTREAM[s]
        return [f.name for f in dataclasses.fields(cls) if f.metadata["stage"] in wanted]

    def stage_params(self, stage: str) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["stage"] == stage}

    def stage_key(self, stage: str) -> str:
        """Hash of a stage's own parameters and its upstream stages' keys; the sampling stage's also
        holds the sha256 of the task's data file (the questions and the gold answers graded against)."""
        payload = {"stage": stage, "params": self.stage_params(stage),
                   "upstream": {u: self.stage_key(u) for u in UPSTREAM[stage]}}
        if stage == STAGES[0]:
            payload["data"] = task_data_sha256(self.task)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def notebook_values(self, stage: str) -> dict:
        """What a stage's notebook is given: its declared parameters, and in ``upstream`` the upstream
        stages' values, which it does not declare one by one (the runner injects exactly these)."""
        own = own_keys(stage)
        return {**{k: getattr(self, k) for k in notebook_keys(stage)},
                "upstream": {k: getattr(self, k) for k in self.keys_for(stage) if k != "config" and k not in own}}


CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(value: str, where: str, key: str = "config") -> str:
    """A run or campaign name: it names directories (runs/<name>/, tables/<name>/), so it is one path
    component of letters, digits, '.', '_' and '-', starting with a letter or digit."""
    if not CONFIG_NAME.fullmatch(value):
        raise ValueError(f"{where}: parameter '{key}' is {short(value)}; a name is letters, digits, '.', '_' and '-', "
                         f"starting with a letter or digit (it names the run's directories); rename it")
    return value


def _check_range(f, value, where: str) -> None:
    lo, hi, above = f.metadata.get("lo"), f.metadata.get("hi"), f.metadata.get("above")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: parameter '{f.name}' is {short(value)}; give a finite number")
    if hi is not None and value > hi:
        raise ValueError(f"{where}: parameter '{f.name}' is {short(value)}; it must be at most {hi} "
                         f"({f.metadata['why'] or f.metadata['doc']})")
    if (lo is not None and value < lo) or (above is not None and value <= above):
        want = " and ".join(x for x in (f"at least {lo}" if lo is not None else "",
                                         f"above {above}" if above is not None else "",
                                         f"at most {hi}" if hi is not None else "") if x)
        raise ValueError(f"{where}: parameter '{f.name}' is {short(value)}; it must be {want} ({f.metadata['doc']})")
    if f.name in ("temperature", "cont_temperature") and 0 < value < MIN_TEMPERATURE:
        raise ValueError(f"{where}: parameter '{f.name}' is {short(value)}; it must be 0 (greedy) or at least "
                         f"{MIN_TEMPERATURE:g} (a smaller one is greedy in all but name, and a far smaller one "
                         f"overflows the scaled logits)")


def _check_type(name: str, value, where: str):
    f = {f.name: f for f in dataclasses.fields(Params)}[name]
    want = f.type if isinstance(f.type, type) else {"str": str, "int": int, "float": float,
                                                      "bool": bool, "list": list}[f.type]
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ValueError(f"{where}: parameter '{name}' must be {want.__name__}, got {short(value)} "
                         f"({type(value).__name__}); fix its value")
    if name in CHOICES and value not in CHOICES[name]:
        raise ValueError(f"{where}: parameter '{name}' is {short(value)}; choose one of {CHOICES[name]}")
    if want in (int, float):
        _check_range(f, value, where)
    if name == "config":
        check_name(value, where)
    if name == "model" and not value.strip():
        raise ValueError(f"{where}: parameter 'model' is empty; name a model (embedded:NAME, tiny[:SEED], a local "
                         f"directory or a hub id)")
    if name == "passes" and not all(isinstance(x, str) for x in value):
        raise ValueError(f"{where}: parameter 'passes' must be a list of pass names, got {short(value)}")
    if name == "passes":
        known = set(pass_table.PASSES)
        first, *others = pass_table.required()
        if value[:1] != [first] or not set(others) <= set(value) <= known or len(set(value)) != len(value):
            raise ValueError(f"{where}: parameter 'passes' must start with '{first}', include "
                             f"{' and '.join(repr(p) for p in others)}, and use only {sorted(known)}, each once")
    return value


def make(overrides: dict, where: str = "parameters", scope=None) -> Params:
    """Params from defaults plus overrides, refusing unknown keys and wrong types.

    scope: the keys these Params speak for (a stage notebook's declared ones); the checks that
    combine keys skip a key outside it, whose value is only the default."""
    names = Params.names()
    clean = {}
    for name, value in overrides.items():
        if not isinstance(name, str):
            raise ValueError(f"{where}: key {short(name)} is not a parameter name ({type(name).__name__}); parameter "
                             f"names are text, see replaylib/runtime/params.py")
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see replaylib/runtime/params.py for the known ones"
            raise ValueError(f"{where}: unknown parameter '{name}' ({hint})")
        clean[name] = _check_type(name, value, where)
    params = Params(**clean)
    scope = set(names if scope is None else scope)
    if {"problem_start", "n_problems"} & scope:
        _check_task_size(params, where)
    if params.gpus_per_worker > 1:
        raise ValueError(f"{where}: parameter 'gpus_per_worker' is {params.gpus_per_worker:g}, but an engine uses one "
                         f"GPU (tensor-parallel engines are not built), so the others would sit idle; set "
                         f"gpus_per_worker: 1 (or a fraction, to share a GPU) and raise ray_workers instead")
    if params.engine == "vllm" and "stop_at_answer" in scope and params.stop_at_answer:
        raise ValueError(f"{where}: parameter 'stop_at_answer' is true, which the vllm engine does not implement "
                         f"(its continuations run to EOS or max_cont_tokens, as in the paper); set stop_at_answer: false")
    if "pass_submission" in scope and params.pass_submission != "stock" and not (
            params.engine == "vllm" and params.vllm_serving == "multiprocess"):
        raise ValueError(f"{where}: parameter 'pass_submission' is {params.pass_submission!r}, which only differs from "
                         f"'stock' on the multi-process vLLM engine (engine: vllm, vllm_serving: multiprocess: "
                         f"elsewhere every call's requests are in before its first step); set pass_submission: stock")
    refused = [p for p in params.passes if "passes" in scope and not engines.runs(params.engine, p)]
    if refused:
        fix = " or ".join(f"engine: {e}" for e in engines.ENGINES if all(engines.runs(e, p) for p in refused))
        raise ValueError(f"{where}: parameter 'passes' has {', '.join(refused)}, which the {params.engine} engine "
                         f"does not run ({engines.ENGINES[params.engine].lacks}); remove them or set {fix}")
    if params.engine == "vllm" and ("layer_profile" in scope and params.layer_profile
                                    or "prefix_precision" in scope and params.prefix_precision != "native"):
        raise ValueError(f"{where}: layer_profile and prefix_precision need engine: hf (vLLM's APIs cannot place a "
                         f"given KV state into its prefix cache nor hand it out); set engine: hf")
    if params.engine == "vllm" and "trunk_prefill" in scope and params.trunk_prefill != "batched":
        raise ValueError(f"{where}: parameter 'trunk_prefill' is {params.trunk_prefill!r}, which needs engine: hf (vLLM "
                         f"schedules its prefills itself); set engine: hf or remove trunk_prefill")
    return params


def _check_task_size(params: Params, where: str) -> None:
    """problem_start and n_problems within the task's problems (the screen cannot keep more than there are)."""
    size = task_size(params.task)
    if params.problem_start >= size:
        raise ValueError(f"{where}: parameter 'problem_start' is {params.problem_start}, past the {size} problems of "
                         f"task {params.task} (0-{size - 1}); lower it")
    if params.n_problems > size - params.problem_start:
        raise ValueError(f"{where}: parameter 'n_problems' is {params.n_problems}; it must be at most "
                         f"{size - params.problem_start} (task {params.task} has {size} problems, and the scan starts "
                         f"at problem_start {params.problem_start})")


def task_size(task: str) -> int:
    """How many problems a task's data file holds (read again only when the file changes)."""
    from ..measure.data import TASKS
    path = TASKS[task][0]
    st = path.stat()
    return _task_size_cached(task, str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _task_size_cached(task: str, path: str, mtime_ns: int, size: int) -> int:
    from ..measure.data import load_problems
    return len(load_problems(task))


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one mapping (YAML keeps the last, silently), a key
    that is not text, and aliases (*name): a params file is a few values, and an alias can repeat one a
    billion times."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}) at line {event.start_mark.line + 1}: params files do not "
                            f"take aliases; write the value out", event.start_mark)
        return super().compose_node(parent, index)


def _mapping_without_repeats(loader, node):
    seen = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"line {key_node.start_mark.line + 1}: a key is a {key_node.id}; keys are names",
                key_node.start_mark)
        key = loader.construct_object(key_node)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"line {key_node.start_mark.line + 1}: key {short(key)} is not a name", key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {short(key)} appears twice (line {key_node.start_mark.line + 1}); keep one",
                key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def read_mapping(path: Path, missing: str, shape: str) -> dict:
    """A YAML file holding one non-empty mapping, or a one-line error naming the file (missing: the fix
    when it does not exist; shape: what the mapping holds)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {missing}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    if data is None:
        raise ValueError(f"{path}: the file is empty; give it a mapping {shape}")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping {shape}")
    return data


def read_params_file(path: Path, chain: tuple = ()) -> dict:
    """A params file's values with its ``extends`` chain resolved: the named file's values (a path
    relative to this file, ``.yaml`` optional), overridden by this file's. ``config`` is never
    inherited: a configuration's name is its own (its ``config:`` or the file's stem)."""
    data = read_mapping(path, "params file not found; pick one of params/*.yaml or give a path",
                        "of parameter: value")
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ValueError(f"{path}: 'extends' must name another params file (e.g. extends: gpu-embedded.yaml)")
    parent = Path(base) if Path(base).is_absolute() else path.parent / base
    if not parent.suffix:
        parent = parent.with_suffix(".yaml")
    seen = chain + (path.resolve(),)
    if parent.resolve() in seen:
        raise ValueError(f"{path}: 'extends' makes a cycle ({' -> '.join(p.name for p in seen + (parent,))}); "
                         f"remove one of them")
    if not parent.is_file():
        raise FileNotFoundError(f"{path}: 'extends' names {base}, which does not exist (looked for {parent}); "
                                f"fix the name")
    inherited = read_params_file(parent, seen)
    inherited.pop("config", None)
    return {**inherited, **data}


def load(path: str | Path) -> Params:
    """Read a params YAML file (its ``extends`` chain resolved); its stem is the default config name."""
    path = Path(path)
    data = read_params_file(path)
    data.setdefault("config", path.stem)
    return make(data, where=str(path))


def own_keys(stage: str) -> list[str]:
    """The parameters a stage owns (its own key's, without its upstream stages')."""
    return [f.name for f in dataclasses.fields(Params) if f.metadata["stage"] == stage]


def notebook_keys(stage: str) -> list[str]:
    """The parameters a stage's notebook declares: config, where its engines run (the stages that start
    engines), the stage's own keys, and the display-only ones. The upstream stages' values reach it in
    one more parameter, ``upstream`` (the runner passes them; in Jupyter they come from the upstream
    stages' params.json)."""
    return (["config"] + (EXECUTOR_KEYS if stage in EXECUTOR_STAGES else []) + own_keys(stage)
            + Params.display_keys())


def upstream_values(config: str, stage: str, out_dir=None, reads_data: bool = True) -> dict:
    """The parameters of a stage's upstream stages, as they ran: from each key-upstream stage's
    params.json under runs/<config>/ (a stage that reads no upstream files, the statistics of the
    published records, takes the defaults). A missing one is a one-line error naming the fix."""
    from ..core.paths import out_root
    values = {}
    for up in UPSTREAM[stage]:
        path = out_root(out_dir) / "runs" / config / up / "params.json"
        try:
            recorded = json.loads(path.read_text())["params"]
        except (OSError, ValueError, KeyError):
            if not reads_data:
                continue
            raise ValueError(f"notebook {stage}: needs the parameters {up} ran with, from {path}, which is missing "
                             f"or unreadable; run {up} first (its notebook, or python -m replaylib.run "
                             f"PARAMS.yaml {up})") from None
        values.update({k: v for k, v in recorded.items() if k != "config"})
    return values


def from_notebook(namespace: dict, stage: str) -> Params:
    keys = notebook_keys(stage)
    own = {k: namespace[k] for k in keys if k in namespace}
    upstream = dict(namespace.get("upstream") or {})
    if not upstream and UPSTREAM[stage]:
        probe = make(own, where=f"notebook {stage}", scope=keys)  # does this stage read upstream files?
        upstream = upstream_values(probe.config, stage, namespace.get("out_dir") or None,
                                   reads_data=bool(probe.data_upstream(stage)))
    unknown = sorted(set(upstream) - set(Params.names()))
    if unknown:
        raise ValueError(f"notebook {stage}: upstream parameter '{unknown[0]}' is not a parameter of this "
                         f"version of replaylib; rerun the upstream stages")
    scope = keys + [k for k in Params.keys_for(stage) if k not in keys]
    return make({**upstream, **own}, where=f"notebook {stage}", scope=scope)
