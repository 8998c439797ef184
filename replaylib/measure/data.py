"""Loading the vendored GSM8K and MATH-500 test sets (docs/protocol.md section 2) and the generated arith
task (replaylib.measure.arith: short word problems for models too small for GSM8K)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.paths import DATA, REPO

# task -> (default file, question field, answer field)
TASKS = {
    "gsm8k": (DATA / "gsm8k" / "test.jsonl", "question", "answer"),
    "math500": (DATA / "math500" / "test.jsonl", "problem", "answer"),
    "arith": (DATA / "arith" / "test.jsonl", "question", "answer"),
}


@dataclass(frozen=True)
class Problem:
    problem_id: int  # 0-based line index in the file
    question: str
    gold: str
    task: str


def _shown(path: Path) -> str:
    """The path as it should appear in error messages: repo-relative when possible."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def gsm8k_gold(answer: str) -> str | None:
    """The number after '####' with commas removed, or None if there is no '####'."""
    if "####" not in answer:
        return None
    return answer.split("####")[-1].strip().replace(",", "")


def load_problems(task: str, path: Path | str | None = None) -> list[Problem]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(sorted(TASKS))}")
    default_path, q_field, a_field = TASKS[task]
    path = Path(path) if path is not None else default_path
    shown = _shown(path)
    if not path.is_file():
        raise ValueError(
            f"{shown}: file not found; restore the vendored copy under data/ or pass the right path"
        )

    problems = []
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise ValueError(f"{shown} line {line}: not UTF-8 text ({e.reason}); fix that line or restore the "
                         f"vendored copy under data/") from None
    for index, line in enumerate(lines):
        where = f"{shown} line {index + 1}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}: not valid JSON ({e.msg} at column {e.colno}); fix or remove that line"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: not a JSON object; fix or remove that line")
        for field in (q_field, a_field):
            if field not in record:
                raise ValueError(
                    f"{where}: missing field {field!r}; each line needs {q_field!r} and {a_field!r}"
                )
            if not isinstance(record[field], str):
                raise ValueError(f"{where}: field {field!r} is not a string; make it one")
        gold = record[a_field].strip()
        if task in ("gsm8k", "arith"):
            gold = gsm8k_gold(record[a_field])
            if gold is None:
                raise ValueError(
                    f"{where}: field {a_field!r} has no '####'; end it with '#### <gold number>'"
                )
        if not gold:
            raise ValueError(f"{where}: field {a_field!r} has an empty gold answer; fill it in")
        problems.append(Problem(index, record[q_field], gold, task))

    if not problems:
        raise ValueError(f"{shown}: no problems in the file; it is empty")
    return problems
