import json

import pytest

from replaylib.core.paths import REPO as REPO_ROOT
from replaylib.measure.data import load_problems
from replaylib.measure.grading import (
    extract_answer,
    extract_boxed,
    grade,
    grade_gsm8k,
    grade_math,
    normalize_math,
    parse_number,
)

# ---------------------------------------------------------------- GSM8K extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        # boxed wins over Answer: and over later numbers
        ("Answer: 7\nso \\boxed{18} and then 99", "18"),
        ("first \\boxed{3}, finally \\boxed{4}", "4"),
        # empty box: no boxed answer, fall through to Answer:
        ("Answer: 12\n\\boxed{}", "12"),
        ("so 5 + 6 = 11 \\boxed{ }", "11"),
        ("\\boxed{\\$1,234}", "1234"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{-3}", "-3"),
        ("\\boxed{2.50}", "2.50"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed{25\\%}", "25"),
        ("\\fbox{8}", "8"),
        ("\\boxed{\\text{no idea}} but Answer: 9", "9"),
        # Answer: line, case-insensitive, optional :/=, $ and commas
        ("Answer: $1,000.", "1000"),
        ("answer = 42", "42"),
        ("ANSWER 17", "17"),
        ("Answer: \\$5", "5"),
        ("**Answer:** 64", "64"),
        ("Answer: -10", "-10"),
        ("Answer: 0.75 cups", "0.75"),
        ("Answer: 3\nwait, recheck.\nAnswer: 4\nThat is 4 apples out of 10.", "4"),
        ("Answer: 1/2", "1/2"),
        # last-number fallback
        ("She has 3 apples and buys 5 more, so 8.", "8"),
        ("It costs $1,250 in total.", "1250"),
        ("The temperature dropped to -7 degrees", "-7"),
        ("From 10 we take 3-5 cookies", "5"),
        ("So the answer is 5.", "5"),
        ("He pays 2.5 dollars.", "2.5"),
        ("the dose is .5 ml", ".5"),
        ("Answer: <number>\nThe result is 40", "40"),
        # no number at all
        ("I do not know.", None),
        ("", None),
        ("\\boxed{}", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "s, value",
    [
        ("18", 18.0),
        ("1,234", 1234.0),
        ("$1,234.50", 1234.5),
        ("\\$7", 7.0),
        ("-5", -5.0),
        ("5.", 5.0),
        ("0.125", 0.125),
        ("\\frac{1}{2}", 0.5),
        ("-\\frac{3}{4}", -0.75),
        ("\\frac12", 0.5),
        ("\\dfrac{6}{3}", 2.0),
        ("3/4", 0.75),
        ("18 \\text{ dollars}", 18.0),
        ("\\text{18}", 18.0),
        ("25%", 25.0),
        ("1/0", None),
        ("abc", None),
        ("18 dollars", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_number(s, value):
    assert parse_number(s) == value


@pytest.mark.parametrize(
    "text, gold, correct",
    [
        ("\\boxed{18}", "18", 1),
        ("\\boxed{18.00001}", "18", 1),
        ("\\boxed{18.001}", "18", 0),
        ("\\boxed{17}", "18", 0),
        ("Answer: $1,000.", "1000", 1),
        ("Answer: 1,000", "1,000", 1),
        ("\\boxed{\\$1,234}", "1234", 1),
        ("\\boxed{18 \\text{ dollars}}", "18", 1),
        ("\\boxed{-10}", "-10", 1),
        ("\\boxed{10}", "-10", 0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1),
        ("The answer is 2/4", "0.5", 1),
        ("Answer: 70000", "70000", 1),
        ("so she makes 18.", "18", 1),
        ("no number here", "18", 0),
        ("\\boxed{}", "0", 0),
        ("Answer: 5 \n\\boxed{}", "5", 1),
    ],
)
def test_grade_gsm8k(text, gold, correct):
    assert grade_gsm8k(text, gold) == correct


# ---------------------------------------------------------------- MATH


def test_extract_boxed_balanced_and_last():
    text = "try \\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{2}} and \\boxed{}"
    assert extract_boxed(text) == "\\frac{\\sqrt{3}}{2}"
    assert extract_boxed("\\fbox{ x+1 }") == "x+1"
    assert extract_boxed("\\boxed{unclosed") is None
    assert extract_boxed("no box") is None


@pytest.mark.parametrize(
    "raw, normal",
    [
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("\\dfrac{17}{50}", "\\frac{17}{50}"),
        ("\\frac 59", "\\frac{5}{9}"),
        ("\\frac9{19}", "\\frac{9}{19}"),
        ("\\frac\\pi2", "\\frac{\\pi}{2}"),
        ("11\\sqrt2", "11\\sqrt{2}"),
        ("90^\\circ", "90"),
        ("10,\\!080", "10080"),
        ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
        ("\\$32,\\!348", "32348"),
        ("15\\mbox{ cm}^2", "15"),
        ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
        ("\\text{Evelyn}", "Evelyn"),
        ("\\text{(C)}", "C"),
        ("x \\in [-2,7]", "[-2,7]"),
        ("y = 2x + 3", "2x+3"),
        ("5x - 7y + 11z + 4 = 0", "5x-7y+11z+4=0"),
        (".35625", "0.35625"),
        ("3/4", "\\frac{3}{4}"),
        ("-3/4", "-\\frac{3}{4}"),
        ("4210_{5}", "4210_5"),
        ("50\\%", "50"),
        ("\\frac{1}{2}.", "\\frac{1}{2}"),
    ],
)
def test_normalize_math(raw, normal):
    assert normalize_math(raw) == normal


# (model's boxed answer, gold, correct)
MATH_CASES = [
    ("\\frac12", "\\frac{1}{2}", 1),
    ("0.5", "\\frac{1}{2}", 1),
    ("\\dfrac{1}{2}", "0.5", 1),
    ("1/2", "\\frac{1}{2}", 1),
    ("\\tfrac{3}{4}", "\\frac 34", 1),
    ("0.15", "\\frac{3}{20}", 1),
    ("\\frac{3}{20}", "0.15", 1),
    ("2.5", "\\frac{5}{2}", 1),
    ("137.5", "137 \\frac{1}{2}", 1),
    ("\\frac{9}{5}", "1\\frac{4}{5}", 1),
    ("x = 5", "5", 1),
    ("k=3", "3", 1),
    ("5", "x=5", 1),
    ("\\sqrt2", "\\sqrt{2}", 1),
    ("11 \\sqrt{2}", "11\\sqrt2", 1),
    ("90", "90^\\circ", 1),
    ("90^{\\circ}", "90^\\circ", 1),
    ("\\$18.90", "18.9", 1),
    ("10080", "10,\\!080", 1),
    ("1,000", "1000", 1),
    ("25\\%", "25", 1),
    ("15 \\text{ cm}^2", "15\\mbox{ cm}^2", 1),
    ("\\text{Evelyn}", "\\text{Evelyn}", 1),
    ("Evelyn", "\\text{Evelyn}", 1),
    ("(C)", "\\text{(C)}", 1),
    ("C", "\\text{(C)}", 1),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", 1),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)", 0),  # \pi/2 is not rewritten
    ("\\left(\\frac{3}{5},\\frac{8}{3}\\right]", "(0.6, \\frac{8}{3}]", 1),
    ("(0.6, \\frac{8}{3})", "\\left(\\frac{3}{5},\\frac{8}{3}\\right]", 0),  # bracket differs
    ("[-2, 7]", "x \\in [-2,7]", 1),
    ("(-\\infty, 0]", "(-\\infty,0]", 1),
    ("(3,\\infty)\\cup(-\\infty,2)", "(-\\infty, 2) \\cup (3, \\infty)", 1),
    ("(6,31,-1)", "(6, 31, -1)", 1),
    ("(31,6,-1)", "(6,31,-1)", 0),  # tuples are ordered
    ("-2, 1", "1,-2", 1),  # bare lists of solutions are not
    ("1, -2, 3", "1,-2", 0),
    ("\\{-2, 1\\pm\\sqrt{5}\\}", "\\{1\\pm\\sqrt{5},-2\\}", 1),
    (
        "\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac23 \\\\ 5/3 \\end{pmatrix}",
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        1,
    ),
    (
        "\\begin{pmatrix} 1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
        "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
        0,
    ),
    ("y = 2x + 3", "y = 2x + 3", 1),
    ("2x+3", "y = 2x + 3", 1),
    ("204_{5}", "204_5", 1),
    ("-\\frac{24}{25}", "-\\frac{24}{25}", 1),
    # true negatives
    ("\\frac{1}{3}", "\\frac{1}{2}", 0),
    ("0.33", "\\frac{1}{3}", 0),
    ("3", "-3", 0),
    ("\\sqrt{3}", "\\sqrt{2}", 0),
    ("2\\sqrt{5}", "\\sqrt{20}", 0),  # no symbolic simplification
    ("x^2+1", "x^3+1", 0),
    ("\\text{Navin}", "\\text{Evelyn}", 0),
    ("(1,2)", "[1,2]", 0),
    ("204", "204_5", 0),
    ("\\frac{5}{0}", "0", 0),
    ("", "5", 0),
]


@pytest.mark.parametrize("pred, gold, correct", MATH_CASES)
def test_grade_math_table(pred, gold, correct):
    assert grade_math(f"Reasoning... so the answer is $\\boxed{{{pred}}}$.", gold) == correct


def test_grade_math_needs_a_box():
    assert grade_math("The answer is 5.", "5") == 0
    assert grade_math("Answer: 5", "5") == 0
    assert grade_math("\\boxed{4} no wait \\boxed{5}", "5") == 1
    assert grade_math("\\boxed{5} and \\boxed{}", "5") == 1


def test_grade_dispatch():
    assert grade("Answer: 18", "18", "gsm8k") == 1
    assert grade("\\boxed{\\frac12}", "\\frac{1}{2}", "math500") == 1
    assert grade("\\boxed{0.5}", "0.5", "math500") == 1
    with pytest.raises(ValueError, match="unknown task 'aime'.*gsm8k, math500"):
        grade("1", "1", "aime")


def test_every_math500_gold_matches_itself_and_its_solution():
    with open(REPO_ROOT / "data" / "math500" / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        assert grade_math(f"\\boxed{{{row['answer']}}}", row["answer"]) == 1, row["answer"]
        assert grade_math(row["solution"], row["answer"]) == 1, row["unique_id"]


def test_every_gsm8k_reference_solution_grades_correct():
    with open(REPO_ROOT / "data" / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
        answers = [json.loads(line)["answer"] for line in f]
    problems = load_problems("gsm8k")
    assert all(grade_gsm8k(a, p.gold) == 1 for a, p in zip(answers, problems))
