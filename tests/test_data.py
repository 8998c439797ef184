import json

import pytest

from replaylib.core.files import sha256_file
from replaylib.core.paths import REPO as REPO_ROOT
from replaylib.measure.data import Problem, load_problems

GSM8K_TEST_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
MATH500_SHA256 = "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"


def test_gsm8k_test_split():
    problems = load_problems("gsm8k")
    assert len(problems) == 1319
    assert [p.problem_id for p in problems] == list(range(1319))
    first = problems[0]
    assert first.question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert (first.gold, first.task) == ("18", "gsm8k")
    assert problems[1].gold == "3"
    assert problems[2].gold == "70000"
    assert problems[146].gold == "2125"  # "#### 2,125" in the file
    assert problems[611].gold == "1450000"  # "#### 1,450,000"
    assert problems[489].gold == "-10"
    assert all("," not in p.gold for p in problems)


def test_gsm8k_train_split_via_path():
    problems = load_problems("gsm8k", REPO_ROOT / "data" / "gsm8k" / "train.jsonl")
    assert len(problems) == 7473
    assert problems[345].gold == "1080"  # "#### 1,080"


def test_math500():
    problems = load_problems("math500")
    assert len(problems) == 500
    first = problems[0]
    assert first.question.startswith("Convert the point $(0,3)$ in rectangular coordinates")
    assert first.gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.task == "math500"
    assert problems[1].gold == "p - q"
    assert problems[2].gold == "\\frac{14}{3}"


def test_problem_is_frozen():
    p = Problem(0, "q", "1", "gsm8k")
    with pytest.raises(AttributeError):
        p.gold = "2"


def test_vendored_checksums_match_readmes():
    gsm8k, math500 = REPO_ROOT / "data" / "gsm8k", REPO_ROOT / "data" / "math500"
    assert sha256_file(gsm8k / "test.jsonl") == GSM8K_TEST_SHA256
    assert sha256_file(math500 / "test.jsonl") == MATH500_SHA256
    for folder in (gsm8k, math500):
        readme = (folder / "README.md").read_text()
        for jsonl in folder.glob("*.jsonl"):
            assert f"sha256 {jsonl.name}" in readme
            assert sha256_file(jsonl) in readme
        assert (folder / "LICENSE").is_file()


def test_sha256_file_of_known_bytes(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    assert sha256_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


# ---------------------------------------------------------------- errors

GOOD = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})


def write_lines(tmp_path, *lines, name="bad.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def error_of(task, path):
    with pytest.raises(ValueError) as info:
        load_problems(task, path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_small_file_loads(tmp_path):
    path = write_lines(tmp_path, GOOD, GOOD.replace("#### 2", "#### 1,002"))
    problems = load_problems("gsm8k", path)
    assert problems == [
        Problem(0, "1+1?", "2", "gsm8k"),
        Problem(1, "1+1?", "1002", "gsm8k"),
    ]


def test_malformed_json_names_file_and_line(tmp_path):
    path = write_lines(tmp_path, GOOD, GOOD, '{"question": "q", "answer": ')
    message = error_of("gsm8k", path)
    assert str(path) in message
    assert "line 3" in message
    assert "not valid JSON" in message
    assert "fix or remove that line" in message


def test_blank_line_is_an_error(tmp_path):
    message = error_of("gsm8k", write_lines(tmp_path, GOOD, "", GOOD))
    assert "line 2" in message and "not valid JSON" in message


def test_not_an_object(tmp_path):
    message = error_of("gsm8k", write_lines(tmp_path, "[1, 2]"))
    assert "line 1" in message and "not a JSON object" in message


def test_missing_field(tmp_path):
    path = write_lines(tmp_path, GOOD, json.dumps({"question": "q"}))
    message = error_of("gsm8k", path)
    assert str(path) in message and "line 2" in message
    assert "missing field 'answer'" in message


def test_math500_missing_field(tmp_path):
    path = write_lines(tmp_path, json.dumps({"question": "q", "answer": "1"}))
    message = error_of("math500", path)
    assert "line 1" in message and "missing field 'problem'" in message


def test_field_not_a_string(tmp_path):
    message = error_of("gsm8k", write_lines(tmp_path, json.dumps({"question": "q", "answer": 3})))
    assert "line 1" in message and "field 'answer' is not a string" in message


def test_gsm8k_answer_without_marker(tmp_path):
    path = write_lines(tmp_path, GOOD, GOOD, GOOD, json.dumps({"question": "q", "answer": "2"}))
    message = error_of("gsm8k", path)
    assert str(path) in message and "line 4" in message
    assert "field 'answer'" in message and "'####'" in message


def test_empty_gold(tmp_path):
    path = write_lines(tmp_path, json.dumps({"question": "q", "answer": "x ####"}))
    message = error_of("gsm8k", path)
    assert "line 1" in message and "empty gold" in message


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert "no problems" in error_of("gsm8k", path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    message = error_of("gsm8k", path)
    assert str(path) in message and "not found" in message


def test_unknown_task():
    with pytest.raises(ValueError, match=r"unknown task 'svamp'; known tasks: arith, gsm8k, math500"):
        load_problems("svamp")


def test_repo_files_are_named_relative_to_the_repo(tmp_path):
    # a path inside the repository is shown as data/...; no file is written there
    message = error_of("gsm8k", REPO_ROOT / "data" / "gsm8k" / "missing.jsonl")
    assert message.startswith("data/gsm8k/missing.jsonl: ")


def test_the_arith_task_is_its_generator_s_output_and_every_gold_is_right():
    """data/arith/test.jsonl is replaylib.measure.arith's output (seed 0), every gold answer is the arithmetic
    of its own steps, and the task loads and grades as GSM8K does."""
    import json
    import re

    from replaylib.core.paths import DATA
    from replaylib.measure import arith
    from replaylib.measure.grading import grade
    rows = [json.loads(line) for line in (DATA / "arith" / "test.jsonl").read_text().splitlines()]
    assert rows == arith.generate()
    assert arith.generate(seed=1) != rows
    for row in rows:
        *steps, gold = row["answer"].splitlines()
        for step in steps:
            left, right = step.split(" = ")
            assert eval(left, {}) == int(right), step  # noqa: S307 - digits and + - * only, from the file above
        assert gold == f"#### {int(steps[-1].split(' = ')[1])}" and re.fullmatch(r"#### \d+", gold)
    problems = load_problems("arith")
    assert len(problems) == 200 and problems[0].gold == rows[0]["answer"].rsplit("#### ", 1)[1]
    assert grade(f"So the answer is \\boxed{{{problems[0].gold}}}.", problems[0].gold, "arith") == 1
    assert grade("So the answer is \\boxed{-1}.", problems[0].gold, "arith") == 0
