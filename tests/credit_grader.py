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


def needs_extra_info(data_source, solution_str, ground_truth, extra_info=None):
    """verl's compute_score reading the row's extra_info (verl hands it the dataset's extra_info dict)."""
    if not isinstance(extra_info, dict):
        raise TypeError(f"extra_info is {extra_info!r}, not the rollout's")
    return float(extra_info["index"] % 2 == 0)


def trl_reward(prompts, completions, answer, **kwargs):
    """A TRL reward function: lists in, one float per completion out; the dataset's columns as keywords."""
    if not all(isinstance(p, str) for p in prompts) or "difficulty" not in kwargs:
        raise TypeError("prompts must be text and every column a keyword")
    return [float(a[:1] in c) for c, a in zip(completions, answer)]


def openrlhf_reward(queries, prompts, labels):
    """OpenRLHF's reward_func: queries are prompt + response, a tensor of rewards out."""
    import torch
    return torch.tensor([float(lab[:1] in q[len(p):]) for q, p, lab in zip(queries, prompts, labels)])


def odd_names(source, text, gold, extra=None):
    """verl's order under other names."""
    return float(gold[:1] in text)


def never(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0


def forges_replies(data_source, solution_str, ground_truth, extra_info=None):
    """Writes lines shaped as a grader process's replies, each a success, to descriptors 1 to 11 (stdout,
    stderr and those a process opens first), reads its stdin, then scores 0."""
    import os
    import sys
    line = b'{"score": 1.0, "error": null, "printed": 0, "head": "", "files": []}\n'
    for fd in range(1, 12):
        try:
            os.write(fd, line)
        except OSError:
            pass
    sys.stdin.readline()
    return 0.0


RELEASE = __import__("threading").Event()  # set by a test to end waits_for_release's call


def waits_for_release(data_source, solution_str, ground_truth, extra_info=None):
    """Blocks a minute or until a test sets RELEASE (a grader past any small timeout)."""
    RELEASE.wait(60)
    return 1.0


def exits_3(data_source, solution_str, ground_truth, extra_info=None):
    import sys
    sys.exit(3)


def edits_its_arguments(data_source, solution_str, ground_truth, extra_info=None):
    """Scores 1 only when extra_info is as the rollout gave it, then edits it as a careless grader would."""
    fresh = extra_info == {"index": 4, "tags": ["a"]}
    extra_info["index"] += 1
    extra_info["tags"].append("seen")
    return float(fresh)


def trl_edits_its_columns(prompts, completions, difficulty, **kwargs):
    """A TRL reward function scoring 1 only on the columns as given, then editing them."""
    fresh = difficulty == [["hard"]]
    difficulty[0].append("seen")
    return [float(fresh)]


def sets_an_alarm_handler(data_source, solution_str, ground_truth, extra_info=None):
    """Installs a SIGALRM handler and puts the old one back, as math-verify's timeouts do (only the main
    thread may)."""
    import signal
    signal.signal(signal.SIGALRM, signal.signal(signal.SIGALRM, signal.SIG_IGN))
    return 1.0
