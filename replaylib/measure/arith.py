"""The arith task: short arithmetic word problems generated from a seed, for models too small to solve
GSM8K problems often enough for the sign statistics (a problem must be solved by some of its rollouts and
missed by others). One to two steps of addition, subtraction and multiplication with small numbers, in
GSM8K's format (a question; an answer whose last line is ``#### N``), graded as GSM8K is.

The vendored file ``data/arith/test.jsonl`` is this module's output with its defaults
(``python -m replaylib.measure.arith > data/arith/test.jsonl``); a test checks that they agree."""
from __future__ import annotations

import json
import random
import sys

NAMES = ["Ava", "Ben", "Chloe", "Dan", "Ella", "Finn", "Grace", "Hugo", "Ivy", "Jack", "Kim", "Leo", "Mia",
         "Noah", "Olive", "Paul", "Rosa", "Sam", "Tara", "Omar"]
ITEMS = ["apple", "marble", "pencil", "sticker", "book", "coin", "shell", "card", "cookie", "flower"]


def problem(rng: random.Random) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choice(["add", "subtract", "multiply", "add then subtract"])
    if kind == "add":
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        question = f"{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?"
        steps, gold = f"{a} + {b} = {a + b}", a + b
    elif kind == "subtract":
        a = rng.randint(10, 40)
        b = rng.randint(2, a - 1)
        question = f"{name} has {a} {item}s and gives {b} of them away. How many {item}s does {name} have left?"
        steps, gold = f"{a} - {b} = {a - b}", a - b
    elif kind == "multiply":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        question = f"{name} has {a} boxes with {b} {item}s in each box. How many {item}s does {name} have?"
        steps, gold = f"{a} * {b} = {a * b}", a * b
    else:
        a, b = rng.randint(5, 30), rng.randint(2, 20)
        c = rng.randint(1, a + b - 1)
        question = (f"{name} has {a} {item}s, gets {b} more, then gives {c} to a friend. How many {item}s does "
                    f"{name} have now?")
        steps, gold = f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}", a + b - c
    return {"question": question, "answer": f"{steps}\n#### {gold}"}


def generate(seed: int = 0, n: int = 200) -> list[dict]:
    rng = random.Random(seed)
    return [problem(rng) for _ in range(n)]


def main() -> None:
    for row in generate():
        sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
