"""What the credit tool's groups cost (each group's timing is a part of its shard, so a resumed run, which
computes nothing for the groups it reuses, still reports them): timing.json's totals, and the grader's
counts for summary.json."""
from __future__ import annotations


def grader_totals(groups: list[dict]) -> dict:
    """What the grader did over the groups: calls, seconds, bytes it printed (never shown) and their first
    characters."""
    found = [g["passes"].get("grader", {}) for g in groups if g.get("passes")]
    return {"calls": sum(f.get("calls", 0) for f in found),
            "seconds": round(sum(f.get("seconds", 0.0) for f in found), 3),
            "printed_bytes": sum(f.get("printed_bytes", 0) for f in found),
            "printed_head": next((f["printed_head"] for f in found if f.get("printed_head")), "")}


def throughput(groups: list[dict], settings) -> dict:
    """timing.json: per pass (and the forced decoding) seconds, tokens decoded and tokens per second over every
    group of the results, those computed now and those reused (each as it was computed; 'reused' says which);
    and each group's."""
    total: dict = {}
    for group in groups:
        for name, spent in (group.get("passes") or {}).items():
            if name == "grader":  # not a decode: summary.json's grader entry
                continue
            acc = total.setdefault(name, {"seconds": 0.0, "tokens": 0})
            acc["seconds"] += spent["seconds"]
            acc["tokens"] += spent["tokens"]
    return {"executor": settings.executor, "workers": settings.workers, "invariant": settings.invariant,
            "computed_groups": sum(not g.get("reused") for g in groups),
            "reused_groups": sum(bool(g.get("reused")) for g in groups),
            "passes": {name: {"seconds": round(t["seconds"], 3), "tokens": int(t["tokens"]),
                              "tokens_per_s": round(t["tokens"] / t["seconds"], 1) if t["seconds"] else None}
                       for name, t in sorted(total.items())},
            "groups": sorted(groups, key=lambda g: g["group"])}
