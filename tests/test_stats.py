"""Statistics of docs/protocol.md section 4: the paper's published numbers, and edge cases."""

import json
import math
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from replaylib.analysis import records, stats, stats_extras, tables

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "data" / "paper-records"


@pytest.fixture(scope="module")
def rows():
    return {label: records.load_paper_row(label, PAPER) for label in records.PAPER_ROWS}


@pytest.fixture(scope="module")
def main_summary(rows):
    return stats.summarize(rows["main pooled"])


def r1(x):
    return f"{100 * x:.1f}"


# ---------------------------------------------------------------- main pooled row (README)

def test_main_pooled_rates_exact(main_summary):
    c = main_summary["common"]
    assert c["n"] == 636
    assert Fraction(c["refeed"]["flips"], c["n"]) == Fraction(215, 636)
    assert Fraction(c["floor"]["flips"], c["n"]) == Fraction(96, 636)
    assert c["refeed"]["polarity"] == 25 and c["floor"]["polarity"] == 7
    assert c["refeed"]["rate"] == 215 / 636
    assert (r1(c["refeed"]["rate"]), r1(c["refeed"]["polarity_rate"])) == ("33.8", "3.9")
    assert (r1(c["floor"]["rate"]), r1(c["floor"]["polarity_rate"])) == ("15.1", "1.1")
    assert c["refeed"]["zero_crossings"] == 215 - 25
    assert main_summary["excess_pp"] == pytest.approx(100 * 119 / 636, abs=1e-12)
    assert f"{main_summary['excess_pp']:+.1f}" == "+18.7"


def test_main_pooled_inference(main_summary):
    assert f"{main_summary['clustered']['t']:.2f}" == "5.51"
    assert main_summary["clustered"]["n_problems"] == 40
    assert f"{main_summary['mcnemar']['z']:.2f}" == "8.61"
    b = main_summary["bias"]
    assert (f"{b['mean']:.4f}", f"{b['t']:.3f}") == ("-0.0110", "-1.233")
    assert [f"{x:.4f}" for x in b["ci95"]] == ["-0.0285", "0.0065"]
    assert b["n"] == 636


def test_main_pooled_sets(main_summary):
    assert f"{main_summary['excess_pp_exact1']:+.1f}" == "+11.7"
    assert main_summary["exact1_conditioned"]["n"] == 515
    assert main_summary["eligibility"] == {"exact1_nonzero": 515, "only_refeed": 77, "only_replica": 18}
    j5, j75 = main_summary["jaccard"]["0.5"], main_summary["jaccard"]["0.75"]
    assert j5["n_exact1"] == 229
    assert (f"{j5['refeed']:.3f}", f"{j5['replica']:.3f}") == ("0.684", "0.837")
    assert (f"{j75['refeed']:.3f}", f"{j75['replica']:.3f}") == ("0.746", "0.862")
    m = main_summary["margin"]
    assert m["split"] == 0.3
    assert (r1(m["lt"]["refeed_rate"]), r1(m["ge"]["refeed_rate"])) == ("34.2", "33.6")
    assert (r1(m["lt"]["floor_rate"]), r1(m["ge"]["floor_rate"])) == ("12.0", "16.9")


def test_main_pooled_probes_and_cache(main_summary):
    p = main_summary["probes"]
    assert p["n"] == 1567
    assert (r1(p["replica"]["divergence_rate"]), r1(p["refeed"]["divergence_rate"])) == ("7.9", "22.8")
    assert (f"{p['replica']['p90']:.1e}", f"{p['refeed']['p90']:.1e}") == ("3.7e-03", "4.8e-02")
    assert main_summary["cache"] == {"n": 1567, "exact1_ok_rate": 1.0, "exact2_ok_rate": 1.0}


def test_summary_keys_exact(main_summary):
    assert list(main_summary) == [
        "n_records", "n_problems", "common", "exact1_conditioned", "excess_pp", "excess_pp_exact1",
        "eligibility", "bias", "mcnemar", "clustered", "jaccard", "margin", "probes", "contrast", "cache",
    ]
    json.dumps(main_summary, allow_nan=False)


# ---------------------------------------------------------------- every Table 1 row (docs/protocol.md 5.1)

TABLE1 = {  # n, refeed, (polarity), floor, (polarity), excess, t, z  as printed
    "main pooled": (636, "33.8", "3.9", "15.1", "1.1", "+18.7", "5.51", "8.61"),
    "K=8": (490, "35.7", "4.9", "10.4", "1.0", "+25.3", "6.36", "9.68"),
    "K=16": (239, "36.8", "5.9", "23.0", "5.9", "+13.8", "2.87", "3.71"),
    "greedy continuations": (189, "40.2", "0.5", "13.8", "0.0", "+26.5", "3.64", "5.66"),
    "GRPO checkpoint": (373, "35.4", "3.8", "9.1", "1.1", "+26.3", "5.50", "8.66"),
    "Phi-4-mini": (370, "48.6", "6.2", "20.8", "3.0", "+27.8", "3.47", "7.79"),
}


@pytest.mark.parametrize("label", list(TABLE1))
def test_table1_row_numbers(rows, label):
    n, rr, rp, fr, fp, exc, t, z = TABLE1[label]
    s = stats.summarize(rows[label])
    c = s["common"]
    assert c["n"] == n
    assert (r1(c["refeed"]["rate"]), r1(c["refeed"]["polarity_rate"])) == (rr, rp)
    assert (r1(c["floor"]["rate"]), r1(c["floor"]["polarity_rate"])) == (fr, fp)
    assert f"{s['excess_pp']:+.1f}" == exc
    assert f"{s['clustered']['t']:.2f}" == t
    assert f"{s['mcnemar']['z']:.2f}" == z


def test_batch_invariant_row(rows):
    s = stats.summarize(rows["batch-invariant"])
    assert s["common"]["n"] == 106
    assert s["common"]["refeed"]["flips"] == s["common"]["floor"]["flips"] == 0
    assert s["excess_pp"] == 0.0
    assert s["clustered"]["t"] == 0.0 and s["mcnemar"] == {"b": 0, "c": 0, "z": 0.0}
    assert s["jaccard"]["0.5"]["refeed"] == s["jaccard"]["0.5"]["replica"] == 1.0
    p = s["probes"]
    for side in ("refeed", "replica"):
        assert p[side]["divergence_rate"] == 0.0 and p[side]["bit_exact_rate"] == 1.0


def test_table1_formatting(rows):
    t = tables.table1(rows)
    assert list(t.columns) == ["configuration", "model", "K", "cont. temp", "problems", "n (common)",
                               "refeed (polarity)", "floor (polarity)", "excess pp", "t_clust", "z"]
    main = t.iloc[0].tolist()
    assert main == ["main pooled", "Qwen/Qwen2.5-7B-Instruct", 4, "0.7", "primary 20 + screened 20",
                    636, "33.8% (3.9)", "15.1% (1.1)", "+18.7", "5.51", "8.61"]
    greedy = t.set_index("configuration").loc["greedy continuations"]
    assert (greedy["K"], greedy["cont. temp"]) == (1, "0")
    bi = t.iloc[-1].tolist()
    assert bi[5:] == [106, "0.0%", "0.0%", "0", "-", "-"]


# ---------------------------------------------------------------- in-text numbers (docs/protocol.md 5.1)

IN_TEXT = {  # exact1-conditioned excess, Jaccard 0.5 refeed, ceiling
    "main pooled": ("+11.7", "0.68", "0.84"),
    "K=8": ("+19.0", "0.68", "0.87"),
    "K=16": ("+7.4", "0.90", "0.96"),
    "greedy continuations": ("+11.9", "0.59", "0.83"),
    "GRPO checkpoint": ("+17.1", "0.66", "0.88"),
    "Phi-4-mini": ("+21.1", "0.34", "0.63"),
}


@pytest.mark.parametrize("label", list(IN_TEXT))
def test_in_text_numbers(rows, label):
    exc1, jr, jc = IN_TEXT[label]
    s = stats.summarize(rows[label])
    assert f"{s['excess_pp_exact1']:+.1f}" == exc1
    j = s["jaccard"]["0.5"]
    assert (f"{j['refeed']:.2f}", f"{j['replica']:.2f}") == (jr, jc)


def test_probe_ranges_and_cache_totals(rows):
    stock = [lab for lab in rows if lab != "batch-invariant"]
    summaries = {lab: stats.summarize(rows[lab]) for lab in rows}
    replica = [summaries[lab]["probes"]["replica"]["bit_exact_rate"] for lab in stock]
    refeed = [summaries[lab]["probes"]["refeed"]["bit_exact_rate"] for lab in stock]
    assert (f"{100 * min(replica):.0f}", f"{100 * max(replica):.0f}") == ("61", "94")
    assert (r1(min(refeed)), r1(max(refeed))) == ("2.6", "5.7")
    # first-campaign rows carry no cache fields
    assert summaries["greedy continuations"]["cache"] is None
    assert summaries["GRPO checkpoint"]["cache"] is None
    tab = tables.table_cache(rows).set_index("configuration")
    assert tab.loc["total, stock engine", "pivots"] == 3434
    assert tab.loc["total", "pivots"] == 3829
    assert tab.loc["total", "exact1 verified"] == tab.loc["total", "exact2 verified"] == "100.0%"


def test_all_tables_written(rows, tmp_path):
    small = {lab: rows[lab] for lab in ("main pooled", "greedy continuations", "batch-invariant")}
    written = tables.all_tables(small)
    assert list(written) == ["tab1_main", "tab2_jaccard", "tab3_exact1_excess", "tab4_bias", "tab5_margin",
                             "tab6_probes", "tab7_eligibility", "tab8_cache", "tab9_bootstrap", "tab10_passes",
                             "tab11_pass_order", "tab12_exactness", "tab13_clustered", "tab14_selection",
                             "tab15_preregistered", "tab16_cohorts", "tab17_per_problem", "tab18_runs"]
    for name, df in written.items():
        paths = tables.write_table(df, name, tmp_path)
        assert [p.name for p in paths] == [f"{name}.csv", f"{name}.md", f"{name}.tex"]
        assert all(p.stat().st_size > 0 for p in paths)
    md = (tmp_path / "tab1_main.md").read_text().splitlines()
    assert md[0].startswith("| configuration | model | K |") and md[1].startswith("|---|")
    assert "\\%" in (tmp_path / "tab1_main.tex").read_text()
    bias = written["tab4_bias"].set_index("configuration")
    assert bias.loc["main pooled", "95% CI"] == "[-0.0285, +0.0065]"
    elig = written["tab7_eligibility"].iloc[0]
    assert (elig["exact1 non-zero"], elig["only refeed"], elig["only replica"]) == (515, 77, 18)


def test_extras_main(rows):
    e = stats_extras.extras(rows["main pooled"], seed=1, n_boot=300)
    b = e["bootstrap"]
    assert b["n_boot"] == 300 and b["n_problems"] == 40
    for key in ("excess_pp", "jaccard_refeed_0.5", "jaccard_replica_0.5"):
        lo, hi = b[key]["ci95"]
        assert lo < b[key]["estimate"] < hi
    assert e["lpm"]["coef_pp"] == pytest.approx(100 * 119 / 636)
    assert e["lpm"]["n_obs"] == 2 * 636 and e["lpm"]["z"] > 0
    assert e["paper_t"] == pytest.approx(5.5134, abs=1e-3)
    again = stats_extras.extras(rows["main pooled"], seed=1, n_boot=300)
    assert again["bootstrap"] == b


# ---------------------------------------------------------------- synthetic records

def frame(pivots, **extra):
    """pivots: (problem, A_exact1, A_exact2, A_refeed, margin) tuples."""
    df = pd.DataFrame(pivots, columns=["problem_id", "A_exact1", "A_exact2", "A_refeed", "margin"])
    df["rollout"] = 0
    df["abs_pos"] = range(len(df))
    for k, v in extra.items():
        df[k] = v
    return df


# Two problems, hand-computed (see each assertion).
HAND = [
    (1, 0.5, 0.5, -0.5, 0.1),    # a: refeed polarity flip
    (1, 0.0, 0.0, 0.25, 0.3),    # b: refeed zero-crossing, only-refeed eligible, margin exactly 0.3
    (1, 0.0, 0.0, 0.0, 0.5),     # c: not in the common set
    (1, 0.25, 0.0, 0.25, 0.5),   # d: floor zero-crossing
    (2, -0.75, -0.75, -0.75, 0.2),  # e: agreement
    (2, 0.0, 0.5, 0.5, 0.9),     # f: both flip (zero-crossings)
]


def test_hand_computed_rates():
    s = stats.summarize(frame(HAND))
    assert s["n_records"] == 6 and s["n_problems"] == 2
    c = s["common"]
    assert c["n"] == 5
    assert c["refeed"] == {"flips": 3, "rate": 0.6, "zero_crossings": 2, "polarity": 1, "polarity_rate": 0.2}
    assert c["floor"] == {"flips": 2, "rate": 0.4, "zero_crossings": 2, "polarity": 0, "polarity_rate": 0.0}
    assert s["excess_pp"] == pytest.approx(20.0)
    cond = s["exact1_conditioned"]
    assert cond["n"] == 3 and cond["refeed"]["flips"] == 1 and cond["floor"]["flips"] == 1
    assert s["excess_pp_exact1"] == 0.0
    assert s["eligibility"] == {"exact1_nonzero": 3, "only_refeed": 1, "only_replica": 0}
    assert s["mcnemar"] == {"b": 2, "c": 1, "z": pytest.approx(1 / math.sqrt(3))}


def test_hand_computed_clustered_and_bias():
    s = stats.summarize(frame(HAND))
    # problem 1: common a,b,d, refeed 2, floor 1 -> 1/3; problem 2: common e,f, 1 and 1 -> 0
    cl = s["clustered"]
    assert cl["n_problems"] == 2
    assert cl["mean_excess"] == pytest.approx(100 / 6)
    assert cl["t"] == pytest.approx(1.0)  # mean 1/6, sd sqrt(2)/6, n 2
    assert (cl["refeed_worse"], cl["floor_worse"], cl["equal"]) == (1, 0, 1)
    # A_refeed - A_exact1 on the common set: -1, 0.25, 0, 0, 0.5
    b = s["bias"]
    sd = math.sqrt(1.3 / 4)
    assert b["n"] == 5 and b["mean"] == pytest.approx(-0.05)
    assert b["t"] == pytest.approx(-0.05 / (sd / math.sqrt(5)))
    assert b["ci95"] == pytest.approx([-0.05 - 1.96 * sd / math.sqrt(5), -0.05 + 1.96 * sd / math.sqrt(5)])


def test_hand_computed_jaccard_and_margin():
    s = stats.summarize(frame(HAND))
    # |A| >= 0.5: exact1 {a, e}, refeed {a, e, f}, replica {a, e, f}
    assert s["jaccard"]["0.5"] == {"n_exact1": 2, "refeed": pytest.approx(2 / 3), "replica": pytest.approx(2 / 3)}
    assert s["jaccard"]["0.75"] == {"n_exact1": 1, "refeed": 1.0, "replica": 1.0}
    m = s["margin"]
    # margin exactly 0.3 (b) belongs to the >= bucket
    assert m["lt"] == {"n": 2, "refeed_rate": 0.5, "floor_rate": 0.0}
    assert m["ge"] == {"n": 3, "refeed_rate": pytest.approx(2 / 3), "floor_rate": pytest.approx(2 / 3)}
    assert s["probes"] is None and s["cache"] is None


def test_all_zero_estimates():
    s = stats.summarize(frame([(1, 0.0, 0.0, 0.0, 0.5), (2, 0.0, 0.0, 0.0, 0.1)]))
    assert s["common"]["n"] == 0 and s["common"]["refeed"]["rate"] is None
    assert s["excess_pp"] is None and s["excess_pp_exact1"] is None
    assert s["bias"] == {"mean": None, "t": None, "ci95": None, "n": 0}
    assert s["mcnemar"] == {"b": 0, "c": 0, "z": 0.0}
    assert s["clustered"]["n_problems"] == 0 and s["clustered"]["t"] is None
    assert s["jaccard"]["0.5"] == {"n_exact1": 0, "refeed": None, "replica": None}
    assert s["margin"]["lt"] == {"n": 0, "refeed_rate": None, "floor_rate": None}
    json.dumps(s, allow_nan=False)
    assert stats_extras.extras(frame([(1, 0.0, 0.0, 0.0, 0.5)]), n_boot=10)["lpm"] is None


def test_one_problem_and_no_disagreement():
    s = stats.summarize(frame([(7, 0.5, 0.5, 0.5, 0.5), (7, -0.25, -0.25, -0.25, 0.5)]))
    assert s["common"]["n"] == 2 and s["excess_pp"] == 0.0
    assert s["mcnemar"] == {"b": 0, "c": 0, "z": 0.0}  # b + c = 0
    assert s["clustered"]["n_problems"] == 1 and s["clustered"]["t"] is None  # one problem: no sd
    assert s["clustered"]["equal"] == 1
    assert s["bias"]["t"] == 0.0 and s["bias"]["ci95"] == [0.0, 0.0]  # zero spread -> t = 0
    assert stats_extras.lpm_clustered(frame([(7, 0.5, 0.5, -0.5, 0.5), (7, 0.5, 0.5, 0.5, 0.5)])) is None


def test_zero_spread_clustered_t():
    # two problems with identical per-problem excess: t = 0 by convention
    s = stats.summarize(frame([(1, 0.5, 0.5, -0.5, 0.5), (2, 0.5, 0.5, -0.5, 0.5)]))
    assert s["clustered"]["t"] == 0.0 and s["clustered"]["mean_excess"] == 100.0


def test_problem_without_common_pivots_left_out():
    df = frame([(1, 0.5, 0.5, -0.5, 0.5), (1, 0.5, 0.5, 0.5, 0.5), (2, 0.25, 0.25, 0.0, 0.5),
                (2, 0.5, 0.5, 0.5, 0.5), (3, 0.0, 0.0, 0.0, 0.5)])
    cl = stats.summarize(df)["clustered"]
    assert cl["n_problems"] == 2  # problem 3 has no common pivot
    assert cl["mean_excess"] == pytest.approx(50.0) and cl["t"] == 0.0


def test_jaccard_threshold_ties():
    df = frame([(1, 0.5, 0.4999, 0.5, 0.5), (1, -0.75, -0.75, -0.5, 0.5), (1, 0.25, 0.75, 0.0, 0.5)])
    j5, j75 = stats.jaccard(df, 0.5), stats.jaccard(df, 0.75)
    # exact1 {0, 1}; refeed {0, 1}; replica {1, 2} (0.4999 is not selected, 0.5 and 0.75 are)
    assert j5 == {"n_exact1": 2, "refeed": 1.0, "replica": pytest.approx(1 / 3)}
    # exact1 {1}; refeed {}; replica {1, 2}
    assert j75 == {"n_exact1": 1, "refeed": 0.0, "replica": 0.5}
    assert stats.jaccard_sets(set(), set()) is None


def test_probe_statistics_conventions():
    df = frame([(1, 0.5, 0.5, 0.5, 0.5)] * 6)
    df["greedy_divergence_refeed"] = [True, False, False, False, True, None]
    df["greedy_divergence_exact2"] = [False, False, False, False, False, None]
    df["greedy_first_logprob_delta_refeed"] = [0.0, 0.0, 0.1, 0.3, 0.2, None]
    df["greedy_first_logprob_delta_exact2"] = [0.0, 0.0, 0.0, 0.0, 0.0, None]
    p = stats.summarize(df)["probes"]
    assert p["n"] == 5  # the record without probe fields is left out
    # sorted deltas [0, 0, .1, .2, .3]: p90 = index floor(4.5) = 4; non-zero [.1, .2, .3]: index 1
    assert p["refeed"] == {"divergence_rate": 0.4, "bit_exact_rate": 0.4, "median_nonzero": 0.2, "p90": 0.3}
    assert p["replica"] == {"divergence_rate": 0.0, "bit_exact_rate": 1.0, "median_nonzero": None, "p90": 0.0}


def test_cache_partial_fields():
    df = frame([(1, 0.5, 0.5, 0.5, 0.5)] * 4)
    df["cache_ok_exact1"] = [True, False, True, None]
    df["cache_ok_exact2"] = [True, True, True, None]
    assert stats.cache(df) == {"n": 3, "exact1_ok_rate": pytest.approx(2 / 3), "exact2_ok_rate": 1.0}


def test_exact_ok_exclusion():
    df = frame(HAND, exact_ok=[True, False, True, True, None, True])
    s = stats.summarize(df)
    assert s["excluded_not_exact"] == 1 and s["n_records"] == 5
    assert s["common"]["n"] == 4  # pivot b dropped
    assert list(s)[-1] == "excluded_not_exact"
    kept = stats.summarize(df, exclude_flagged=False)
    assert kept["n_records"] == 6 and "excluded_not_exact" not in kept
    assert "excluded_not_exact" not in stats.summarize(frame(HAND))


def test_bootstrap_small_and_seeded():
    df = frame(HAND)
    a = stats_extras.bootstrap(df, n_boot=50, rng=3)
    assert a == stats_extras.bootstrap(df, n_boot=50, rng=3)
    assert a["n_problems"] == 2 and a["excess_pp"]["estimate"] == pytest.approx(20.0)
    lo, hi = a["excess_pp"]["ci95"]
    assert lo <= 20.0 <= hi


def test_pass_comparisons_order_and_exactness_on_synthetic_records():
    import pandas as pd
    df = pd.DataFrame({
        "problem_id": [0, 0, 1, 1], "rollout": [0, 1, 0, 1], "abs_pos": [5, 6, 7, 8], "margin": [0.1] * 4,
        "A_exact1": [0.5, 0.0, -0.5, 0.0], "A_exact2": [0.5, 0.0, -0.5, 0.0], "A_refeed": [0.0, 0.0, 0.5, 0.0],
        "A_refeed2": [0.5, 0.0, 0.5, 0.0], "A_serial": [0.0, 0.25, -0.5, 0.0],
        "pass_order": ["a", "a", "b", "b"], "exact_ok": [True] * 4,
        "first_step_exact": [True, False, None, True], "regenerates_trunk": [True, True, True, None]})
    t = stats_extras.pass_comparisons(df).set_index("comparison")
    assert t.loc["refeed vs exact1", "n"] == 3  # any pass non-zero: rows 0, 1, 2
    assert t.loc["refeed vs exact1", "flips"] == 2 and t.loc["refeed vs exact1", "polarity"] == 1
    assert t.loc["exact2 vs exact1", "flips"] == 0
    assert t.loc["refeed2 vs refeed", "flips"] == 1
    assert t.loc["serial vs exact1", "flips"] == 2
    order = stats_extras.by_pass_order(df).set_index("pass_order")
    assert order.loc["a", "n"] == 1 and order.loc["b", "refeed_rate"] == 1.0
    e = stats_extras.resume_exactness(df)
    assert e["first_step_exact"] == {"checked": 3, "held": 2, "share": 2 / 3}
    assert e["regenerates_trunk"]["held"] == 3


# ---------------------------------------------------------------- metadata from the files, cache first

def test_table1_metadata_from_config_blocks(rows):
    """Model, K, temperature and problems come from the records' config blocks, not literals."""
    k8 = rows["K=8"].copy()
    (cfg,) = k8.attrs["configs"].values()
    k8.attrs = {"configs": {"k8": {**cfg, "model": "org/Other-1B", "k": 8, "cont_temp": 0.3, "problems": 7}}}
    line = tables.table1({"K=8": k8}).iloc[0]
    assert (line["model"], line["K"], line["cont. temp"], line["problems"]) == ("org/Other-1B", 8, "0.3", "7 screened")
    # a null cont_temp means the trunk temperature (the harness's convention)
    k8.attrs["configs"]["k8"].update(cont_temp=None, temperature=0.9)
    assert tables.table1({"K=8": k8}).iloc[0]["cont. temp"] == "0.9"


def test_cache_rates_over_all_records_before_exclusion():
    df = frame(HAND, exact_ok=[True, False, True, True, None, True])
    df["cache_ok_exact1"] = [True, False, True, True, True, True]  # the flagged pivot also missed the cache
    df["cache_ok_exact2"] = True
    s = stats.summarize(df)
    assert s["excluded_not_exact"] == 1 and s["common"]["n"] == 4  # other statistics exclude it
    assert s["cache"]["n"] == 6 and s["cache"]["exact1_ok_rate"] == pytest.approx(5 / 6)
    assert s["cache"]["excluded_not_exact"] == 1


def test_cache_table_counts_all_records_and_exclusions():
    df = frame(HAND, exact_ok=[True, False, True, True, None, True], cache_ok_exact1=True, cache_ok_exact2=True)
    df.loc[1, "cache_ok_exact1"] = False
    line = tables.table_cache({"run": df}).set_index("configuration").loc["run"]
    assert (line["pivots"], line["exact1 verified"], line["excluded (exact_ok false)"]) == (6, "83.3%", 1)


# ---------------------------------------------------------------- the text's numbers (docs/protocol.md 5.3)

def test_clustered_per_problem_splits_as_printed(rows):
    split = tables.table_clustered(rows).set_index("configuration")["worse-better"]
    assert (split["main pooled"], split["K=8"], split["GRPO checkpoint"]) == ("29-5", "19-0", "16-2")
    cl = stats.clustered(rows["main pooled"])
    assert cl["refeed_worse"] + cl["floor_worse"] + cl["equal"] == cl["n_problems"] == 40


def test_selection_gap_share_two_fifths_to_two_thirds(rows):
    """Re-feeding adds two-fifths to two-thirds of the critical-token selection gap (|A| >= 0.5)."""
    shares = {lab: stats.selection_gap(rows[lab], 0.5)["share_added_by_refeed"] for lab in rows if lab != "batch-invariant"}
    assert all(2 / 5 <= s <= 2 / 3 for s in shares.values()), shares
    g = stats.selection_gap(rows["main pooled"], 0.5)
    assert g["share_added_by_refeed"] == pytest.approx((g["replica"] - g["refeed"]) / (1 - g["refeed"]))
    assert stats.selection_gap(rows["batch-invariant"], 0.5)["share_added_by_refeed"] is None  # J = 1: no gap


def test_every_selection_disagreement_within_one_step(rows):
    for label, df in rows.items():
        k = stats.infer_k(df)
        for t in stats.JACCARD_THRESHOLDS:
            near = stats.selection_near_threshold(df, t, k)
            for side in ("refeed", "replica"):
                assert near[side]["within_1_over_k"] == near[side]["disagreements"], (label, t, side)
    assert stats.selection_near_threshold(rows["main pooled"], 0.5, 4)["refeed"]["disagreements"] == 85


@pytest.mark.parametrize("name", ["2026-06-11/primary.json", "2026-06-11/screened.json", "2026-06-11/k8.json",
                                  "2026-06-11/k16.json", "2026-06-10/temp0.json", "2026-06-10/grpo.json",
                                  "2026-06-11/phi.json", "2026-06-11/batchinv.json"])
def test_preregistered_metric_reproduces_the_harness_aggregate(name):
    """Each comparison on its own eligible set, as registered: equal to the file's own aggregate."""
    assert stats.preregistered(records.load_records(PAPER / name)) == records.load_blocks(PAPER / name)["aggregate"]


def test_preregistered_beside_common_set_and_cohorts(rows):
    primary, screened = (records.load_records(PAPER / f"2026-06-11/{c}.json") for c in ("primary", "screened"))
    pre = stats.preregistered(rows["main pooled"])
    assert pre["primary_exact_vs_refeed"] == {"eligible": 618, "flips": 215, "rate": 215 / 618}
    assert pre["floor_exact_vs_exact"]["eligible"] == 559 and pre["floor_exact_vs_exact"]["flips"] == 96
    t = tables.table1({"primary": primary, "screened": screened, "main pooled": rows["main pooled"]})
    t = t.set_index("configuration")
    assert list(t["problems"]) == ["primary 0-19", "20 screened", "primary 20 + screened 20"]
    assert t.loc["primary", "n (common)"] + t.loc["screened", "n (common)"] == 636


def test_run_blocks_tables():
    blocks = {name: {"records": records.load_records(PAPER / f), "file": f, **records.load_blocks(PAPER / f)}
              for name, f in (("primary", "2026-06-11/primary.json"), ("GRPO checkpoint", "2026-06-10/grpo.json"))}
    per = tables.table_per_problem(blocks)
    assert len(per) == 40 and set(per["run"]) == {"primary", "GRPO checkpoint"}
    first = per.iloc[0]
    assert (first["problem_id"], first["rollout accuracy"], first["cache violations exact1"], first["seconds exact1"],
            first["seconds total"]) == (0, 1.0, 0, 8.2, 25.6)
    assert per.set_index("run").loc["GRPO checkpoint", "cache violations exact1"].eq("-").all()  # first campaign
    runs = tables.table_runs(blocks).set_index("run")
    assert runs.loc["primary", "elapsed seconds"] == "752.1" and runs.loc["GRPO checkpoint", "pivots"] == 779
