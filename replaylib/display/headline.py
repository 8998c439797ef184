"""A run's headline."""
from __future__ import annotations

import json

import pandas as pd

from ..core.paths import out_root, stage_dir, tables_dir
from ..core.text import short
from .worked_examples import TABLE1_SHORT

PAPER = "paper"            # the published records' configuration (params/paper.yaml)


PAPER_ROW = "main pooled"  # the paper's headline row of Table 1


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _sign_sentence(main: dict) -> str:
    c, t = main["common"], main["clustered"]["t"]
    tail = (f"clustered t = {t:.2f} over {main['clustered']['n_problems']} problems" if t is not None else
            f"the clustered t is undefined ({main['clustered']['n_problems']} problems with a common pivot)")
    return (f"Re-feed changed the sign of A at {_pct(c['refeed']['rate'])} of the {c['n']} eligible pivots "
            f"({c['refeed']['flips']}/{c['n']}), {main['excess_pp']:+.1f} pp above the replica floor of "
            f"{_pct(c['floor']['rate'])}; {tail}.")


def _need_sentence(main: dict) -> str:
    sp, n = main["sign_power"], main["common"]["n"]
    need = ((f"about {sp['needed_pivots']} common pivots ({sp['needed_problems']} problems at this run's "
             f"{sp['per_problem']} per problem)")
            if sp["needed_pivots"] else
            "common pivots in 2 problems or more before a clustered t exists"
            if sp["per_problem"] is None else
            f"more than {sp['searched_problems'] * sp['per_problem']} common pivots at {sp['per_problem']} per problem")
    return (f"Sign statistics need {need}; this run has {n} (re-feed changed the sign at "
            f"{main['common']['refeed']['flips']}, the replica at {main['common']['floor']['flips']}).")


def headline_channel(main: dict) -> str:
    """Which channel the headline leads with: "empty" (no pivot), "identical" (all passes agreed bit for
    bit on the probes and continuations), "sign" (the sign statistics have power, or the records carry
    no grading-free channel, as the published ones), or "contrast" (the probe and continuation contrast)."""
    if not main["n_records"]:
        return "empty"
    contrast = main.get("contrast") or {}
    probe, cont = contrast.get("probe"), contrast.get("continuations")
    if probe and cont and all(x["refeed_exact"] == x["replica_exact"] == x["n"] for x in (probe, cont)):
        return "identical"
    if probe is None or "sign_power" not in main or main["sign_power"]["powered"]:
        return "sign"
    return "contrast"


def headline_sentence(main: dict) -> str:
    """The strongest claim a stats.summarize() dict (summary.json's "main") supports: the sign
    disagreement where its statistics have power, else the grading-free contrast of re-feed against the
    replica (greedy probes and continuations, paired bit-exactness, exact McNemar p), with the size the
    sign statistics would need."""
    channel = headline_channel(main)
    n = main["n_records"]
    if channel == "empty":
        return "No pivot to measure: the replay produced no record."
    if channel == "identical":
        return (f"All three passes agreed bit for bit at all {n} pivots (greedy probes and continuations): "
                f"re-feeding changed nothing here, as with batch-invariant kernels.")
    if channel == "sign":
        if not main["common"]["n"]:
            return (f"No pivot was eligible: A was 0 in every pass at all {n} pivots, so re-feeding "
                    f"had no sign to change (the common set is empty).")
        return _sign_sentence(main)
    probe, cont = main["contrast"]["probe"], main["contrast"]["continuations"]
    conts = (f"; the continuations reproduced exact1's at {cont['replica_exact']}/{cont['n']} replica and "
             f"{cont['refeed_exact']}/{cont['n']} re-fed pivots (p = {cont['p']:.2g})" if cont else "")
    return (f"Re-feeding did not replay the decode-time pass where a replica did: the greedy probe was bit-exact "
            f"at {probe['replica_exact']}/{probe['n']} replica pivots and {probe['refeed_exact']}/{probe['n']} "
            f"re-fed ones (exact McNemar p = {probe['p']:.2g}){conts}. " + _need_sentence(main))


def read_table(path) -> pd.DataFrame:
    """A table the statistics stage wrote (a .csv), every cell as text; one line naming the file otherwise."""
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except ValueError as e:  # pandas' parser errors, a file that is not UTF-8
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"{path}: not a table as the statistics stage writes it ({type(e).__name__}: "
                         f"{short(first)}); rerun the statistics stage, or leave this run out") from None


def claims_table(config: str, out_dir=None) -> pd.DataFrame | None:
    """The paper's claims judged on this run's records (tables/<config>/tab21_claims.csv), or None."""
    path = tables_dir(config, out_dir) / "tab21_claims.csv"
    return read_table(path) if path.exists() else None


def claims_html(config: str, out_dir=None) -> str:
    """claims_table as HTML with every sentence in full (a notebook's display.max_colwidth cuts a frame's
    cells); empty where the run has none."""
    table = claims_table(config, out_dir)
    return "" if table is None else table.to_html(index=False)


def summary_json(config: str, out_dir=None) -> dict:
    path = stage_dir(config, "04_statistics", out_dir) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run the statistics stage: "
                                f"python -m replaylib.run params/{config}.yaml 04")
    return json.loads(path.read_text())


def table1(config: str, out_dir=None) -> pd.DataFrame:
    """Table 1 as the statistics stage wrote it (tables/<config>/tab1_main.csv)."""
    path = tables_dir(config, out_dir) / "tab1_main.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run the statistics stage: "
                                f"python -m replaylib.run params/{config}.yaml 04")
    return read_table(path)


def paper_row(out_dir=None) -> pd.DataFrame | None:
    """The paper's main pooled row, recomputed from the published records (tables/paper/), or None."""
    try:
        t = table1(PAPER, out_dir)
    except FileNotFoundError:
        return None
    row = t[t.configuration == PAPER_ROW].copy()
    row["configuration"] = f"paper: {PAPER_ROW}"
    return row


def table1_beside_paper(config: str, out_dir=None) -> pd.DataFrame:
    """This run's Table 1 rows, then the paper's main pooled row (when tables/paper/ exists)."""
    own = table1(config, out_dir)
    paper = paper_row(out_dir) if config != PAPER else None
    return pd.concat([own, paper], ignore_index=True) if paper is not None else own


def invariant_verdict(config: str, out_dir=None) -> str:
    """The batch-invariant confirmation in words, from stage 5's invariant.json (or the paper's row)."""
    root = out_root(out_dir)
    path = stage_dir(config, "05_batch_invariant", root) / "invariant.json"
    if path.exists():
        r = json.loads(path.read_text())
        verdict = "all passes identical on every channel" if r.get("all_identical") else "passes DIFFER"
        return (f"{verdict}: estimates {r.get('estimates_identical', 0)}/{r['pivots']}, probe tokens "
                f"{r.get('probe_tokens_identical', 0)}/{r['pivots']}, probe logprobs bit-exact "
                f"{r.get('probe_logprobs_bit_exact', 0)}/{r['pivots']}, continuations "
                f"{r.get('continuations_identical', 0)}/{r['pivots']} ({path.relative_to(root)})")
    t = table1(config, out_dir)
    row = t[t.configuration.str.contains("batch-invariant")]
    if row.empty:
        return "not run for this configuration"
    r = row.iloc[0]
    return (f"Table 1 row '{r['configuration']}': n {r['n (common)']}, refeed {r['refeed (polarity)']}, "
            f"floor {r['floor (polarity)']}")


def headline_block(config: str, out_dir=None) -> list[str]:
    """The runner's closing lines: Table 1 beside the paper's, the headline sentence, batch-invariance."""
    t = table1_beside_paper(config, out_dir)[TABLE1_SHORT]
    lines = [("Table 1    " if i == 0 else " " * 11) + line for i, line in enumerate(t.to_string(index=False).splitlines())]
    if paper_row(out_dir) is None:
        lines.append("           (the paper's row: python -m replaylib.run params/paper.yaml recomputes it from "
                     "the published records)")
    summary = summary_json(config, out_dir)
    lines.append("headline   " + headline_sentence(summary["main"]))
    for i, x in enumerate(summary.get("claims", [])):
        # a refutation says what refutes it (which row, the number and why)
        why = "; ".join(f"{label}: {r['value']}" + (f", {r['why']}" if r["why"] else "")
                        for label, r in x["rows"].items() if r["verdict"] == "does not hold")
        lines.append(("claims     " if i == 0 else " " * 11) + f"{x['verdict']:<14} {x['claim']}" +
                     (f" ({why})" if why else ""))
    exact = exactness_sentence(config, out_dir)
    if exact:
        lines.append("exactness  " + exact)
    lines.append("invariant  " + invariant_verdict(config, out_dir))
    return lines


def exactness_sentence(config: str, out_dir=None) -> str | None:
    """How the replay's pivots resumed their decode-time state, and how many were excluded (stage 3's
    manifest); None where the run has no replay stage (the published records)."""
    path = stage_dir(config, "03_three_pass_replay", out_dir) / "manifest.json"
    if not path.exists():
        return None
    m = json.loads(path.read_text())
    n, flagged, states = m.get("n_records", 0), m.get("flagged_not_exact", 0), m.get("state_established", {})
    how = "; ".join(f"{k} {v}" for k, v in sorted(states.items(), key=lambda kv: -kv[1]))
    return (f"{n - flagged} of {n} pivots resumed a verified decode-time state, {flagged} excluded"
            + (f" (state: {how})" if how else ""))
