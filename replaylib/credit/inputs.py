"""Reading rollouts: one JSON object a line, with this tool's field names or those of verl, TRL and
OpenRLHF dumps (docs/credit.md). Every problem is one line naming the file, the line and the field."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import stat
from dataclasses import dataclass
from pathlib import Path

from ..core.text import short

# field -> the names it is read from, in order (the first present wins)
ALIASES = {
    "id": ("id",),  # verl's uid and index name a prompt, shared by its n responses: no alias
    "prompt_ids": ("prompt_ids", "prompts", "prompt_token_ids"),
    "response_ids": ("response_ids", "completion_ids", "responses", "output_token_ids"),
    "ground_truth": ("ground_truth", "reward_model.ground_truth", "label", "answer"),
    "data_source": ("data_source",),
    "extra_info": ("extra_info",),
    "top_logprobs": ("top_logprobs",),
    # the sampler's logprob of each response token (verl's rollout_log_probs, TRL's sampling_per_token_logps)
    "logprobs": ("logprobs", "rollout_log_probs", "sampling_per_token_logps"),
    "positions": ("positions",),
}
MASKS = ("attention_mask", "prompt_mask", "completion_mask", "response_mask")
# the line's fields the tool reads itself; the others are columns, handed to TRL-style graders
READ = {name.split(".")[0] for names in ALIASES.values() for name in names} | set(MASKS)


# a rollout at the runner's bounds (32768 prompt and 32768 response tokens, a top-20 per position) is under
# 30 MB of JSON; the rollouts of a file are held in memory (parsed, several times their JSON's size)
MAX_LINE_BYTES = 64 * 2**20
MAX_FILE_BYTES = 2**30


class BadInput(ValueError):
    """One line: the file, the line, the field, the fix."""


@dataclass(eq=False)
class SampledBatch:
    """The padded batch a sampler decoded rollouts in, for forcing them as it batched them: every row's prompt
    and response (padding dropped) in the batch's order, and the width its prompts were left-padded to (its
    padding included, pad_to_multiple_of's too). One object per batch read; its rollouts share it."""
    prompts: list
    responses: list
    width: int
    digest: str
    # Estimator's resident=: a callable saying None while the blocks the sampler wrote are in the engine's prefix
    # cache as it wrote them, else why not; without one the batch is forced
    resident: object = None


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
    logprobs: list[float] | None = None  # per response position, the sampled token's (at --logprobs-temperature)
    extra_info: object = None  # verl's extra_info, handed to its compute_score as given
    columns: dict | None = None  # the line's other fields (a dataset's columns), for TRL-style graders
    # the name the ground truth was read from (TRL-style graders get it under that name)
    ground_truth_name: str = dataclasses.field(default="ground_truth", compare=False)
    # forcing="batch": the batch the rollout was sampled in, and its row there
    batch: SampledBatch | None = dataclasses.field(default=None, compare=False)
    batch_row: int = -1


def _lookup(obj: dict, name: str):
    for part in name.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _is_text(value) -> bool:
    """Text where token ids would be: a string, or a list holding anything but integers (chat messages)."""
    return isinstance(value, str) or (isinstance(value, list) and any(not _is_int(x) for x in value))


def _field(obj: dict, field: str, where: str):
    return _named_field(obj, field, where)[1]


def _named_field(obj: dict, field: str, where: str) -> tuple[str | None, object]:
    """(name, value) of the field under the first of its names present; two names present with different
    values are refused (which one a dump meant is not ours to guess). For token ids a name holding text
    (TRL's prompts column beside its prompt_ids) is not a second value."""
    found = [(name, value) for name in ALIASES[field] if (value := _lookup(obj, name)) is not None]
    if field in ("prompt_ids", "response_ids") and any(not _is_text(v) for _, v in found):
        found = [(name, value) for name, value in found if not _is_text(value)]
    for name, value in found[1:]:
        if _canonical(value) != _canonical(found[0][1]):
            raise BadInput(f"{where}: fields '{found[0][0]}' and '{name}' both give the {field.replace('_', ' ')} and "
                           f"differ; keep one of them")
    return found[0] if found else (None, None)


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, (str, int, float)) else str(value)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _token_ids(value, where: str, name: str, vocab: int) -> list[int]:
    if not isinstance(value, list) or not value or not all(_is_int(t) for t in value):
        raise BadInput(f"{where}: field '{name}' must be a non-empty list of token ids (integers), not text; "
                       f"tokenize with the model's tokenizer")
    bad = next((t for t in value if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadInput(f"{where}: field '{name}' holds token id {short(bad)}, outside the model's vocabulary "
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
        bad = next((p[1] for p in step if not math.isfinite(p[1])), None)
        if bad is not None:
            raise BadInput(f"{where}: field 'top_logprobs' at position {i} holds logprob {bad}; every logprob must be "
                           f"a finite number (a NaN or infinity is no record of a decode)")
    return value


def _logprobs(value, where: str, name: str, n: int) -> list[float]:
    if (not isinstance(value, list) or len(value) != n
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
        raise BadInput(f"{where}: field '{name}' must hold one logprob (a number) per response token ({n}): the "
                       f"sampled token's, at the temperature it was sampled at (--logprobs-temperature)")
    bad = next((x for x in value if not math.isfinite(x)), None)
    if bad is not None:
        raise BadInput(f"{where}: field '{name}' holds logprob {bad}; every logprob must be a finite number")
    return [float(x) for x in value]


def _unpadded(obj: dict, prompt, response, where: str, per_token=None):
    """Padded batches as dumped: verl's attention_mask over prompts + responses, TRL's prompt_mask and
    completion_mask; the tokens where a mask is 0 are padding and are dropped, and so are the per-token
    logprobs (per_token, response-aligned) at those positions."""
    if per_token is not None and isinstance(response, list) and isinstance(per_token, list) \
            and len(per_token) == len(response):
        response = [(t, lp) for t, lp in zip(response, per_token)]
        prompt, pairs = _unpadded(obj, prompt, response, where)
        return prompt, [t for t, _ in pairs], [lp for _, lp in pairs]
    masks = []
    if obj.get("attention_mask") is not None and isinstance(prompt, list) and isinstance(response, list):
        mask = obj["attention_mask"]
        if not isinstance(mask, list) or len(mask) != len(prompt) + len(response):
            raise BadInput(f"{where}: field 'attention_mask' must have one 0 or 1 per prompt and response token "
                           f"({len(prompt) + len(response)})")
        masks = [(("attention_mask", "attention_mask"), mask[:len(prompt)], mask[len(prompt):])]
    elif obj.get("prompt_mask") is not None or obj.get("completion_mask") is not None:
        masks = [(("prompt_mask", "completion_mask"), obj.get("prompt_mask"), obj.get("completion_mask"))]
    for names, pm, rm in masks:
        kept = []
        for ids, m, part, name in ((prompt, pm, "prompt", names[0]), (response, rm, "response", names[1])):
            if m is None:
                kept.append(ids)
                continue
            if not isinstance(m, list) or not isinstance(ids, list) or len(m) != len(ids) or \
                    not all(x in (0, 1) for x in m):
                raise BadInput(f"{where}: field '{name}' does not match the {part}'s tokens one 0 or 1 each")
            if ids and not any(m):
                raise BadInput(f"{where}: field '{name}' is 0 at every one of the {part}'s {len(ids)} tokens, leaving "
                               f"no {part}; leave the rollout out or fix its mask")
            kept.append([t for t, keep in zip(ids, m) if keep])
        prompt, response = kept
    return (prompt, response) if per_token is None else (prompt, response, per_token)


def _loads(text: str, where: str):
    """json.loads with every way it can fail as one line (a number of more than 4300 digits, nesting deeper
    than the interpreter's recursion limit, malformed text)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{where}: not a JSON object ({e.msg}); write one rollout per line") from None
    except ValueError as e:
        raise BadInput(f"{where}: cannot be read as JSON ({short(str(e))}); write one rollout per line") from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested too deeply to read; a rollout is a flat object of lists and "
                       f"numbers") from None


def _check_text(obj: dict, where: str) -> None:
    """Every string of the line can be written as UTF-8 (a lone surrogate, written as \\ud800, cannot)."""
    for key, value in obj.items():
        try:
            json.dumps([key, value], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"{where}: field {short(key)} holds a string that is not valid Unicode (a lone surrogate "
                           f"such as \\ud800); fix the text") from None
        except RecursionError:
            raise BadInput(f"{where}: field {short(key)} is nested too deeply; a rollout is a flat object of lists "
                           f"and numbers") from None
        except (TypeError, ValueError) as e:
            raise BadInput(f"{where}: field {short(key)} is not JSON data ({short(str(e))}); give lists, numbers and "
                           f"strings") from None


def parse_line(text: str, where: str, vocab: int) -> Rollout:
    return parse_record(_loads(text, where), where, vocab)


def parse_record(obj, where: str, vocab: int) -> Rollout:
    """One rollout from its JSON object (a line of the file, or a dict given in Python)."""
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: not a JSON object; write one rollout per line")
    _check_text(obj, where)
    rid = _field(obj, "id", where)
    if not (_is_int(rid) or (isinstance(rid, str) and rid)):
        raise BadInput(f"{where}: field 'id' is missing or not a string or integer; give each rollout an id")
    lp_name, logprobs = _named_field(obj, "logprobs", where)
    prompt, response, *rest = _unpadded(obj, _field(obj, "prompt_ids", where), _field(obj, "response_ids", where),
                                        where, logprobs)
    prompt = _token_ids(prompt, where, "prompt_ids", vocab)
    response = _token_ids(response, where, "response_ids", vocab)
    logprobs = None if logprobs is None else _logprobs(rest[0] if rest else logprobs, where, lp_name, len(response))
    gold_name, gold = _named_field(obj, "ground_truth", where)
    if not isinstance(gold, (str, int, float)) or isinstance(gold, bool) or gold == "":
        raise BadInput(f"{where}: field 'ground_truth' is missing or not a string; give the reference answer")
    if isinstance(gold, float) and not math.isfinite(gold):
        raise BadInput(f"{where}: field 'ground_truth' is {gold}; give the reference answer (a string, or a finite "
                       f"number)")
    source = _field(obj, "data_source", where)
    if source is not None and not isinstance(source, str):
        raise BadInput(f"{where}: field 'data_source' must be a string")
    top = _field(obj, "top_logprobs", where)
    top = None if top is None else _top_logprobs(top, where, len(response), vocab)
    positions = _field(obj, "positions", where)
    if positions is not None:
        if not isinstance(positions, list) or not all(_is_int(p) for p in positions):
            raise BadInput(f"{where}: field 'positions' must be a list of response positions (integers)")
        bad = next((p for p in positions if not 0 <= p < len(response)), None)
        if bad is not None:
            raise BadInput(f"{where}: field 'positions' holds {bad}, past the response ({len(response)} tokens); "
                           f"give positions in [0, {len(response)})")
        positions = sorted(set(positions))
    extra_info = _field(obj, "extra_info", where)
    columns = {k: v for k, v in obj.items() if k not in READ}
    fields = [rid, prompt, response, str(gold), source, top, positions]
    if logprobs is not None or extra_info is not None or columns:  # (a plain rollout keeps its digest)
        fields += [logprobs, extra_info, columns]
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return Rollout(0, rid, prompt, response, str(gold), source, top, positions, digest, logprobs, extra_info,
                   columns, (gold_name or "ground_truth").split(".")[-1])


def check_file(path: Path) -> None:
    """A rollouts file that can be read within the bounds: a regular file (or a pipe) of at most MAX_FILE_BYTES;
    a device such as /dev/zero never ends."""
    try:
        st = Path(path).stat()
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror or e}); give a JSONL file of rollouts") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise BadInput(f"{path}: not a regular file; give a JSONL file of rollouts")
    if st.st_size > MAX_FILE_BYTES:
        raise BadInput(f"{path}: {st.st_size >> 20} MiB, more than the {MAX_FILE_BYTES >> 20} MiB the tool reads at "
                       f"once (every rollout is held in memory); split it into several files and runs")


def _lines(path: Path):
    """(line number, text) of a file, each line and the whole within the bounds."""
    total = 0
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
                total += len(raw)
                if len(raw) > MAX_LINE_BYTES:
                    raise BadInput(f"{path}:{n}: longer than {MAX_LINE_BYTES >> 20} MiB, more than a rollout at the "
                                   f"runner's token bounds; write one rollout per line")
                if total > MAX_FILE_BYTES:
                    raise BadInput(f"{path}: more than the {MAX_FILE_BYTES >> 20} MiB the tool reads at once; split it "
                                   f"into several files and runs")
                try:
                    yield n, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise BadInput(f"{path}:{n}: not UTF-8 text (byte {e.start}: {e.reason}); save the file as "
                                   f"UTF-8") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror or e}); give a JSONL file of rollouts") from None


def collect(numbered, source: str, vocab: int) -> list[Rollout]:
    """Rollouts from (line number, JSON text or object) pairs, ids unique; BadInput for the first bad one."""
    rollouts, seen = [], {}
    for n, item in numbered:
        if isinstance(item, str) and not item.strip():
            continue
        where = f"{source}:{n}"
        r = parse_line(item, where, vocab) if isinstance(item, str) else parse_record(item, where, vocab)
        r.line = n
        if str(r.id) in seen:
            raise BadInput(f"{where}: field 'id' {short(r.id)} repeats line {seen[str(r.id)]}; ids must be unique")
        seen[str(r.id)] = n
        rollouts.append(r)
    if not rollouts:
        raise BadInput(f"{source}: no rollout in it; write one JSON object per line")
    return rollouts


def read_rollouts(path: Path, vocab: int) -> list[Rollout]:
    """Every rollout of a JSONL file (blank lines skipped), or BadInput for the first bad line."""
    path = Path(path)
    check_file(path)
    return collect(_lines(path), str(path), vocab)
