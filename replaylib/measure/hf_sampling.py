"""How the transformers engine chooses tokens: greedy, or the top-p nucleus sampled with a uniform that
depends only on (seed, absolute position), so that a resumed trunk regenerates itself bit for bit and
every pass sees the same randomness; and the raw top-k logprobs it records."""
from __future__ import annotations

import torch

NUCLEUS_CANDIDATES = 128  # the nucleus is searched among the top tokens first (full sort as fallback)


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, absolute position): splitmix64."""
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (2**64 - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    x ^= x >> 31
    return (x >> 11) / float(2**53)


def choose_tokens(logits: torch.Tensor, temperature: list[float], top_p: list[float], uniforms: list[float]) -> list[int]:
    """Greedy where temperature is 0, else inverse-CDF sampling of the top-p nucleus with the given uniforms.

    Probabilities of the top candidates come from one log-sum-exp over the vocabulary; the
    nucleus is searched among the candidates, with a full sort when it is wider.
    """
    out = logits.argmax(dim=-1).tolist()
    rows = [b for b, t in enumerate(temperature) if t > 0]
    if not rows:
        return out
    sub = logits if len(rows) == len(temperature) else logits[torch.tensor(rows, device=logits.device)]
    inv_t = torch.tensor([1.0 / temperature[b] for b in rows], dtype=torch.float32, device=logits.device)[:, None]
    scaled = sub * inv_t
    log_z = torch.logsumexp(scaled, dim=-1, keepdim=True)
    n_cand = min(NUCLEUS_CANDIDATES, logits.shape[-1])
    cand_s, cand_i = scaled.topk(n_cand, dim=-1)  # sorted, descending
    # the nucleus of each row is searched on the CPU: one transfer per step instead of a few device syncs per
    # row (on a CPU engine .cpu() returns the tensors themselves, and nothing changes)
    cand_p, cand_i = torch.exp(cand_s - log_z).cpu(), cand_i.cpu()
    for j, b in enumerate(rows):
        p, ids = cand_p[j], cand_i[j]
        if float(p.sum()) < top_p[b]:  # nucleus wider than the candidates: sort everything
            p, ids = torch.sort(torch.exp(scaled[j] - log_z[j]).cpu(), descending=True, stable=True)
        cum = torch.cumsum(p, dim=0)
        keep = int(((cum - p) < top_p[b]).sum())
        kept = cum[:keep]
        pick = int(torch.searchsorted(kept, uniforms[b] * float(kept[-1]), right=True).clamp(max=keep - 1))
        out[b] = int(ids[pick])
    return out


def raw_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k raw logprobs (log-softmax before temperature and top-p) and their token ids."""
    values, ids = logits.topk(k, dim=-1)
    return values - torch.logsumexp(logits, dim=-1, keepdim=True), ids
