"""The Hugging Face transformers engine (any device; the embedded default on CPU).

- Trunks are decoded with the model's KV cache and the decode-time KV of every trunk is
  kept, so a later pass can resume it at any token (no 16-token blocks).
- Sampling noise is a function of (seed, absolute position): the uniform that picks a
  token from the nucleus is hashed from both. A resumed trunk therefore regenerates
  itself bit for bit, and every pass sees the same randomness.
- Logprobs are the raw distribution (before temperature and top-p), as in the paper.
- exact passes resume the saved state; refeed prefills the same token ids afresh.
- Invariant mode runs every forward pass on one token of one sequence, so prefill and
  decode compute each token identically: all passes must then agree bit for bit.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..core import progress
from . import engines
from .engine import (
    ARMS,
    PassSettings,
    PivotJob,
    PivotOutput,
    ResumeReport,
    Trunk,
    answer_stop_ids,
    chat_prompt_ids,
)
from .grading import answer_complete
from .hf_linear import cpu_has_native_bf16, swap_linears
from .hf_prefix_states import PrefixStates, row_state, stacked_cache
from .hf_sampling import choose_tokens, position_uniform, raw_topk
from .state import ResidentState, load_state

# on CUDA, attention's default cuDNN kernel does not reproduce itself run to run on this engine's masked
# batches; the memory-efficient kernel does, and takes the mask; an unmasked batch (one sequence, nothing
# padded) goes through grouped-query attention, which that kernel does not take: the math kernel then,
# which reproduces itself too (docs/gpu-h200.md, leases 9 and 10). The choice depends on the shapes only.
CUDA_ATTENTION_KERNELS = ("EFFICIENT_ATTENTION", "MATH")


@dataclass
class _Rows:
    """The per-row settings of one decode batch."""
    seeds: list[int]
    temperature: list[float]
    top_p: list[float]
    max_new: list[int]
    topk: int = 0  # record raw top-k at every step
    stop_at_answer: bool = False
    prefix_text: list[str] | None = None  # for the answer check
    forced: list[list[int]] | None = None  # forced decoding: each row's tokens, fed one decode step at a time
    observe: object = None  # observe(logits, tokens) -> one value per row, kept per step (forced decoding)
    observed: list | None = None


class HFEngine(PrefixStates):
    name = "hf"

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "bfloat16",
                 invariant: bool = False, max_batch_rows: int = 128, prefix_precision: str = "native",
                 trunk_prefill: str = "batched"):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device: cuda was asked for, but this machine has no CUDA GPU; set device: cpu")
        self.device, self.dtype_name = torch.device(device), dtype
        self.invariant, self.max_batch_rows = invariant, max_batch_rows
        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype),
                                                          attn_implementation="sdpa").to(self.device).eval()
        self.linear_kernel = "native"
        # invariant mode multiplies one row at a time, where native bf16 is the faster kernel
        if self.device.type == "cpu" and dtype == "bfloat16" and not invariant and not cpu_has_native_bf16():
            swap_linears(self.model)
            self.linear_kernel = "fp32-accumulate"
        self._token_ids()
        self.model_path = str(model_path)
        # [ours] re-fed prefix states computed by a float32 copy of the model, rounded to the run's
        # dtype (invariant mode keeps one computation for everything: always native)
        if prefix_precision not in ("native", "float32"):
            raise ValueError(f"prefix_precision must be native or float32, not {prefix_precision!r}")
        self.prefix_precision = "native" if invariant else prefix_precision
        self._model32 = None
        # [ours] how sample_trunks prefills its prompts: batched (left-padded to one length, one forward pass) or
        # alone (each distinct prompt in a forward pass of its own, then decoded in the same batches)
        if trunk_prefill not in ("batched", "alone"):
            raise ValueError(f"trunk_prefill must be batched or alone, not {trunk_prefill!r}")
        self.trunk_prefill = trunk_prefill

    def _token_ids(self) -> None:
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.stop_ids = {i for i in [*eos, self.tok.eos_token_id] if i is not None} | answer_stop_ids(self.tok)
        self.special_ids = set(self.tok.all_special_ids) | self.stop_ids
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else min(self.stop_ids)

    @classmethod
    def around(cls, model, tokenizer, invariant: bool = False, max_batch_rows: int = 128) -> "HFEngine":
        """An engine over a model already in memory (a trainer's policy, as it is now): its device, dtype and
        attention as they are, nothing in it swapped or copied. The caller keeps it in eval mode while the
        engine runs (replaylib.credit.Estimator does)."""
        engine = cls.__new__(cls)
        first = next(model.parameters())
        engine.device, engine.dtype_name = first.device, str(first.dtype).removeprefix("torch.")
        engine.invariant, engine.max_batch_rows = invariant, max_batch_rows
        engine.tok, engine.model, engine.linear_kernel = tokenizer, model, "native"
        engine._token_ids()
        engine.model_path = f"{getattr(model, 'name_or_path', '') or type(model).__name__} (in memory)"
        engine.prefix_precision, engine._model32, engine.trunk_prefill = "native", None, "batched"
        return engine

    @classmethod
    def from_params(cls, params, invariant: bool = False, lifecycle=None, forcing: bool = False) -> "HFEngine":
        """The engine of a configuration (no lifecycle to manage: it runs in this process; forcing asks for
        nothing more: it can always force a response through its decode)."""
        from .models import resolve_model
        torch.set_num_threads(torch.get_num_threads())
        return cls(resolve_model(params.model), params.device, params.dtype, invariant, params.max_batch_rows,
                   getattr(params, "prefix_precision", "native"), getattr(params, "trunk_prefill", "batched"))

    def close(self) -> None:
        """Free the model (nothing runs outside this process)."""
        self.model = self._model32 = None

    def describe(self) -> dict:
        cuda = {"attention_kernels": list(CUDA_ATTENTION_KERNELS)} if self.device.type == "cuda" else {}
        return {"engine": "hf", "model": self.model_path, "device": str(self.device), "dtype": self.dtype_name,
                "linear_kernel": self.linear_kernel, "invariant": self.invariant,
                "prefix_precision": self.prefix_precision, "trunk_prefill": self.trunk_prefill,
                "attention": self.model.config._attn_implementation, **cuda}

    def _attention_kernel(self):
        """The attention kernel every forward pass uses: on CUDA the one that reproduces itself."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([getattr(SDPBackend, name) for name in CUDA_ATTENTION_KERNELS])

    # ---------------------------------------------------------------- text
    def prompt_ids(self, question: str, instruction: str, task: str = "gsm8k") -> list[int]:
        return chat_prompt_ids(self.tok, question, instruction, task)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    # ---------------------------------------------------------------- model calls
    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None, model=None):
        with self._attention_kernel():
            out = (model or self.model)(input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                                        attention_mask=None if mask is None else mask.to(self.device),
                                        past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float(), out.past_key_values

    def _new_cache(self, keys=None, values=None):
        """A DynamicCache, optionally filled with per-layer tensors [B, H, L, D]. Every layer keeps every
        position, a sliding-window layer (Gemma 3's) too: its window is the attention mask's, so the state a
        decode leaves is whole, and a pass resumes it exactly as decoding left it, past the window too."""
        from transformers import DynamicCache
        cache = DynamicCache()
        if keys is not None:
            for layer, (k, v) in enumerate(zip(keys, values)):
                cache.update(k.to(self.device), v.to(self.device), layer)
        return cache

    def _prefill(self, seqs: list[list[int]], model=None, width: int = 0):
        """Prefill sequences, left-padded to one length (at least `width`: a sampler's padded batch); returns
        (last logits, cache, mask, pads)."""
        length = max(width, *(len(s) for s in seqs))
        pads = [length - len(s) for s in seqs]
        ids = torch.tensor([[self.pad_id] * p + s for p, s in zip(pads, seqs)])
        mask = torch.tensor([[0] * p + [1] * len(s) for p, s in zip(pads, seqs)])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if self.invariant:  # one token of one sequence per forward pass
            assert len(seqs) == 1, "invariant mode runs one sequence at a time"
            cache, logits = self._new_cache(), None
            for t in range(length):
                logits, cache = self._forward(ids[:, t:t + 1], positions[:, t:t + 1], cache, None)
            return logits, cache, None, pads
        logits, cache = self._forward(ids, positions, self._new_cache(), mask if any(pads) else None, model)
        return logits, cache, (mask if any(pads) else None), pads

    def _prefill_alone(self, seqs: list[list[int]]):
        """_prefill's result with every distinct sequence prefilled in a forward pass of its own (no padding, no
        other rows), the states then left-padded into one batch to be decoded together."""
        alone = {}
        for s in map(tuple, seqs):
            if s not in alone:
                logits, cache, _, _ = self._prefill([list(s)])
                alone[s] = (logits[0], torch.stack([layer.keys[0] for layer in cache.layers]),
                            torch.stack([layer.values[0] for layer in cache.layers]))
        rows = [alone[tuple(s)] for s in seqs]
        cache, mask, pads, _ = self._left_padded_cache([k for _, k, _ in rows], [v for _, _, v in rows],
                                                       [len(s) for s in seqs])
        return torch.stack([lg for lg, _, _ in rows]), cache, mask, pads

    def _left_padded_cache(self, keys: list, values: list, lens: list[int]):
        """One cache of per-row states (each [layers, kv_heads, len, head_dim]) left-padded with zeros to one
        length: (cache, mask or None when nothing is padded, pads, whether the cache holds the padded tensors
        bit for bit). A padded position is masked, so its value never reaches a row's numbers."""
        width = max(lens)
        pads = [width - n for n in lens]
        pad_kv = lambda t, p: F.pad(t, (0, 0, p, 0)) if p else t
        layers = range(keys[0].shape[0])
        cache_k = [torch.stack([pad_kv(k[layer], p) for k, p in zip(keys, pads)]) for layer in layers]
        cache_v = [torch.stack([pad_kv(v[layer], p) for v, p in zip(values, pads)]) for layer in layers]
        cache = self._new_cache(cache_k, cache_v)
        # the cache holds, bit for bit, the state slices it was built from (no device or dtype change)
        placed = all(torch.equal(layer.keys, k.to(self.device)) and torch.equal(layer.values, v.to(self.device))
                     for layer, k, v in zip(cache.layers, cache_k, cache_v))
        mask = torch.tensor([[0] * p + [1] * n for p, n in zip(pads, lens)]) if any(pads) else None
        return cache, mask, pads, placed

    # ---------------------------------------------------------------- the decode loop
    def _decode(self, logits, cache, mask, next_pos: list[int], rows: _Rows, keep_state: bool = False):
        """Sample or greedily decode every row until EOS, a complete answer, or its limit.

        `logits` predict the token at absolute position next_pos[b]. Finished rows leave
        the batch. Returns per row: tokens, raw top-k (ids, logprobs) per step, finish
        reason, and with keep_state each row's final KV (keys, values: [layers, H, L, D],
        still left-padded).
        """
        n = len(next_pos)
        assert not self.invariant or n == 1, "invariant mode decodes one sequence at a time"
        tokens = [[] for _ in range(n)]
        top_ids, top_lps = [[] for _ in range(n)], [[] for _ in range(n)]
        texts = list(rows.prefix_text) if rows.prefix_text else None
        starts = [len(t) if t is not None else 0 for t in texts] if texts else None
        finish = ["length"] * n
        states = {}
        active = list(range(n))
        pos = list(next_pos)
        mask = None if mask is None else mask.to(self.device)  # grown on the device, not copied there every step
        while active:
            if rows.topk:  # one transfer per step (a per-row .tolist() is a device sync per row on a GPU)
                lp, ix = (t.tolist() for t in raw_topk(logits, rows.topk))
            if rows.forced:
                chosen = [rows.forced[b][len(tokens[b])] for b in active]
                if rows.observe is not None:
                    for b, seen in zip(active, rows.observe(logits, chosen)):
                        rows.observed[b].append(seen)
            else:
                chosen = choose_tokens(logits, [rows.temperature[b] for b in active], [rows.top_p[b] for b in active],
                                       [position_uniform(rows.seeds[b], pos[b]) if rows.temperature[b] > 0 else 0.0
                                        for b in active])
            keep = []
            for j, b in enumerate(active):
                t = chosen[j]
                tokens[b].append(t)
                if rows.topk:
                    top_ids[b].append(ix[j])
                    top_lps[b].append(lp[j])
                done = None
                if t in self.stop_ids and (not rows.forced or len(tokens[b]) >= rows.max_new[b]):
                    done = "eos"
                elif rows.stop_at_answer and texts is not None and texts[b] is not None:
                    texts[b] += self.tok.decode([t])
                    if answer_complete(texts[b], starts[b]):
                        done = "answer"
                if done is None and len(tokens[b]) >= rows.max_new[b]:
                    done = "length"
                if done:
                    finish[b] = done
                    if keep_state:
                        states[b] = row_state(cache, j)
                else:
                    keep.append(j)
            progress.tokens(len(active), len(active) - len(keep))
            if not keep:
                break
            if len(keep) < len(active):
                sel = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(sel)
                mask = None if mask is None else mask[sel]
            active = [active[j] for j in keep]
            feed = torch.tensor([[tokens[b][-1]] for b in active])
            positions = torch.tensor([[pos[b]] for b in active])
            for b in active:
                pos[b] += 1
            if mask is not None:
                mask = torch.cat([mask, torch.ones(len(active), 1, dtype=mask.dtype, device=mask.device)], dim=1)
            logits, cache = self._forward(feed, positions, cache, mask)
        return tokens, top_ids, top_lps, finish, states

    # ---------------------------------------------------------------- trunks
    def sample_trunks(self, prompts: dict[int, list[int]], n_rollouts: int, seeds: dict, temperature: float,
                      top_p: float, max_new_tokens: int, top_logprobs: int):
        """Trunks for several problems; returns (trunks by problem, decode-time KV state by problem).

        seeds[(problem_id, rollout)] is each trunk's sampling seed. The state maps
        problem_id -> rollout -> (keys, values), each [layers, kv_heads, length, head_dim],
        holding the KV the model had while decoding (prompt + every fed generated token).
        """
        jobs = [(pid, r) for pid in prompts for r in range(n_rollouts)]
        return self._trunks(jobs, prompts, seeds, temperature, top_p, [max_new_tokens] * len(jobs), top_logprobs)

    def force_trunks(self, prompt_ids: list[int], responses: list[list[int]], top_logprobs: int, observe=None):
        """Forced decoding: one prompt's responses, each fed one decode step at a time from the prompt's
        prefill, as sample_trunks decodes (same batches, same state kept); returns (trunks, state), rollout r
        the r-th response of a one-problem state. The raw top-k of every step is what decoding the response
        computed: equal, bit for bit, to what sampling it recorded at the same batch shape. observe(logits,
        tokens): called with every step's float32 logits of the rows decoding and their forced tokens; what it
        returns per row is the trunk's `observed`, one entry per step."""
        jobs = [(0, r) for r in range(len(responses))]
        trunks, state = self._trunks(jobs, {0: list(prompt_ids)}, dict.fromkeys(jobs, 0), 0.0, 1.0,
                                     [len(r) for r in responses], top_logprobs, list(responses), observe)
        return trunks[0], state[0]

    def _trunks(self, jobs, prompts, seeds, temperature, top_p, max_new: list, top_logprobs, forced=None,
                observe=None):
        trunks, state = {pid: [] for pid in prompts}, {pid: {} for pid in prompts}
        step = 1 if self.invariant else max(1, self.max_batch_rows)
        for start in range(0, len(jobs), step):
            chunk = jobs[start:start + step]
            seqs = [prompts[pid] for pid, _ in chunk]
            prefill = self._prefill_alone if self.trunk_prefill == "alone" and not self.invariant else self._prefill
            logits, cache, mask, pads = prefill(seqs)
            rows = _Rows(seeds=[seeds[j] for j in chunk], temperature=[temperature] * len(chunk),
                         top_p=[top_p] * len(chunk), max_new=max_new[start:start + step], topk=top_logprobs,
                         forced=forced[start:start + step] if forced else None, observe=observe,
                         observed=[[] for _ in chunk] if observe else None)
            tokens, top_ids, top_lps, finish, states = self._decode(logits, cache, mask, [len(s) for s in seqs],
                                                                    rows, keep_state=True)
            for b, (pid, r) in enumerate(chunk):
                trunks[pid].append(Trunk(pid, r, seeds[(pid, r)], prompts[pid], tokens[b], top_ids[b], top_lps[b],
                                         finish[b], rows.observed[b] if observe else None))
                fed = len(prompts[pid]) + len(tokens[b]) - 1  # the last token is never fed back
                k, v = states[b]
                state[pid][r] = (k[:, :, pads[b]:pads[b] + fed].clone(), v[:, :, pads[b]:pads[b] + fed].clone())
        # digests taken as the states are produced: what every later resume is checked against
        return trunks, {pid: ResidentState.produced(kv) for pid, kv in state.items()}

    # ---------------------------------------------------------------- passes
    def problem_state(self, sampling_dir: Path, problem_id: int, trunks, expected: dict | None = None,
                      ) -> tuple["ResidentState", dict]:
        """The decode-time KV the sampling stage saved for one problem, on this engine's device.

        expected: rollout -> digest taken when the sampling stage produced the state (its
        manifest). Returns the resident state and, per rollout, whether the tensors now on
        the device have that digest and cover the trunk. Every exact pass checks the
        digest again on the tensors it places in the cache (run_pass).
        """
        path = Path(sampling_dir) / "state" / f"problem_{problem_id:05d}.safetensors"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no saved decode-time state for problem {problem_id}; "
                                    f"rerun the sampling stage with engine: hf")
        loaded, _ = load_state(path)
        state = ResidentState({r: (k.to(self.device), v.to(self.device)) for r, (k, v) in loaded.items()},
                              expected or {})
        verified = {}
        for t in trunks[trunks.problem_id == problem_id].itertuples(index=False):
            length = len(t.prompt_ids) + len(t.gen_ids) - 1
            verified[t.rollout] = bool(t.rollout in state and state[t.rollout][0].shape[2] == length
                                       and state.verify(t.rollout))
        return state, verified

    def run_pass(self, jobs: list[PivotJob], pass_name: str, settings: PassSettings, state: dict | None,
                 prefix_state: dict | None = None) -> list[PivotOutput]:
        """One pass over pivot jobs, computed by its kind (replaylib.measure.passes):

        exact    resume the decode-time state (rollout -> (keys, values)) at the pivot token
        refeed   prefill prompt + prefix + forced token afresh
        serial   refeed with every request alone (a batch of one), which separates "the prefix
                 state was recomputed" from "the batch was composed differently"
        block    the paper's paged-cache resume: the saved state up to the last 16-token
                 boundary, the rest of the prefix prefilled on top of it
        xrefeed  [ours] exact's procedure (the forced token fed as a decode step on the cache,
                 same batches) resuming the KV a fresh prefill of prompt + generated[:i]
                 (without the forced token) produces
        xdecode  [ours] refeed's procedure (the forced token's logits out of refeed's prefill
                 call, same batches) with the decode-time KV of [0, abs_pos) placed in place of
                 the prefix's own K and V

        prefix_state (transplant passes only): pivot_id -> (keys, values) [layers, kv_heads,
        abs_pos, head_dim], the state to transplant instead of the default one (tests inject the
        pass's own state this way: a transplant of a state onto itself is the original pass).
        """
        kind = engines.pass_kind("hf", pass_name)
        if (kind in ("exact", "block") or (kind == "xdecode" and prefix_state is None)) and state is None:
            raise ValueError(f"pass {pass_name}: the decode-time state of the trunks is needed")
        # the state this pass resumes, digested now (after any device move) against the digest
        # taken when it was produced: a check that observes the tensors, not a file's own metadata
        verified = ({r: bool(getattr(state, "verify", lambda _: False)(r)) for r in {j.rollout for j in jobs}}
                    if kind in ("exact", "xdecode") and prefix_state is None else {})
        alone = self.invariant or kind == "serial"
        rows_per_job = 2 * (settings.k + 1)
        per_chunk = 1 if alone else max(1, self.max_batch_rows // rows_per_job)
        # even chunks: every decode step pays for reading the weights, so 6 pivots run as 3 + 3, not 5 + 1
        if jobs:
            per_chunk = math.ceil(len(jobs) / math.ceil(len(jobs) / per_chunk))
        outputs = []
        for start in range(0, len(jobs), per_chunk):
            outputs += self._run_chunk(jobs[start:start + per_chunk], kind, settings, state, alone, prefix_state)
        for out, job in zip(outputs, jobs):
            out.resume.min_cached_tokens = {"exact": job.abs_pos, "block": job.abs_pos // 16 * 16,
                                               "xdecode": job.abs_pos}.get(kind, 0)
            if kind in ("exact", "xdecode") and verified:
                out.resume.state_ok = bool(verified[job.rollout] and out.resume.placed)
                out.resume.state = "saved"  # the sampling stage's tensors, digest-checked as placed
        return outputs

    def check_regeneration(self, jobs: list[PivotJob], settings: PassSettings, state) -> dict:
        """pivot_id -> whether resuming the actual token with the trunk's own seed regenerates the
        trunk bit for bit. Runs after the passes, in batches of its own, so that every pass of the
        measurement sees the same batches (only the prefix state may differ between passes)."""
        jobs = [j for j in jobs if j.trunk_rest]
        per_chunk = 1 if self.invariant else self.max_batch_rows
        result = {}
        for start in range(0, len(jobs), per_chunk):
            chunk = jobs[start:start + per_chunk]
            out = self._run_rows(chunk, [[("actual", "regen")] for _ in chunk], "exact", settings, state)
            result.update({j.pivot_id: tokens == list(j.trunk_rest) for j, tokens in zip(chunk, out["tokens"])})
        return result

    def resident_state(self, problem_id: int, trunks, produced: dict | None):
        """The state sample_trunks produced in this process, checked against its digests."""
        state = produced[problem_id]
        return state, {r: state.verify(r) for r in state}

    def _run_chunk(self, jobs, kind, settings, state, alone, prefix_state=None):
        layouts = [job.requests(settings.k) for job in jobs]
        if alone:  # every row alone; an arm's re-fed prefix is computed once and copied
            results = []
            for job, layout in zip(jobs, layouts):
                memo = {}
                per_row = [self._run_rows([job], [[row]], kind, settings, state, memo, prefix_state)
                           for row in layout]
                merged = {key: sum((r[key] for r in per_row), []) for key in ROW_FIELDS}
                results.append(self._collect(job, layout, merged, settings))
            return results
        out = self._run_rows(jobs, layouts, kind, settings, state, prefix_state=prefix_state)
        results, offset = [], 0
        for job, layout in zip(jobs, layouts):
            part = {key: out[key][offset:offset + len(layout)] for key in ROW_FIELDS}
            results.append(self._collect(job, layout, part, settings))
            offset += len(layout)
        return results

    def _prefill_on(self, state, start: int, seqs: list[list[int]]):
        """Prefill seqs[:, start:] on top of the saved state's first `start` positions (block16)."""
        k, v = state
        n = len(seqs)
        cache = self._new_cache([k[layer, :, :start].expand(n, -1, -1, -1).clone() for layer in range(k.shape[0])],
                                [v[layer, :, :start].expand(n, -1, -1, -1).clone() for layer in range(v.shape[0])])
        ids = torch.tensor([s[start:] for s in seqs])
        positions = torch.arange(start, start + ids.shape[1]).expand(n, -1)
        if self.invariant:
            logits = None
            for t in range(ids.shape[1]):
                logits, cache = self._forward(ids[:, t:t + 1], positions[:, t:t + 1], cache, None)
            return logits, cache
        return self._forward(ids, positions, cache, None)

    def _invariant_refeed(self, job: PivotJob, arms, memo: dict):
        """Invariant mode: both arms' fresh prefill shares everything but the forced token.

        Every forward pass is one token of one sequence here, so computing the shared part
        once and the forced token per arm gives bit for bit what two separate prefills give,
        at half the cost."""
        if (job.pivot_id, "shared") not in memo:
            _, cache, _, _ = self._prefill([job.prompt_ids + job.gen_prefix])
            memo[(job.pivot_id, "shared")] = ([layer.keys for layer in cache.layers],
                                              [layer.values for layer in cache.layers])
        shared_k, shared_v = memo[(job.pivot_id, "shared")]
        out = {}
        for arm in arms:
            if (job.pivot_id, arm) not in memo:
                logits, cache = self._forward(torch.tensor([[job.forced[arm]]]), torch.tensor([[job.abs_pos]]),
                                              self._new_cache(shared_k, shared_v), None)
                memo[(job.pivot_id, arm)] = (logits[0], [layer.keys[0] for layer in cache.layers],
                                             [layer.values[0] for layer in cache.layers])
            out[arm] = memo[(job.pivot_id, arm)]
        return out

    def _run_rows(self, jobs, layouts, kind, settings, state, memo=None, prefix_state=None):
        """Build the resumed or re-fed state for the rows of these jobs and decode them."""
        row_job, row_arm, row_kind = [], [], []
        for j, layout in enumerate(layouts):
            for arm, what in layout:
                row_job.append(j), row_arm.append(arm), row_kind.append(what)
        keys, values, lens, first_logits = [], [], [], []
        if kind in ("exact", "xrefeed"):
            fresh = {} if memo is None else memo  # xrefeed: one fresh prefix prefill per pivot
            for j, arm in zip(row_job, row_arm):
                job = jobs[j]
                if kind == "exact":
                    k, v = state[job.rollout]
                    k, v = k[:, :, :job.abs_pos], v[:, :, :job.abs_pos]
                else:
                    k, v = self._transplant(job, kind, state, prefix_state, fresh)
                keys.append(k)
                values.append(v)
                lens.append(job.abs_pos)
        else:
            by_job = {}
            for j in sorted(set(row_job)):
                job = jobs[j]
                arms = [a for a in ARMS if a in {row_arm[i] for i in range(len(row_job)) if row_job[i] == j}]
                if memo is not None and all((job.pivot_id, a) in memo for a in arms):
                    by_job[j] = {a: memo[(job.pivot_id, a)] for a in arms}
                    continue
                if self.invariant and kind in ("refeed", "serial") and memo is not None:
                    by_job[j] = self._invariant_refeed(job, arms, memo)
                    continue
                seqs = [job.prefix_ids(a) for a in arms]  # the arms share a length: no padding
                if kind == "block":
                    logits, cache = self._prefill_on(state[job.rollout], job.abs_pos // 16 * 16, seqs)
                elif kind == "xdecode":
                    if self.invariant:
                        outs = [self._spliced_prefill([s_], *self._transplant(job, kind, state, prefix_state, None))
                                for s_ in seqs]
                        logits = torch.cat([lg for lg, _ in outs])
                        cache = stacked_cache(self, [c for _, c in outs])
                    else:
                        logits, cache = self._spliced_prefill(
                            seqs, *self._transplant(job, kind, state, prefix_state, None))
                else:
                    logits, cache, _, _ = self._refed_prefill(seqs)
                by_job[j] = {a: (logits[i], [layer.keys[i] for layer in cache.layers],
                                 [layer.values[i] for layer in cache.layers]) for i, a in enumerate(arms)}
                if memo is not None:
                    memo.update({(job.pivot_id, a): by_job[j][a] for a in arms})
            for j, arm in zip(row_job, row_arm):
                lg, k, v = by_job[j][arm]
                first_logits.append(lg)
                keys.append(torch.stack(k))
                values.append(torch.stack(v))
                lens.append(jobs[j].abs_pos + 1)
        cache, mask, _, placed = self._left_padded_cache(keys, values, lens)
        if kind in ("exact", "xrefeed"):  # feed the forced token at the pivot as a decode step on the state
            feed = torch.tensor([[jobs[j].forced[a]] for j, a in zip(row_job, row_arm)])
            positions = torch.tensor([[jobs[j].abs_pos] for j in row_job])
            if mask is not None:
                mask = torch.cat([mask, torch.ones(len(lens), 1, dtype=mask.dtype)], dim=1)
            logits, cache = self._forward(feed, positions, cache, mask)
        else:
            logits = torch.stack(first_logits)
        seeds, temps, top_ps, max_new, stops = [], [], [], [], []
        for j, a, what in zip(row_job, row_arm, row_kind):
            job = jobs[j]
            if what == "probe":  # greedy, fixed length: a grading-free logprob channel
                seeds.append(0), temps.append(0.0), top_ps.append(1.0), max_new.append(settings.probe_tokens)
                stops.append(False)
            elif what == "regen":  # the trunk's own seed and sampling: must regenerate the trunk
                seeds.append(job.trunk_seed), temps.append(settings.trunk_temperature)
                top_ps.append(settings.trunk_top_p), max_new.append(len(job.trunk_rest)), stops.append(False)
            else:
                seeds.append(job.seeds[a][what]), temps.append(settings.temperature), top_ps.append(settings.top_p)
                max_new.append(settings.max_tokens), stops.append(settings.stop_at_answer)
        texts = [self.decode(jobs[j].gen_prefix + [jobs[j].forced[a]]) if stop else None
                 for j, a, stop in zip(row_job, row_arm, stops)] if any(stops) else None
        rows = _Rows(seeds=seeds, temperature=temps, top_p=top_ps, max_new=max_new, topk=0,
                     stop_at_answer=any(stops), prefix_text=texts)
        first_lp = torch.log_softmax(logits, dim=-1)
        first_values, first_ids = raw_topk(logits, 5)
        tokens, _, _, _, _ = self._decode(logits, cache, mask, [jobs[j].abs_pos + 1 for j in row_job], rows)
        return {"tokens": tokens, "placed": [placed] * len(row_job),
                "first_lp": [first_lp[r] for r in range(len(row_job))],
                "first_topk": [(first_ids[r].tolist(), first_values[r].tolist()) for r in range(len(row_job))]}

    def _collect(self, job: PivotJob, layout, part, settings) -> PivotOutput:
        conts, probe_ids, probe_lp = {a: [] for a in ARMS}, {}, {}
        resume = ResumeReport(placed=all(part["placed"]))
        for (arm, what), tokens, first_lp, first_topk in zip(layout, part["tokens"], part["first_lp"],
                                                            part["first_topk"]):
            if what == "probe":
                probe_ids[arm] = tokens[:settings.probe_tokens]
                probe_lp[arm] = float(first_lp[tokens[0]])
                if arm == "actual" and job.trunk_next is not None:
                    # does the first post-pivot step reproduce the trunk's own raw top-k bit for bit?
                    resume.first_step_exact = (first_topk[0] == list(job.trunk_next[0])
                                                  and first_topk[1] == list(job.trunk_next[1]))
            else:
                conts[arm].append(tokens)
        return PivotOutput(job.pivot_id, conts, probe_ids, probe_lp, resume)


ROW_FIELDS = ("tokens", "placed", "first_lp", "first_topk")
