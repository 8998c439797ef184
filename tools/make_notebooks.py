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
from replaylib.params import STAGES, Params  # noqa: E402

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
    keys = Params.keys_for(stage)
    for owner in STAGES:
        own = [k for k in keys if fields[k].metadata["stage"] == owner]
        if own:
            lines.append(f"# {TITLES[owner]}")
            lines += [f"{k} = {getattr(defaults, k)!r}  # {fields[k].metadata['doc']}" for k in own]
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
        ("code", "from replaylib import pivots, plotting, sampling\nfrom replaylib.rundir import StageDir, figures_dir\n\npivot_table = pivots.run(P, OUT)\ntrunks, _, _ = sampling.load(P, OUT)\npivots.summary(pivot_table, trunks)"),
        ("md", "## Margins of every generated token\n\nMost tokens are confident; the pivots come from the low-margin tail left of the line."),
        ("code", "margins = pd.read_parquet(StageDir(P, pivots.STAGE, OUT).path / \"margins.parquet\")\nfig, ax = plotting.margin_histogram(margins.margin, P.margin_threshold)\nplotting.save_figure(fig, \"figS1_margins\", figures_dir(P.config, OUT),\n                      plotting.margin_histogram_data(margins.margin, P.margin_threshold))\nfig"),
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
        ("md", """## Beyond the paper: where does re-feeding's change enter? (issue 17)

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


def build(stage: str):
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    body = BODY[stage]
    cells = [new_markdown_cell(body[0][1]), parameters_cell(stage), new_code_cell(SETUP.format(stage=stage))]
    cells += [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in body[1:]]
    for i, cell in enumerate(cells):  # stable ids: regenerating leaves unchanged notebooks unchanged
        cell.id = f"{stage[:2]}-{i:02d}"
    nb.cells = cells
    return nb


if __name__ == "__main__":
    (REPO / "notebooks").mkdir(exist_ok=True)
    for stage in STAGES:
        nbformat.write(build(stage), str(REPO / "notebooks" / f"{stage}.ipynb"))
        print("wrote", f"notebooks/{stage}.ipynb")
