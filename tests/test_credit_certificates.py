"""Certificates a trainer's logs can pass: rollouts sampled with plain ``model.generate()`` on the tiny model,
their top-5 taken with log_softmax and their per-token logprobs at the sampling temperature (TRL's field
names), are bit-exact or within float32 arithmetic of the forced decode; perturbed ones differ. And the
arithmetic bound itself, on logits of a real vocabulary's size."""
import json
from types import SimpleNamespace

import numpy as np
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


def realistic_logits(vocab: int, seed: int) -> torch.Tensor:
    """One position's logits as a model's are: bf16 values, N(0, 3^2) with a few far above the rest."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=g) * 3
    logits[torch.randint(0, vocab, (4,), generator=g)] += torch.tensor([18.0, 15.0, 14.0, 12.0])
    return logits.to(torch.bfloat16).float()


def honest_log_softmaxes(z: torch.Tensor) -> dict:
    """float32 log softmax of z computed as frameworks do, each summing the exponentials in its own order."""
    zn = z.numpy()
    m = zn.max()
    exps = np.exp(zn - m)
    perm = torch.randperm(len(z), generator=torch.Generator().manual_seed(len(z)))
    permuted = torch.empty_like(z)
    permuted[perm] = torch.log_softmax(z[perm], dim=-1)
    return {"torch log_softmax (8 lanes)": torch.log_softmax(z, dim=-1).numpy(),
            "z - torch.logsumexp (cascade)": (z - torch.logsumexp(z, dim=-1)).numpy(),
            "numpy (pairwise)": zn - m - np.log(np.sum(exps, dtype=np.float32)),
            "numpy, 64 strided chains": zn - m - np.log(exps.reshape(-1, 64).sum(axis=0).sum(dtype=np.float32)),
            "torch log_softmax, permuted vocabulary": permuted.numpy()}


def one_position(logits: torch.Tensor, token: int, temperature: float):
    """A forced decode of one position: its trunk (top-5 as the engine takes it, and what the observer keeps)."""
    seen = Observer(5, temperature)(logits[None], [token])
    values, ids = logits.topk(5)
    return SimpleNamespace(topk_ids=[ids.tolist()], topk_logprobs=[(values - torch.logsumexp(logits, -1)).tolist()],
                           observed=seen)


@pytest.mark.parametrize("vocab", [151936, 262144])
def test_honest_float32_log_softmaxes_are_within_the_bound_on_real_vocabularies(vocab):
    """Per-token logprobs at T 1 and 0.7 and top-5s, from float32 log softmaxes that sum in different orders,
    over many logit vectors: every certificate bit-exact or within arithmetic."""
    used = []
    for seed in range(12):
        logits = realistic_logits(vocab, seed)
        tokens = [int(logits.argmax()), int(torch.randint(0, vocab, (1,), generator=torch.Generator().manual_seed(seed)))]
        for temperature in (1.0, 0.7):
            for name, logprobs in honest_log_softmaxes(logits / temperature).items():
                for token in tokens:
                    cert = certificate(None, [float(logprobs[token])], one_position(logits, token, temperature))
                    assert cert["certificate"] in ("bit-exact", "within arithmetic"), (name, seed, token, cert)
                    used.append(cert["certificate_bound_used"])
                if temperature == 1.0:
                    trunk = one_position(logits, tokens[0], 1.0)
                    top = [[[i, float(logprobs[i])] for i in trunk.topk_ids[0]]]
                    cert = certificate(top, None, trunk)
                    assert cert["certificate"] in ("bit-exact", "within arithmetic"), (name, seed, cert)
                    used.append(cert["certificate_bound_used"])
    print(f"V {vocab}: the largest share of the bound used {max(used):.3f}")


@pytest.mark.parametrize("off", [0.016, 1e-3])
def test_a_logprob_off_by_a_thousandth_on_a_real_vocabulary_differs(off):
    """V = 151,936: a per-token logprob (at T 1 or 0.7) off by `off`, or a whole top-5 shifted by it (its
    midpoint, the shared normalizer's part), is beyond what float32 arithmetic does."""
    logits = realistic_logits(151936, 0)
    token = int(logits.argmax())
    for temperature in (1.0, 0.7):
        honest = float(torch.log_softmax(logits / temperature, dim=-1)[token])
        trunk = one_position(logits, token, temperature)
        assert certificate(None, [honest], trunk)["certificate"] == "bit-exact"
        assert certificate(None, [honest + off], trunk)["certificate"] == "differs"
        assert certificate(None, [honest - off], trunk)["certificate"] == "differs"
    trunk = one_position(logits, token, 1.0)
    shifted = [[[i, lp + off] for i, lp in zip(trunk.topk_ids[0], torch.log_softmax(logits, -1)[trunk.topk_ids[0]].tolist())]]
    assert certificate(shifted, None, trunk)["certificate"] == "differs"


def test_per_token_logprobs_without_the_engine_s_logits_are_not_comparable():
    forced = SimpleNamespace(topk_ids=[[4, 5]], topk_logprobs=[[-0.5, -1.5]], observed=None)
    assert certificate(None, [-0.5], forced)["certificate"] == "not comparable"
    assert certificate([[[4, -0.5], [5, -1.5]]], [-0.5], forced)["certificate"] == "bit-exact"


def test_entries_tied_at_the_top_k_s_lowest_value_may_differ_by_id_but_nothing_else_may():
    """bfloat16 logits tie often: the sampler's top-3 holds id 7 of two entries at -2.0, the forced decode's first
    three hold id 8. Its wider top-k finds id 7 at -2.0 as recorded: bit-exact. An entry it ranks above the
    recorded ones' lowest that was not recorded, a recorded one it does not hold, or a tied value a bit lower, differ."""
    forced = SimpleNamespace(topk_ids=[[4, 5, 8, 7, 9]], topk_logprobs=[[-0.5, -1.5, -2.0, -2.0, -3.0]], observed=None,
                             token_logprobs=[-0.5])
    recorded = [[[4, -0.5], [5, -1.5], [7, -2.0]]]
    assert certificate(recorded, [-0.5], forced)["certificate"] == "bit-exact"
    assert certificate(recorded, [-0.5], forced)["certificate_first_diff"] is None
    above = SimpleNamespace(**{**vars(forced), "topk_logprobs": [[-0.5, -1.5, -1.75, -2.0, -3.0]]})
    assert certificate(recorded, [-0.5], above)["certificate"] == "differs"
    assert certificate([[[4, -0.5], [5, -1.5], [6, -2.0]]], [-0.5], forced)["certificate"] == "differs"
    lower = SimpleNamespace(**{**vars(forced), "topk_logprobs": [[-0.5, -1.5, -2.0, -2.0001, -3.0]]})
    assert certificate(recorded, [-0.5], lower)["certificate"] == "differs"


def test_a_certificate_names_the_first_position_whose_numbers_differ():
    """Three positions, equal at the first, the token's own logprob off at the second, a top-k entry at the third."""
    forced = SimpleNamespace(topk_ids=[[4, 5]] * 3, topk_logprobs=[[-0.5, -1.5]] * 3, observed=None,
                             token_logprobs=[-0.5] * 3)
    top = [[[4, -0.5], [5, -1.5]]] * 3
    assert certificate(top, [-0.5] * 3, forced)["certificate_first_diff"] is None
    assert certificate(top, [-0.5, -0.25, -0.5], forced)["certificate_first_diff"] == 1
    assert certificate(top[:2] + [[[4, -0.5], [5, -1.25]]], [-0.5] * 3, forced)["certificate_first_diff"] == 2


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
