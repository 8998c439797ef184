"""Lease 19's probe: does forcing a batch as TRL's colocated engine sampled it reproduce the sampler's raw numbers,
with each request ending as it was sampled (the package's forcing since lease 18) and with every request forced to
its length (the forcing lease 18 ran)? One vllm.LLM built as TRL 1.16 builds its colocated one (external_launcher,
4096 batched tokens, processed logprobs) with what vllm_for_credit() adds; GSM8K problems 1000 on with the chat
template, --generations each, sampled in one call at temperature 1 with the sampler tapped (the tap also shows the
rows vLLM's async scheduler decodes past a request's end); then the batch forced as sampled (twice: is forcing itself
repeatable?) and each request to its length, and every rollout certified against what the tap recorded. One JSON line per forcing, by how the rollout ended, with
where its schedule (the rollouts each sampler call decoded) first left the sampler's.
    python docs/gpu-h200/scripts/lease19_probe.py [--prompts 4] [--generations 8] [--max-tokens 256] [--model M]
(tests/test_credit_trl_vllm.py runs it on the stand-in engine.)"""
import argparse
import json
import os
from collections import Counter

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29620")

import torch  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

from replaylib.credit.trl_vllm import SamplerTap, aligned, model_runner, raw_logprobs, request_number  # noqa: E402
from replaylib.measure.credit_certificate import certificate  # noqa: E402
from replaylib.measure.data import load_problems  # noqa: E402
from replaylib.measure.models import resolve_model  # noqa: E402
from replaylib.measure.vllm_batch_forcing import force_batch  # noqa: E402
from replaylib.measure.vllm_forcing import FORCING_PROCESSOR, forced_params  # noqa: E402
from replaylib.measure.vllm_given import engine_around, llm_settings  # noqa: E402

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
WIDTH = 10  # the forced top-k: the tap's 5 and kernel.TIE_ROOM


def schedule(tap: SamplerTap) -> list[list[int]]:
    """Per sampler call, the rollouts it decoded, numbered from 0 within the generate call."""
    calls = [[request_number(r) for r in ids] for ids, *_ in tap.calls]
    first = min(n for call in calls for n in call)
    return [sorted(n - first for n in call) for call in calls]


def first_difference(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", default="embedded:qwen2.5-coder-0.5b-instruct")
    a = parser.parse_args()
    path = str(resolve_model(a.model))
    wanted = {k: v for k, v in llm_settings().items() if k not in ("logprobs_mode", "logits_processors")}
    llm = LLM(model=path, gpu_memory_utilization=0.2, distributed_executor_backend="external_launcher", seed=0,
              max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", logits_processors=[FORCING_PROCESSOR],
              **wanted)
    tok = llm.get_tokenizer()
    problems = load_problems("gsm8k")[1000:1000 + a.prompts]
    def chat(question):  # transformers 5 hands back a dict of input ids and attention mask
        ids = tok.apply_chat_template([{"role": "user", "content": question + INSTRUCTION}],
                                      add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    prompts = [chat(p.question) for p in problems for _ in range(a.generations)]
    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=a.max_tokens, logprobs=0)
              for _ in prompts]  # TRL's, one per request
    tap = SamplerTap(model_runner(llm))
    llm.reset_prefix_cache()  # as after TRL's weight sync
    with tap.recording():
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    sampled_schedule = schedule(tap)
    responses = [list(o.outputs[0].token_ids) for o in outs]
    ended = [o.outputs[0].finish_reason for o in outs]
    width = max(map(len, responses))
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width, dtype=torch.long)
    for i, r in enumerate(responses):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    rows = tap.matched(ids, mask)
    if rows is None:
        raise SystemExit("the tap's records could not be matched to the rollouts")
    decoded_past = Counter()  # rows the sampler decoded after a request's last token (async scheduling)
    for req, (tokens, _, _) in tap.by_request().items():
        response = responses[request_number(req)]
        decoded_past[ended[request_number(req)]] += len(tokens) - aligned(tokens, response) - len(response)
    print(json.dumps({"rollouts": len(responses), "ended": dict(Counter(ended)),
                      "rows decoded past a request's end, by how it ended": dict(decoded_past)}), flush=True)

    engine = engine_around(llm, raw_switched=True)
    # as lease 18 forced them: every request to its length, as though no response had stopped at a stop token
    old = [forced_params(SamplingParams, p, r, WIDTH, set(), None, None) for p, r in zip(prompts, responses)]
    as_sampled = lambda: force_batch(engine, prompts, responses, WIDTH)[0]  # noqa: E731
    forcings = {"as sampled": as_sampled, "as sampled, again": as_sampled,  # again: is forcing itself repeatable?
                "each to its length": lambda: engine._trunk_call(0, prompts, [(i, 0) for i in range(len(prompts))],
                                                                old, WIDTH, "forced to its length")[0]}
    with raw_logprobs(model_runner(llm)):
        for name, force in forcings.items():
            forced_tap = SamplerTap(model_runner(llm))
            with forced_tap.recording():
                trunks = force()
            forced_schedule = schedule(forced_tap)
            by_end: dict = {}
            for (logprobs, top), trunk, end in zip(rows, trunks, ended):
                cert = certificate(top, logprobs, trunk)
                found = by_end.setdefault(end, {"certificates": Counter(), "first_diff": []})
                found["certificates"][cert["certificate"]] += 1
                if cert["certificate_first_diff"] is not None:
                    found["first_diff"].append(cert["certificate_first_diff"])
            print(json.dumps({"forcing": name, "sampler calls": [len(sampled_schedule), len(forced_schedule)],
                              "schedule first differs at call": first_difference(sampled_schedule, forced_schedule),
                              **{end: {"certificates": dict(v["certificates"]),
                                                        "first_diff": sorted(v["first_diff"])}
                                                  for end, v in by_end.items()}}), flush=True)


if __name__ == "__main__":
    main()
