"""The vLLM engine (vLLM 0.22.1 on a CUDA GPU): the paper's own setup.

Written against the vLLM 0.22.1 wheel's source (vllm/entrypoints/llm.py, vllm/outputs.py,
vllm/sampling_params.py, vllm/logprobs.py, vllm/v1/sample/sampler.py,
vllm/v1/core/block_pool.py, vllm/v1/metrics/); where this file relies on a detail of
that source, the comment names it.

- One offline engine, bf16, prefix caching on, seed 0, in the serving mode of the
  configuration (`vllm_serving`; the environment it needs: replaylib.measure.vllm_setup).
  Its start and stop go through a lifecycle hook: the run layer's finds, registers and
  stops vLLM's engine-core processes (replaylib.runtime.vllm_processes).
- Prompts are token ids ({"prompt_token_ids": ids}), never re-tokenised text.
- Forced decoding (the credit tool's rollouts, force_trunks): an engine started with forcing=True has
  the logits processor of replaylib.measure.vllm_forcing; a response is then decoded token by token
  like a sampled trunk, and re-established by forcing it again instead of by re-sampling.
- Logprobs are the raw distribution (before temperature and top-p): logprobs_mode
  "raw_logprobs", set explicitly (also 0.22.1's default, vllm/config/model.py).
- The trunk's decode-time KV exists only as blocks in vLLM's prefix cache, in this
  process: sample_trunks returns no state. The replay process re-establishes it per
  problem (problem_state): reset the prefix cache, regenerate the problem's trunks with
  the identical requests (same batch, seeds, settings; sampling also resets before every
  problem, so both runs see the same fresh cache) and compare token ids and logprobs
  with the saved trunks. Trunk requests are always submitted *synchronized*: in the
  multi-process mode the scheduler is paused (LLM.sleep(level=0, mode="keep"): requests
  queue, nothing steps), every request is queued (LLM.enqueue), scheduling resumes
  (LLM.wake_up(["scheduling"])) and the outputs are collected (LLM.wait_for_completion),
  so the first step sees the whole call as an in-process engine's does and the
  regeneration can repeat the sampling stage's trunks bit for bit. The passes are
  submitted as the configuration says (pass_submission: stock, one LLM.generate, as the
  paper's harness ran; or synchronized, the control).
- A pivot's exact resume is verified per pivot, not per rollout: its resumed blocks (the
  full blocks before the pivot's block) must be the decode-time blocks of a regenerated
  trunk whose tokens equal the saved ones over those blocks (`state`: "identical" when the
  regenerated trunk equals the saved one in tokens and logprobs, "tokens" when only its
  tokens agree that far: the resumed state is then the regeneration's own decode-time
  state), every request of it must find at least that many tokens cached
  (num_cached_tokens) and nothing may have been preempted; pivots beyond a regeneration's
  first differing token are flagged (state "not established"), never used silently.
- exact passes send `prompt + generated[:i] + [forced]` and the prefix cache serves the
  trunk's full blocks; the last partial block (the pivot's block) is prefilled, so the
  resume is exact to floor(abs_pos / block) * block tokens, as in the paper. Each
  request's num_cached_tokens is checked against that floor.
- refeed resets the prefix cache first (abort if the reset reports failure, which would
  silently make it a third exact pass) and runs the identical batch.
- Eviction guard: the prefix pool evicts the least recently freed cached blocks first
  (free queue of vllm/v1/core/block_pool.py: allocation pops its head, freed blocks go to
  its tail). The trunk blocks are the last freed after the regeneration, so they
  survive while the blocks allocated since then stay below num_gpu_blocks - 1 - (trunk
  blocks). Each exact call is sized against that bound (an upper bound: no sharing,
  every continuation at max_tokens); work that does not fit is split into calls, and
  the trunks are re-established before a call that would overrun the bound. The
  num_cached_tokens check then catches anything the bound missed.
- Preemptions: 0.22.1 exposes no per-request count (RequestOutput has none); the
  Prometheus counter vllm:num_preemptions (LLM.get_metrics(), stats logging on) is read
  around every generate call. Preemptions during a regeneration mark that problem's
  rollouts non-identical; during an exact pass they mark its pivots not verified (a
  preempted request recomputes part of its state); all counts are logged and kept in
  `preemptions` and PivotOutput.resume.
- Stop at answer is not implemented here: continuations run to EOS or max_tokens, as in
  the paper (settings.stop_at_answer is ignored). Grading takes the last answer in the
  text, so a model that writes a second answer after its first is graded on the second.
- Batch-invariant mode: VLLM_BATCH_INVARIANT=1 must be set before vLLM is imported, and
  the attention backend is params.invariant_attention_backend (TRITON_ATTN; FA3 is not
  invariant between prefill and decode, see docs/protocol.md section 7.2). enforce_eager is ignored
  in this mode: eager vLLM 0.22.1 is not invariant between refeed and exact resumes, CUDA graphs
  and torch.compile are (docs/gpu-h200.md).
- vLLM cannot compare the first post-pivot step with the trunk's own
  (first_step_exact is None).
- Passes run by their kind (replaylib.measure.passes): exact resumes the resident trunk
  blocks, refeed resets the cache and runs the identical batch, serial sends every request
  alone on a freshly reset cache (a batch of one, its prefix prefilled alone; slow: one
  generate call per request). A pass the table does not give to this engine is refused.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import time

from ..core import progress
from . import engines
from .engine import (
    ARMS,
    EngineUnavailable,
    PassSettings,
    PivotJob,
    PivotOutput,
    ResumeReport,
    Trunk,
    answer_stop_ids,
    chat_prompt_ids,
)
from .seeds import trunk_seed
from .vllm_forcing import FORCE_KEY, FORCING_PROCESSOR, forced_params, sampler_max_tokens
from .vllm_setup import (
    NoLifecycle,
    engine_identity,
    memory_share,
    prepare_environment,
    trunk_settings,
    unavailable_message,
)
from .vllm_trunks import (
    ResidentTrunks,
    blocks,
    cache_floor,
    common_prefix,
    ints,
    preemption_count,
    topk_of,
)

log = logging.getLogger("replaylib")

LOGPROBS_MODE = "raw_logprobs"


class VLLMEngine:
    name = "vllm"

    def __init__(self, llm, sampling_params_cls, *, serving: str, model: str = "", dtype: str = "bfloat16",
                 invariant: bool = False, attention_backend: str = "", version: str = "", config: str = "?",
                 trunk_settings: dict | None = None, enforce_eager: bool | None = None, lifecycle=None,
                 forcing: bool = False):
        """Wrap an existing vllm.LLM (or a stand-in with the same methods, for tests). serving: the mode the
        LLM was started in (multiprocess or inprocess), which decides how trunk requests are submitted.
        lifecycle: what stops it with its processes (NoLifecycle by default). forcing: the LLM was started
        with the forcing logits processor (replaylib.measure.vllm_forcing), which force_trunks needs."""
        self.llm, self.SamplingParams = llm, sampling_params_cls
        self.model_path, self.dtype_name, self.invariant = model, dtype, invariant
        self.attention_backend, self.version, self.config = attention_backend, version, config
        self.enforce_eager, self.serving, self.forcing = enforce_eager, serving, forcing
        cache_config = llm.llm_engine.vllm_config.cache_config
        self.kv_block_size = int(cache_config.block_size)
        total = getattr(cache_config, "num_gpu_blocks", None)  # set by the engine core after profiling
        self.num_blocks = int(total) - 1 if total else None  # one block is vLLM's null block
        self.tok = llm.get_tokenizer()
        eos = [self.tok.eos_token_id]
        try:
            gen_eos = llm.llm_engine.model_config.try_get_generation_config().get("eos_token_id")
        except AttributeError:
            gen_eos = None
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        # a base model's answer also ends at a blank line: vLLM is told those tokens with every request that may
        # stop (stop_token_ids), never with a forced one (ignore_eos)
        self.answer_stops = sorted(answer_stop_ids(self.tok)) or None
        self.stop_ids = {int(i) for i in eos if i is not None} | set(self.answer_stops or ())
        self.special_ids = {int(i) for i in getattr(self.tok, "all_special_ids", [])} | self.stop_ids
        self.trunk_settings = trunk_settings  # temperature, top_p, max_new_tokens, top_logprobs
        self.epoch = 0  # prefix-cache resets so far
        self.preemptions: dict[str, int] = {}
        self.processes, self.registered = [], []  # the engine core's processes and their registry files
        self.lifecycle = lifecycle or NoLifecycle()
        self.identity: dict | None = None  # engine_identity of the parameters it was built from
        self.owned = True  # it stops the LLM when it closes (not one its caller built: vllm_given)

    def configure(self, params) -> None:
        """Serve the stage of these parameters (another stage or configuration on a shared engine): its
        trunk settings (the regeneration repeats them) and its name in messages. Parameters that would
        build another engine are refused."""
        want = engine_identity(params, self.invariant)
        if self.identity is not None and want != self.identity:
            diff = ", ".join(f"{k}: {self.identity.get(k)!r} here, {want.get(k)!r} asked"
                             for k in sorted(want) if want.get(k) != self.identity.get(k))
            raise ValueError(f"config '{params.config}': this vLLM engine was built with other settings ({diff}); "
                             f"the stage needs an engine of its own")
        self.config, self.trunk_settings = params.config, trunk_settings(params)
        if params.block_size > 1 and params.block_size != self.kv_block_size:
            log.warning("config %s: pivots are mined at block_size %d, but the engine's KV blocks hold %d tokens",
                        params.config, params.block_size, self.kv_block_size)

    @classmethod
    def from_params(cls, params, invariant: bool = False, lifecycle=None, forcing: bool = False) -> "VLLMEngine":
        """The engine of a configuration; lifecycle: the hook around its start and stop (NoLifecycle by
        default; the run layer's also manages vLLM's engine-core processes); forcing: also able to force a
        response's tokens through its decode (force_trunks; the credit tool's engine)."""
        if importlib.util.find_spec("vllm") is None:
            raise EngineUnavailable(unavailable_message(params.config, "vLLM 0.22.1 and a CUDA GPU"))
        import torch
        if not torch.cuda.is_available():
            raise EngineUnavailable(unavailable_message(params.config, "a CUDA GPU and this machine has none"))
        if params.device == "cpu":
            raise EngineUnavailable(f"config '{params.config}': engine 'vllm' runs on CUDA only, but device is cpu; "
                                    f"set device: cuda, or engine: hf")
        prepare_environment(invariant, params.config, params.vllm_serving)
        started = time.perf_counter()
        import vllm

        from .models import resolve_model
        model = resolve_model(params.model)
        backend = params.invariant_attention_backend if invariant else params.attention_backend
        eager = params.enforce_eager
        if invariant and eager:
            log.warning("config %s: enforce_eager is ignored in batch-invariant mode (eager vLLM 0.22.1 was not "
                        "invariant between refeed and exact resumes on the H200; see docs/gpu-h200.md)",
                        params.config)
            eager = False
        kwargs = dict(model=model, dtype=params.dtype, enable_prefix_caching=True,
                      gpu_memory_utilization=params.gpu_memory_utilization, max_model_len=params.max_model_len,
                      seed=0, enforce_eager=eager, logprobs_mode=LOGPROBS_MODE,
                      disable_log_stats=False)  # stats on: the preemption counter (LLM.get_metrics)
        if backend:
            kwargs["attention_config"] = {"backend": backend}
        if forcing:
            kwargs["logits_processors"] = [FORCING_PROCESSOR]
        if params.kv_cache_gib:  # a fixed KV cache: vLLM then skips its free-memory profiling
            kwargs["kv_cache_memory_bytes"] = int(params.kv_cache_gib * 2**30)
            kwargs["gpu_memory_utilization"] = memory_share(params, model)
        lifecycle = lifecycle or NoLifecycle()
        # exclusive: vLLM sizes its KV cache from the free GPU memory it measures while it starts
        llm, procs, files = lifecycle.start(lambda: vllm.LLM(**kwargs), params.config,
                                            exclusive=not params.kv_cache_gib)
        engine = cls(llm, vllm.SamplingParams, model=model, dtype=params.dtype, invariant=invariant,
                     attention_backend=backend, version=vllm.__version__, config=params.config, enforce_eager=eager,
                     serving=params.vllm_serving, lifecycle=lifecycle, forcing=forcing)
        engine.processes, engine.registered = procs, files
        engine.identity = engine_identity(params, invariant)
        log.info("config %s: vLLM engine started in %.1f s (%s; import, weights, compilation, CUDA graphs; "
                 "VLLM_CACHE_ROOT=%s)", params.config, time.perf_counter() - started,
                 f"multiprocess, engine core pid {', '.join(str(p.pid) for p in procs) or '?'}"
                 if params.vllm_serving == "multiprocess" else "inprocess", os.environ["VLLM_CACHE_ROOT"])
        engine.configure(params)
        return engine

    def close(self, timeout_s: float = 60.0) -> list[int]:
        """Shut the engine down; returns the pids of the engine-core processes that exited with it (the
        lifecycle waits for them, and kills and names one that outlives the shutdown). An LLM the caller built
        (replaylib.measure.vllm_given) is left running."""
        if self.llm is None or not self.owned:
            self.llm = None
            return []
        procs = self.lifecycle.stop(self._shutdown, self.config, self.processes, self.registered, timeout_s)
        if procs:
            log.info("config %s: vLLM engine stopped (engine-core processes %s exited)", self.config,
                     ", ".join(str(p.pid) for p in procs))
        return [p.pid for p in procs]

    def _shutdown(self) -> None:
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception as e:  # noqa: BLE001 - a failing shutdown still ends in the lifecycle's checks
            log.warning("config %s: vLLM engine shutdown raised %s: %s", self.config, type(e).__name__, e)
        self.llm = None
        if self.serving == "inprocess":  # give the GPU memory back now (inside the lifecycle's lock), not at exit
            import gc
            gc.collect()
            with contextlib.suppress(Exception):
                import torch
                torch.cuda.empty_cache()

    def describe(self) -> dict:
        return {"engine": "vllm", "model": self.model_path, "device": "cuda", "dtype": self.dtype_name,
                "kv_block_size": self.kv_block_size, "num_gpu_blocks": self.num_blocks,
                "batch_invariant": self.invariant, "attention_backend": self.attention_backend or "default",
                "enforce_eager": self.enforce_eager, "logprobs_mode": LOGPROBS_MODE, "serving": self.serving,
                "trunk_submission": "synchronized" if self.serving == "multiprocess" else "in-process",
                "vllm": self.version, **({"forced_decoding": FORCING_PROCESSOR} if self.forcing else {})}

    # ---------------------------------------------------------------- text
    def prompt_ids(self, question: str, instruction: str, task: str = "gsm8k") -> list[int]:
        return chat_prompt_ids(self.tok, question, instruction, task)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    # ---------------------------------------------------------------- engine calls
    def _reset(self, why: str) -> None:
        ok = self.llm.reset_prefix_cache()
        self.epoch += 1
        if ok is False:
            raise RuntimeError(f"config '{self.config}': vLLM refused to reset its prefix cache ({why}): some blocks "
                               f"are still in use; the run stops rather than measure a stale cache")

    def _submit(self, requests: list[dict], params: list, synchronized: bool):
        """The outputs of one call, in request order. synchronized, on the multi-process engine: pause its
        scheduler (sleep level 0 keeps weights and cache: requests queue, nothing steps), queue every
        request, resume, collect; its first step then sees the whole call, as an in-process engine's
        does. Otherwise one LLM.generate (in-process, every request is in before the first step anyway)."""
        if not (synchronized and self.serving == "multiprocess"):
            return self.llm.generate(requests, params, use_tqdm=False)
        self.llm.sleep(level=0, mode="keep")
        try:
            self.llm.enqueue(requests, params, use_tqdm=False)
        finally:
            self.llm.wake_up(tags=["scheduling"])
        return self.llm.wait_for_completion(use_tqdm=False)

    def _generate(self, prompts: list[list[int]], params: list, label: str, synchronized: bool = False):
        """One call; returns (outputs in request order, preemptions during it or None)."""
        before = preemption_count(self.llm)
        # plain Python ints: ids read back from Parquet are numpy.int64, and vLLM hashes the token ids of
        # its prefix-cache blocks as given, so numpy ids never match the trunk's blocks
        outs = self._submit([{"prompt_token_ids": ints(p)} for p in prompts], params, synchronized)
        progress.tokens(sum(len(c.token_ids) for o in outs for c in o.outputs), len(outs))
        after = preemption_count(self.llm)
        if len(outs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outs)} outputs for {len(prompts)} requests ({label})")
        n = None if before is None or after is None else after - before
        if n:
            self.preemptions[label] = self.preemptions.get(label, 0) + n
            log.warning("vLLM preempted %d requests during %s (KV cache too small for the batch)", n, label)
        return outs, n

    # ---------------------------------------------------------------- trunks
    def _trunk_requests(self, pid: int, prompt: list[int], seeds: list[tuple[int, int]], s: dict):
        """Sample one problem's trunks (rollout, seed) on a freshly reset prefix cache, submitted
        synchronized (the regeneration must be able to repeat them)."""
        params = [self.SamplingParams(temperature=s["temperature"], top_p=s["top_p"], max_tokens=s["max_new_tokens"],
                                      logprobs=s["top_logprobs"], seed=seed, detokenize=False,
                                      stop_token_ids=self.answer_stops) for _, seed in seeds]
        return self._trunk_call(pid, [prompt] * len(seeds), seeds, params, s["top_logprobs"],
                                f"trunks of problem {pid}")

    def _trunk_call(self, pid: int, prompts: list[list[int]], seeds: list[tuple[int, int]], params: list,
                    top_logprobs: int, label: str):
        """Trunk requests (a prompt each; rollout, seed; their sampling parameters) in one call, synchronized,
        on a freshly reset prefix cache; returns (trunks, preemptions during the call)."""
        self._reset(label)
        outs, preempted = self._generate(prompts, params, label, synchronized=True)
        trunks = []
        for (r, seed), prompt, out in zip(seeds, prompts, outs):
            comp = out.outputs[0]
            top = [topk_of(step, top_logprobs) for step in comp.logprobs]
            gen = ints(comp.token_ids)
            finish = "eos" if comp.finish_reason == "stop" or (gen and gen[-1] in self.stop_ids) else "length"
            trunks.append(Trunk(pid, r, seed, list(prompt), gen, [t[0] for t in top], [t[1] for t in top], finish,
                                token_logprobs=[float(step[t].logprob) for t, step in zip(gen, comp.logprobs)]))
        return trunks, preempted

    def sample_trunks(self, prompts: dict[int, list[int]], n_rollouts: int, seeds: dict, temperature: float,
                      top_p: float, max_new_tokens: int, top_logprobs: int):
        """Trunks for several problems, one call per problem (the batch problem_state
        regenerates); returns (trunks by problem, None): the KV stays in this process."""
        self.trunk_settings = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
                               "top_logprobs": top_logprobs}
        trunks = {}
        for pid, prompt in prompts.items():
            trunks[pid], _ = self._trunk_requests(pid, prompt, [(r, seeds[(pid, r)]) for r in range(n_rollouts)],
                                                  self.trunk_settings)
        return trunks, None

    def force_trunks(self, prompt_ids: list[int], responses: list[list[int]], top_logprobs: int):
        """Forced decoding: one prompt's responses decoded token by token, as they would have been sampled (one
        synchronized call on a freshly reset prefix cache, the forcing logits processor choosing each token),
        so that their blocks in the prefix cache are decode-time blocks. Returns (trunks, state): rollout r is
        the r-th response; its raw top-k is what decoding it computed. A re-establishment forces them again
        and compares with this first decode."""
        if not self.forcing:
            raise ValueError(f"config '{self.config}': forced decoding needs the engine started with "
                             f"VLLMEngine.from_params(..., forcing=True) (the forcing logits processor)")
        prompt = ints(prompt_ids)
        trunks, preempted = self._forced_requests(0, [prompt] * len(responses), [ints(r) for r in responses],
                                                  top_logprobs)
        state = ResidentTrunks.of_forced(prompt, trunks, top_logprobs)
        self._record(state, trunks, preempted)
        return trunks, state

    def _forced_requests(self, pid: int, prompts: list[list[int]], responses: list[list[int]], top_logprobs: int):
        """The responses (each after its prompt) forced through the decode (greedy over the one allowed token),
        each ending as its sampler's did (vllm_forcing.forced_params), submitted as trunks are; a request whose
        tokens are not the response's stops the run: the forcing was not in effect."""
        context = getattr(self.llm.llm_engine.model_config, "max_model_len", None)
        ran_out = sampler_max_tokens(responses, self.stop_ids)
        params = [forced_params(self.SamplingParams, prompt, resp, top_logprobs, self.stop_ids, context, ran_out)
                  for prompt, resp in zip(prompts, responses)]
        trunks, preempted = self._trunk_call(pid, prompts, [(r, 0) for r in range(len(responses))], params,
                                             top_logprobs, f"forced decoding of problem {pid}")
        for trunk, resp in zip(trunks, responses):
            if trunk.gen_ids != resp:
                at = common_prefix(trunk.gen_ids, resp)
                got = trunk.gen_ids[at] if at < len(trunk.gen_ids) else None
                raise RuntimeError(f"config '{self.config}': forced decoding of response {trunk.rollout} gave token "
                                   f"{got} at position {at} where the response has "
                                   f"{resp[at] if at < len(resp) else None}; the forcing logits processor was not "
                                   f"in effect, so no state of this response can be claimed")
        return trunks, preempted

    def problem_state(self, sampling_dir, problem_id: int, trunks, expected=None) -> tuple[dict, dict]:
        """Make this problem's trunk blocks resident: reset, regenerate, compare with the saved trunks.

        trunks: the sampling stage's trunk table (columns problem_id, rollout, seed, prompt_ids,
        gen_ids, topk_ids, topk_logprobs); sampling_dir and expected are unused (nothing is saved on
        disk: the regenerated trunks are compared with the saved ones token and logprob for logprob).
        Returns (state handle, {rollout: the regeneration ran clean}): whether a pivot's resumed
        blocks hold the saved tokens is decided per pivot in each exact pass (_resident).
        """
        if self.trunk_settings is None:
            raise ValueError("the trunks' sampling settings are unknown; build the engine with from_params")
        rows = trunks[trunks.problem_id == problem_id].sort_values("rollout")
        saved = {}
        for t in rows.itertuples(index=False):
            seed = int(t.seed) if hasattr(t, "seed") else trunk_seed(problem_id, int(t.rollout))
            saved[int(t.rollout)] = {"seed": seed, "prompt_ids": ints(t.prompt_ids), "gen_ids": ints(t.gen_ids),
                                     "topk_ids": [ints(s) for s in t.topk_ids],
                                     "topk_logprobs": [[float(v) for v in s] for s in t.topk_logprobs]}
        prompts = {tuple(s["prompt_ids"]) for s in saved.values()}
        if len(prompts) != 1:
            raise ValueError(f"problem {problem_id}: its trunks do not share one prompt")
        state = ResidentTrunks(problem_id, saved[min(saved)]["prompt_ids"], saved)
        self._establish(state)
        return state, {r: state.clean for r in saved}

    def _establish(self, state: "ResidentTrunks") -> None:
        if state.batch is not None:  # its rows of a batch forced whole (vllm_batch_forcing): the batch again
            regen, preempted = state.batch.force(self)
        elif state.forced:
            responses = [s["gen_ids"] for _, s in sorted(state.saved.items())]
            regen, preempted = self._forced_requests(state.problem_id, [state.prompt_ids] * len(responses),
                                                     responses, state.forced)
        else:
            regen, preempted = self._trunk_requests(state.problem_id, state.prompt_ids,
                                                    [(r, s["seed"]) for r, s in sorted(state.saved.items())],
                                                    self.trunk_settings)
        self._record(state, regen, preempted)

    def _record(self, state: "ResidentTrunks", regen: list, preempted) -> None:
        """What a regeneration made resident, compared with the saved trunks."""
        saved = state.saved
        # preempted None: the metrics could not be read, so the regeneration is not known to be clean
        state.clean = preempted == 0
        state.identical = {t.rollout: bool(state.clean and t.gen_ids == saved[t.rollout]["gen_ids"]
                                              and t.topk_ids == saved[t.rollout]["topk_ids"]
                                              and t.topk_logprobs == saved[t.rollout]["topk_logprobs"])
                              for t in regen}
        # every regenerated sequence (prompt + tokens): its full blocks are what the exact passes resume
        state.regenerated = [list(state.prompt_ids) + t.gen_ids for t in regen]
        state.agree = {t.rollout: common_prefix(t.gen_ids, saved[t.rollout]["gen_ids"]) for t in regen}
        state.trunk_blocks = sum(blocks(max(len(seq), len(state.prompt_ids) + len(saved[t.rollout]["gen_ids"])),
                                           self.kv_block_size) for seq, t in zip(state.regenerated, regen))
        state.epoch, state.allocated = self.epoch, 0
        state.established += 1
        differ = {r: n for r, n in sorted(state.agree.items()) if not state.identical[r]}
        if not state.clean:
            log.warning("problem %d: the trunk regeneration was preempted (or its preemptions could not be read); "
                        "its pivots are flagged", state.problem_id)
        elif differ:
            log.warning("problem %d: regenerated trunks differ from the saved ones for rollouts %s (tokens agree "
                        "up to generated index %s); pivots whose resumed blocks lie within the agreeing tokens are "
                        "kept (state 'tokens'), later ones flagged", state.problem_id, sorted(differ),
                        [differ[r] for r in sorted(differ)])

    def _resident(self, job: PivotJob, state: "ResidentTrunks") -> str:
        """How this pivot's resumed blocks came to be cached: 'sampled' (the sampler's own, nothing forced since:
        vllm_batch_forcing.sampled_state), 'identical' (its trunk regenerated bit for bit),
        'tokens' (a regenerated trunk has the saved tokens over those blocks, so they are its decode-time
        state), or 'not established' (no regeneration reached them: the pivot is flagged)."""
        if not state.clean:
            return "not established"
        if state.from_sampler and not state.established:  # the sampler's own blocks, never forced since
            return "sampled"
        if state.identical.get(job.rollout):
            return "identical"
        floor = cache_floor(job.abs_pos, self.kv_block_size)
        want = (job.prompt_ids + job.gen_prefix)[:floor]
        # the KV of a sequence's last token is never computed: its full blocks end before it
        if any(len(seq) - 1 >= floor and seq[:floor] == want for seq in state.regenerated):
            return "tokens"
        return "not established"

    # ---------------------------------------------------------------- passes
    def check_regeneration(self, jobs, settings, state) -> dict:
        """Nothing to add: problem_state already regenerates every trunk whole and compares it with
        the sampling stage's (each pivot's resumed blocks are checked against it in the exact passes)."""
        return {}

    def job_blocks(self, job: PivotJob, settings: PassSettings) -> int:
        """Upper bound on the KV blocks one pivot's requests allocate beyond the cached trunk blocks."""
        cached = job.abs_pos // self.kv_block_size
        lengths = [settings.max_tokens] * settings.k + [settings.probe_tokens]
        return len(ARMS) * sum(blocks(job.abs_pos + 1 + n, self.kv_block_size) - cached for n in lengths)

    def _split(self, jobs: list[PivotJob], settings: PassSettings, state: ResidentTrunks) -> list[list[PivotJob]]:
        """Jobs in calls whose allocations keep the trunk blocks out of reach of eviction."""
        if self.num_blocks is None:  # the engine did not say: one call, the cache check still verifies
            return [jobs]
        budget = self.num_blocks - state.trunk_blocks
        chunks, used = [[]], 0
        for job in jobs:
            need = self.job_blocks(job, settings)
            if need > budget:
                raise RuntimeError(f"config '{self.config}': one pivot needs up to {need} KV blocks beside the "
                                   f"{state.trunk_blocks} trunk blocks, but the engine has {self.num_blocks}; "
                                   f"raise gpu_memory_utilization or lower max_cont_tokens / k")
            if chunks[-1] and used + need > budget:
                chunks.append([])
                used = 0
            chunks[-1].append(job)
            used += need
        return chunks

    def _request_params(self, settings: PassSettings, job: PivotJob, arm: str, kind):
        """The sampling parameters of one request of a pivot's layout (PivotJob.requests)."""
        if kind == "probe":  # greedy, fixed length, first-token logprob: the grading-free channel
            return self.SamplingParams(temperature=0.0, max_tokens=settings.probe_tokens, logprobs=1,
                                       detokenize=False, stop_token_ids=self.answer_stops)
        return self._sampling(settings, job.seeds[arm][kind])

    def resident_state(self, problem_id: int, trunks, produced=None):
        """The trunks' KV lives in the prefix cache: make it resident again (as problem_state)."""
        return self.problem_state(None, problem_id, trunks)

    def layer_profile(self, jobs, state):
        raise ValueError("layer_profile needs engine: hf (vLLM's APIs do not hand out a KV state)")

    def _sampling(self, settings: PassSettings, seed: int):
        common = dict(max_tokens=settings.max_tokens, detokenize=False, stop_token_ids=self.answer_stops)
        if settings.temperature > 0:
            return self.SamplingParams(temperature=settings.temperature, top_p=settings.top_p, seed=seed, **common)
        return self.SamplingParams(temperature=0.0, **common)

    def run_pass(self, jobs: list[PivotJob], pass_name: str, settings: PassSettings,
                 state: ResidentTrunks | None) -> list[PivotOutput]:
        """One pass over pivot jobs, computed by its kind (replaylib.measure.passes): exact resumes the
        resident trunk blocks; refeed resets the prefix cache first; serial runs every request alone."""
        kind = engines.pass_kind("vllm", pass_name)
        exact = kind == "exact"
        if not jobs:
            return []
        if exact:
            if state is None:
                raise ValueError(f"pass {pass_name}: call problem_state first (the trunk blocks must be resident)")
            chunks = self._split(jobs, settings, state)
        elif kind == "serial":
            return self._run(jobs, pass_name, settings, None, alone=True)
        else:
            self._reset(f"{pass_name} pass")  # a failed reset would make this a third exact pass
            chunks = [jobs]
        outputs, preempted = [], 0
        for chunk in chunks:
            if exact:
                need = sum(self.job_blocks(j, settings) for j in chunk)
                over = self.num_blocks is not None and state.allocated + need > self.num_blocks - state.trunk_blocks
                if state.epoch != self.epoch or over:  # reset since, or the pool could evict the trunks
                    self._establish(state)
                state.allocated += need
            part = self._run(chunk, pass_name, settings, state if exact else None)
            n = part[0].resume.preemptions if part else 0
            preempted = None if n is None or preempted is None else preempted + n
            outputs += part
        for out in outputs:  # the pass's count: any preemption or unknown count leaves no pivot verified
            out.resume.preemptions = preempted
            if exact:
                out.resume.state_ok = bool(out.resume.state_ok and preempted == 0)
        return outputs

    def _run(self, jobs: list[PivotJob], pass_name: str, settings: PassSettings, state: ResidentTrunks | None,
             alone: bool = False):
        """All requests of these jobs in one generate call, mapped back to pivot and arm.

        alone (the serial pass): every request in its own generate call on a freshly reset
        prefix cache, so its whole prefix is prefilled in a batch of one; a request that still
        finds cached tokens stops the run (the reset did not happen).
        """
        layout, prompts, params = [], [], []
        for j, job in enumerate(jobs):
            for arm, kind in job.requests(settings.k):
                layout.append((j, arm, kind))
                prompts.append(job.prefix_ids(arm))
                params.append(self._request_params(settings, job, arm, kind))
        if alone:
            outs, preempted = [], 0
            for i, (prompt, sp) in enumerate(zip(prompts, params)):
                self._reset(f"{pass_name} request {i}")
                out, n = self._generate([prompt], [sp], f"{pass_name} pass")
                if out[0].num_cached_tokens:
                    raise RuntimeError(f"config '{self.config}': a {pass_name} request found {out[0].num_cached_tokens} "
                                       f"cached tokens right after a prefix-cache reset; the serial control "
                                       f"would not be a fresh prefill, so the run stops")
                outs.append(out[0])
                preempted = None if n is None or preempted is None else preempted + n
        else:
            outs, preempted = self._generate(prompts, params, f"{pass_name} pass",
                                             synchronized=settings.submission == "synchronized")
        per_job = [{"conts": {a: [] for a in ARMS}, "probe": {}, "lp": {}, "cached": []} for _ in jobs]
        for (j, arm, kind), out in zip(layout, outs):
            comp, rec = out.outputs[0], per_job[j]
            rec["cached"].append(int(out.num_cached_tokens or 0))
            if kind == "probe":
                ids = ints(comp.token_ids)
                rec["probe"][arm] = ids
                rec["lp"][arm] = float(comp.logprobs[0][ids[0]].logprob)
            else:
                rec["conts"][arm].append(ints(comp.token_ids))
        results = []
        for job, rec in zip(jobs, per_job):
            resume = ResumeReport(min_cached_tokens=min(rec["cached"]), preemptions=preempted)
            if state is not None:
                resume.cache_hit = all(c >= cache_floor(job.abs_pos, self.kv_block_size) for c in rec["cached"])
                resume.state = self._resident(job, state)
                resume.establishment = state.established
                resume.state_ok = bool(resume.cache_hit and preempted == 0 and resume.state != "not established")
            results.append(PivotOutput(job.pivot_id, rec["conts"], rec["probe"], rec["lp"], resume))
        return results
