"""Certificates a trainer's logs can pass: rollouts sampled with plain ``model.generate()`` on the tiny model,
their top-5 taken with log_softmax and their per-token logprobs at the sampling temperature (TRL's field
names), are bit-exact or within float32 arithmetic of the forced decode; perturbed ones differ. And the
arithmetic bound itself, on logits of a real vocabulary's size."""
import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from test_credit import FAST, PROMPT, write

from replaylib.credit.tool import Settings, run
from replaylib.measure.credit_certificate import Observer, certificate

T = 0.7


@pytest.fixture(scope="module")
def generated(tiny_model_dir):
    """Two responses sampled by transformers' generate() from a model loaded on its own (not the engine's),
    with the scores and logits it returns, in TRL's field names."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    torch.manual_seed(3)
    out = model.generate(torch.tensor([PROMPT] * 2), attention_mask=torch.ones(2, len(PROMPT), dtype=torch.long),
                         do_sample=True, temperature=T, top_k=0, top_p=1.0, max_new_tokens=12, output_logits=True,
                         output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    rows = []
    for b in range(2):
        completion = out.sequences[b, len(PROMPT):].tolist()
        assert model.generation_config.eos_token_id not in completion  # one batch shape throughout, as forced
        top = [torch.log_softmax(step[b].float(), dim=-1).topk(5) for step in out.logits]
        rows.append({"id": f"g{b}", "prompt_ids": PROMPT, "completion_ids": completion, "answer": "7",
                     "top_logprobs": [[[int(i), float(v)] for v, i in zip(t.values, t.indices)] for t in top],
                     # TRL's per-token logprobs: log_softmax of the temperature-scaled logits (here the scores)
                     "sampling_per_token_logps": [float(torch.log_softmax(step[b].float(), dim=-1)[tok])
                                                  for step, tok in zip(out.scores, completion)]})
    return rows


def credited(rows, tiny_engine, tiny_model_dir, out, **settings):
    run(write(out.with_suffix(".jsonl"), rows), out,
        Settings(model=tiny_model_dir, grader="gsm8k", **{**FAST, "logprobs_temperature": T, **settings}),
        engine=tiny_engine)
    return pd.read_parquet(out / "credit.parquet")


def test_generate_s_own_rollouts_are_bit_exact_or_within_arithmetic(generated, tiny_engine, tiny_model_dir, tmp_path):
    frame = credited(generated, tiny_engine, tiny_model_dir, tmp_path / "both")
    assert len(frame) > 0 and set(frame.certificate) <= {"bit-exact", "within arithmetic"}, frame.certificate
    assert (frame.certificate_bound_used <= 1).all()
    # each record alone: the top-5 (log_softmax's, not the engine's formula) and the per-token logprobs
    top_only = [{k: v for k, v in r.items() if k != "sampling_per_token_logps"} for r in generated]
    frame = credited(top_only, tiny_engine, tiny_model_dir, tmp_path / "top")
    assert set(frame.certificate) <= {"bit-exact", "within arithmetic"}, frame.certificate
    per_token = [{k: v for k, v in r.items() if k != "top_logprobs"} for r in generated]
    frame = credited(per_token, tiny_engine, tiny_model_dir, tmp_path / "per-token")
    assert set(frame.certificate) <= {"bit-exact", "within arithmetic"} and set(frame.margin_source) == {"forced"}


@pytest.mark.parametrize("change", ["per-token logprob +0.01", "a top-5 id replaced", "wrong temperature"])
def test_perturbed_rollouts_differ(change, generated, tiny_engine, tiny_model_dir, tmp_path):
    rows = json.loads(json.dumps(generated))
    settings = {}
    for r in rows:
        if change == "per-token logprob +0.01":
            del r["top_logprobs"]
            r["sampling_per_token_logps"][0] += 0.01  # position 0 precedes every pivot
        elif change == "a top-5 id replaced":
            del r["sampling_per_token_logps"]
            step = r["top_logprobs"][0]  # (bf16 logits tie often: swapping two entries may change nothing)
            step[0][0] = next(t for t in range(600) if t not in {i for i, _ in step})
        else:
            del r["top_logprobs"]
            settings = {"logprobs_temperature": 1.0}  # taken at 0.7, certified as if raw
    frame = credited(rows, tiny_engine, tiny_model_dir, tmp_path / "out", **settings)
    assert len(frame) > 0 and set(frame.certificate) == {"differs"}, frame.certificate


def test_every_position_of_the_response_is_compared_not_only_those_up_to_the_pivot(generated, tiny_engine,
                                                                                   tiny_model_dir, tmp_path):
    """A pivot at position 0, the recorded per-token logprobs off by 0.01 only at the response's last position:
    the rollout was decoded elsewhere, and its certificate says so (it is not bit-exact on position 0 alone)."""
    rows = json.loads(json.dumps(generated))
    for r in rows:
        del r["top_logprobs"]
        r["positions"] = [0]
    frame = credited(rows, tiny_engine, tiny_model_dir, tmp_path / "honest")
    assert set(frame.position) == {0} and set(frame.certificate) <= {"bit-exact", "within arithmetic"}
    for r in rows:
        r["sampling_per_token_logps"][-1] += 0.01
    frame = credited(rows, tiny_engine, tiny_model_dir, tmp_path / "late")
    assert set(frame.position) == {0} and set(frame.certificate) == {"differs"}, frame.certificate


def test_the_bound_holds_between_the_two_usual_formulas_on_a_real_vocabulary_and_not_for_a_changed_logit():
    """topk(l) - logsumexp(l) against log_softmax(l).topk, both float32, on 151936 bf16 logits: within the
    bound, as derived; a logit moved by 1e-3 (a different state) is not."""
    torch.manual_seed(0)
    logits = (torch.randn(4, 151936) * 3 + 8).to(torch.bfloat16).float()
    observer = Observer(5)
    seen = observer(logits, [0, 1, 2, 3])
    values, ids = logits.topk(5, dim=-1)
    engine_style = values - torch.logsumexp(logits, dim=-1, keepdim=True)
    trainer_style = torch.log_softmax(logits, dim=-1).gather(1, ids)
    for b in range(4):
        forced = SimpleNamespace(topk_ids=[ids[b].tolist()], topk_logprobs=[engine_style[b].tolist()],
                                 observed=[seen[b]])
        recorded = [[[int(i), float(v)] for i, v in zip(ids[b], trainer_style[b])]]
        cert = certificate(recorded, None, forced)
        assert cert["certificate"] in ("bit-exact", "within arithmetic") and cert["certificate_bound_used"] <= 1
        moved = logits[b].clone()
        moved[ids[b, 1]] += 1e-3
        shifted = torch.log_softmax(moved, dim=-1)[ids[b]]
        recorded = [[[int(i), float(v)] for i, v in zip(ids[b], shifted)]]
        assert certificate(recorded, None, forced)["certificate"] == "differs"


def test_per_token_logprobs_without_the_engine_s_logits_are_not_comparable():
    forced = SimpleNamespace(topk_ids=[[4, 5]], topk_logprobs=[[-0.5, -1.5]], observed=None)
    assert certificate(None, [-0.5], forced)["certificate"] == "not comparable"
    assert certificate([[[4, -0.5], [5, -1.5]]], [-0.5], forced)["certificate"] == "bit-exact"


@pytest.mark.slow
@pytest.mark.skipif(__import__("os").environ.get("REPLAYLIB_SLOW") != "1", reason="set REPLAYLIB_SLOW=1")
def test_generate_s_rollouts_on_the_embedded_model_are_within_arithmetic():
    """The embedded model (bf16, CPU): two 40-token rollouts of plain generate(), top-5 from log_softmax of its
    output_logits and per-token logprobs at T, against the engine's forced decode of the same model object."""
    from replaylib.measure.engine_hf import HFEngine
    from replaylib.measure.models import resolve_model
    engine = HFEngine(resolve_model("embedded:qwen2.5-coder-0.5b-instruct"), "cpu", "bfloat16")
    prompt = engine.prompt_ids("Tom has 3 apples and buys 4 more. How many apples does he have?",
                               "\nPlease reason step by step, and put your final answer within \\boxed{}.")
    torch.manual_seed(0)
    out = engine.model.generate(torch.tensor([prompt] * 2), attention_mask=torch.ones(2, len(prompt), dtype=torch.long),
                                do_sample=True, temperature=T, top_p=1.0, top_k=0, max_new_tokens=40,
                                output_logits=True, return_dict_in_generate=True, pad_token_id=engine.pad_id)
    responses = [out.sequences[b, len(prompt):].tolist() for b in range(2)]
    trunks, _ = engine.force_trunks(prompt, responses, 5, observe=Observer(5, T))
    for b, trunk in enumerate(trunks):
        steps = [step[b].float() for step in out.logits]
        top = [[[int(i), float(v)] for v, i in zip(*torch.log_softmax(lg, dim=-1).topk(5))] for lg in steps]
        per_token = [float(torch.log_softmax(lg / T, dim=-1)[t]) for lg, t in zip(steps, responses[b])]
        assert certificate(top, None, trunk)["certificate"] in ("bit-exact", "within arithmetic")
        assert certificate(None, per_token, trunk)["certificate"] in ("bit-exact", "within arithmetic")
