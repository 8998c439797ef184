"""All five stage notebooks through the runner on params/tiny.yaml, in a temporary directory."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylib.core import files
from replaylib.run import stages_to_run
from replaylib.runtime import params, stagedir, verify
from replaylib.runtime.params import STAGES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny_run(tiny_finished):
    return tiny_finished


def test_every_stage_finishes_with_manifest_and_notebook(tiny_run):
    for stage in STAGES:
        d = tiny_run / "runs" / "tiny" / stage
        assert (d / "DONE").exists() and (d / f"{stage}.ipynb").exists()
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["key"] == params.load(REPO / "params" / "tiny.yaml").stage_key(stage)
        assert {"git", "versions", "device", "inputs", "outputs"} <= set(manifest)
    assert verify.verify_run(tiny_run / "runs" / "tiny") == []


def test_records_follow_the_published_schema(tiny_run):
    from replaylib.analysis.records import KEY, REQUIRED, load_records
    run = tiny_run / "runs" / "tiny"
    recs = load_records(run / "03_three_pass_replay" / "records.parquet")
    assert len(recs) > 0 and set(REQUIRED) <= set(recs.columns)
    pivots = pd.read_parquet(run / "02_pivot_mining" / "pivots.parquet")
    assert len(recs) == len(pivots)  # one record per mined pivot, each once
    same = ["gen_index", "margin", "rollout_correct"]
    merged = recs[KEY + same].merge(pivots[KEY + same], on=KEY, suffixes=("", "_pivot"), validate="one_to_one")
    assert len(merged) == len(pivots)
    for col in same:
        assert (merged[col] == merged[f"{col}_pivot"]).all(), col
    assert (recs["config"] == "tiny").all() and recs.attrs["configs"]["records"]["k"] == 2
    for name in ("exact1", "exact2", "refeed"):
        k = 2  # params/tiny.yaml
        assert ((recs[f"A_{name}"] * k).round() == recs[f"A_{name}"] * k).all()
        assert recs[f"A_{name}"].between(-1, 1).all()
    assert recs.exact_ok.all()
    assert (recs.A_exact1 == recs.A_exact2).all()  # one deterministic process: the replica is exact


def _summarized(df):
    from replaylib.analysis import stats
    return json.loads(json.dumps({**stats.summarize(df), **stats.text_numbers(df)}, default=str))


def test_tables_figures_and_summary_hold_the_statistics_of_the_records(tiny_run):
    from replaylib.analysis import stats
    from replaylib.analysis.records import load_records
    run = tiny_run / "runs" / "tiny"
    recs = load_records(run / "03_three_pass_replay" / "records.parquet")
    inv_recs = load_records(run / "05_batch_invariant" / "records.parquet")
    summary = json.loads((run / "04_statistics" / "summary.json").read_text())
    from replaylib.analysis import claims
    main = {**_summarized(recs), "sign_power": claims.sign_power(stats.exclude_not_exact(recs)[0])}
    assert summary["main"] == main and summary["main"]["n_records"] == len(recs)
    assert summary["rows"] == {"tiny": _summarized(recs), "tiny batch-invariant": _summarized(inv_recs)}
    table = pd.read_csv(tiny_run / "tables" / "tiny" / "tab1_main.csv").set_index("configuration")
    for label, df in [("tiny", recs), ("tiny batch-invariant", inv_recs)]:
        row = table.loc[label]
        assert row["n (common)"] == len(stats.common_set(stats.exclude_not_exact(df)[0])), label
        n = df.problem_id.nunique()  # params/tiny.yaml: unscreened problems from index 0
        assert (row["model"], row["K"], row["problems"]) == ("tiny:0", 2, f"primary 0-{n - 1}"), label
    # every table and figure the statistics stage wrote is in its manifest, with its hash
    # (named relative to the out root, so a copied or moved run still verifies)
    products = json.loads((run / "04_statistics" / "manifest.json").read_text())["products"]
    written = {f"{d}/tiny/{p.name}" for d in ("tables", "figures") for p in (tiny_run / d / "tiny").iterdir()}
    assert set(products) == written - {f"figures/tiny/figS1_margins.{e}" for e in ("pdf", "png", "csv")}
    # the margin histogram is a display the pivot notebook draws, not a stage product
    assert "products" not in json.loads((run / "02_pivot_mining" / "manifest.json").read_text())
    assert all((tiny_run / "figures" / "tiny" / f"figS1_margins.{e}").exists() for e in ("pdf", "png", "csv"))
    assert all(files.sha256_file(tiny_run / p) == h for p, h in products.items())
    for name in ("fig1_quadrants", "fig2_configs", "fig3_logprob_ecdf"):
        assert f"figures/tiny/{name}.pdf" in products and f"figures/tiny/{name}.csv" in products
    inv = json.loads((run / "05_batch_invariant" / "invariant.json").read_text())
    assert inv["all_identical"] is True and inv["pivots"] == len(inv_recs) > 0


def _verify(run, capsys):
    from replaylib import report
    code = report.main(["--verify", str(run)])
    return code, capsys.readouterr().out.strip().splitlines()


def test_verify_catches_a_changed_table(tiny_run, capsys):
    table = tiny_run / "tables" / "tiny" / "tab4_bias.csv"
    original = table.read_bytes()
    try:
        table.write_bytes(original + b"\n")
        code, lines = _verify(tiny_run / "runs" / "tiny", capsys)
    finally:
        table.write_bytes(original)
    assert code == 1 and lines == [f"{table}: sha256 differs from the manifest (product of 04_statistics)"]
    assert verify.verify_run(tiny_run / "runs" / "tiny") == []


def test_verify_reads_products_named_relative_to_the_out_root(tiny_run, tmp_path, capsys):
    copy = tmp_path / "copy"  # a moved run: its products are found relative to its own out root
    shutil.copytree(tiny_run, copy)
    assert verify.verify_run(copy / "runs" / "tiny") == []
    (copy / "figures" / "tiny" / "fig2_configs.png").unlink()
    code, lines = _verify(copy / "runs" / "tiny", capsys)
    assert code == 1 and lines == [f"{copy / 'figures' / 'tiny' / 'fig2_configs.png'}: missing (product of 04_statistics)"]


def test_verify_checks_every_input_against_the_upstream_output(tiny_run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    sampling = copy / "runs" / "tiny" / "01_sampling"
    trunks = sampling / "trunks.parquet"
    data = bytearray(trunks.read_bytes())
    data[len(data) // 2] ^= 1
    trunks.write_bytes(bytes(data))
    manifest = json.loads((sampling / "manifest.json").read_text())
    manifest["outputs"]["trunks.parquet"] = files.sha256_file(trunks)  # 01 consistent with itself
    (sampling / "manifest.json").write_text(json.dumps(manifest))
    code, lines = _verify(copy / "runs" / "tiny", capsys)
    assert code == 1
    assert lines == [f"{trunks}: input of {stage} has another sha256 there now (upstream 01_sampling changed since "
                     f"{stage} read it; rerun {stage})"
                     for stage in ("02_pivot_mining", "03_three_pass_replay", "05_batch_invariant")]


def test_rerun_is_a_no_op_and_a_change_reruns_only_what_it_invalidates(tiny_run, tmp_path):
    tiny = params.load(REPO / "params" / "tiny.yaml")
    assert stages_to_run(tiny, [], False, tiny_run) == []
    changed = params.make({**{k: v for k, v in tiny.to_dict().items()}, "bootstrap_draws": 20})
    assert [s for s, _ in stages_to_run(changed, [], False, tiny_run)] == ["04_statistics"]
    changed = params.make({**tiny.to_dict(), "k": 3})
    assert [s for s, _ in stages_to_run(changed, [], False, tiny_run)] == ["03_three_pass_replay", "05_batch_invariant",
                                                                   "04_statistics"]
    assert stages_to_run(tiny, ["02_pivot_mining"], False, tiny_run) == []  # named, up to date: left as it is
    assert stages_to_run(tiny, ["02_pivot_mining"], True, tiny_run) == [("02_pivot_mining", "forced")]


def test_a_stage_refuses_an_upstream_made_with_other_parameters(tiny_run):
    other = params.make({**params.load(REPO / "params" / "tiny.yaml").to_dict(), "margin_threshold": 0.5})
    stage = stagedir.StageDir(other, "03_three_pass_replay", tiny_run)
    with pytest.raises(stagedir.UpstreamError, match="margin_threshold: 1.0 there, 0.5 here"):
        stage.check_upstream("02_pivot_mining")


def test_a_modified_upstream_file_is_refused(tiny_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    (copy / "runs" / "tiny" / "02_pivot_mining" / "pivots.parquet").write_bytes(b"changed")
    tiny = params.load(REPO / "params" / "tiny.yaml")
    with pytest.raises(stagedir.UpstreamError, match="changed or missing"):
        stagedir.StageDir(tiny, "03_three_pass_replay", copy).check_upstream("02_pivot_mining")
    assert any("sha256 differs" in p for p in verify.verify_run(copy / "runs" / "tiny"))


def test_runner_refuses_unknown_parameters_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: bad\nmax_cont_token: 3\n")
    proc = subprocess.run([sys.executable, "-m", "replaylib.run", str(bad), "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "max_cont_token" in proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = subprocess.run([sys.executable, "-m", "replaylib.run", str(REPO / "params" / "tiny.yaml"), "stage9"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "unknown stage" in proc.stderr


def test_upto_runs_only_a_stage_and_what_it_needs(tiny_run, tmp_path):
    tiny = params.load(REPO / "params" / "tiny.yaml")
    fresh = tmp_path / "fresh"
    assert [s for s, _ in stages_to_run(tiny, [], False, fresh, ["03_three_pass_replay"])] == [
        "01_sampling", "02_pivot_mining", "03_three_pass_replay"]
    assert [s for s, _ in stages_to_run(tiny, [], False, fresh, ["05_batch_invariant"])] == ["01_sampling", "05_batch_invariant"]
    assert stages_to_run(tiny, [], False, tiny_run, ["03_three_pass_replay"]) == []  # up to date: nothing, not forced
    assert [s for s, _ in stages_to_run(tiny, [], True, tiny_run, ["02_pivot_mining"])] == ["01_sampling", "02_pivot_mining"]
