"""The credit tool's certificates: whether forced decoding reproduced what a rollout recorded of its decode,
at every position of the response. Every position counts, not only those up to a pivot: a rollout whose
numbers differ anywhere was decoded in another state (another model, batch or kernel) than the one forced,
and a pivot early in the response (at position 0, say) would otherwise be certified on next to nothing.

A rollout records a top-k of raw logprobs per position (``top_logprobs``), or one logprob per position, the
sampled token's, at the temperature it was sampled at (``logprobs``: log softmax(logits / T), as trainers
keep them), or both. The verdict is

* ``bit-exact``: the same top-k ids (up to ties at its lowest value) and every recorded number equal to the
  forced decode's float32 one;
* ``within arithmetic``: the same top-k ids, and every difference within what float32 arithmetic on the
  forced decode's own logits can produce (the bound below), so the state is the one that was decoded;
* ``differs``: anything else (or a difference no bound covers: an engine that returns no logits);
* ``not recorded`` / ``not comparable`` (per-position logprobs on an engine that returns neither logits nor the
  token's own logprob).

On vLLM, which returns no logits, a per-position logprob is compared with vLLM's own raw logprob of the forced
token (``Trunk.token_logprobs``): bit-exact, or differs.

The bound. u = 2^-24 (float32's unit roundoff); at a position, z = logits / T, m = max z, L = logsumexp(z),
p_i = exp(z_i - L), H = -sum p_i ln p_i <= ln V, V the number of logits, x the exact logprob of an entry (in
float64 from the forced decode's float32 logits). A float32 log softmax (``log_softmax(z)``, ``z -
logsumexp(z)``, their top-k) computes z_i - m - ln S^ with S^ the float32 sum of exp(z_i - m); exactly,
S = exp(L - m) in [1, V]. Its errors, to first order:

* each entry's own roundings (dividing by T, the two subtractions): e(x) = u (|L| + 3|x|);
* one shared by the position's entries, the normalizer's: S^'s relative error, which ln S^ carries as an
  absolute one, plus the log's own rounding. Summed, each term weighted by its share p_i of S:
  - the exponentials' arguments (z_i = logits_i / T and z_i - m, each rounded): sum p_i (|z_i| + |z_i - m|) u
    <= u (|L| + 3 ln V), as sum p_i (m - z_i) = H - (L - m) <= ln V and |m| <= |L| + ln V;
  - the exponentials, at most 2 ulp each (CUDA's fast exp; torch's CPU exp is 1 ulp): 4u;
  - the sum (the assumption): the exponentials are added in chains of at most V/8 terms, then pairwise, at
    most ceil(log2 V) levels: torch's CPU log_softmax adds in 8 float32 lanes (AVX2; 16 on AVX-512), each
    lane every 8th entry in vocabulary order; torch.logsumexp and torch.sum on the CPU, numpy's sum: cascade
    or pairwise over short blocks; CUDA: a few hundred terms a thread, then a tree. A chain of n terms errs
    by at most u times the sum of its partial sums, which over an order unrelated to the terms' sizes (the
    vocabulary's) averages (n + 1)/2 times the chain's total: u (V/16 + ceil(log2 V)) of S. Not every
    order's worst case (up to u V/8: the largest terms first and every rounding one way); five honest float32
    log softmaxes of realistic logits used at most 11.5% of the bound (tests/test_credit_certificates.py);
  - the log, rounded and at most an ulp off: 2 u (L - m) <= 2 u ln V; adding m back: u |L|.

  So c1 = u (V/16 + ceil(log2 V) + 5 ln V + 2|L| + 4), and with every higher-order term, c = c1 / (1 - c1).

The shared part cancels in the differences d = recorded - x of a position's entries: their spread must be
within 2 * 2 max e (the factor 2: slack over the first-order bound) and their midpoint within c + max e; a
single entry within c + e. On V = 151,936 with |L| near 30 that is 5.8e-4: a logprob off by 1e-3 differs.
"""
from __future__ import annotations

import math

U = 2.0 ** -24  # float32 unit roundoff
SPREAD_SLACK = 2.0  # over the entries' own first-order bound


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
    """The normalizer's float32 error, shared by a position's entries (the module's derivation):
    c1 = u (V/16 + ceil(log2 V) + 5 ln V + 2|L| + 4), higher-order terms included: c1 / (1 - c1)."""
    first = U * (vocab / 16 + math.ceil(math.log2(vocab)) + 5 * math.log(vocab) + 2 * abs(lse) + 4)
    return first / (1 - first)


def _position_used(diffs: list[float], lse: float, exact: list[float], vocab: int) -> float:
    """The largest share of its bound a position's differences use (above 1: beyond arithmetic)."""
    if any(math.isnan(d) or math.isinf(d) for d in diffs):
        return math.inf
    e = max(entry_bound(lse, x) for x in exact)
    offset = (max(diffs) + min(diffs)) / 2
    used = abs(offset) / (normalizer_bound(lse, vocab) + e)
    if len(diffs) > 1:
        used = max(used, (max(diffs) - min(diffs)) / (SPREAD_SLACK * 2 * e))
    return used


NO_NUMBERS = {"certificate_max_diff": None, "certificate_bound_used": None, "certificate_first_diff": None}


def certificate(top: list | None, logprobs: list | None, trunk) -> dict:
    """The certificate of one rollout, over every position of its response: verdict, the largest
    |recorded - forced| (float32 against float32), the largest share of the arithmetic bound used (None
    where no bound) and the first position whose numbers are not the forced decode's bit for bit (None: none)."""
    if top is None and logprobs is None:
        return {"certificate": "not recorded", **NO_NUMBERS}
    seen, own = trunk.observed, getattr(trunk, "token_logprobs", None)
    if logprobs is not None and seen is None and own is None:  # no logits, no token's logprob: nothing to match
        if top is None:
            return {"certificate": "not comparable", **NO_NUMBERS}
        logprobs = None
    worst, used, same_ids, exact, first = 0.0, 0.0, True, True, None
    for i in range(len(trunk.topk_ids)):
        if top is not None:
            mine = dict(zip(trunk.topk_ids[i], trunk.topk_logprobs[i]))
            recorded = {int(t): float(lp) for t, lp in top[i]}
            # the same entries at the top: none the forced decode ranks above the recorded ones' lowest is missing
            # (where entries tie at that value, either top-k may hold any of them: the forced decode records a wider
            # top-k, so that each recorded entry is found with its own value)
            lowest = min(recorded.values(), default=math.inf)
            same_ids &= {t for t, lp in mine.items() if lp > lowest} <= set(recorded)
            diffs = [abs(lp - mine[t]) if t in mine else math.inf for t, lp in recorded.items()]
            exact &= all(d == 0.0 for d in diffs)
            worst = max([worst, *diffs], key=lambda d: (math.isnan(d), d))
            if seen is not None:
                at = dict(zip(seen[i]["top_ids"], seen[i]["top_exact"]))
                shared = [t for t in recorded if t in at]
                if shared:
                    used = max(used, _position_used([recorded[t] - at[t] for t in shared], seen[i]["lse"],
                                                    [at[t] for t in shared], seen[i]["vocab"]))
        if logprobs is not None:  # without logits (vLLM), its own logprob of the token: equal, or no bound says more
            diff = abs(float(logprobs[i]) - (own[i] if seen is None else seen[i]["token_float32"]))
            exact &= diff == 0.0
            worst = max([worst, diff], key=lambda d: (math.isnan(d), d))
            if seen is not None:
                used = max(used, _position_used([float(logprobs[i]) - seen[i]["token_exact"]], seen[i]["lse_t"],
                                                [seen[i]["token_exact"]], seen[i]["vocab"]))
        if first is None and not (same_ids and exact):
            first = i  # where the numbers first differ: from there on, another state (a batch, a kernel)
    if math.isnan(worst):
        used = math.inf
    if exact and same_ids:
        verdict = "bit-exact"
    elif same_ids and seen is not None and used <= 1.0:
        verdict = "within arithmetic"
    else:
        verdict = "differs"
    return {"certificate": verdict, "certificate_max_diff": float(worst),
            "certificate_bound_used": None if seen is None else float(used), "certificate_first_diff": first}
