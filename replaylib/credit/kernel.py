"""The credit tool's computation, as a stage's is (replaylib.measure.units): its plan (one unit per group of
rollouts of one prompt, named by their contents), the unit that computes a group (forced decoding, pivots,
passes, certificates: ``group_rows``) and the assembly of every group's rows. The runner
(replaylib.runtime.units) runs it with the tool's shards, keyed by its settings and the engine, each with the
record of what computed it (the code that ran, the user's grader and what it imports and reads:
replaylib.core.recording), so an edit of what computes a row recomputes the shards it made."""
from __future__ import annotations

import hashlib
import inspect
import logging
import time
import weakref

import pandas as pd

from ..measure import credit as kernel
from ..measure.credit_certificate import NO_NUMBERS, Observer, certificate
from ..measure.state import ResidentState
from ..measure.units import Kernel, Outputs, Unit
from . import graders
from .inputs import BadInput

TOP_K = 5  # top-k the forced decode records per step (margins and alternatives when none are recorded)
# entries the forced decode records beyond the widest recorded top-k: where entries tie at a top-k's lowest value
# (bfloat16 logits often do), the sampler's top-k and the forced one may each hold a different one of them
TIE_ROOM = 5
ROOTS = (("replaylib.credit.kernel", "KERNEL"),)  # what a group's record holds without running it
log = logging.getLogger("replaylib")


def prompt_digest(prompt_ids: list[int]) -> str:
    """A short name of a prompt: the clustering unit of the claims' statistics (a problem)."""
    import json
    return hashlib.sha256(json.dumps([int(t) for t in prompt_ids]).encode()).hexdigest()[:12]


def groups_of(rollouts: list) -> list[list]:
    """Rollouts of one prompt together (in the file's order), as a sampler batches a prompt's n responses."""
    found: dict = {}
    for r in rollouts:
        found.setdefault(tuple(r.prompt_ids), []).append(r)
    return list(found.values())


def plan(settings, inputs, done: dict) -> list[Unit]:
    """One unit per group, named by its rollouts' contents (a shard is reused only for the same rollouts)."""
    units = []
    for i, group in enumerate(inputs["groups"]):
        name = hashlib.sha256("|".join(r.digest for r in group).encode()).hexdigest()[:24]
        units.append(Unit(f"group_{name}", f"group {i}", (group, inputs["path"]), size=len(group)))
    return units


def observes(engine) -> bool:
    """Whether the engine's forced decoding hands its logits to an observer (transformers' does; vLLM's
    returns its top-k only)."""
    return "observe" in inspect.signature(engine.force_trunks).parameters


# the last batch forced (forcing "batch"), by the batch it forced: its groups are computed one after another
FORCED = weakref.WeakKeyDictionary()


def batch_rows(engine, group: list, width: int, observe: dict):
    """A group's trunks and decode-time states out of its whole sampled batch forced as the sampler batched it
    (the batch forced once for all its groups on this engine)."""
    batch = group[0].batch
    rows = [r.batch_row for r in group]
    key = (id(engine), width, getattr(observe.get("observe"), "temperature", None))
    if engine.name == "vllm":  # the blocks live in its prefix cache: each group's state forces the batch again
        from ..measure import vllm_batch_forcing as forcing

        def forced_whole():
            FORCED[batch] = (key, *forcing.force_batch(engine, batch.prompts, batch.responses, width), engine.epoch)

        if FORCED.get(batch, (None,))[0] != key:
            FORCED.clear()
            if sampler_blocks_resident(batch, group):  # its first group resumes them, nothing forced
                FORCED[batch] = (key, None, 0, engine.epoch)
            else:
                forced_whole()
        _, trunks, preempted, epoch = FORCED[batch]
        group_of_batch = forcing.GroupOfBatch(batch.prompts, batch.responses, rows, width)
        if trunks is None:
            sampled = [as_sampled(r, i) for i, r in enumerate(group)]
            state = forcing.sampled_state(engine, group_of_batch, sampled, epoch)
            if state is not None:
                return sampled, state
            log.info("credit: the batch is forced as sampled (some of the blocks its sampling wrote were evicted)")
            forced_whole()
            _, trunks, preempted, epoch = FORCED[batch]
        return [trunks[b] for b in rows], forcing.group_state(engine, group_of_batch, trunks, preempted, epoch)
    from ..measure.hf_batch_forcing import force_batch
    if FORCED.get(batch, (None,))[0] != key:
        FORCED.clear()  # one batch's states held at a time
        FORCED[batch] = (key, *force_batch(engine, batch.prompts, batch.responses, batch.width, width, **observe))
    _, trunks, state = FORCED[batch]
    return [trunks[b] for b in rows], ResidentState({i: state[b] for i, b in enumerate(rows)},
                                                    {i: state.expected[b] for i, b in enumerate(rows)})


def sampler_blocks_resident(batch, group: list, say: bool = True) -> bool:
    """Whether the blocks the sampler wrote while decoding this batch are in the engine's prefix cache as it wrote
    them (the caller's ``resident``: None while they are, else why not), with the top-k it recorded of every step
    (the pivots' margins, and what forcing them again is compared with)."""
    check = getattr(batch, "resident", None)
    if check is None or any(r.top_logprobs is None or r.logprobs is None for r in group):
        return False
    why = check()
    if why is not None and say:
        log.info("credit: the batch is forced as sampled (%s)", why)
    return why is None


def as_sampled(rollout, i: int):
    """A rollout as its sampler decoded it, the group's i-th trunk: what it recorded of each step."""
    from ..measure.engine import Trunk
    top = rollout.top_logprobs
    return Trunk(0, i, 0, list(rollout.prompt_ids), list(rollout.response_ids), [[int(t) for t, _ in s] for s in top],
                 [[float(lp) for _, lp in s] for s in top], "length", token_logprobs=list(rollout.logprobs))


SAMPLER_BLOCKS = "sampler's blocks"  # the certificate of a rollout never forced: its passes resumed what it sampled


def group_certificate(rollout, i: int, trunk, state) -> dict:
    """A rollout's certificate: its recorded decode against its forced one; a group on the sampler's own blocks
    is compared with the batch's forcing since (a pass reset the cache), if there was one."""
    if getattr(state, "from_sampler", False):
        forced = state.batch.last
        if forced is None:
            return {"certificate": SAMPLER_BLOCKS, **NO_NUMBERS}
        trunk = forced[i]
    return certificate(rollout.top_logprobs, rollout.logprobs, trunk)  # the whole response: one per rollout


def group_rows(engine, settings, group: list, path: str) -> dict:
    """One group's rows: forced decoding, pivots, passes, certificates (runs where the engine is); the
    seconds and tokens of the forced decoding and of each pass, and the grader's counts."""
    grade = graders.for_settings(settings, engine.decode)
    # wider than any recorded top-k, so that every recorded entry has its counterpart, ties at its lowest included
    width = max([TOP_K, *(len(step) for r in group for step in r.top_logprobs or [])]) + TIE_ROOM
    timing = {}
    started = time.perf_counter()
    # where the engine hands out its logits, what the certificates compare with is kept at every step
    observe = {"observe": Observer(width, settings.logprobs_temperature)} if observes(engine) else {}
    if group[0].batch is not None:
        trunks, state = batch_rows(engine, group, width, observe)
    else:
        trunks, state = engine.force_trunks(group[0].prompt_ids, [r.response_ids for r in group], width, **observe)
    timing["forced decoding"] = {"seconds": time.perf_counter() - started,
                                 "tokens": sum(len(r.response_ids) for r in group)}
    pivots, seeds = [], []
    for r, trunk in zip(group, trunks):
        forced_topk = [[[t, lp] for t, lp in zip(ids, lps)] for ids, lps in zip(trunk.topk_ids, trunk.topk_logprobs)]
        topk = r.top_logprobs if r.top_logprobs is not None else forced_topk
        pivots.append(kernel.select_pivots(r.response_ids, topk, settings.margin, settings.max_pivots_per_rollout,
                                           engine.special_ids, r.positions))
        seeds.append([kernel.seeds_for(r.id, len(r.prompt_ids), p["position"], settings.k, settings.seed,
                                       settings.seeds) for p in pivots[-1]])
    if not any(pivots):
        return {"rows": pd.DataFrame(), "timing": timing}

    def grade_text(i: int, text: str) -> int:
        try:
            return grade(text, group[i])
        except graders.GraderFailed as e:
            raise BadInput(f"{path}:{group[i].line}: field 'ground_truth': {e}") from None

    rows = kernel.credit_group(engine, group[0].prompt_ids, [r.response_ids for r in group], pivots, seeds,
                               settings.passes, settings.pass_settings(), state, grade_text, timing)
    timing["grader"] = dict(grade.stats)
    out = []
    for i, (r, trunk, found, rollout_rows) in enumerate(zip(group, trunks, pivots, rows)):
        cert = group_certificate(r, i, trunk, state)
        for p, row in zip(found, rollout_rows):
            out.append({"id": str(r.id), "line": r.line, "prompt": prompt_digest(r.prompt_ids), **p,
                        "margin_source": "recorded" if r.top_logprobs else "forced", "k": settings.k, **row,
                        **cert})
    return {"rows": pd.DataFrame(out), "timing": timing}


def shard_path(unit: Unit, part: str, value) -> str:
    return f"{unit.name}.{part}" + (".parquet" if part == "rows" else ".json")


def assemble(settings, inputs, done: dict) -> Outputs:
    """Every group's rows, in the file's order (line, then position)."""
    parts = [done[u.name]["rows"] for u in plan(settings, inputs, done) if len(done[u.name]["rows"])]
    frame = pd.concat(parts, ignore_index=True).sort_values(["line", "position"], kind="stable") \
        .reset_index(drop=True) if parts else pd.DataFrame()
    return Outputs({"credit.parquet": frame}, result=frame)


KERNEL = Kernel(plan=plan, unit=group_rows, assemble=assemble, shard=shard_path, progress=("credit", "rollout"))

