"""Batches as trainers hold them, read as the credit tool's rollouts in memory: TRL's prompt_ids/prompt_mask
(left-padded) and completion_ids/completion_mask (right-padded) as torch tensors or numpy arrays, verl's
DataProto (prompts/responses/attention_mask with non_tensor_batch's data_source, reward_model, extra_info),
a list of dicts; errors name the row."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from replaylib.credit.batches import read_input, rollout_dicts
from replaylib.credit.inputs import BadInput

VOCAB = 600
PAD = 0


def trl_batch(to=torch.tensor):
    """Two rows: prompts [5, 6, 7] and [8, 9] left-padded to 3, completions [10, 11] and [12, 13, 14]
    right-padded to 3, with TRL's per-token logprobs padded alike."""
    return {"prompt_ids": to([[5, 6, 7], [PAD, 8, 9]]), "prompt_mask": to([[1, 1, 1], [0, 1, 1]]),
            "completion_ids": to([[10, 11, PAD], [12, 13, 14]]), "completion_mask": to([[1, 1, 0], [1, 1, 1]]),
            "sampling_per_token_logps": to([[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]),
            "answer": ["72", "18"], "num_items_in_batch": to(5)}


@pytest.mark.parametrize("to", [torch.tensor, np.array], ids=["torch", "numpy"])
def test_a_trl_batch_of_tensors_is_its_rows_without_padding(to):
    source, (a, b) = read_input(trl_batch(to), VOCAB)
    assert source == "batch" and (a.line, b.line) == (1, 2) and (a.id, b.id) == ("0", "1")
    assert (a.prompt_ids, a.response_ids, a.ground_truth, a.logprobs) == ([5, 6, 7], [10, 11], "72", [-0.5, -0.25])
    assert (b.prompt_ids, b.response_ids, b.ground_truth, b.logprobs) == ([8, 9], [12, 13, 14], "18", [-1, -2, -3])
    assert a.ground_truth_name == "answer" and a.columns == {}  # the batch-level scalar is no column


class TensorDictLike(dict):
    """What verl's DataProto.batch offers the adapter: keys() and a tensor per key."""


def test_a_verl_dataproto_is_its_rows_with_ground_truth_and_extra_info():
    proto = SimpleNamespace(
        batch=TensorDictLike(prompts=torch.tensor([[PAD, 5, 6], [7, 8, 9]]),
                             responses=torch.tensor([[10, PAD, PAD], [11, 12, PAD]]),
                             attention_mask=torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]),
                             input_ids=torch.zeros(2, 6, dtype=torch.long)),
        non_tensor_batch={"data_source": np.array(["openai/gsm8k", "openai/gsm8k"], dtype=object),
                          "reward_model": np.array([{"ground_truth": "72", "style": "rule"},
                                                    {"ground_truth": "18", "style": "rule"}], dtype=object),
                          "extra_info": np.array([{"index": np.int64(3), "split": "train"},
                                                  {"index": np.int64(4), "split": "train"}], dtype=object),
                          "uid": np.array(["u7", "u7"], dtype=object)})
    _, (a, b) = read_input(proto, VOCAB)
    assert (a.prompt_ids, a.response_ids, b.prompt_ids, b.response_ids) == ([5, 6], [10], [7, 8, 9], [11, 12])
    assert (a.ground_truth, a.data_source, a.extra_info) == ("72", "openai/gsm8k", {"index": 3, "split": "train"})
    assert (a.id, b.id) == ("u7-0", "u7-1") and type(a.extra_info["index"]) is int
    assert "input_ids" not in a.columns  # derived tensors are not read


def test_a_list_of_dicts_with_tensor_values_and_bad_rows_named():
    rows = [{"id": "x", "prompt_ids": torch.tensor([5, 6]), "response_ids": np.array([7, 8]), "ground_truth": "1"}]
    assert read_input(rows, VOCAB)[1][0].response_ids == [7, 8]
    bad = trl_batch()
    bad["completion_mask"] = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    with pytest.raises(BadInput, match=r"^batch:1: field 'completion_mask' does not match the response's tokens"):
        read_input(bad, VOCAB)
    short = dict(trl_batch(), answer=["72"])
    with pytest.raises(BadInput, match="column 'answer' has 1 rows where others have 2"):
        rollout_dicts(short)
    with pytest.raises(BadInput, match="give a JSONL path, a list of rollout dicts"):
        read_input(42, VOCAB)


def verl_proto(**tensors):
    return SimpleNamespace(batch=TensorDictLike(**tensors), non_tensor_batch={
        "reward_model": np.array([{"ground_truth": "72"}, {"ground_truth": "18"}], dtype=object)})


@pytest.mark.parametrize("batch, named", [
    (verl_proto(prompts=torch.tensor([[PAD, 5, 6], [7, 8, 9]]), responses=torch.tensor([[10, PAD], [11, 12]])),
     "batch: column 'prompts' is a padded 2-D batch without 'attention_mask', so its padding would be read as "
     "tokens; give 'attention_mask'"),
    ({k: v for k, v in trl_batch().items() if k != "completion_mask"},
     "batch: column 'completion_ids' is a padded 2-D batch without 'completion_mask', so its padding would be read "
     "as tokens; give 'completion_mask'"),
    ({k: v for k, v in trl_batch(np.array).items() if k != "prompt_mask"},
     "batch: column 'prompt_ids' is a padded 2-D batch without 'prompt_mask'"),
])
def test_a_padded_batch_without_its_masks_is_refused_not_read_with_its_padding(batch, named):
    with pytest.raises(BadInput) as e:
        read_input(batch, VOCAB)
    assert str(e.value).startswith(named) and "\n" not in str(e.value), e.value


def test_an_all_zero_mask_or_a_1d_token_column_names_the_column_and_the_row():
    zero = dict(trl_batch(), completion_mask=torch.tensor([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(BadInput, match=r"^batch:2: field 'completion_mask' is 0 at every one of the response's 3 "
                                       r"tokens, leaving no response; leave the rollout out or fix its mask$"):
        read_input(zero, VOCAB)
    proto = verl_proto(prompts=torch.tensor([[5, 6], [7, 8]]), responses=torch.tensor([[10, 11], [12, 13]]),
                       attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(BadInput, match=r"^batch:1: field 'attention_mask' is 0 at every one of the prompt's 2 tokens"):
        read_input(proto, VOCAB)
    flat = dict(trl_batch(), completion_ids=torch.tensor([10, 11]))  # one completion, not given as a row
    with pytest.raises(BadInput, match=r"^batch:1: column 'completion_ids' is 1-D \(2 token ids in all\), not rows "
                                       r"x tokens; give a 2-D tensor, one row per rollout \(ids\[None\] for a single "
                                       r"row\)"):
        read_input(flat, VOCAB)
