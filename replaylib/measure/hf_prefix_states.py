"""[ours] The transformers engine's prefix states beside the two it resumes and re-feeds: the float32
prefix-precision control, the cache transplants (xplant_refeed_kv, xplant_decode_kv) and the
per-layer profile of decode-time against re-fed K and V. ``PrefixStates`` is part of
``engine_hf.HFEngine``, whose model calls (_forward, _prefill, _new_cache) it uses."""
from __future__ import annotations

import torch

from .engine import PivotJob


class PrefixStates:
    def _float32_model(self):
        """A float32 copy of the model (loaded once, on first use): the prefix-precision control."""
        if self._model32 is None:
            from transformers import AutoModelForCausalLM
            self._model32 = AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=torch.float32, attn_implementation="sdpa").to(self.device).eval()
        return self._model32

    def _refed_prefill(self, seqs: list[list[int]]):
        """The re-fed prefill of a pass (refeed, refeed2, serial, xplant_refeed_kv's prefix).

        prefix_precision native: exactly `_prefill`. float32: the same call on a float32 copy
        of the model, its KV and last logits rounded to the run's dtype; everything after it
        (the decode) runs on the run's model unchanged."""
        if self.prefix_precision == "native" or self.model.dtype == torch.float32:
            return self._prefill(seqs)
        logits, cache32, mask, pads = self._prefill(seqs, model=self._float32_model())
        dtype = self.model.dtype
        cache = self._new_cache([layer.keys.to(dtype) for layer in cache32.layers],
                                [layer.values.to(dtype) for layer in cache32.layers])
        return logits.to(dtype).float(), cache, mask, pads

    def fresh_prefix_state(self, job: PivotJob):
        """The KV a fresh prefill of prompt + generated[:i] (without the forced token) produces:
        (keys, values), each [layers, kv_heads, abs_pos, head_dim], in the prefix precision."""
        _, cache, _, _ = self._refed_prefill([job.prompt_ids + job.gen_prefix])
        return row_state(cache, 0)

    def _spliced_prefill(self, seqs: list[list[int]], keys: torch.Tensor, values: torch.Tensor):
        """xplant_decode_kv: refeed's prefill call of seqs (one length, no padding) in which every
        layer's K and V of the first n positions are replaced, before attention, by the given
        state ([layers, kv_heads, n, head_dim]). The forced token's logits thus come out of
        refeed's own prefill computation, attending to the transplanted prefix; the prefix
        positions' own outputs are computed and discarded. Given the very K and V this prefill
        computes, it is refeed bit for bit (tested)."""
        n = keys.shape[2]
        if self.invariant:  # one token of one sequence per forward pass: prefill only the forced token
            assert len(seqs) == 1, "invariant mode runs one sequence at a time"
            cache = self._new_cache([keys[layer][None] for layer in range(keys.shape[0])],
                                    [values[layer][None] for layer in range(values.shape[0])])
            ids, pos = torch.tensor([s[n:] for s in seqs]), torch.arange(n, len(seqs[0]))[None]
            logits = None
            for t in range(ids.shape[1]):
                logits, cache = self._forward(ids[:, t:t + 1], pos[:, t:t + 1], cache, None)
            return logits, cache
        assert len({len(s) for s in seqs}) == 1, "the arms share a length"
        cache = _splice_cache_class()()  # every layer keeps every position (HFEngine._new_cache)
        cache.splice = (keys.to(self.device), values.to(self.device), n)
        ids = torch.tensor(seqs)
        positions = torch.arange(ids.shape[1]).expand(len(seqs), -1)
        return self._forward(ids, positions, cache, None)

    def layer_profile(self, jobs: list[PivotJob], state) -> list[dict]:
        """[ours] Per pivot and layer: max |decode-time - re-fed| of K and of V over the prefix
        [0, abs_pos), split into prompt positions, generated positions before the last one,
        and the last prefix position (abs_pos - 1); the first position that differs; the share
        of positions that differ; the largest |decode-time value| (for scale)."""
        rows = []
        for job in jobs:
            dk, dv = state[job.rollout]
            rk, rv = self.fresh_prefix_state(job)
            n, p = job.abs_pos, len(job.prompt_ids)
            for which, dec, ref in (("k", dk[:, :, :n], rk), ("v", dv[:, :, :n], rv)):
                diff = (dec.float() - ref.float().to(dec.device)).abs().amax(dim=(1, 3)).cpu()  # [layers, n]
                scale = dec.float().abs().amax(dim=(1, 2, 3)).cpu()
                for layer in range(diff.shape[0]):
                    d = diff[layer]
                    nz = torch.nonzero(d).flatten()
                    rows.append({
                        "problem_id": job.problem_id, "rollout": job.rollout, "pivot_id": job.pivot_id,
                        "abs_pos": n, "prompt_len": p, "layer": layer, "tensor": which,
                        "max_abs_diff": float(d.max()) if n else 0.0,
                        "max_abs_diff_prompt": float(d[:p].max()) if p else 0.0,
                        "max_abs_diff_generated": float(d[p:n - 1].max()) if n - 1 > p else 0.0,
                        "max_abs_diff_last": float(d[n - 1]) if n else 0.0,
                        "first_diff_pos": int(nz[0]) if len(nz) else -1,
                        "share_positions_differing": float(len(nz) / n) if n else 0.0,
                        "max_abs_value": float(scale[layer])})
        return rows

    def _transplant(self, job: PivotJob, kind: str, state, prefix_state, memo):
        """The prefix state a transplant pass resumes: injected, else re-fed (xrefeed) or decode-time (xdecode)."""
        if prefix_state is not None:
            return prefix_state[job.pivot_id]
        if kind == "xdecode":
            k, v = state[job.rollout]
            return k[:, :, :job.abs_pos], v[:, :, :job.abs_pos]
        key = (job.pivot_id, "fresh-prefix")
        if memo is None or key not in memo:
            kv = self.fresh_prefix_state(job)
            if memo is None:
                return kv
            memo[key] = kv
        return memo[key]


def stacked_cache(engine, caches):
    """One cache holding the rows of several one-row caches (same length)."""
    return engine._new_cache([torch.cat([c.layers[layer].keys for c in caches]) for layer in range(len(caches[0].layers))],
                             [torch.cat([c.layers[layer].values for c in caches]) for layer in range(len(caches[0].layers))])


_SPLICE_CLASS = None


def _splice_cache_class():
    """A DynamicCache whose first update per layer (the prefill) replaces the first n positions
    of the new K and V with a transplanted state before attention reads them."""
    global _SPLICE_CLASS
    if _SPLICE_CLASS is None:
        from transformers import DynamicCache

        class SpliceCache(DynamicCache):
            splice = None

            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                if self.splice is not None and key_states.shape[2] > self.splice[2]:
                    keys, values, n = self.splice
                    key_states, value_states = key_states.clone(), value_states.clone()
                    key_states[:, :, :n] = keys[layer_idx][None]
                    value_states[:, :, :n] = values[layer_idx][None]
                return super().update(key_states, value_states, layer_idx, *args, **kwargs)

        _SPLICE_CLASS = SpliceCache
    return _SPLICE_CLASS


def row_state(cache, slot: int):
    """One batch row's KV as [layers, kv_heads, length, head_dim] tensors."""
    return (torch.stack([layer.keys[slot] for layer in cache.layers]),
            torch.stack([layer.values[slot] for layer in cache.layers]))
