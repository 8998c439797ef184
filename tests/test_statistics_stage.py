"""Stage 4 on the published records, in a temporary out root: what it writes and records."""

import json

import pandas as pd
import pytest

from replaylib.core.files import sha256_file
from replaylib.runtime.params import Params
from replaylib.stages import statistics as statistics_stage


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("out")
    summary = statistics_stage.run(Params(config="paper", records="published", bootstrap_draws=50), root)
    return root, summary


def test_products_relative_to_the_out_root(out):
    root, _ = out
    manifest = json.loads((root / "runs" / "paper" / "04_statistics" / "manifest.json").read_text())
    products = manifest["products"]
    assert "figures/paper/fig3_logprob_ecdf.csv" in products and "tables/paper/tab15_preregistered.md" in products
    for rel, digest in products.items():
        assert not rel.startswith("/") and sha256_file(root / rel) == digest
    for name in ("fig1_quadrants", "fig2_configs", "fig3_logprob_ecdf"):
        assert all(f"figures/paper/{name}.{ext}" in products for ext in ("pdf", "png", "csv"))


def test_figure3_csv_is_the_papers_pool(out):
    root, _ = out
    fig3 = pd.read_csv(root / "figures" / "paper" / "fig3_logprob_ecdf.csv").set_index("series")
    assert {"n", "exactly_zero_share"} <= set(fig3.columns)
    assert fig3.loc["replica", "n"] == 3047 and round(100 * fig3.loc["replica", "exactly_zero_share"], 1) == 79.1
    assert round(100 * fig3.loc["refeed", "exactly_zero_share"], 1) == 3.5
    assert fig3.loc["batch-invariant refeed", "exactly_zero_share"] == 1.0


def test_summary_holds_the_text_numbers(out):
    root, summary = out
    assert json.loads((root / "runs" / "paper" / "04_statistics" / "summary.json").read_text()) == \
        json.loads(json.dumps(summary))
    runs = summary["runs"]
    assert all(runs[name]["aggregate_reproduced"] for name in runs if name != "main pooled")
    assert runs["main pooled"]["aggregate_reproduced"] is None  # a pool has no harness aggregate
    assert runs["primary"]["elapsed_seconds"] == 752.1 and len(runs["primary"]["per_problem"]) == 20
    assert set(summary["cohorts"]) == {"primary", "screened", "main pooled"}
    main = summary["rows"]["main pooled"]
    assert main["clustered"]["refeed_worse"] == 29 and main["clustered"]["floor_worse"] == 5
    assert 0.4 < main["selection"]["0.5"]["share_added_by_refeed"] < 2 / 3
    assert main["preregistered"]["mean_abs_A_delta_exact_vs_refeed"] == pytest.approx(
        (runs["primary"]["preregistered"]["mean_abs_A_delta_exact_vs_refeed"] * 784
         + runs["screened"]["preregistered"]["mean_abs_A_delta_exact_vs_refeed"] * 783) / 1567)
