"""Graders for tests/test_credit.py, with verl's compute_score signature."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Success when the text holds the ground truth's first character (often, on a random model)."""
    return {"score": float(ground_truth[:1] in solution_str), "data_source": data_source}


def always(data_source, solution_str, ground_truth, extra_info=None):
    return 1


def broken(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("no such field")


def fails_on_bad_source(data_source, solution_str, ground_truth, extra_info=None):
    """Fails only for rollouts whose data_source is 'bad' (so the check before the run passes)."""
    if data_source == "bad":
        raise KeyError("no such field")
    return 0.0


def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    """Never returns (the tool's per-call timeout must stop it)."""
    import time
    time.sleep(3600)


def exits(data_source, solution_str, ground_truth, extra_info=None):
    import sys
    sys.exit(0)


def not_a_number(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


def chatty(data_source, solution_str, ground_truth, extra_info=None):
    """Prints 200 kB to each stream per call, then scores as compute_score does."""
    import sys
    print("x" * 100_000)
    print("y" * 100_000, file=sys.stderr)
    return compute_score(data_source, solution_str, ground_truth)
