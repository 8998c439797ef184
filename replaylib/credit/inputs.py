"""Reading rollouts: one JSON object a line, with this tool's field names or those of verl, TRL and
OpenRLHF dumps (docs/credit.md). Every problem is one line naming the file, the line and the field."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

# field -> the names it is read from, in order (the first present wins)
ALIASES = {
    "id": ("id",),  # verl's uid and index name a prompt, shared by its n responses: no alias
    "prompt_ids": ("prompt_ids", "prompts", "prompt_token_ids"),
    "response_ids": ("response_ids", "completion_ids", "responses", "output_token_ids"),
    "ground_truth": ("ground_truth", "reward_model.ground_truth", "label", "answer"),
    "data_source": ("data_source",),
    "top_logprobs": ("top_logprobs",),
    "positions": ("positions",),
}


class BadInput(ValueError):
    """One line: the file, the line, the field, the fix."""


@dataclass
class Rollout:
    line: int
    id: str | int
    prompt_ids: list[int]
    response_ids: list[int]
    ground_truth: str
    data_source: str | None
    top_logprobs: list | None
    positions: list[int] | None
    digest: str  # sha256 of the line's fields as read: a shard is reused only for the same rollout


def _lookup(obj: dict, name: str):
    for part in name.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _field(obj: dict, field: str):
    for name in ALIASES[field]:
        value = _lookup(obj, name)
        if value is not None:
            return value
    return None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _token_ids(value, where: str, name: str, vocab: int) -> list[int]:
    if not isinstance(value, list) or not value or not all(_is_int(t) for t in value):
        raise BadInput(f"{where}: field '{name}' must be a non-empty list of token ids (integers), not text; "
                       f"tokenize with the model's tokenizer")
    bad = next((t for t in value if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadInput(f"{where}: field '{name}' holds token id {bad}, outside the model's vocabulary "
                       f"[0, {vocab}); use the ids of the model given by --model")
    return value


def _top_logprobs(value, where: str, n: int, vocab: int) -> list:
    fix = "give per response position the decode-time top-k as [[token_id, logprob], ...] (at least 2)"
    if not isinstance(value, list) or len(value) != n:
        raise BadInput(f"{where}: field 'top_logprobs' must have one entry per response token ({n}); {fix}")
    for i, step in enumerate(value):
        if (not isinstance(step, list) or len(step) < 2
                or not all(isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and 0 <= p[0] < vocab
                           and isinstance(p[1], (int, float)) and not isinstance(p[1], bool) for p in step)):
            raise BadInput(f"{where}: field 'top_logprobs' at position {i} is not a top-k of in-vocabulary "
                           f"[token_id, logprob] pairs; {fix}")
    return value


def _unpadded(obj: dict, prompt, response, where: str):
    """Padded batches as dumped: verl's attention_mask over prompts + responses, TRL's prompt_mask and
    completion_mask; the tokens where a mask is 0 are padding and are dropped."""
    masks = []
    if obj.get("attention_mask") is not None and isinstance(prompt, list) and isinstance(response, list):
        mask = obj["attention_mask"]
        if not isinstance(mask, list) or len(mask) != len(prompt) + len(response):
            raise BadInput(f"{where}: field 'attention_mask' must have one 0 or 1 per prompt and response token "
                           f"({len(prompt) + len(response)})")
        masks = [("attention_mask", mask[:len(prompt)], mask[len(prompt):])]
    elif obj.get("prompt_mask") is not None or obj.get("completion_mask") is not None:
        masks = [("prompt_mask", obj.get("prompt_mask"), obj.get("completion_mask"))]
    for name, pm, rm in masks:
        kept = []
        for ids, m, part in ((prompt, pm, "prompt"), (response, rm, "response")):
            if m is None:
                kept.append(ids)
                continue
            if not isinstance(m, list) or not isinstance(ids, list) or len(m) != len(ids) or \
                    not all(x in (0, 1) for x in m):
                raise BadInput(f"{where}: field '{name}' does not match the {part}'s tokens one 0 or 1 each")
            kept.append([t for t, keep in zip(ids, m) if keep])
        prompt, response = kept
    return prompt, response


def parse_line(text: str, where: str, vocab: int) -> Rollout:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{where}: not a JSON object ({e.msg}); write one rollout per line") from None
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: not a JSON object; write one rollout per line")
    rid = _field(obj, "id")
    if not (_is_int(rid) or (isinstance(rid, str) and rid)):
        raise BadInput(f"{where}: field 'id' is missing or not a string or integer; give each rollout an id")
    prompt, response = _unpadded(obj, _field(obj, "prompt_ids"), _field(obj, "response_ids"), where)
    prompt = _token_ids(prompt, where, "prompt_ids", vocab)
    response = _token_ids(response, where, "response_ids", vocab)
    gold = _field(obj, "ground_truth")
    if not isinstance(gold, (str, int, float)) or isinstance(gold, bool) or gold == "":
        raise BadInput(f"{where}: field 'ground_truth' is missing or not a string; give the reference answer")
    source = _field(obj, "data_source")
    if source is not None and not isinstance(source, str):
        raise BadInput(f"{where}: field 'data_source' must be a string")
    top = _field(obj, "top_logprobs")
    top = None if top is None else _top_logprobs(top, where, len(response), vocab)
    positions = _field(obj, "positions")
    if positions is not None:
        if not isinstance(positions, list) or not all(_is_int(p) for p in positions):
            raise BadInput(f"{where}: field 'positions' must be a list of response positions (integers)")
        bad = next((p for p in positions if not 0 <= p < len(response)), None)
        if bad is not None:
            raise BadInput(f"{where}: field 'positions' holds {bad}, past the response ({len(response)} tokens); "
                           f"give positions in [0, {len(response)})")
        positions = sorted(set(positions))
    fields = [rid, prompt, response, str(gold), source, top, positions]
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return Rollout(0, rid, prompt, response, str(gold), source, top, positions, digest)


def read_rollouts(path: Path, vocab: int) -> list[Rollout]:
    """Every rollout of a JSONL file (blank lines skipped), or BadInput for the first bad line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot be read ({e.__class__.__name__}); give a JSONL file of rollouts") from None
    rollouts, seen = [], {}
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{path}:{n}"
        r = parse_line(text, where, vocab)
        r.line = n
        if str(r.id) in seen:
            raise BadInput(f"{where}: field 'id' {r.id!r} repeats line {seen[str(r.id)]}; ids must be unique")
        seen[str(r.id)] = n
        rollouts.append(r)
    if not rollouts:
        raise BadInput(f"{path}: no rollout in the file; write one JSON object per line")
    return rollouts
