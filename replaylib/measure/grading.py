"""Answer extraction and 0/1 grading for GSM8K (docs/protocol.md section 2) and MATH-500.

GSM8K: the prediction is the last \\boxed{N} holding a number, else the last `Answer: N`,
else the last number in the text; commas and `$` are stripped; correct iff
|pred - gold| < 1e-4.

MATH-500: the last non-empty \\boxed{...} (or \\fbox{...}), normalised in the manner of
Hendrycks' `is_equiv` plus the usual extensions, then compared as strings, as simple
numbers, or element-wise for tuples, intervals, sets, lists and matrices. No symbolic
algebra: `x+1` and `1+x` are different answers here.
"""

from __future__ import annotations

import math
import re

GSM8K_TOL = 1e-4

# ---------------------------------------------------------------- shared helpers


def _read_group(s: str, i: int) -> tuple[str, int] | None:
    """The TeX argument starting at s[i] (after spaces): a balanced {...}, a command such
    as \\pi, or one character.

    Returns (content without the outer braces, index after the argument), or None.
    """
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "\\":
        m = re.compile(r"\\[a-zA-Z]+").match(s, i)
        if m:
            return m.group(0), m.end()
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1 : j], j + 1
    return None  # unbalanced


def boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} / \\fbox{...} with balanced braces, in order."""
    found = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        group = _read_group(text, m.end() - 1)
        if group is not None:
            found.append(group[0])
    return found


def extract_boxed(text: str) -> str | None:
    """The last non-empty boxed content, stripped, or None."""
    for content in reversed(boxed_contents(text)):
        if content.strip():
            return content.strip()
    return None


# ---------------------------------------------------------------- GSM8K

_NUM = r"(?:\d+(?:\.\d+)?|\.\d+)"
# A number token: \frac{a}{b}, \frac12, a/b, or a plain number; optional minus. The
# look-behind keeps "3-5" from reading as -5 and a token from starting inside a number.
_TOKEN = re.compile(
    rf"(?<![\d.])-?(?:\\frac\{{\s*-?{_NUM}\s*\}}\{{\s*-?{_NUM}\s*\}}|\\frac\d\d"
    rf"|{_NUM}\s*/\s*{_NUM}|{_NUM})"
)
_ANSWER = re.compile(rf"\banswer\b[\s*]*[:=]?[\s*]*({_TOKEN.pattern})", re.IGNORECASE)


def _clean_numbers(text: str) -> str:
    """Remove what may sit inside or around a number: $, thousands commas, TeX spacing, %."""
    text = text.replace("\u2212", "-").replace("\\!", "").replace("{,}", ",")
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"(?<=\d)\\,(?=\d)", "", text)
    text = text.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    return re.sub(r"(?<=\d),(?=\d)", "", text)


def _tokens(text: str) -> list[str]:
    return [re.sub(r"\s+", "", m.group(0)) for m in _TOKEN.finditer(_clean_numbers(text))]


def _token_value(token: str) -> float | None:
    sign = -1.0 if token.startswith("-") else 1.0
    body = token.lstrip("-")
    if body.startswith("\\frac"):
        parts = re.findall(r"-?" + _NUM, body) if "{" in body else list(body[5:])
    elif "/" in body:
        parts = body.split("/")
    else:
        return sign * float(body)
    num, den = float(parts[0]), float(parts[1])
    return None if den == 0 else sign * num / den


def extract_answer(text: str) -> str | None:
    """The predicted GSM8K answer as a number string (commas and `$` removed), or None."""
    for content in reversed(boxed_contents(text)):
        found = _tokens(content)
        if found:
            # inside a box the final number wins: \boxed{x = 5}, \boxed{3 + 4 = 7}
            return found[-1]
    answers = list(_ANSWER.finditer(_clean_numbers(text)))
    if answers:
        return re.sub(r"\s+", "", answers[-1].group(1))
    found = _tokens(text)
    return found[-1] if found else None


def parse_number(s: str | None) -> float | None:
    """The value of a string that is one number: '-1,234.5', '$18', '\\frac{1}{2}', '3/4',
    '18 \\text{ dollars}' (TeX units dropped), '5.' -> 5.0. Anything else -> None."""
    if s is None:
        return None
    s = re.sub(r"\\(?:text|mbox|mathrm)\s*\{[^{}\d]*\}", "", _clean_numbers(s))
    s = re.sub(r"\\(?:text|textbf|mathbf|mbox|mathrm)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if not _TOKEN.fullmatch(s):
        return None
    return _token_value(s)


def grade_gsm8k(text: str, gold: str) -> int:
    pred = parse_number(extract_answer(text))
    target = parse_number(gold)
    if pred is None or target is None:
        return 0
    return int(abs(pred - target) < GSM8K_TOL)


# ---------------------------------------------------------------- MATH-500

_UNIT = re.compile(r"\s*\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\^\{?\d\}?)?\s*$")


def _fix_fracs(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{2} -> \\frac{1}{2}."""
    out, i = [], 0
    while True:
        j = s.find("\\frac", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i : j + 5])
        num = _read_group(s, j + 5)
        den = _read_group(s, num[1]) if num else None
        if den is None:
            out.append(s[j + 5 :])
            return "".join(out)
        out.append("{" + _fix_fracs(num[0]) + "}{" + _fix_fracs(den[0]) + "}")
        i = den[1]


def normalize_math(s: str) -> str:
    """Normalise a MATH answer string for comparison (Hendrycks-style, extended)."""
    s = s.strip().replace("\n", " ").replace("\u2212", "-")
    s = re.sub(r",\\!\s*", ",", s).replace("\\!", "").replace("{,}", ",")  # 10,\!080
    s = re.sub(r"(?<!\\)\\[,;: ]", "", s)  # TeX spacing, but not the \\ row break
    s = re.sub(r"\\[dt]frac", r"\\frac", s).replace("\\displaystyle", "")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|\u00b0", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    # a \text{...} after a value is a unit ("5.4 \text{ cents}", "15\mbox{ cm}^2") ...
    while True:
        m = _UNIT.search(s)
        if not m or not s[: m.start()].strip():
            break
        s = s[: m.start()]
    # ... one standing alone is the answer ("\text{Evelyn}")
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", s)
    if re.fullmatch(r"\s*-?\d{1,3}(?:,\d{3})+(?:\.\d+)?\s*", s):
        s = s.replace(",", "")  # thousands separators, not a list
    s = re.sub(r"\s+", "", s).rstrip(".")

    if s.count("=") == 1:  # "x=5", "k=3", "\theta=2" -> the value
        left, right = s.split("=")
        if re.fullmatch(r"[a-zA-Z]\w?|\\[a-zA-Z]+", left):
            s = right
    s = re.sub(r"^[a-zA-Z]\\in", "", s)  # "x \in [-2,7]"

    s = re.sub(r"\\sqrt([^{\[\\])", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    if m:
        s = rf"{m.group(1)}\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    s = re.sub(r"(?<!\d)\.(\d)", r"0.\1", s)
    s = re.sub(r"([_^])\{(\w)\}", r"\1\2", s)  # x^{2} -> x^2, 204_{5} -> 204_5
    m = re.fullmatch(r"\(([A-E])\)", s)  # multiple choice "(C)" -> "C"
    return m.group(1) if m else s


def _math_number(s: str) -> float | None:
    """The value of a normalised simple numeric form, else None."""
    if re.fullmatch(r"-?\d+(?:\.\d+)?", s):
        return float(s)
    m = re.fullmatch(r"(-?)(\d+)?\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", s)
    if not m or float(m.group(4)) == 0:
        return None
    value = float(m.group(3)) / float(m.group(4))
    if m.group(2):  # mixed number 1\frac{4}{5}, only for a proper fraction
        if not 0 <= value < 1:
            return None
        value += float(m.group(2))
    return -value if m.group(1) else value


def _split_top(s: str, sep: str = ",") -> list[str]:
    """Split on sep outside (), [], {}."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def _one_group(s: str) -> bool:
    """True if s[0] is a bracket closed only by s[-1], as in (1,2) but not (1,2)\\cup(3,4)."""
    depth = 0
    for i, c in enumerate(s):
        depth += c in "([{"
        depth -= c in ")]}"
        if depth == 0 and i < len(s) - 1:
            return False
    return depth == 0


def _same_elements(a: list[str], b: list[str], ordered: bool) -> bool:
    if len(a) != len(b):
        return False
    if ordered:
        return all(_equiv(x, y) for x, y in zip(a, b))
    left = list(b)
    for x in a:
        match = next((y for y in left if _equiv(x, y)), None)
        if match is None:
            return False
        left.remove(match)
    return True


def _equiv(a: str, b: str) -> bool:
    """Equivalence of two answers (normalised again here, so elements of lists work)."""
    a, b = normalize_math(a), normalize_math(b)
    if a == b:
        return True
    va, vb = _math_number(a), _math_number(b)
    if va is not None and vb is not None:
        return math.isclose(va, vb, rel_tol=1e-6, abs_tol=1e-12)

    if "\\cup" in a and "\\cup" in b:
        return _same_elements(a.split("\\cup"), b.split("\\cup"), ordered=False)
    matrix = r"\\begin\{[pb]matrix\}(.*)\\end\{[pb]matrix\}"
    ma, mb = re.fullmatch(matrix, a), re.fullmatch(matrix, b)
    if ma and mb:
        rows_a, rows_b = ma.group(1).split("\\\\"), mb.group(1).split("\\\\")
        return len(rows_a) == len(rows_b) and all(
            _same_elements(x.split("&"), y.split("&"), ordered=True)
            for x, y in zip(rows_a, rows_b)
        )
    # sets \{...\} are compared as unordered lists
    if a.startswith("\\{") and a.endswith("\\}"):
        a = a[2:-2]
    if b.startswith("\\{") and b.endswith("\\}"):
        b = b[2:-2]
    # tuples and intervals: the same brackets, elements in order
    if (
        len(a) > 1 and len(b) > 1 and a[0] in "([" and b[0] in "(["
        and _one_group(a) and _one_group(b)
    ):
        return (a[0], a[-1]) == (b[0], b[-1]) and _same_elements(
            _split_top(a[1:-1]), _split_top(b[1:-1]), ordered=True
        )
    # bare lists "1,-2" (all solutions): order does not matter
    parts_a, parts_b = _split_top(a), _split_top(b)
    if len(parts_a) > 1 or len(parts_b) > 1:
        return _same_elements(parts_a, parts_b, ordered=False)
    return False


def grade_math(text: str, gold: str) -> int:
    pred = extract_boxed(text)
    if pred is None:
        return 0
    return int(_equiv(pred, gold))


# ---------------------------------------------------------------- dispatch

GRADERS = {"gsm8k": grade_gsm8k, "math500": grade_math, "arith": grade_gsm8k}  # arith: GSM8K's format


def grade(text: str, gold: str, task: str) -> int:
    if task not in GRADERS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(sorted(GRADERS))}")
    return GRADERS[task](text, gold)


_ANSWER_LINE = re.compile(r"\banswer\b[\s*]*[:=][^\n]*\d[^\n]*\n", re.IGNORECASE)


def answer_complete(text: str, start: int = 0) -> bool:
    """True once a final answer ends at or after text[start]: a closed \\boxed{...} or an
    `Answer: N` line. Used to stop a continuation early; everything graded is kept."""
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        group = _read_group(text, m.end() - 1)
        if group is not None and group[1] > start and group[0].strip():
            return True
    return any(m.end() > start for m in _ANSWER_LINE.finditer(text))
