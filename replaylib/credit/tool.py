"""The credit tool's run: read and check every rollout, group them by prompt, then per group (one shard
each, reused on a rerun under the same settings, engine and code: replaylib.credit.kernel, run by the stages'
runner) rebuild the decode-time states by forced decoding, choose the pivots and run the passes; then write
credit.parquet, summary.json, timing.json and report.html, each atomically. Groups run on one local engine,
or on engines on Ray actors (--executor ray --workers N); what a group computes never depends on where it
ran."""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import pandas as pd

from ..core.files import atomic_save, atomic_write_bytes, atomic_write_json
from ..measure import credit as kernel
from ..measure.engine import EngineUnavailable, PassSettings
from ..runtime import provenance
from . import graders, timings
from .batches import read_input
from .calibration import calibrate, estimate_line
from .checks import check_bounds, check_lengths, model_context
from .diagnostics import plan_line, unfinished, warnings
from .inputs import BadInput
from .kernel import KERNEL, ROOTS, groups_of
from .outdir import check_out, holding

log = logging.getLogger("replaylib")
FORCINGS = ("groups", "batch")
WHERE = ("executor", "workers", "ray_address", "kv_cache_gib")  # where groups run and in what memory: in no shard's
# key (a cache too small to hold a pivot's blocks shows in the rows' verification, and the engine's description
# holds its size)


@dataclass
class Settings:
    """Everything that decides a shard's bytes besides the rollouts themselves (its key), and where it runs."""
    model: str
    grader: str
    passes: list = field(default_factory=lambda: list(kernel.TOOL_PASSES))
    k: int = 4
    margin: float = 1.0
    max_pivots_per_rollout: int = 3
    max_cont_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    probe_tokens: int = 1
    stop_at_answer: bool = False
    engine: str = "hf"
    device: str = "cpu"
    dtype: str = "bfloat16"
    invariant: bool = False
    seed: int = 0
    seeds: str = "hash"
    success_above: float = 0.0
    grader_timeout: float = graders.DEFAULT_TIMEOUT  # seconds per call of a user's grader
    grader_kind: str = "auto"  # how a user's grader is called: auto (from its parameters), verl, trl, openrlhf
    logprobs_temperature: float = 1.0  # the temperature per-position logprobs were taken at
    # how the decode-time states are rebuilt: each prompt's rollouts forced together ("groups"), or a batch's rows all
    # together as the sampler batched them ("batch": generate's left padding, finished rows kept; vLLM's one call)
    forcing: str = "groups"
    serving: str = "multiprocess"  # vLLM: its default multi-process engine (as pipelines run it) or in-process
    gpu_memory_utilization: float = 0.9  # vLLM: the share of GPU memory for weights and (with kv_cache_gib 0) cache
    kv_cache_gib: float = 4.0  # vLLM: a fixed KV cache, so that the engine starts beside others on one GPU
    max_model_len: int = 4096  # vLLM
    enforce_eager: bool = False  # vLLM: no CUDA graphs (as the sampler ran, if it did: its numbers then match)
    executor: str = "local"
    workers: int = 1
    ray_address: str = ""  # ray: empty starts a local instance; auto or HOST:PORT joins a cluster

    def check(self) -> None:
        bad = [p for p in self.passes if p not in kernel.PASS_OF]
        if bad or not self.passes:
            raise BadInput(f"--passes {','.join(self.passes)}: choose among {','.join(kernel.TOOL_PASSES)}")
        for name, lo in (("k", 1), ("max_pivots_per_rollout", 1), ("max_cont_tokens", 1), ("probe_tokens", 1),
                         ("workers", 1)):
            if getattr(self, name) < lo:
                raise BadInput(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least {lo}")
        check_bounds(self)
        if self.seeds not in ("hash", "replay"):
            raise BadInput(f"--seeds {self.seeds}: choose hash or replay")
        if self.engine == "vllm" and self.stop_at_answer:
            raise BadInput("--stop-at-answer: the vllm engine runs continuations to EOS or --max-cont-tokens; "
                           "leave it out, or use --engine hf")
        if self.enforce_eager and self.engine != "vllm":
            raise BadInput("--enforce-eager: only the vllm engine has CUDA graphs to leave out; leave it out, or use "
                           "--engine vllm")
        if self.executor not in ("local", "ray"):
            raise BadInput(f"--executor {self.executor}: choose local or ray")
        if self.forcing not in FORCINGS:
            raise BadInput(f"forcing {self.forcing!r}: choose {' or '.join(FORCINGS)}")
        if self.forcing == "batch" and self.invariant:
            raise BadInput("forcing 'batch' rebuilds the sampler's batch, which --invariant (one sequence at a time) "
                           "does not have; use forcing 'groups'")
        graders.check_kind(self.grader_kind)

    def key(self) -> str:
        what = {k: v for k, v in asdict(self).items() if k not in WHERE + ("grader_timeout",)}
        if self.forcing == "groups":  # the default adds nothing: shards written without the setting stay valid
            del what["forcing"]
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def pass_settings(self) -> PassSettings:
        return PassSettings(k=self.k, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_cont_tokens,
                            probe_tokens=self.probe_tokens, stop_at_answer=self.stop_at_answer, task="credit")

    def params(self):
        """The engine's configuration in the package's parameters (runtime.params), so that the tool's engines
        are built, placed and stopped as the stages' are."""
        from ..runtime import params
        try:
            return params.make({"config": "credit", "engine": self.engine, "device": self.device, "model": self.model,
                                "dtype": self.dtype, "vllm_serving": self.serving,
                                "gpu_memory_utilization": self.gpu_memory_utilization,
                                "kv_cache_gib": self.kv_cache_gib,
                                "max_model_len": self.max_model_len, "enforce_eager": self.enforce_eager,
                                "executor": self.executor,
                                "ray_workers": self.workers, "ray_address": self.ray_address}, where="the credit tool's settings", scope=[])
        except ValueError as e:
            raise BadInput(str(e)) from None


def model_files(settings: Settings):
    """The model's tokenizer, vocabulary size and context (positions), read in this process (the engines may
    run elsewhere); a path that does not exist is one line, not the hub's message about repository ids."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..measure.models import resolve_model
    hf_logging.set_verbosity_error()  # the terminal gets the tool's lines, not the library's loading bars
    hf_logging.disable_progress_bar()
    spec = settings.model
    if spec.startswith(("/", "./", "../", "~")) and not Path(spec).expanduser().is_dir():
        raise BadInput(f"--model {spec}: no such directory; give a local model directory, embedded:NAME, tiny:SEED "
                       f"or a hub id")
    try:
        path = resolve_model(str(Path(spec).expanduser()) if spec.startswith("~") else spec)
        config = AutoConfig.from_pretrained(path)
        limit = settings.max_model_len if settings.engine == "vllm" else None
        return AutoTokenizer.from_pretrained(path), config.vocab_size, model_context(config, limit)
    except (ValueError, OSError) as e:
        raise BadInput(f"--model {settings.model}: {str(e)[:200]}") from None


class GivenEngine:
    """An executor over an engine the caller already loaded (the API's engine=): groups run in order."""
    name = "given"
    reports_progress = True
    lease_info = None

    def __init__(self, engine):
        self.engine = engine

    def call(self, fn, *args):
        return fn(self.engine, *args)

    def map(self, fn, units, ordered: bool = True):
        for label, args in units:
            yield label, fn(self.engine, *args)

    def close(self):
        pass


def open_executor(settings: Settings, engine=None, record: bool = False):
    """Where the groups run: the given engine, one local engine, or Ray actors; a missing model, device or
    library is one line. record: what builds a local engine is recorded (for shards kept on disk)."""
    if engine is not None:
        return GivenEngine(engine)
    from ..runtime.executor import make_executor
    params = settings.params()  # a setting out of range is its own line, not the model's
    try:
        return make_executor(params, settings.invariant, settings.workers, stage="credit", forcing=True,
                             record=record)
    except EngineUnavailable as e:
        raise BadInput(str(e)) from None
    except (OSError, RuntimeError, ValueError) as e:
        raise BadInput(f"--model {settings.model}: cannot be loaded with --engine {settings.engine} on --device "
                       f"{settings.device} ({e.__class__.__name__}: {str(e)[:160]})") from None


def vocab_of(engine) -> int:
    """The vocabulary size of an engine already loaded (transformers' model config, or vLLM's)."""
    if getattr(engine, "model", None) is not None:
        return engine.model.config.vocab_size
    return engine.llm.llm_engine.model_config.get_vocab_size()


def context_of(engine) -> int | None:
    """The context (positions) of an engine already loaded."""
    if getattr(engine, "model", None) is not None:
        return model_context(engine.model.config)
    config = getattr(getattr(getattr(engine, "llm", None), "llm_engine", None), "model_config", None)
    return getattr(config, "max_model_len", None)


def describe(engine) -> dict:
    return engine.describe()


def check_seeds(rollouts, settings: Settings, path: Path) -> None:
    if settings.seeds != "replay":
        return
    for r in rollouts:
        parts = str(r.id).split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise BadInput(f"{path}:{r.line}: field 'id' {r.id!r} is not '<problem_id>:<rollout>', which --seeds "
                           f"replay needs; use --seeds hash")


def versions(grader: str) -> dict:
    """The versions a manifest records (runtime.provenance.versions), with math-verify's where it grades."""
    from importlib.metadata import version
    found = provenance.versions()
    if grader == "math":
        found["math-verify"] = version("math-verify")
    return found


def shown_settings(settings: Settings) -> dict:
    """The settings as the summary shows them: a grader given as an object by its name (copying it would copy
    what it holds, a trainer and its engine)."""
    shown = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name not in WHERE}
    if not isinstance(settings.grader, str):
        shown["grader"] = getattr(settings.grader, "__name__", type(settings.grader).__name__)
    return {**shown, "passes": list(settings.passes)}


def summarize(frame: pd.DataFrame, settings: Settings, n_rollouts: int, described: dict) -> dict:
    rows = frame.to_dict("records")
    certs = frame["certificate"].value_counts().to_dict() if len(frame) else {}
    cut, continuations = unfinished(frame, settings)
    summary = {"rollouts": n_rollouts, "pivots": len(rows),
               "floor": kernel.share_differing(rows, "replica"), "refeed": kernel.share_differing(rows, "refeed"),
               "common_pivots": len(kernel.common(rows)),
               "not_verified": int(sum(not kernel.verified(r) for r in rows)),
               "certificates": {str(k): int(v) for k, v in certs.items()},
               "passes_agree": int(frame["passes_agree"].sum()) if len(frame) else 0,
               "continuations": continuations, "continuations_cut": cut,
               "pass_map": {p: kernel.PASS_OF[p] for p in settings.passes},
               "settings": shown_settings(settings),
               "engine": described, "versions": versions(settings.grader)}
    if settings.invariant:  # invariant mode: every pass must agree bit for bit
        summary["invariant_ok"] = bool(frame["passes_agree"].all()) if len(frame) else True
    if len(frame) and set(kernel.TOOL_PASSES) <= set(settings.passes):
        summary.update(judged(frame))
    return summary


def records_of(frame: pd.DataFrame) -> pd.DataFrame:
    """Credit rows as the statistics stage's records: resume as exact1, replica as exact2, a prompt as a problem,
    exact_ok where every exact pass was verified."""
    return pd.DataFrame({"problem_id": frame["prompt"], "A_exact1": frame["A_resume"],
                         "A_exact2": frame["A_replica"], "A_refeed": frame["A_refeed"],
                         "exact_ok": [kernel.verified(r) for r in frame.to_dict("records")]})


def judged(frame: pd.DataFrame) -> dict:
    """The paper's Table 1 numbers and its two main claims on these pivots, as the statistics stage judges
    its records (unverified pivots left out)."""
    from dataclasses import asdict as fields

    from ..analysis import claims, stats
    records = records_of(frame)
    kept = stats.exclude_not_exact(records)[0]
    return {"table1": stats.table1_numbers(records),
            "claims": {"the replica floor is above zero": fields(claims.floor_above_zero(kept)),
                       "re-feed disagrees above the floor": fields(claims.excess_above_floor(kept))}}


def read_checked(batch, settings: Settings, vocab: int, context: int | None) -> tuple[str, list, dict]:
    """(what errors name, the rollouts, the kernel's inputs) of a JSONL path or a batch, every rollout checked
    against the settings and the model's context (BadInput: the first bad one)."""
    source, rollouts = read_input(batch, vocab, as_sampled=settings.forcing == "batch")
    check_seeds(rollouts, settings, source)
    check_lengths(rollouts, context, settings, source)
    return source, rollouts, {"groups": groups_of(rollouts), "path": source}


def compute_groups(settings: Settings, inputs: dict, executor, store=None, where=None, show: bool = True):
    """Every group's rows on the executor's engines (the stages' runner), reused from store where it holds
    them (each group kept there with its record of what computed it)."""
    from ..runtime.units import Lent, compute
    try:
        return compute(KERNEL, settings, inputs, lambda n: Lent(executor), store, where, "credit", show=show,
                       roots=ROOTS)
    except BadInput as e:  # from a Ray actor it carries the actor's traceback: the one line is its cause's
        raise BadInput(str(getattr(e, "cause", None) or e)) from None


def warn(line: str) -> None:
    log.warning("warning: %s", line)


def results(settings: Settings, inputs: dict, computed, n_rollouts: int, described: dict, say=warn):
    """(the rows of every group, each group's timing, the summary with the grader's counts and the warnings,
    each warning given to say)."""
    frame = KERNEL.assemble(settings, inputs, computed.done).result
    timing = [{"group": i, "rollouts": u.size, "reused": u.name not in computed.ran,
               "passes": computed.done[u.name]["timing"]} for i, u in enumerate(KERNEL.plan(settings, inputs, {}))]
    summary = summarize(frame, settings, n_rollouts, described)
    summary["grader"] = timings.grader_totals(timing)
    summary["warnings"] = warnings(frame, settings)
    for line in summary["warnings"]:
        say(line)
    return frame, timing, summary


def run(rollouts, out, settings: Settings, engine=None) -> dict:
    """The tool: check everything first (BadInput: nothing written), then compute and write, holding --out
    for this run alone. rollouts: a JSONL path or a batch (replaylib.credit.batches); engine: one already
    loaded (its settings must be these); otherwise the executor of settings starts them."""
    from ..runtime.shards import ShardStore
    from .report import report_html
    if not isinstance(settings.grader, str):  # a function: run and recorded as MODULE:FUNCTION
        settings = replace(settings, grader=graders.importable_name(settings.grader))
    settings.check()
    out = check_out(out)
    if engine is not None:
        tok, vocab, context = engine.tok, vocab_of(engine), context_of(engine)
    else:
        tok, vocab, context = model_files(settings)
    def decode(ids) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    grade = graders.for_settings(settings, decode)
    path, rollouts, inputs = read_checked(rollouts, settings, vocab, context)
    first = rollouts[0]
    try:  # the grader on a real text before anything is written
        grade(decode(first.response_ids), first)
    except graders.GraderFailed as e:
        raise BadInput(f"{path}:{first.line}: field 'ground_truth': {e}") from None
    executor = open_executor(settings, engine, record=True)  # a model, device or library missing: one line
    with holding(out):
        try:
            described = executor.call(describe)
            # what a shard was computed with: the settings and the engine as it describes itself (model path,
            # dtype, kernels); each shard also records the code and files it used (its grader's among them)
            key = hashlib.sha256(json.dumps([settings.key(), described], sort_keys=True).encode()).hexdigest()
            store = ShardStore(out / "shards", key)
            if not store.fresh:
                store.reset()
            units = KERNEL.plan(settings, inputs, {})
            todo = [i for i, u in enumerate(units) if store.load(u) is None]
            log.info(plan_line(inputs["groups"], todo, settings))
            if todo:  # what it will cost, from a short calibration on the engine
                measured = executor.call(calibrate, settings, inputs["groups"][todo[0]])
                log.info(estimate_line(inputs["groups"], todo, settings, measured))
            computed = compute_groups(settings, inputs, executor, store, out / "shards")
        finally:
            executor.close()
        frame, timing, summary = results(settings, inputs, computed, len(rollouts), described)
        atomic_save(out / "credit.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
        atomic_write_json(out / "summary.json", summary)
        atomic_write_json(out / "timing.json", timings.throughput(timing, settings))
        page = report_html(frame, summary, {str(r.id): r for r in rollouts}, decode)
        atomic_write_bytes(out / "report.html", page.encode())
    return summary
