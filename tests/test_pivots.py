"""Pivot selection rules (docs/protocol.md 3.2) on synthetic trunks."""
import pandas as pd

from replaylib.measure.mining import mine
from replaylib.runtime import params

EOS, SPECIAL = 99, 98


def trunk(margins, prompt_len=30, gen=None, correct=1, rollout=0, alt_of=None):
    """A trunk whose step i has top-1/top-2 logprobs separated by margins[i]."""
    n = len(margins)
    gen = gen or [10 + i for i in range(n)]
    topk_ids, topk_lps = [], []
    for i, m in enumerate(margins):
        other = (alt_of or {}).get(i, 500 + i)
        topk_ids.append([gen[i], other, 700])
        topk_lps.append([-0.1, -0.1 - m, -9.0])
    return {"problem_id": 0, "rollout": rollout, "prompt_ids": list(range(prompt_len)), "gen_ids": gen,
            "topk_ids": topk_ids, "topk_logprobs": topk_lps, "correct": correct}


def run(trunks, **overrides):
    p = params.make({"min_rollout_tokens": 4, "max_pivots_per_rollout": 5, **overrides})
    return mine(pd.DataFrame(trunks), p, {EOS, SPECIAL})


def test_threshold_is_strict_and_earliest_first():
    got = run([trunk([2.0, 0.5, 1.0, 0.99, 0.1, 0.2])], max_pivots_per_rollout=2)
    assert got.gen_index.tolist() == [1, 3]  # margin 1.0 is not below the threshold
    assert got.abs_pos.tolist() == [31, 33]
    assert got.alt.tolist() == [501, 503]


def test_block_filter_reproduces_the_papers_engine():
    margins = [0.1] * 40
    got = run([trunk(margins, prompt_len=30)], block_size=16, boundary_slack=2)
    assert sorted(got.abs_pos.tolist()) == [32, 33, 34, 48, 49]
    assert all(p % 16 <= 2 for p in got.abs_pos)
    assert len(run([trunk(margins)], block_size=1)) == 5


def test_special_alternatives_and_short_rollouts_are_skipped():
    got = run([trunk([0.1, 0.1, 0.1, 0.1], alt_of={0: EOS, 1: SPECIAL})])
    assert got.gen_index.tolist() == [2, 3]
    assert run([trunk([0.1, 0.1, 0.1])]).empty  # shorter than min_rollout_tokens
    eos_sampled = trunk([0.1, 0.1, 0.1, 0.1], gen=[10, 11, 12, EOS])
    assert 3 not in run([eos_sampled]).gen_index.tolist()


def test_alternative_is_the_best_other_token_when_the_sampled_one_was_not_top():
    t = trunk([0.3, 0.3, 0.3, 0.3])
    t["topk_ids"][0] = [600, 10, 700]  # sampled token 10 was second
    got = run([t])
    assert got.iloc[0].alt == 600 and got.iloc[0].actual == 10


def test_pivots_carry_the_trunks_correctness_and_ids():
    got = run([trunk([0.1] * 5, correct=0, rollout=2), trunk([0.1] * 5, rollout=3)], max_pivots_per_rollout=1)
    assert got.pivot_id.tolist() == [0, 1]
    assert got.rollout.tolist() == [2, 3] and got.rollout_correct.tolist() == [0, 1]


def test_pivot_window_keeps_only_the_trunks_last_tokens():
    got = run([trunk([0.1] * 20)], pivot_window=5)
    assert got.gen_index.tolist() == [15, 16, 17, 18, 19]
