"""Forcing a batch as transformers' generate sampled it (forcing "batch"): two prompts of different lengths
sampled together in one left-padded batch on the tiny model, rows finishing at different steps; every rollout
of both prompts certified bit-exact over its whole response, where forcing each prompt's rollouts alone
(forcing "groups") does not reproduce the padded prompt's rows."""
import pandas as pd
import pytest
import torch
from test_credit import FAST, PROMPT
from transformers import LogitsProcessor, LogitsProcessorList

from replaylib.credit import Estimator
from replaylib.credit.inputs import BadInput

T = 0.7
SHORT_PROMPT = [1, 88, 301, 45, 12]
GENERATIONS = 4
ENDS = {1: 4, 6: 7}  # row -> the step at which it samples EOS (the others run to max_new_tokens)


class EndsEarly(LogitsProcessor):
    """Makes EOS the only choice of some rows at given steps, so that rows finish at different steps. It runs
    after generate takes the raw logits its output_logits returns: the recorded logprobs are the model's."""

    def __init__(self, eos: int, prompt_width: int, ends: dict):
        self.eos, self.prompt_width, self.ends = eos, prompt_width, ends

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_width
        scores = scores.clone()  # generate's raw logits are this very tensor
        for row, at in self.ends.items():
            if step == at:
                scores[row] = -torch.inf
                scores[row, self.eos] = 0.0
        return scores


def sampled_batch(engine, pad_to: int | None, max_new: int = 10, prompts=(PROMPT, SHORT_PROMPT), ends=ENDS) -> dict:
    """Two prompts x GENERATIONS rows sampled by generate in one left-padded batch (its width a multiple of
    pad_to where given, as TRL's pad_to_multiple_of pads), on the engine's own model, as TRL's HF path samples:
    the batch in TRL's tensors, each row's completion cut after its EOS, and the sampled tokens' logprobs at T
    from generate's raw logits."""
    prompts = [list(p) for p in prompts for _ in range(GENERATIONS)]
    width = max(map(len, prompts))
    if pad_to:
        width = -(-width // pad_to) * pad_to
    pad, eos = engine.pad_id, engine.model.generation_config.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(3)
    out = engine.model.generate(ids, attention_mask=mask, do_sample=True, temperature=T, top_k=0, top_p=1.0,
                                max_new_tokens=max_new, output_logits=True, return_dict_in_generate=True,
                                pad_token_id=pad, logits_processor=LogitsProcessorList([EndsEarly(eos, width, ends)]))
    completions, logprobs = [], []
    for b in range(len(prompts)):
        row = out.sequences[b, width:].tolist()
        row = row[:row.index(eos) + 1] if eos in row else row
        completions.append(row)
        logprobs.append([float(torch.log_softmax(step[b] / T, dim=-1)[t]) for step, t in zip(out.logits, row)])
    assert {len(c) for c in completions} == {at + 1 for at in ends.values()} | {max_new}
    longest = max(map(len, completions))
    return {"prompt_ids": ids, "prompt_mask": mask,
            "completion_ids": torch.tensor([c + [pad] * (longest - len(c)) for c in completions]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (longest - len(c)) for c in completions]),
            "sampling_per_token_logps": torch.tensor([lp + [0.0] * (longest - len(lp)) for lp in logprobs]),
            "id": [f"p{b // GENERATIONS}#{b % GENERATIONS}" for b in range(len(prompts))],
            "answer": ["7"] * len(prompts)}


def certificates(engine, batch, forcing: str) -> dict:
    """Each rollout's certificate (on its pivots' rows), with a pivot at every rollout's first position."""
    estimator = Estimator(engine=engine, grader="gsm8k", forcing=forcing, logprobs_temperature=T,
                          **{**FAST, "passes": ["resume"]})
    batch = {**batch, "positions": [[0]] * len(batch["id"])}
    frame = estimator(batch)
    assert sorted(set(frame.id)) == sorted(batch["id"])
    return {rid: ",".join(sorted(set(frame.certificate[frame.id == rid]))) for rid in batch["id"]}


def shown(found: dict) -> str:
    return "; ".join(f"{rid} {cert}" for rid, cert in found.items())


@pytest.mark.parametrize("pad_to", [None, 16])
def test_a_two_prompt_left_padded_generate_batch_is_bit_exact_when_forced_as_sampled(tiny_engine, pad_to):
    """Every rollout of both prompts bit-exact over its whole response: the prompts left-padded to the batch's
    width (pad_to_multiple_of's included), finished rows kept in the batch fed pad tokens."""
    batch = sampled_batch(tiny_engine, pad_to)
    found = certificates(tiny_engine, batch, "batch")
    assert set(found.values()) == {"bit-exact"}, shown(found)


def test_forcing_each_prompt_alone_does_not_reproduce_a_padded_batch(tiny_engine):
    """The short prompt's rows were decoded padded beside the longer prompt's: forced alone, unpadded, their
    numbers differ."""
    found = certificates(tiny_engine, sampled_batch(tiny_engine, None), "groups")
    assert "differs" in {c for rid, c in found.items() if rid.startswith("p1")}, shown(found)


def test_one_prompt_whose_rows_end_together_gives_the_same_rows_forced_either_way(tiny_engine):
    """Nothing padded and no row finished early: the batch is the prompt's group, and every column of every
    pivot (the passes' continuations included) is the same under both forcings."""
    batch = {**sampled_batch(tiny_engine, None, prompts=(PROMPT,), ends={}), "positions": [[0, 3]] * GENERATIONS}
    frames = [Estimator(engine=tiny_engine, grader="gsm8k", forcing=forcing, logprobs_temperature=T, **FAST)(batch)
              for forcing in ("groups", "batch")]
    assert len(frames[0]) == 2 * GENERATIONS and set(frames[0].certificate) == {"bit-exact"}
    pd.testing.assert_frame_equal(frames[0], frames[1])


def test_forcing_a_batch_needs_the_sampler_s_batch_and_left_padding(tiny_engine, tmp_path):
    batch = sampled_batch(tiny_engine, None, max_new=8)
    estimator = Estimator(engine=tiny_engine, grader="gsm8k", forcing="batch", **FAST)
    with pytest.raises(BadInput, match="not a file"):
        estimator(tmp_path / "rollouts.jsonl")
    right = {**batch, "prompt_mask": batch["prompt_mask"].flip(1), "prompt_ids": batch["prompt_ids"].flip(1)}
    with pytest.raises(BadInput, match=r"batch:5: field 'prompt_mask' pads the prompt elsewhere than on the left"):
        estimator(right)
    with pytest.raises(BadInput, match="forcing 'sampled': choose groups or batch"):
        Estimator(engine=tiny_engine, grader="gsm8k", forcing="sampled")
