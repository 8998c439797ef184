"""Credit inside a training loop: an estimator loaded once and called per batch (TRL tensors, a verl DataProto,
a trainer's model in memory), writing nothing, within a time budget when given one, each warning said once; the
one-shot estimate(); a caller's vLLM engine refused in one line when it cannot force. TRL's GRPOTrainer with the
credit callback: tests/test_credit_trl.py."""
import json
import logging
import re
import tempfile
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from test_credit import FAST, PROMPT, sampled_rollouts

from replaylib import credit
from replaylib.credit.calibration import Cost
from replaylib.credit.estimator import Estimator
from replaylib.credit.inputs import BadInput

PAD = 0


def trl_batch(rows: list[dict]) -> dict:
    """Rollouts as TRL holds a step's: prompts left-padded, completions right-padded, with masks, and the
    dataset's answer column."""
    width_p = max(len(r["prompt_ids"]) for r in rows)
    width_c = max(len(r["response_ids"]) for r in rows)
    prompt = [[PAD] * (width_p - len(r["prompt_ids"])) + r["prompt_ids"] for r in rows]
    completion = [r["response_ids"] + [PAD] * (width_c - len(r["response_ids"])) for r in rows]
    return {"prompt_ids": torch.tensor(prompt), "completion_ids": torch.tensor(completion),
            "prompt_mask": torch.tensor([[0] * (width_p - len(r["prompt_ids"])) + [1] * len(r["prompt_ids"])
                                         for r in rows]),
            "completion_mask": torch.tensor([[1] * len(r["response_ids"]) + [0] * (width_c - len(r["response_ids"]))
                                             for r in rows]),
            "answer": [r["ground_truth"] for r in rows]}


def reward(prompts, completions, answer, **kwargs) -> list[float]:
    """A TRL reward function: 1 where the completion holds the answer."""
    return [float(a in c) for c, a in zip(completions, answer)]


@pytest.fixture(scope="module")
def rows(tiny_engine):
    return sampled_rollouts(tiny_engine, n=2, max_new=8) + sampled_rollouts(tiny_engine, n=2, max_new=8,
                                                                            prompt=PROMPT[:6], tag="s")


def test_an_estimator_loads_once_and_estimates_batch_after_batch_writing_nothing(rows, tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    from replaylib.measure import engine_hf
    loads = []
    real = engine_hf.HFEngine.from_params.__func__
    monkeypatch.setattr(engine_hf.HFEngine, "from_params",
                        classmethod(lambda cls, *a, **k: loads.append(1) or real(cls, *a, **k)))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.chdir(tmp_path)
    with Estimator(model=tiny_model_dir, grader=reward, **FAST) as estimator:
        first = estimator(trl_batch(rows))
        again = estimator(trl_batch(rows))
        metrics = estimator.metrics()
    assert loads == [1]  # one engine for every batch
    assert len(first) > 0 and {"A_resume", "A_replica", "A_refeed", "certificate"} <= set(first.columns)
    pd.testing.assert_frame_equal(first, again)
    assert set(first["id"]) <= {"0", "1", "2", "3"} and set(first["certificate"]) == {"not recorded"}
    assert metrics["credit/pivots"] == len(first) and all(isinstance(v, float) for v in metrics.values())
    lengths = [len(c) for name in ("resume", "replica", "refeed") for text in first[f"continuations_{name}"]
               for arm in json.loads(text).values() for c in arm]
    assert metrics["credit/continuations_cut"] == sum(n >= FAST["max_cont_tokens"] for n in lengths) / len(lengths)
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no file


def test_an_estimator_takes_the_rollouts_its_budget_fits_logs_its_estimate_and_warns_once(rows, tiny_model_dir,
                                                                                         caplog):
    """A budget takes the rollouts in order while their estimated cost fits (a fake calibration here: 1 s of
    passes a pivot, 2 pivots and 3 passes a rollout, 6 s); the estimate is logged before the groups run; a
    warning of a later batch that only repeats one already said is not said again."""
    with Estimator(model=tiny_model_dir, grader=reward, **FAST) as estimator, \
            caplog.at_level(logging.INFO, logger="replaylib"):
        estimator.cost = Cost(estimator.settings, {"forced": (0.0, 0.0), "pass": (1.0, 0.0), "pivots": 1})
        two = estimator(trl_batch(rows), budget_s=15.0)
        assert estimator.summary["rollouts"] == 2 and estimator.summary["rollouts_given"] == 4
        assert set(two["id"]) <= {"0", "1"} and len(two) > 0
        assert "credit: 2 of 4 rollouts (1 prompt groups) in a budget of" in caplog.text
        assert "about 12.00 s (from a calibration on the first group" in caplog.text
        none = estimator(trl_batch(rows), budget_s=0.0)
        assert len(none) == 0 and estimator.metrics()["credit/rollouts"] == 0.0
        assert "fits no rollout of this batch" in caplog.text
        estimator(trl_batch(rows))
        assert estimator.summary["rollouts"] == 4 and "(from the groups measured so far (1))" in caplog.text
        estimator(trl_batch(rows))
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert estimator.summary["warnings"]  # the last batch's, each said once over the four batches
    def numbers_out(text: str) -> str:
        return re.sub(r"\d+(\.\d+)?", "#", text)

    for line in estimator.summary["warnings"]:
        assert [numbers_out(s) for s in said].count(numbers_out(f"warning: {line}")) == 1, (line, said)


def test_an_estimator_s_lines_name_its_keywords_not_the_command_s_flags(rows, tiny_model_dir, caplog):
    """A trainer's logs say 'raise max_cont_tokens', not 'raise --max-cont-tokens': the Estimator takes keywords."""
    with pytest.raises(BadInput, match="^Estimator: max_cont_tokens=0: must be at least 1$"):
        Estimator(model=tiny_model_dir, grader=reward, **{**FAST, "max_cont_tokens": 0})
    with Estimator(model=tiny_model_dir, grader=reward, **FAST) as estimator, \
            caplog.at_level(logging.INFO, logger="replaylib"):
        estimator(trl_batch(rows))
        estimator(trl_batch(rows))
    said = [r.getMessage() for r in caplog.records]
    estimates = [line for line in said if line.startswith("credit: 4 rollouts")]
    assert len(estimates) == 2 and re.search(r"; the calibration took \d+\.\d\d s\)$", estimates[0]), estimates
    assert "calibration took" not in estimates[1]  # only the call that calibrated says so
    assert any("max_cont_tokens=6" in line for line in said), said  # continuations cut at 6 tokens
    assert not [line for line in said if "--" in line], said
    from replaylib.credit.estimator import as_keywords  # a path's own dashes left as they are
    assert as_keywords("/tmp/run--x/a.jsonl:1: lower --max-cont-tokens/--probe-tokens to at most 144") == \
        "/tmp/run--x/a.jsonl:1: lower max_cont_tokens/probe_tokens to at most 144"


def test_a_prudent_estimator_measures_one_rollout_until_a_measured_group_has_scaled_its_price(rows, tiny_model_dir):
    """Lease 20: priced by the calibration alone, 7 rollouts fitted a budget of 1.37 s and took 11.2 s. A prudent
    estimator (CreditCallback's) takes one rollout while no measured group has scaled the price (the fake
    calibration of the test above: 6 s a rollout), then what the budget fits."""
    with Estimator(model=tiny_model_dir, grader=reward, **FAST) as estimator:
        estimator.prudent = True
        estimator.cost = Cost(estimator.settings, {"forced": (0.0, 0.0), "pass": (1.0, 0.0), "pivots": 1})
        estimator(trl_batch(rows), budget_s=15.0)
        assert estimator.summary["rollouts"] == 1 and estimator.cost.groups == 1
        estimator.cost.took = estimator.cost.estimated  # as if the group took what it was priced at
        estimator(trl_batch(rows), budget_s=15.0)
        assert estimator.summary["rollouts"] == 2


def test_estimate_on_a_trl_batch_with_a_trl_reward_function_returns_a_per_pass(rows, tiny_model_dir, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    frame = credit.estimate(trl_batch(rows), model=tiny_model_dir, grader=reward, **FAST)
    assert len(frame) > 0 and frame[["A_resume", "A_replica", "A_refeed"]].notna().all().all()
    assert not list(tmp_path.iterdir())  # no temporary directory left, none made


def test_a_trainer_s_model_in_memory_gives_the_rows_of_the_same_weights_loaded(rows, tiny_model_dir):
    """The estimator runs the trainer's model as it is (eval mode while it runs, its training mode restored,
    nothing in it swapped) and gets the rows the same weights loaded from their files give."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    live = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    live.train()
    kinds = [type(m).__name__ for m in live.modules()]
    weights = {k: v.clone() for k, v in live.state_dict().items()}
    settings = dict(grader="gsm8k", **FAST)
    mine = credit.estimate(rows, model=live, tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir), **settings)
    loaded = credit.estimate(rows, model=tiny_model_dir, dtype="float32", **settings)
    assert live.training and [type(m).__name__ for m in live.modules()] == kinds
    assert all(torch.equal(v, live.state_dict()[k]) for k, v in weights.items())
    columns = [c for c in loaded.columns if c.startswith(("A_", "continuations_", "wins_"))] + ["position", "id"]
    pd.testing.assert_frame_equal(mine[columns], loaded[columns])


class TensorDictLike(dict):
    """What verl's DataProto.batch offers: keys() and a tensor per key."""


def test_a_verl_dataproto_batch_with_its_extra_info_reaches_the_grader(rows, tiny_model_dir):
    """verl's shape (docs/credit.md): prompts left-padded, responses right-padded, one attention mask over both,
    non_tensor_batch with data_source, reward_model and extra_info; compute_score receives each row's
    extra_info."""
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, extra_info["index"]))
        return float(ground_truth in solution_str)

    batch = trl_batch(rows)
    proto = SimpleNamespace(
        batch=TensorDictLike(prompts=batch["prompt_ids"], responses=batch["completion_ids"],
                             attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)),
        non_tensor_batch={"data_source": np.array(["openai/gsm8k"] * len(rows), dtype=object),
                          "reward_model": np.array([{"ground_truth": r["ground_truth"], "style": "rule"} for r in rows],
                                                   dtype=object),
                          "extra_info": np.array([{"index": i, "split": "train"} for i in range(len(rows))],
                                                 dtype=object),
                          "uid": np.array(["a", "a", "b", "b"], dtype=object)})
    frame = credit.estimate(proto, model=tiny_model_dir, grader=compute_score, **FAST)
    assert set(frame["id"]) <= {"a-0", "a-1", "b-0", "b-1"} and len(frame) > 0
    assert {source for source, _ in seen} == {"openai/gsm8k"} and {i for _, i in seen} <= {0, 1, 2, 3}
    assert len({i for _, i in seen}) > 1  # each row's own extra_info


def test_a_vllm_engine_built_without_the_forcing_settings_is_refused_in_one_line():
    from replaylib.measure.engine import EngineUnavailable
    from replaylib.measure.vllm_given import engine_around, llm_settings, missing_settings
    model_config = SimpleNamespace(logits_processors=None, logprobs_mode="processed_logprobs", model="m")
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=model_config, log_stats=True, vllm_config=SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=True))))
    with pytest.raises(EngineUnavailable) as e:
        engine_around(llm)
    assert "built without logits_processors=" in str(e.value) and "logprobs_mode='raw_logprobs'" in str(e.value)
    assert "\n" not in str(e.value)
    model_config.logits_processors, model_config.logprobs_mode = llm_settings()["logits_processors"], "raw_logprobs"
    assert missing_settings(llm) == []
    # vLLM's default: no stats, so no preemption count, and no resume could be verified
    llm.llm_engine.log_stats = False
    assert missing_settings(llm) == ["disable_log_stats=False"]
    assert llm_settings()["disable_log_stats"] is False


def test_the_estimator_is_where_the_docs_call_it():
    from replaylib.credit import Estimator as imported
    assert credit.Estimator is imported is Estimator


def test_an_estimator_takes_one_model_and_a_model_in_memory_needs_its_tokenizer(tiny_model_dir):
    with pytest.raises(BadInput, match="give one of model"):
        Estimator(grader="gsm8k")
    with pytest.raises(BadInput, match="needs its tokenizer"):
        Estimator(model=torch.nn.Linear(2, 2), grader="gsm8k")


def test_the_tool_s_vllm_engine_has_a_fixed_kv_cache_unless_told_otherwise():
    """A fixed cache: the engine starts beside others on a GPU without profiling its free memory."""
    from replaylib.credit.tool import Settings
    from replaylib.measure.vllm_setup import engine_identity
    settings = Settings(model="m", grader="gsm8k", engine="vllm", device="cuda")
    assert settings.params().kv_cache_gib == 4.0 and engine_identity(settings.params())["kv_cache_gib"] == 4.0
    assert Settings(model="m", grader="gsm8k", kv_cache_gib=0).params().kv_cache_gib == 0
    with pytest.raises(BadInput, match=r"^--kv-cache-gib -1"):
        Settings(model="m", grader="gsm8k", kv_cache_gib=-1).check()


def test_a_grader_holding_what_cannot_be_copied_is_named_in_the_summary(rows, tiny_engine):
    """A grader object that holds a trainer (TRL's reward around GRPOTrainer, whose vLLM engine holds queues) is
    shown by its name: the summary copies no grader."""
    import queue

    class Reward:
        def __init__(self):
            self.engine_queue = queue.SimpleQueue()  # as vLLM's engine holds: it cannot be copied or pickled

        def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
            return float(ground_truth in solution_str)

    estimator = Estimator(engine=tiny_engine, grader=Reward(), **FAST)
    frame = estimator(rows)
    assert len(frame) and estimator.summary["settings"]["grader"] == "Reward"
    assert estimator.summary["settings"]["k"] == FAST["k"]
