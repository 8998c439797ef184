"""Graders as trainers write them: verl's compute_score with the rollout's extra_info, TRL reward functions
(prompts, completions, **columns), OpenRLHF-style reward_func(queries, prompts, labels), each told from its
parameters or named; the gsm8k grader on GSM8K's own answer column ("... #### 18")."""
import json
from pathlib import Path

import pytest
from test_credit import FAST, sampled_rollouts, write

from replaylib.credit import cli, graders
from replaylib.credit.inputs import parse_record
from replaylib.credit.tool import Settings, run

REPO = Path(__file__).resolve().parents[1]
ROW = {"id": "a", "prompt_ids": [1, 345, 267, 201], "response_ids": [44, 279, 320], "ground_truth": "7"}


def rollout(**fields):
    return parse_record(dict(ROW, **fields), "f:1", 600)


def test_verl_s_compute_score_gets_the_rollout_s_extra_info():
    grade = graders.Grader("tests.credit_grader:needs_extra_info", 0.0)
    assert grade.kind == "verl"
    assert grade("x", rollout(extra_info={"index": 4, "split": "test"})) == 1
    assert grade("x", rollout(extra_info={"index": 3, "split": "test"})) == 0


def test_extra_info_reaches_the_grader_through_a_run(tiny_engine, tiny_model_dir, tmp_path, capsys):
    rows = [dict(r, extra_info={"index": i, "split": "test"}) for i, r in enumerate(sampled_rollouts(tiny_engine))]
    path = write(tmp_path / "r.jsonl", rows)
    assert cli.main([str(path), "--model", tiny_model_dir, "--grader", "tests.credit_grader:needs_extra_info",
                     "--out", str(tmp_path / "out"), "--k", "1", "--max-cont-tokens", "2", "--margin", "9",
                     "--max-pivots-per-rollout", "1"]) == 0, capsys.readouterr().err


def test_a_trl_reward_function_is_called_with_lists_and_the_dataset_s_columns():
    grade = graders.Grader("tests.credit_grader:trl_reward", 0.0, decode=lambda ids: "the question")
    assert grade.kind == "trl"
    row = dict(ROW, answer="7", difficulty="hard")
    del row["ground_truth"]
    r = parse_record(row, "f:1", 600)
    assert grade("so 7", r) == 1 and grade("so 8", r) == 0
    request = grade.request("so 7", r)
    assert request["prompt"] == "the question" and request["columns"] == {"difficulty": "hard"}


def test_an_openrlhf_reward_func_gets_queries_prompts_and_labels():
    grade = graders.Grader("tests.credit_grader:openrlhf_reward", 0.0, decode=lambda ids: "Q: 3 + 4?")
    assert grade.kind == "openrlhf"
    assert grade(" 7", rollout()) == 1 and grade(" 8", rollout()) == 0


def test_a_named_kind_overrides_the_parameters_and_a_bad_kind_is_one_line(tmp_path, capsys, tiny_model_dir):
    grade = graders.Grader("tests.credit_grader:odd_names", 0.0, kind="verl")
    assert grade("7", rollout()) == 1
    path = write(tmp_path / "r.jsonl", [ROW])
    with pytest.raises(SystemExit):  # argparse: not among the choices
        cli.main([str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--out", str(tmp_path / "o"),
                  "--grader-kind", "other"])
    with pytest.raises(ValueError, match="--grader-kind other: choose auto, verl, trl, openrlhf"):
        Settings(model="m", grader="gsm8k", grader_kind="other").check()


def test_the_gsm8k_grader_reads_gsm8k_s_own_answer_column():
    problem = json.loads((REPO / "data" / "gsm8k" / "test.jsonl").read_text().splitlines()[0])
    assert problem["answer"].endswith("#### 18")
    r = parse_record(dict({k: v for k, v in ROW.items() if k != "ground_truth"}, answer=problem["answer"]),
                     "f:1", 600)
    grade = graders.Grader("gsm8k", 0.0)
    assert grade("She makes 9 * 2 = $18 every day. The answer is \\boxed{18}.", r) == 1
    assert grade("The answer is \\boxed{17}.", r) == 0


def test_a_trl_batch_graded_by_a_trl_reward_function_gives_a_columns(tiny_engine, tiny_model_dir, tmp_path):
    torch = pytest.importorskip("torch")
    rows = sampled_rollouts(tiny_engine)
    width = max(len(r["response_ids"]) for r in rows)
    batch = {"prompt_ids": torch.tensor([r["prompt_ids"] for r in rows]),
             "prompt_mask": torch.ones(len(rows), len(rows[0]["prompt_ids"]), dtype=torch.long),
             "completion_ids": torch.tensor([r["response_ids"] + [0] * (width - len(r["response_ids"])) for r in rows]),
             "completion_mask": torch.tensor([[1] * len(r["response_ids"]) + [0] * (width - len(r["response_ids"]))
                                              for r in rows]),
             "answer": ["7"] * len(rows), "difficulty": ["easy"] * len(rows)}
    summary = run(batch, tmp_path / "out", Settings(model=tiny_model_dir, grader="tests.credit_grader:trl_reward",
                                                    **FAST), engine=tiny_engine)
    import pandas as pd
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert summary["pivots"] == len(frame) > 0 and {"A_resume", "A_replica", "A_refeed"} <= set(frame.columns)
    assert set(frame["id"]) == {"0", "1"}


def test_a_function_grader_with_an_out_is_recorded_by_its_name_or_refused_in_one_line(tiny_engine, tiny_model_dir,
                                                                                      tmp_path):
    import importlib

    from replaylib import credit
    from replaylib.credit.inputs import BadInput
    compute_score = importlib.import_module("tests.credit_grader").compute_score
    rows = sampled_rollouts(tiny_engine, n=1)
    frame = credit.estimate(rows, model=tiny_model_dir, grader=compute_score, out=tmp_path / "out",
                            engine=tiny_engine, **FAST)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["settings"]["grader"] == "tests.credit_grader:compute_score" and summary["pivots"] == len(frame)
    with pytest.raises(BadInput) as e:  # a lambda has no name to import it by
        credit.estimate(rows, model=tiny_model_dir, grader=lambda *args: 1.0, out=tmp_path / "out2",
                        engine=tiny_engine, **FAST)
    assert str(e.value).startswith("grader <lambda>: a function written to an output directory must be importable "
                                   "by its name") and "\n" not in str(e.value), e.value
    assert not (tmp_path / "out2").exists()


def test_a_grader_that_writes_reply_shaped_lines_to_low_descriptors_or_reads_stdin_does_not_shift_the_grades():
    grade = graders.Grader("tests.credit_grader:forges_replies", 0.0, timeout=20)
    assert [grade("x", rollout()) for _ in range(3)] == [0, 0, 0]
    assert grade.stats["printed_bytes"] > 0  # what it wrote to stdout and stderr was counted as printed


def test_an_in_process_grader_s_sys_exit_is_a_grader_failure_not_the_end_of_the_trainer(tiny_engine):
    import importlib

    from replaylib import credit
    from replaylib.credit.inputs import BadInput
    exits_3 = importlib.import_module("tests.credit_grader").exits_3
    with pytest.raises(graders.GraderFailed, match=r"^--grader exits_3 called sys.exit\(3\)$"):
        graders.Grader(exits_3, 0.0)("x", rollout())
    with pytest.raises(BadInput, match=r"^batch:1: field 'ground_truth': --grader exits_3 called sys.exit\(3\)$"):
        credit.estimate(sampled_rollouts(tiny_engine, n=1), grader=exits_3, engine=tiny_engine, **FAST)


def test_an_in_process_grader_s_timeout_holds_and_a_call_still_running_blocks_the_next():
    import importlib
    module = importlib.import_module("tests.credit_grader")
    grade = graders.Grader(module.waits_for_release, 0.0, timeout=0.5)
    try:
        with pytest.raises(graders.GraderFailed, match=r"^--grader waits_for_release took longer than 0.5 s grading "
                                                       r"\(it runs on in a thread of this process"):
            grade("x", rollout())
        with pytest.raises(graders.GraderFailed, match="is still running a call that took longer than 0.5 s"):
            grade("x", rollout())
    finally:
        module.RELEASE.set()


def test_an_in_process_grader_gets_its_own_copy_of_the_row_each_call():
    import importlib
    module = importlib.import_module("tests.credit_grader")
    r = rollout(extra_info={"index": 4, "tags": ["a"]}, difficulty=["hard"])
    verl = graders.Grader(module.edits_its_arguments, 0.0)
    assert [verl("x", r) for _ in range(3)] == [1, 1, 1]
    trl = graders.Grader(module.trl_edits_its_columns, 0.0, decode=lambda ids: "")
    assert [trl("7", r) for _ in range(3)] == [1, 1, 1]
    assert r.extra_info == {"index": 4, "tags": ["a"]} and r.columns == {"difficulty": ["hard"]}


def test_an_in_process_grader_that_installs_signal_handlers_is_called_in_the_caller_s_thread():
    import importlib
    grade = graders.Grader(importlib.import_module("tests.credit_grader").sets_an_alarm_handler, 0.0)
    assert [grade("x", rollout()) for _ in range(2)] == [1, 1]
