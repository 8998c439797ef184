"""The passes, in one table: the parameters' validation, the engines' dispatch, the statistics, the
tables and the figures read them here.

Every pass decodes the same requests (``PivotJob.requests``) with the same seeds and batches; only
the prefix state differs. Adding a pass is one row here, whose ``kind`` an engine's kernel computes
(the transformers engine: ``engine_hf.run_pass``; vLLM: ``engine_vllm.run_pass``); its records then
get ``A_<pass>`` and the other per-pass columns, and the statistics compare it with exact1.
"""
from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class Pass:
    name: str
    prefix: str  # where the prefix state comes from
    kind: str  # the kernel an engine computes it with: exact, refeed, serial, block, xrefeed, xdecode
    engines: tuple  # the engines that run it
    group: str  # reference, replica, re-feed, control or transplant: how the statistics compare it
    label: str  # a short label for figures
    replica_of: str | None = None  # a replica repeats this pass's work exactly: their difference is the floor
    required: bool = False  # every run has it (Table 1 compares exact1, exact2 and refeed)
    why_not: str = ""  # why the engines outside ``engines`` do not run it


PASSES = {p.name: p for p in (
    Pass("exact1", "the decode-time state, resumed", "exact", ENGINES, "reference", "exact1", required=True),
    Pass("exact2", "the decode-time state, resumed", "exact", ENGINES, "replica", "exact2\n(replica)",
         replica_of="exact1", required=True),
    Pass("refeed", "a fresh prefill", "refeed", ENGINES, "re-feed", "refeed", required=True),
    Pass("refeed2", "a fresh prefill", "refeed", ENGINES, "replica", "refeed2", replica_of="refeed"),
    Pass("serial", "a fresh prefill, one request at a time", "serial", ENGINES, "control", "serial"),
    Pass("block16", "the decode-time state up to the last 16-token boundary, the rest prefilled on it", "block",
         ("hf",), "control", "block16", why_not="vLLM's exact passes are block-granular resumes already"),
    Pass("xplant_refeed_kv", "a fresh prefill's state, resumed as exact1 resumes the decode-time one", "xrefeed",
         ("hf",), "transplant", "re-fed KV,\nexact decode",
         why_not="vLLM's APIs cannot place a given KV state into its prefix cache"),
    Pass("xplant_decode_kv", "the decode-time state, placed into refeed's prefill", "xdecode", ("hf",),
         "transplant", "decode KV,\nrefeed prefill",
         why_not="vLLM's APIs cannot place a given KV state into its prefix cache"),
)}


def get(name: str) -> Pass:
    """A pass's row, or a one-line error naming the known ones."""
    if name not in PASSES:
        raise ValueError(f"unknown pass '{name}' (replaylib/measure/passes.py); passes: {', '.join(PASSES)}")
    return PASSES[name]


def for_engine(name: str, engine: str) -> Pass:
    """A pass's row, refused in one line where this engine does not run it."""
    row = get(name)
    if engine not in row.engines:
        raise ValueError(f"pass '{name}' does not run on engine {engine} ({row.why_not}); leave it out of passes "
                         f"with engine: {engine}")
    return row


def names(group: str | None = None) -> list[str]:
    """The passes in table order, or those of one comparison group."""
    return [p.name for p in PASSES.values() if group is None or p.group == group]


def required() -> list[str]:
    """The passes every run has, the reference first."""
    return [p.name for p in PASSES.values() if p.required]


def is_exact(name: str) -> bool:
    """Whether a pass resumes the decode-time state as it was (its records carry cache_ok_<pass>)."""
    return PASSES[name].kind == "exact"
