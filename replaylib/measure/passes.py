"""The passes, in one table: the parameters' validation, the engines' dispatch, the statistics, the
tables and the figures read them here.

Every pass decodes the same requests (``PivotJob.requests``) with the same seeds and batches; only
the prefix state differs. Adding a pass is one row here, whose ``kind`` an engine's kernel computes
(the kinds each engine has are in its entry of ``replaylib.measure.engines``): the engines with that
kernel run it, its records get ``A_<pass>`` and the other per-pass columns, and the statistics
compare it with exact1.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pass:
    name: str
    prefix: str  # where the prefix state comes from
    kind: str  # the kernel an engine computes it with: exact, refeed, serial, block, xrefeed, xdecode
    group: str  # reference, replica, re-feed, control or transplant: how the statistics compare it
    label: str  # a short label for figures
    replica_of: str | None = None  # a replica repeats this pass's work exactly: their difference is the floor
    required: bool = False  # every run has it (Table 1 compares exact1, exact2 and refeed)


PASSES = {p.name: p for p in (
    Pass("exact1", "the decode-time state, resumed", "exact", "reference", "exact1", required=True),
    Pass("exact2", "the decode-time state, resumed", "exact", "replica", "exact2\n(replica)",
         replica_of="exact1", required=True),
    Pass("refeed", "a fresh prefill", "refeed", "re-feed", "refeed", required=True),
    Pass("refeed2", "a fresh prefill", "refeed", "replica", "refeed2", replica_of="refeed"),
    Pass("serial", "a fresh prefill, one request at a time", "serial", "control", "serial"),
    Pass("block16", "the decode-time state up to the last 16-token boundary, the rest prefilled on it", "block",
         "control", "block16"),
    Pass("xplant_refeed_kv", "a fresh prefill's state, resumed as exact1 resumes the decode-time one", "xrefeed",
         "transplant", "re-fed KV,\nexact decode"),
    Pass("xplant_decode_kv", "the decode-time state, placed into refeed's prefill", "xdecode", "transplant",
         "decode KV,\nrefeed prefill"),
)}


def get(name: str) -> Pass:
    """A pass's row, or a one-line error naming the known ones."""
    if name not in PASSES:
        raise ValueError(f"unknown pass '{name}' (replaylib/measure/passes.py); passes: {', '.join(PASSES)}")
    return PASSES[name]


def names(group: str | None = None) -> list[str]:
    """The passes in table order, or those of one comparison group."""
    return [p.name for p in PASSES.values() if group is None or p.group == group]


def required() -> list[str]:
    """The passes every run has, the reference first."""
    return [p.name for p in PASSES.values() if p.required]


def is_exact(name: str) -> bool:
    """Whether a pass resumes the decode-time state as it was (its records carry cache_ok_<pass>)."""
    return PASSES[name].kind == "exact"
