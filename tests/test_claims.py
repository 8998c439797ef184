"""The claims' verdicts on records built for each case: a claim does not hold only where the records
could have shown it, and is underpowered where they could not."""
import numpy as np
import pandas as pd

from replaylib.analysis import claims


def records(a1, a2, ar, problems=None, identical_channels=None) -> pd.DataFrame:
    n = len(a1)
    df = pd.DataFrame({"problem_id": problems if problems is not None else np.arange(n) % 4, "rollout": 0,
                       "abs_pos": np.arange(n), "A_exact1": a1, "A_exact2": a2, "A_refeed": ar})
    if identical_channels is not None:  # the channels a live run keeps: continuations and probes of exact2
        df["cont_diff_exact2"] = 0 if identical_channels else 1
        df["greedy_divergence_exact2"] = False
        df["greedy_first_logprob_delta_exact2"] = 0.0 if identical_channels else 1e-3
    return df


def test_one_replica_flip_proves_a_floor():
    df = records([0.5, 0.25, -0.25], [0.5, 0.0, -0.25], [0.5, 0.25, -0.25])
    assert claims.floor_above_zero(df).verdict == "holds"


def test_no_flip_is_underpowered_at_small_n_and_refutes_at_large_n():
    small = records([0.5] * 19, [0.5] * 19, [0.0] * 19, identical_channels=False)
    v = claims.floor_above_zero(small)
    assert v.verdict == "underpowered" and v.n == 19 and "0.16" in v.why
    large = records([0.5] * 60, [0.5] * 60, [0.0] * 60, identical_channels=False)
    assert claims.floor_above_zero(large).verdict == "does not hold"


def test_a_replica_identical_on_every_channel_refutes_the_floor_at_any_n():
    df = records([0.5] * 5, [0.5] * 5, [0.0] * 5, identical_channels=True)
    v = claims.floor_above_zero(df)
    assert v.verdict == "does not hold" and "exactly 0" in v.why
    # published records keep no continuation tokens: that proof is not available there
    assert claims.floor_above_zero(records([0.5] * 5, [0.5] * 5, [0.0] * 5)).verdict == "underpowered"


def test_the_excess_is_underpowered_over_few_problems_and_refuted_over_many():
    rng = np.random.default_rng(0)
    few = records([0.5, 0.5, 0.25, 0.0] * 2, [0.5, 0.5, 0.25, 0.0] * 2, [0.0, 0.5, 0.25, 0.0] * 2,
                  problems=[0, 0, 1, 1, 2, 2, 0, 1])
    v = claims.excess_above_floor(few)
    assert v.verdict == "underpowered" and "problems would do" in v.why
    # 64 problems, 12 pivots each, re-feed exactly as often wrong as the replica: the paper's effect would show
    n = 64 * 12
    a1 = rng.choice([-0.5, 0.5], n)
    flip = rng.random(n) < 0.15
    df = records(a1, np.where(flip, 0.0, a1), np.where(rng.permutation(flip), 0.0, a1), problems=np.arange(n) // 12)
    assert claims.excess_above_floor(df).verdict == "does not hold"
    strong = records(a1, a1, np.where(rng.random(n) < 0.4, 0.0, a1), problems=np.arange(n) // 12)
    assert claims.excess_above_floor(strong).verdict == "holds"


def test_a_t_over_two_or_three_problems_needs_students_point_not_2():
    # a GRPO run's pooled pivots: re-feed flipped 1 of 1 pivots on one prompt and 1 of 2 on another, the replica none
    two = records([0.5, 0.5, 0.25], [0.5, 0.5, 0.25], [0.0, 0.5, 0.0], problems=["p1", "p1", "p2"])
    v = claims.excess_above_floor(two)
    assert "t 3.00 over 2 problems" in v.value and v.verdict == "underpowered" and "t > 12.71" in v.why
    # at 3 problems the bar is 4.30: a t of 4 does not clear it, a t of 8 does
    three = records([0.5] * 6, [0.5] * 6, [0.0, 0.5, 0.0, 0.0, 0.0, 0.5], problems=[0, 0, 1, 1, 2, 2])
    assert "t 4.00" in claims.excess_above_floor(three).value
    assert claims.excess_above_floor(three).verdict == "underpowered"
    sure = records([0.5] * 9, [0.5] * 9, [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0], problems=[0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert claims.excess_above_floor(sure).verdict == "holds"


def with_probes(df, refeed_delta=0.0):
    for p, d in (("exact2", 0.0), ("refeed", refeed_delta)):
        df[f"greedy_divergence_{p}"] = False
        df[f"greedy_first_logprob_delta_{p}"] = d
    return df


def test_batch_invariant_identity_is_exact():
    same = with_probes(records([0.5, 0.0], [0.5, 0.0], [0.5, 0.0]))
    assert claims.batch_invariant_identity(same).verdict == "holds"
    assert claims.batch_invariant_identity(with_probes(records([0.5, 0.0], [0.5, 0.0], [0.5, 0.25]))).verdict == \
        "does not hold"
    assert claims.batch_invariant_identity(with_probes(records([0.5], [0.5], [0.5]), 1e-6)).verdict == "does not hold"
    assert claims.batch_invariant_identity(same.iloc[:0]).verdict == "not measured"


def test_jaccard_needs_enough_selected_pivots_to_refute():
    few = records([1.0, 0.75, 0.0], [1.0, 0.0, 0.0], [1.0, 0.75, 0.0])  # refeed matches exact1 better than exact2
    assert claims.jaccard_below_ceiling(few).verdict == "underpowered"
    many = records([1.0] * 12, [1.0] * 6 + [0.0] * 6, [1.0] * 12)
    assert claims.jaccard_below_ceiling(many).verdict == "does not hold"
    assert claims.jaccard_below_ceiling(records([1.0] * 12, [1.0] * 12, [1.0] * 6 + [0.0] * 6)).verdict == "holds"


def test_zero_crossings_against_polarity_reversals_by_a_sign_test():
    zc = records([0.5] * 8, [0.5] * 8, [0.0] * 8)  # 8 zero-crossings
    assert claims.zero_crossings_dominate(zc).verdict == "holds"
    pol = records([0.5] * 8, [0.5] * 8, [-0.5] * 8)  # 8 polarity reversals
    assert claims.zero_crossings_dominate(pol).verdict == "does not hold"
    assert claims.zero_crossings_dominate(records([0.5] * 3, [0.5] * 3, [0.0, 0.0, -0.5])).verdict == "underpowered"


def test_bias_needs_a_narrow_interval_to_hold():
    rng = np.random.default_rng(1)
    a1 = rng.choice([-0.5, 0.0, 0.5], 400)
    noise = rng.choice([-0.25, 0.0, 0.25], 400)
    assert claims.bias_mean_zero(records(a1 + 0.01, a1 + 0.01, a1 + noise + 0.01)).verdict == "holds"
    assert claims.bias_mean_zero(records(a1 + 0.01, a1 + 0.01, a1 + 0.3)).verdict == "does not hold"
    assert claims.bias_mean_zero(records([0.5, -0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.5, -0.5])).verdict == \
        "underpowered"


def test_combining_rows_a_refutation_wins_then_a_holding_row():
    v = claims.Verdict
    assert claims.combine({"a": v("holds", 10, "x"), "b": v("underpowered", 3, "y")})[0] == "holds"
    assert claims.combine({"a": v("holds", 10, "x"), "b": v("does not hold", 90, "y")})[0] == "does not hold"
    assert claims.combine({"a": v("underpowered", 3, "x"), "b": v("not measured", 0, "y")})[0] == "underpowered"
    verdict, detail = claims.combine({"a": v("holds", 10, "1/10"), "b": v("underpowered", 3, "0/3", "too few")})
    assert "holds on a (1/10)" in detail and "underpowered on b (0/3; too few)" in detail
    assert claims.combine({})[0] == "not measured"
