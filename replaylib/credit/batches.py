"""A trainer's batch as the credit tool's rollouts, in memory (no file): pure functions, no model.

A batch is a list of rollout dicts, or a mapping of per-row columns (torch tensors, numpy arrays or lists,
first dimension the batch), or a verl ``DataProto`` (``.batch``, a TensorDict of tensors, and
``.non_tensor_batch``, a dict of numpy object arrays). Each row becomes one rollout dict in the tool's or a
trainer's field names (docs/credit.md), read as a JSONL line is, padding dropped by its masks: TRL's
``prompt_ids/prompt_mask/completion_ids/completion_mask`` (prompts left-padded, completions right-padded),
verl's ``prompts/responses/attention_mask`` with ``data_source``, ``reward_model`` (its ``ground_truth``)
and ``extra_info``. Errors name the row as ``batch:N`` (N from 1)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .inputs import ALIASES, BadInput, Rollout, SampledBatch, _field, collect, read_rollouts

# verl's DataProto tensors that the tool reads; its others (input_ids, position_ids, old_log_probs, ...) are
# derived from these or the trainer's own, and are left out
VERL_TENSORS = ("prompts", "responses", "attention_mask", "response_mask", "rollout_log_probs")


JSON_SCALARS = (int, float, str, bool, type(None))  # plain already (exactly these types: numpy's subclass float)


def plain(value):
    """A value as JSON data: tensors and arrays as (nested) lists, numpy scalars as Python numbers,
    mappings and sequences element by element."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        numbers = str(getattr(value, "dtype", "object")) != "object"
        value = value.tolist()
        if numbers:  # a tensor's or numeric array's: nested lists of Python numbers already
            return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in JSON_SCALARS else plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes, int, float, bool)):
        return value.item()
    return value


def _check_token_columns(columns: dict, verl: bool) -> None:
    """Token ids as rows x tokens, with the masks that tell a padded batch's padding from its tokens: a 2-D
    tensor or array has rows of one width, so without its mask its padding would be read as tokens."""
    shapes = {n: getattr(columns.get(n), "shape", None) for n in ALIASES["prompt_ids"] + ALIASES["response_ids"]}
    for name, shape in shapes.items():  # (a 1-D array of objects holds a list of ids per row)
        if shape is not None and len(shape) == 1 and str(getattr(columns[name], "dtype", "")) != "object":
            raise BadInput(f"batch:1: column '{name}' is 1-D ({shape[0]} token ids in all), not rows x tokens; give "
                           f"a 2-D tensor, one row per rollout (ids[None] for a single row), with its mask")
    for names, own_mask in ((ALIASES["prompt_ids"], "prompt_mask"), (ALIASES["response_ids"], "completion_mask")):
        for name in names:
            if shapes[name] is not None and len(shapes[name]) == 2 and "attention_mask" not in columns \
                    and (verl or own_mask not in columns):
                mask, over = ("attention_mask", "prompts + responses") if verl else (own_mask, name)
                raise BadInput(f"batch: column '{name}' is a padded 2-D batch without '{mask}', so its padding would "
                               f"be read as tokens; give '{mask}' (1 per token, 0 per pad, over {over})")


def _rows_of(columns: dict, source: str) -> list[dict]:
    """Per-row dicts of per-row columns; a batch-level scalar (a 0-d tensor, a number) is left out."""
    lengths = {}
    for name, value in columns.items():
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) == 0 or isinstance(value, (int, float, str, bool)) or value is None:
            continue
        lengths[name] = shape[0] if shape is not None else len(value)
    if not lengths:
        raise BadInput(f"{source}: no per-row column; give prompt and response token ids per row")
    size = max(lengths.values())
    wrong = next((n for n, k in lengths.items() if k != size), None)
    if wrong is not None:
        raise BadInput(f"{source}: column '{wrong}' has {lengths[wrong]} rows where others have {size}; give every "
                       f"column one entry per row")
    whole = {name: plain(columns[name]) for name in lengths}  # a column at once: one copy off the device
    return [{name: whole[name][i] for name in lengths} for i in range(size)]


def _with_ids(rows: list[dict]) -> list[dict]:
    """Rows without an id get one: verl's uid with the response's number within it ('<uid>-<n>'), or the
    row's index."""
    seen: dict = {}
    for i, row in enumerate(rows):
        if row.get("id") is None:
            uid = row.get("uid")
            if uid is None:
                row["id"] = str(i)
            else:
                seen[uid] = seen.get(uid, -1) + 1
                row["id"] = f"{uid}-{seen[uid]}"
    return rows


def rollout_dicts(batch) -> list[dict]:
    """The rollout dicts of a batch (list of dicts, mapping of columns, or a DataProto-shaped object)."""
    if hasattr(batch, "batch") and hasattr(batch, "non_tensor_batch"):  # verl's DataProto
        tensors = batch.batch
        if tensors is None or not hasattr(tensors, "keys"):
            raise BadInput("batch: a DataProto without tensors; give one with prompts, responses and attention_mask")
        columns = {k: tensors[k] for k in VERL_TENSORS if k in tensors.keys()}
        columns.update(dict(batch.non_tensor_batch or {}))
        _check_token_columns(columns, verl=True)
        return _with_ids(_rows_of(columns, "batch"))
    if hasattr(batch, "keys") and hasattr(batch, "__getitem__"):  # a mapping of columns (TRL's batch)
        columns = {k: batch[k] for k in batch.keys()}
        _check_token_columns(columns, verl=False)
        return _with_ids(_rows_of(columns, "batch"))
    if isinstance(batch, (list, tuple)):
        return [plain(row) if isinstance(row, dict) else row for row in batch]
    raise BadInput(f"batch: a {type(batch).__name__}; give a JSONL path, a list of rollout dicts, a mapping of "
                   f"per-row columns (TRL's prompt_ids/completion_ids with their masks) or a verl DataProto")


def sampled_together(rows: list[dict], rollouts: list[Rollout]) -> None:
    """Give every rollout the batch its rows form, as a sampler decoded them (forcing="batch"): the rows in
    order, their prompts left-padded to the widest prompt as given (a padded batch's width). A prompt whose
    mask pads it elsewhere than on the left was not sampled so."""
    widths = []
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise BadInput(f"batch:{n}: a {type(row).__name__}; forcing 'batch' reads the sampler's rows as dicts or "
                           f"columns (TRL's prompt_ids/prompt_mask/completion_ids/completion_mask)")
        prompt = _field(row, "prompt_ids", f"batch:{n}")
        mask = row.get("prompt_mask")
        if mask is None and row.get("attention_mask") is not None:  # verl's: over prompt + response
            mask = row["attention_mask"][:len(prompt)]
        if mask is not None and list(mask) != sorted(mask):
            raise BadInput(f"batch:{n}: field 'prompt_mask' pads the prompt elsewhere than on the left; forcing "
                           f"'batch' rebuilds a left-padded batch, as generate takes it: give the sampler's "
                           f"left-padded prompts, or forcing 'groups'")
        widths.append(len(prompt))
    prompts, responses = [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts]
    digest = hashlib.sha256(json.dumps([max(widths), prompts, responses]).encode()).hexdigest()
    batch = SampledBatch(prompts, responses, max(widths), digest)
    for i, r in enumerate(rollouts):  # a rollout forced in another batch is another shard
        r.batch, r.batch_row = batch, i
        r.digest = hashlib.sha256(f"{r.digest}|{digest}|{i}".encode()).hexdigest()


def read_input(source, vocab: int, as_sampled: bool = False) -> tuple[str, list[Rollout]]:
    """(what errors name, the rollouts) of a JSONL path, or of a batch given in Python, its rows named
    batch:N (N from 1); nothing is written. as_sampled: the batch's rows are one batch of the sampler's
    (sampled_together)."""
    if isinstance(source, (str, os.PathLike)):
        if as_sampled:
            raise BadInput(f"{source}: forcing 'batch' takes the sampler's batch given in Python (TRL's prompt_ids "
                           f"and prompt_mask, ...), not a file; use forcing 'groups' for a file")
        return str(source), read_rollouts(Path(source), vocab)
    rows = rollout_dicts(source)
    rollouts = collect(enumerate(rows, 1), "batch", vocab)
    if as_sampled:
        sampled_together(rows, rollouts)
    return "batch", rollouts
