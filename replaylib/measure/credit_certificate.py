"""The credit tool's certificates: whether forced decoding reproduced what a rollout recorded of its decode,
at every position of the response. Every position counts, not only those up to a pivot: a rollout whose
numbers differ anywhere was decoded in another state (another model, batch or kernel) than the one forced,
and a pivot early in the response (at position 0, say) would otherwise be certified on next to nothing.

A rollout records a top-k of raw logprobs per position (``top_logprobs``), or one logprob per position, the
sampled token's, at the temperature it was sampled at (``logprobs``: log softmax(logits / T), as trainers
keep them), or both. The verdict is

* ``bit-exact``: the same top-k ids and every recorded number equal to the forced decode's float32 one;
* ``within arithmetic``: the same top-k ids, and every difference within what float32 arithmetic on the
  forced decode's own logits can produce (the bound below), so the state is the one that was decoded;
* ``differs``: anything else (or a difference no bound covers: an engine that returns no logits);
* ``not recorded`` / ``not comparable`` (per-position logprobs on an engine that returns no logits).

The bound. u = 2^-24 (float32's unit roundoff); at a position, z = logits / T, L = logsumexp(z), V the
number of logits, x the exact logprob of an entry (in float64 from the forced decode's float32 logits). A
float32 log softmax, as ``z - logsumexp(z)`` or ``log_softmax(z)`` or their top-k, makes two kinds of error:
each entry's own roundings (dividing by T, subtracting), at most e(x) = u (|L| + 3|x|), and one shared by
the position's entries, the normalizer's (the float32 sum of V exponentials in any order, (V - 1) u; each
exponential and its argument, 0.37 V u; the log, u ln V; adding the maximum back, u |L|), at most
c = u (|L| + 1.4 V + ln V). Where a position has several entries, the shared part cancels in their
differences d = recorded - x: their spread must be within 2 * 2 max e and their midpoint within
2 (c + max e); a single entry within 2 (c + e). The factor 2 covers second-order terms.
"""
from __future__ import annotations

import math

U = 2.0 ** -24  # float32 unit roundoff
SAFETY = 2.0  # over the first-order bound: second-order terms


class Observer:
    """What forced decoding keeps per step and row (the engine's ``observe``): the raw logits' exact
    logsumexp, their top-`width` ids with exact logprobs, and the forced token's logprob at `temperature`
    exact and in float32 (as a trainer computes log_softmax(logits / T)). Picklable: it runs where the
    engine does."""

    def __init__(self, width: int, temperature: float = 1.0):
        self.width, self.temperature = width, temperature

    def __call__(self, logits, tokens: list[int]) -> list[dict]:
        import torch
        exact = logits.double()
        lse = torch.logsumexp(exact, dim=-1)
        ids = logits.topk(self.width, dim=-1).indices
        top_exact = exact.gather(1, ids) - lse[:, None]
        token = torch.tensor(tokens, device=logits.device)[:, None]
        scaled = exact / self.temperature
        lse_t = torch.logsumexp(scaled, dim=-1)
        token_exact = scaled.gather(1, token)[:, 0] - lse_t
        token_float32 = torch.log_softmax(logits / self.temperature, dim=-1).gather(1, token)[:, 0]
        vocab = logits.shape[-1]
        return [{"vocab": vocab, "lse": a, "top_ids": b, "top_exact": c, "lse_t": d, "token_exact": e,
                 "token_float32": f}
                for a, b, c, d, e, f in zip(lse.tolist(), ids.tolist(), top_exact.tolist(), lse_t.tolist(),
                                            token_exact.tolist(), token_float32.tolist())]


def entry_bound(lse: float, x: float) -> float:
    """An entry's own float32 roundings: e(x) = u (|L| + 3|x|)."""
    return U * (abs(lse) + 3 * abs(x))


def normalizer_bound(lse: float, vocab: int) -> float:
    """The normalizer's float32 error, shared by a position's entries: c = u (|L| + 1.4 V + ln V)."""
    return U * (abs(lse) + 1.4 * vocab + math.log(vocab))


def _position_used(diffs: list[float], lse: float, exact: list[float], vocab: int) -> float:
    """The largest share of its bound a position's differences use (above 1: beyond arithmetic)."""
    if any(math.isnan(d) or math.isinf(d) for d in diffs):
        return math.inf
    e = max(entry_bound(lse, x) for x in exact)
    offset = (max(diffs) + min(diffs)) / 2
    used = abs(offset) / (SAFETY * (normalizer_bound(lse, vocab) + e))
    if len(diffs) > 1:
        used = max(used, (max(diffs) - min(diffs)) / (SAFETY * 2 * e))
    return used


def certificate(top: list | None, logprobs: list | None, trunk) -> dict:
    """The certificate of one rollout, over every position of its response: verdict, the largest
    |recorded - forced| (float32 against float32) and the largest share of the arithmetic bound used (None
    where no bound)."""
    if top is None and logprobs is None:
        return {"certificate": "not recorded", "certificate_max_diff": None, "certificate_bound_used": None}
    seen = trunk.observed
    if logprobs is not None and seen is None:  # no logits on this engine: a per-position logprob has no match
        if top is None:
            return {"certificate": "not comparable", "certificate_max_diff": None, "certificate_bound_used": None}
        logprobs = None
    worst, used, same_ids, exact = 0.0, 0.0, True, True
    for i in range(len(trunk.topk_ids)):
        if top is not None:
            mine = dict(zip(trunk.topk_ids[i], trunk.topk_logprobs[i]))
            recorded = {int(t): float(lp) for t, lp in top[i]}
            same_ids &= set(recorded) == set(trunk.topk_ids[i][:len(recorded)])
            diffs = [abs(lp - mine[t]) if t in mine else math.inf for t, lp in recorded.items()]
            exact &= all(d == 0.0 for d in diffs)
            worst = max([worst, *diffs], key=lambda d: (math.isnan(d), d))
            if seen is not None:
                at = dict(zip(seen[i]["top_ids"], seen[i]["top_exact"]))
                shared = [t for t in recorded if t in at]
                if shared:
                    used = max(used, _position_used([recorded[t] - at[t] for t in shared], seen[i]["lse"],
                                                    [at[t] for t in shared], seen[i]["vocab"]))
        if logprobs is not None:
            diff = abs(float(logprobs[i]) - seen[i]["token_float32"])
            exact &= diff == 0.0
            worst = max([worst, diff], key=lambda d: (math.isnan(d), d))
            used = max(used, _position_used([float(logprobs[i]) - seen[i]["token_exact"]], seen[i]["lse_t"],
                                            [seen[i]["token_exact"]], seen[i]["vocab"]))
    if math.isnan(worst):
        used = math.inf
    if exact and same_ids:
        verdict = "bit-exact"
    elif same_ids and seen is not None and used <= 1.0:
        verdict = "within arithmetic"
    else:
        verdict = "differs"
    return {"certificate": verdict, "certificate_max_diff": float(worst),
            "certificate_bound_used": None if seen is None else float(used)}
