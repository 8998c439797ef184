"""Write notebooks/*.ipynb (no outputs). Their parameters cells come from replaylib.params,
so a new parameter only needs `python tools/make_notebooks.py` to reach every notebook."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from replaylib.params import EXECUTOR_KEYS, EXECUTOR_STAGES, STAGES, Params  # noqa: E402

TITLES = {"01_sampling": "01 sampling", "02_pivot_mining": "02 pivot mining",
          "03_three_pass_replay": "03 three-pass replay", "04_statistics": "04 statistics",
          "05_batch_invariant": "05 batch-invariant"}


def parameters_cell(stage: str):
    fields = {f.name: f for f in dataclasses.fields(Params)}
    defaults = Params()
    lines = ["# Parameters: plain literals, defaults = the embedded CPU configuration (params/embedded.yaml).",
             "# `python -m replaylib.run PARAMS.yaml` or papermill -p overrides them.",
             f"config = {defaults.config!r}  # {fields['config'].metadata['doc']}",
             'out_dir = ""  # root of runs/, figures/ and tables/ (empty: the repository)']
    if stage in EXECUTOR_STAGES:  # where the engines run: in no stage key (replaylib/executor.py)
        lines.append("# executor")
        lines += [f"{k} = {getattr(defaults, k)!r}  # {fields[k].metadata['doc']}" for k in EXECUTOR_KEYS]
    keys = Params.keys_for(stage)
    for owner in STAGES:
        own = [k for k in keys if fields[k].metadata["stage"] == owner]
        if own:
            lines.append(f"# {TITLES[owner]}")
            lines += [f"{k} = {getattr(defaults, k)!r}  # {fields[k].metadata['doc']}" for k in own]
    lines.append("# display (in no stage's key: changing it reruns nothing)")
    lines += [f"{k} = {getattr(defaults, k)!r}  # {fields[k].metadata['doc']}" for k in Params.display_keys()]
    assert all(line.count("=") <= 1 for line in lines if not line.startswith("#")), "papermill parses one '=' a line"
    cell = new_code_cell("\n".join(lines))
    cell.metadata["tags"] = ["parameters"]
    return cell


SETUP = """import pandas as pd
from IPython.display import Image, Markdown, display

import replaylib
from replaylib import params
replaylib.log_to_stdout()
P = params.from_notebook(globals(), "{stage}")
OUT = out_dir or None
pd.set_option("display.max_colwidth", 80)
P"""

BODY = {
    "01_sampling": [
        ("md", """# Stage 1: sampling trunks

For every problem, N rollouts ("trunks") at the trunk temperature and top-p, seeded by a stable
hash of (problem, "trunk", rollout). Every generated token keeps its raw top-k logprobs (before
temperature and top-p: the pivot margin is measured on the model's own distribution). With
`screen_mixed`, a problem is kept only if its trunk accuracy is neither 0 nor 1 (docs/protocol.md 3.1).
The transformers engine also saves each kept trunk's decode-time KV state, so that the replay
stage can resume exactly the state the model had while decoding.

Writes `runs/<config>/01_sampling/`: `trunks.parquet`, `state/problem_*.safetensors`,
`accuracy.csv`, `problems.json`, `engine.json`."""),
        ("code", "from replaylib import sampling\n\nresult = sampling.run(P, OUT)\nresult"),
        ("md", "## Trunk accuracy of every scanned problem"),
        ("code", "trunks, engine_info, problems = sampling.load(P, OUT)\npd.DataFrame(problems[\"scanned\"])"),
        ("md", "## One trunk, as the model wrote it"),
        ("code", "first = trunks.iloc[0]\nprint(f\"problem {first.problem_id}, rollout {first.rollout}, correct {first.correct}, \"\n      f\"{first.n_tokens} tokens, finished by {first.finish_reason}\\n\")\nprint(first.text)"),
    ],
    "02_pivot_mining": [
        ("md", """# Stage 2: pivot mining

A generated token is a pivot when the gap between its raw top-1 and top-2 logprobs is below
`margin_threshold`. The paper's engine resumes a paged cache in 16-token blocks, so it also
required the pivot to sit within `boundary_slack` tokens past a block boundary; this package's
engine resumes at any token, so `block_size: 1` (the default) lifts that filter and
`block_size: 16` reproduces the paper's. The alternative arm forces the most likely other
token; EOS and special alternatives are skipped; at most `max_pivots_per_rollout` per trunk,
earliest first (docs/protocol.md 3.2).

Writes `runs/<config>/02_pivot_mining/pivots.parquet` and `margins.parquet`."""),
        ("code", "from replaylib import pivots, plotting, sampling\nfrom replaylib.rundir import StageDir\n\npivot_table = pivots.run(P, OUT)\ntrunks, _, _ = sampling.load(P, OUT)\npivots.summary(pivot_table, trunks)"),
        ("md", "## Margins of every generated token\n\nMost tokens are confident; the pivots come from the low-margin tail left of the line."),
        ("code", "# the stage saved this figure (figures/<config>/figS1_margins.*, in its manifest's products)\nmargins = pd.read_parquet(StageDir(P, pivots.STAGE, OUT).path / \"margins.parquet\")\nfig, ax = plotting.margin_histogram(margins.margin, P.margin_threshold)\nfig"),
        ("md", "## The pivots"),
        ("code", "pivot_table"),
    ],
    "03_three_pass_replay": [
        ("md", """# Stage 3: three-pass replay

Each pivot is cut from its trunk and both arms are forced: the sampled token (*actual*) and the
best alternative (*alt*). Each arm gets K sampled continuations, seeded by
hash(problem, rollout, abs_pos, arm, k), and one greedy 32-token probe, in three passes
(docs/protocol.md 3.3):

* **exact1** resumes the decode-time KV state saved by stage 1 (loaded from disk and checked
  against its digest);
* **exact2** repeats exact1 identically: the replica, i.e. the measurement's noise floor;
* **refeed** prefills the same token ids afresh, as published credit pipelines do;
* optionally (`passes`, beyond the paper) **refeed2** (refeed's own replica), **serial** (refeed
  with every request alone) and **block16** (the paper's block-granular resume), in a fixed or
  shuffled order (`pass_order`).

The estimate is A = mean(R | actual) - mean(R | alt) per pass. Records follow the paper's schema
plus exactness columns: `exact_ok` (the resumed state is bit-for-bit the saved one; records
without it are flagged and excluded from the statistics) and `first_step_exact` (the first
post-pivot step of the actual arm reproduces the trunk's own raw top-k logprobs bit for bit), and
with `verify_regeneration` `regenerates_trunk` (resuming the actual token with the trunk's own
seed regenerates the rest of the trunk bit for bit).

Writes `runs/<config>/03_three_pass_replay/records.parquet` (and per-problem shards)."""),
        ("code", "from replaylib import replay\n\nrecords = replay.run(P, OUT)\nrecords[[\"problem_id\", \"rollout\", \"abs_pos\", \"margin\", \"A_exact1\", \"A_exact2\", \"A_refeed\",\n         \"greedy_divergence_refeed\", \"greedy_first_logprob_delta_refeed\", \"exact_ok\", \"first_step_exact\"]]"),
        ("md", "## How exact was each resume?"),
        ("code", "pd.Series({\n    \"pivots\": len(records),\n    \"state verified (exact_ok)\": int(records.exact_ok.sum()),\n    \"first post-pivot step bit-exact\": int((records.first_step_exact == True).sum()),\n    \"first step not checkable (pivot at the trunk's last token)\": int(records.first_step_exact.isna().sum()),\n    \"trunk regenerated bit for bit\": int((records.regenerates_trunk == True).sum()),\n    \"continuations differing, exact2 vs exact1\": int(records.cont_diff_exact2.sum()),\n    \"continuations differing, refeed vs exact1\": int(records.cont_diff_refeed.sum()),\n    \"continuation rows per pass\": len(records) * 2 * P.k,\n})"),
    ],
    "04_statistics": [
        ("md", """# Stage 4: statistics, tables and figures

Every quantity of docs/protocol.md section 4: disagreement of refeed and of the replica (exact2)
with exact1 on the common set (any pass A != 0) and on the exact1-conditioned set, the excess in
percentage points, eligibility sources, the problem-clustered t and its per-problem split,
McNemar's z, the bias of A_refeed - A_exact1, margin buckets, critical-token Jaccard and the share
of the selection gap re-feeding adds, the greedy-probe channel, the cache instrumentation (over all
records, exclusions beside it), and the pre-registered metrics as registered; beyond the paper,
problem-bootstrap CIs and a statsmodels cross-check.
`records: published` computes them from the paper authors' seven runs (data/paper-records) and
regenerates Table 1 and Figures 1-3, each shown beside the paper's own figure; `records: run`
from this configuration's replay, with its batch-invariant confirmation (stage 5) as a second
row, as in the paper.

Writes `tables/<config>/tab*.{csv,md,tex}`, `figures/<config>/fig*.{pdf,png,csv}` (the CSV: the
data the figure plots) and `runs/<config>/04_statistics/summary.json`."""),
        ("code", "from replaylib import plotting, statistics_stage\nfrom replaylib.rundir import figures_dir, tables_dir\n\nsummary = statistics_stage.run(P, OUT)\nTABLES, FIGURES = tables_dir(P.config, OUT), figures_dir(P.config, OUT)"),
        ("md", "## Table 1"),
        ("code", "display(Markdown((TABLES / \"tab1_main.md\").read_text()))"),
        ("md", "## Figure 1: A_exact1 against A_refeed and against the replica\n\nLeft: regenerated here; right: the paper's (data/paper-figures)."),
        ("code", "fig, _ = plotting.side_by_side(FIGURES / \"fig1_quadrants.png\", plotting.paper_figure(\"fig1_quadrants\"))\nImage(plotting.to_png(fig))"),
        ("md", "## Figure 2: disagreement per configuration"),
        ("code", "fig, _ = plotting.side_by_side(FIGURES / \"fig2_configs.png\", plotting.paper_figure(\"fig2_configs\"))\nImage(plotting.to_png(fig))"),
        ("md", "## Figure 3: first-token logprob deltas of the greedy probes"),
        ("code", "fig, _ = plotting.side_by_side(FIGURES / \"fig3_logprob_ecdf.png\", plotting.paper_figure(\"fig3_logprob_ecdf\"))\ndisplay(Image(plotting.to_png(fig)))\npd.read_csv(FIGURES / \"fig3_logprob_ecdf.csv\")"),
        ("md", "## The in-text numbers"),
        ("code", "for name in [\"tab2_jaccard\", \"tab3_exact1_excess\", \"tab4_bias\", \"tab5_margin\", \"tab6_probes\",\n             \"tab7_eligibility\", \"tab8_cache\", \"tab9_bootstrap\", \"tab13_clustered\", \"tab14_selection\"]:\n    display(Markdown(f\"**{name}**\\n\\n\" + (TABLES / f\"{name}.md\").read_text()))"),
        ("md", "## The pre-registered metrics, the cohorts and the runs\n\nThe primary metric as registered (each comparison on its own eligible set), checked against each published file's own `aggregate` block; Table 1 for the primary and screened cohorts apart and pooled; each run's elapsed time (its per-problem blocks: `tab17_per_problem`)."),
        ("code", "for name in [\"tab15_preregistered\", \"tab16_cohorts\", \"tab18_runs\"]:\n    display(Markdown(f\"**{name}**\\n\\n\" + (TABLES / f\"{name}.md\").read_text()))"),
        ("md", """## Beyond the paper: where does re-feeding's change enter?

With `passes` holding `xplant_refeed_kv` (exact's procedure resuming the KV a fresh prefill of the
prefix produces) and `xplant_decode_kv` (refeed's prefill call with the decode-time KV placed in
place of the prefix's own K and V), `tab19_transplant` and `fig5_transplant` compare every pass
with exact1 as Table 1 compares refeed: if the change follows the cache, the re-fed-KV transplant
behaves as refeed and the decode-KV one as exact1. With `layer_profile: true`,
`tab20_layer_profile` and `fig6_layer_profile` show, per layer, where the decode-time and re-fed K
and V differ (prompt positions, generated positions, the last prefix position). Neither exists
for the published records (the paper ran neither)."""),
        ("code", "for name in [\"tab19_transplant\", \"tab20_layer_profile\"]:\n    if (TABLES / f\"{name}.md\").exists():\n        display(Markdown(f\"**{name}**\\n\\n\" + (TABLES / f\"{name}.md\").read_text()))\nfor name in [\"fig5_transplant\", \"fig6_layer_profile\"]:\n    if (FIGURES / f\"{name}.png\").exists():\n        display(Image(filename=str(FIGURES / f\"{name}.png\")))"),
    ],
    "05_batch_invariant": [
        ("md", """# Stage 5: batch-invariant confirmation

The same measurement with the engine in an invariant mode, in which prefill and decode compute
every token identically. On the transformers engine every forward pass is one token of one
sequence; on vLLM, `VLLM_BATCH_INVARIANT=1` with an invariant attention backend. The prediction
(met exactly in the paper): exact1, exact2 and refeed agree on every channel: estimates, probe
tokens and probe logprobs. The stage fails if any pivot disagrees (docs/protocol.md 3.5).

Writes `runs/<config>/05_batch_invariant/records.parquet` and `invariant.json`."""),
        ("code", "from replaylib import invariant\n\nreport = invariant.run(P, OUT)\npd.Series(report)"),
        ("md", "## The invariant records"),
        ("code", "inv = invariant.load(P, OUT)\ninv[[\"problem_id\", \"rollout\", \"abs_pos\", \"A_exact1\", \"A_exact2\", \"A_refeed\",\n     \"greedy_divergence_exact2\", \"greedy_divergence_refeed\",\n     \"greedy_first_logprob_delta_exact2\", \"greedy_first_logprob_delta_refeed\"]]"),
    ],
}


# Worked examples (replaylib/examples.py; the report page shows the same), right after the stage's run call.
EXAMPLES = {
    "01_sampling": [
        ("md", """## Worked example: one trunk and its margins

The first kept trunk with a low-margin token. Every marked token had a raw top-1/top-2 logprob gap
below `margin_threshold`: the model nearly chose another token there (hover for both candidates).
These are the places where stage 2 mines pivots."""),
        ("code", "from IPython.display import HTML\nfrom replaylib import examples\n\n"
                 "trunks, _, _ = sampling.load(P, OUT)\npieces = examples.token_pieces(P.model)\n"
                 "trunk = examples.example_trunk(trunks, P.margin_threshold)\n"
                 "display(HTML(examples.trunk_html(trunk, pieces, P.margin_threshold)))\n"
                 "margins = examples.trunk_margins(trunk, pieces)\nmargins[margins.margin < P.margin_threshold]"),
    ],
    "02_pivot_mining": [
        ("md", """## Worked example: every pivot in context

The text just before each pivot, the sampled (*actual*) token and the *alternative* with their raw
logprobs, and what the trunk went on to write. Stage 3 forces each of the two tokens here."""),
        ("code", "from replaylib import examples\n\npieces = examples.token_pieces(P.model)\n"
                 "examples.pivots_in_context(pivot_table, trunks, pieces)"),
    ],
    "03_three_pass_replay": [
        ("md", """## Worked example: one pivot through the passes

The pivot is `example_pivot` (default: the first where re-feed changed the sign of A). Its prefix,
the two forced tokens, then each pass: how many of the K continuations of each arm were graded
correct, the resulting A, and the first token of each arm's greedy probe with its logprob.
exact1 and exact2 resume the same decode-time state; refeed recomputes the prefix."""),
        ("code", "from IPython.display import HTML\nfrom replaylib import examples, sampling\n\n"
                 "trunks, _, _ = sampling.load(P, OUT)\npieces = examples.token_pieces(P.model)\n"
                 "passes = examples.passes_of(records)\n"
                 "chosen = records.iloc[examples.choose_pivot(records, example_pivot)]\n"
                 "display(HTML(examples.pivot_prefix_html(chosen, trunks, pieces)))\n"
                 "examples.pass_table(chosen, passes, P.k, pieces)"),
        ("md", "Each pass's K continuations per arm, as text with their grades (R):"),
        ("code", "texts = examples.continuations(chosen, passes, trunks, P, OUT)\n"
                 "texts if texts is not None else Markdown(\n"
                 "    \"These records keep each arm's number of correct continuations (`wins_<pass>_<arm>`), not the \"\n"
                 "    \"continuations' tokens, so their text cannot be shown here.\")"),
        ("md", "### Where re-feed changed the sign of A and the replica did not"),
        ("code", "examples.sign_changes(records)"),
        ("md", "### First-token logprob deltas of the greedy probes, per pass against exact1\n\n"
               "0 means bit-identical; the replica should be 0 everywhere, re-feed need not be."),
        ("code", "examples.first_token_deltas(records)"),
    ],
    "04_statistics": [
        ("md", "## The headline\n\nComputed from `summary.json` (the common set: pivots where any pass has A != 0)."),
        ("code", "from replaylib import examples\n\nMarkdown(examples.headline_sentence(summary[\"main\"]))"),
    ],
    "05_batch_invariant": [
        ("md", """## Worked example: the same pivot, invariant

The pivot of the stage 3 example when this stage mined it too (same problem, rollout and position;
this stage samples its own trunks in invariant mode), else its first pivot: every pass gives the same
wins, the same A and bit-identical probe logprobs."""),
        ("code", "from replaylib import examples, replay\n\ninv = invariant.load(P, OUT)\n"
                 "main = replay.load(P, OUT)\nchosen = main.iloc[examples.choose_pivot(main, example_pivot)] if len(main) else None\n"
                 "row = inv.iloc[examples.invariant_example(inv, chosen)]\n"
                 "print(f\"problem {row.problem_id}, rollout {row.rollout}, position {row.abs_pos}: identical in every pass: \"\n"
                 "      f\"{examples.identical_in_every_pass(row, examples.passes_of(inv))}\")\n"
                 "examples.pass_table(row, examples.passes_of(inv), P.k, examples.token_pieces(P.model))"),
    ],
}
CAMPAIGN = "06_campaign"
CAMPAIGN_BODY = [
    ("md", """# 06 campaign: the paper's items from live runs

A campaign file (`params/campaign-*.yaml`) composes configurations into the paper's Table 1 rows
(pooled as the paper pooled them), its batch-invariant row (one configuration's stage 5), Figure 1's
row and Figure 3's pooled runs, and names the published row each one is compared with.
`python -m replaylib.campaign CAMPAIGN.yaml` runs every configuration's stale stages, then this
notebook, which writes `tables/campaign-<name>/` (`tab1_main`, `live_vs_published`) and
`figures/campaign-<name>/` (Figures 1-3 with their data as CSV), and records its inputs (each
row's records, sha256) and products in `runs/campaign-<name>/manifest.json`.

`live_vs_published` sets every Table 1 quantity of every row, published (computed from
data/paper-records) beside live (with a 95% problem-bootstrap interval), then one verdict per claim
of the paper."""),
    ("code", "import pandas as pd\nfrom IPython.display import Image, Markdown, display\n\nimport replaylib\n"
             "from replaylib import campaign as campaigns\nfrom replaylib.rundir import figures_dir, tables_dir\n"
             "replaylib.log_to_stdout()\nOUT = out_dir or None\nC = campaigns.load(campaign)\n"
             "pd.DataFrame([{\"row\": r.label, \"configurations\": \" + \".join(r.configs), \"published row\": r.published}\n"
             "              for r in C.rows + [C.invariant]])"),
    ("code", "manifest = campaigns.statistics(C, OUT)\nTABLES, FIGURES = tables_dir(C.label, OUT), figures_dir(C.label, OUT)"),
    ("md", "## Table 1, live"),
    ("code", "display(Markdown((TABLES / \"tab1_main.md\").read_text()))"),
    ("md", "## Live against published, and the paper's claims"),
    ("code", "display(Markdown((TABLES / \"live_vs_published.md\").read_text()))"),
    ("md", "## Figures 1-3 from the live records"),
    ("code", "for name in [\"fig1_quadrants\", \"fig2_configs\", \"fig3_logprob_ecdf\"]:\n    display(Image(FIGURES / f\"{name}.png\"))"),
]


def build_campaign():
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    params = new_code_cell("# Parameters: plain literals. `python -m replaylib.campaign CAMPAIGN.yaml` or papermill -p\n"
                           "# overrides them.\n"
                           "campaign = 'params/campaign-paper.yaml'  # the campaign file (its paths resolve from the "
                           "repository root)\n"
                           'out_dir = ""  # root of runs/, figures/ and tables/ (empty: the repository)')
    params.metadata["tags"] = ["parameters"]
    cells = [new_markdown_cell(CAMPAIGN_BODY[0][1]), params]
    cells += [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in CAMPAIGN_BODY[1:]]
    for i, cell in enumerate(cells):
        cell.id = f"06-{i:02d}"
    nb.cells = cells
    return nb


def build(stage: str):
    if stage == CAMPAIGN:
        return build_campaign()
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    body = BODY[stage]
    cells = [new_markdown_cell(body[0][1]), parameters_cell(stage), new_code_cell(SETUP.format(stage=stage))]
    rest = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in body[1:]]
    run_call = next(i for i, (kind, _) in enumerate(body[1:]) if kind == "code") + 1
    cells += rest[:run_call] + [new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                                for kind, src in EXAMPLES[stage]] + rest[run_call:]
    for i, cell in enumerate(cells):  # stable ids: regenerating leaves unchanged notebooks unchanged
        cell.id = f"{stage[:2]}-{i:02d}"
    nb.cells = cells
    return nb


if __name__ == "__main__":
    (REPO / "notebooks").mkdir(exist_ok=True)
    for stage in STAGES + [CAMPAIGN]:
        nbformat.write(build(stage), str(REPO / "notebooks" / f"{stage}.ipynb"))
        print("wrote", f"notebooks/{stage}.ipynb")
