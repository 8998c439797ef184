"""The headline leads with the channel the records have power for, and the claims table never
refutes on a set too small to: records built for each case (an underpowered sign set with a strong
probe contrast, a powered sign set, a batch-invariant run)."""
import numpy as np
import pandas as pd

from replaylib.analysis import claims, stats
from replaylib.analysis.records import load_paper_row
from replaylib.core.paths import REPO
from replaylib.display import headline as examples


def live_records(a1, a2, ar, problems, refeed_exact, replica_exact=None) -> pd.DataFrame:
    """Records with the channels a live run keeps: per pivot, whether re-feed's (and the replica's)
    greedy probe and continuations reproduced exact1's bit for bit."""
    n = len(a1)
    refeed_exact = np.broadcast_to(np.asarray(refeed_exact, bool), n)
    replica_exact = np.ones(n, bool) if replica_exact is None else np.broadcast_to(np.asarray(replica_exact), n)
    df = pd.DataFrame({"problem_id": problems, "rollout": 0, "abs_pos": np.arange(n), "margin": 0.5,
                       "A_exact1": a1, "A_exact2": a2, "A_refeed": ar})
    for p, same in (("refeed", refeed_exact), ("exact2", replica_exact)):
        df[f"greedy_divergence_{p}"] = ~same
        df[f"greedy_first_logprob_delta_{p}"] = np.where(same, 0.0, 1e-3)
        df[f"cont_diff_{p}"] = np.where(same, 0, 3)
    return df


def main_of(df) -> dict:
    """summary.json's "main", as the statistics stage writes it."""
    return {**stats.summarize(df), "sign_power": claims.sign_power(stats.exclude_not_exact(df)[0])}


def verdicts(df) -> dict:
    return {x["claim"]: x["verdict"] for x in claims.judge({"run": df}, {})}


def test_an_underpowered_sign_set_with_a_strong_probe_contrast_leads_with_the_contrast():
    # 30 pivots over 3 problems, three of them eligible; every replica reproduced exact1, no re-fed one did
    n = 30
    a1 = np.zeros(n)
    a1[:3] = 0.5
    ar = a1.copy()
    ar[0] = 0.0
    df = live_records(a1, a1.copy(), ar, problems=np.arange(n) % 3, refeed_exact=False)
    main = main_of(df)
    assert main["common"]["n"] == 3 and not main["sign_power"]["powered"]
    assert examples.headline_channel(main) == "contrast"
    text = examples.headline_sentence(main)
    assert "bit-exact at 30/30 replica pivots and 0/30 re-fed ones" in text
    assert f"p = {0.5 ** 30:.2g}" in text
    need = main["sign_power"]["needed_pivots"]
    assert need and need > 3 and f"Sign statistics need about {need} common pivots" in text
    assert "this run has 3" in text
    judged = verdicts(df)
    assert judged[next(c for c, *_ in claims.CLAIMS if "greedy probe" in c)] == "holds"
    # three eligible pivots refute nothing: the sign claims are underpowered, not "does not hold"
    for claim, verdict in judged.items():
        if "replica floor is above zero" not in claim:  # exact2 == exact1 on every channel: measured exactly
            assert verdict != "does not hold", (claim, verdict)
    assert judged[claims.CLAIMS[0][0]] == "underpowered"


def test_a_powered_sign_set_leads_with_the_sign_disagreement():
    rng = np.random.default_rng(0)
    problems = np.arange(64 * 12) // 12
    a1 = rng.choice([-0.5, 0.5], len(problems))
    ar = np.where(rng.random(len(problems)) < 0.4, 0.0, a1)
    df = live_records(a1, a1.copy(), ar, problems=problems, refeed_exact=False)
    main = main_of(df)
    assert main["sign_power"]["powered"] and examples.headline_channel(main) == "sign"
    text = examples.headline_sentence(main)
    assert text.startswith(f"Re-feed changed the sign of A at {100 * main['common']['refeed']['rate']:.1f}% of the "
                           f"{main['common']['n']} eligible pivots")
    assert verdicts(df)[claims.CLAIMS[0][0]] == "holds"


def test_a_batch_invariant_run_says_every_pass_agreed():
    a1 = np.array([0.5, 0.0, 0.25, 0.0])
    df = live_records(a1, a1.copy(), a1.copy(), problems=[0, 0, 1, 1], refeed_exact=True)
    main = main_of(df)
    assert examples.headline_channel(main) == "identical"
    assert examples.headline_sentence(main).startswith("All three passes agreed bit for bit at all 4 pivots")
    judged = {x["claim"]: x["verdict"] for x in claims.judge({}, {"invariant": df})}
    assert judged[claims.CLAIMS[2][0]] == "holds"
    # one re-fed probe off by one ulp is no longer identical, and the headline says what differed
    off = live_records(a1, a1.copy(), a1.copy(), problems=[0, 0, 1, 1], refeed_exact=[True, True, True, False])
    assert examples.headline_channel(main_of(off)) == "contrast"


def test_the_published_records_lead_with_the_sign_disagreement():
    """Published records keep no continuation tokens and the main row has the paper's power."""
    main = main_of(load_paper_row("main pooled", REPO / "data" / "paper-records"))
    assert main["sign_power"]["powered"] and examples.headline_channel(main) == "sign"
    assert examples.headline_sentence(main).startswith("Re-feed changed the sign of A at 33.8% of the 636 eligible")


def test_a_probe_contrast_the_other_way_does_not_hold_and_a_small_one_is_underpowered():
    n = 12
    a1 = np.zeros(n)
    reverse = live_records(a1, a1, a1, problems=np.arange(n) % 3, refeed_exact=True, replica_exact=False)
    assert claims.probes_differ(reverse).verdict == "does not hold"
    small = live_records(a1[:3], a1[:3], a1[:3], problems=[0, 1, 2], refeed_exact=False)
    v = claims.probes_differ(small)
    assert v.verdict == "underpowered" and "3 discordant pivots cannot give p < 0.05" in v.why
    none_differs = live_records(a1, a1, a1, problems=np.arange(n) % 3, refeed_exact=True)
    assert claims.probes_differ(none_differs).verdict == "does not hold"


def test_a_bias_interval_over_a_handful_of_pivots_refutes_nothing():
    df = live_records([0.5, 0.25, -0.25], [0.5, 0.25, -0.25], [0.25, 0.0, -0.5], problems=[0, 1, 2],
                      refeed_exact=False)
    assert stats.bias(df)["ci95"][1] < 0  # the normal interval excludes 0 ...
    assert claims.bias_mean_zero(df).verdict == "underpowered"  # ... but three pivots cannot refute
