"""What a person sees: the runner's progress lines and closing summary, and the report site in a browser.

One module fixture runs the real command line into a temporary directory: the paper's statistics
(stage 04 on the published records, for the paper's row), then params/tiny.yaml with --html.
"""
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylib.core import progress
from replaylib.display import headline
from replaylib.display import worked_examples as examples
from replaylib.run import StageLine, closing_summary, main
from replaylib.runtime.params import load
from replaylib.runtime.registry import RUN_ORDER

REPO = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "-m", "replaylib.run"]


def test_progress_file_follows_the_bar(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "WRITE_EVERY_S", 0.0)
    progress.bar(tmp_path, "replay", 4, "pivot-pass")
    progress.update(3)
    progress.tokens(120, rows_finished=5)  # rows advance only a bar that counts rows
    state = progress.read(tmp_path)
    assert (state["desc"], state["n"], state["total"], state["tokens"], state["done"]) == ("replay", 3, 4, 120, False)
    rows = progress.bar(tmp_path, "trunks", 0, "trunk", count_rows=True)  # a new phase closes the last one
    rows.add_total(6)
    progress.tokens(40, rows_finished=2)
    rows.close()
    state = progress.read(tmp_path)
    assert (state["desc"], state["n"], state["total"], state["tokens"], state["done"]) == ("trunks", 2, 6, 40, True)
    progress.update(1)  # no bar open: nothing happens
    assert progress.read(tmp_path)["n"] == 2


def test_the_runner_draws_the_stage_line_from_the_progress_file(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "WRITE_EVERY_S", 0.0)
    term = io.StringIO()
    line = StageLine("03_three_pass_replay", tmp_path, term)
    bar = progress.bar(tmp_path, "replay", 4, "pivot-pass")
    progress.update(1)
    progress.tokens(500)
    line.poll(final=False)
    line.bar.refresh()
    shown = term.getvalue().split("\r")[-1]
    assert "03_three_pass_replay replay" in shown and "1/4 pivot-pass" in shown
    assert "left" in shown and "500 tok" in shown and "tok/s" in shown
    bar.close()
    line.poll(final=True)
    assert "4/4" not in term.getvalue() and "1/4 pivot-pass" in term.getvalue().split("\r")[-1]


def test_a_stream_that_is_not_a_terminal_gets_plain_lines_every_30_s_and_the_last(tmp_path, monkeypatch):
    """A log file or a pipe: newline-terminated lines, never tqdm's carriage-return redraws."""
    monkeypatch.setattr(progress, "WRITE_EVERY_S", 0.0)
    term = io.StringIO()  # isatty() is False
    line = StageLine("03_three_pass_replay", tmp_path, term)
    bar = progress.bar(tmp_path, "replay", 4, "pivot-pass")
    for _ in range(3):
        progress.update(1)
        line.poll()
    assert term.getvalue().count("\n") == 1  # the first poll's line; the next ones within 30 s write none
    line.last_draw -= 31  # 30 s later
    line.poll()
    bar.close()
    line.poll(final=True)
    line.bar.close()
    text = term.getvalue()
    assert "\r" not in text and text.endswith("\n") and len(text.splitlines()) == 3
    assert all(x.startswith("03_three_pass_replay replay") for x in text.splitlines())
    assert "1/4 pivot-pass" in text.splitlines()[0] and "3/4 pivot-pass" in text.splitlines()[-1]


def test_options_and_stage_names_mix_in_any_order(tmp_path, capsys):
    tiny = str(REPO / "params" / "tiny.yaml")
    assert main([tiny, "--dry-run", "03", "--out", str(tmp_path)]) == 0
    first = capsys.readouterr().out
    assert main(["--out", str(tmp_path), tiny, "3", "--dry-run"]) == 0
    assert capsys.readouterr().out == first
    assert "stage 03_three_pass_replay: would run" in first and not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    paper = subprocess.run(RUN + ["--out", str(out), "params/paper.yaml"], cwd=REPO, capture_output=True, text=True)
    assert paper.returncode == 0, paper.stderr[-2000:]
    proc = subprocess.run(RUN + ["params/tiny.yaml", "--html", "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


def test_the_terminal_shows_one_progress_line_per_stage_and_no_kernel_noise(tiny_run):
    out, proc = tiny_run
    lines = [seg.strip() for seg in proc.stderr.replace("\r", "\n").splitlines() if seg.strip()]
    finals = {stage: [s for s in lines if s.startswith(stage)][-1] for stage in RUN_ORDER}
    assert re.search(r"01_sampling trunks 100%.*6/6 trunk \[.*tok/s\]", finals["01_sampling"])  # 2 problems x 3
    assert re.search(r"03_three_pass_replay replay 100%.*/\d+ pivot-pass", finals["03_three_pass_replay"])
    assert "replay (invariant) 100%" in finals["05_batch_invariant"]
    terminal = proc.stdout + proc.stderr
    assert "IPKernelApp" not in terminal and "Warning" not in terminal and "WARNING" not in terminal
    # the kernel's own messages are kept, in the stage's log file
    logs = [(out / "runs" / "tiny" / s / "run.log").read_text() for s in RUN_ORDER]
    assert any("IPKernelApp" in log for log in logs)
    notebook = (out / "runs" / "tiny" / "01_sampling" / "01_sampling.ipynb").read_text()
    assert "IProgress not found" not in notebook  # no bar and no widget warning inside the executed notebook


def test_the_closing_summary_reads_its_numbers_from_the_statistics_files(tiny_run, tmp_path):
    out, proc = tiny_run
    text = proc.stdout[proc.stdout.index("=== replaylib: config tiny"):]
    assert all(f"{s} " in text.splitlines()[1] for s in RUN_ORDER)
    paper = pd.read_csv(out / "tables" / "paper" / "tab1_main.csv", dtype=str, keep_default_na=False)
    main_row = paper[paper.configuration == "main pooled"].iloc[0]
    assert re.search(rf"paper: main pooled\s+{main_row['n (common)']}\s+33\.8% \(3\.9\)\s+15\.1% \(1\.1\)\s+\+18\.7\s+5\.51",
                     text)
    summary = json.loads((out / "runs" / "tiny" / "04_statistics" / "summary.json").read_text())
    assert headline.headline_sentence(summary["main"]) in text
    assert "all passes identical on every channel" in text
    assert str(out / "site" / "tiny" / "index.html") in text
    # change the files, and the summary follows them
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("state", "*.ipynb", "site"))
    t = pd.read_csv(copy / "tables" / "paper" / "tab1_main.csv", dtype=str, keep_default_na=False)
    t.loc[t.configuration == "main pooled", "n (common)"] = "4321"
    t.to_csv(copy / "tables" / "paper" / "tab1_main.csv", index=False)
    s = json.loads((copy / "runs" / "tiny" / "04_statistics" / "summary.json").read_text())
    s["main"]["common"].update(n=7, refeed={**s["main"]["common"]["refeed"], "rate": 3 / 7, "flips": 3},
                               floor={**s["main"]["common"]["floor"], "rate": 1 / 7, "flips": 1})
    s["main"]["excess_pp"] = 100 * 2 / 7
    s["main"]["clustered"].update(t=2.5, n_problems=2)
    s["main"]["sign_power"].update(powered=True)  # the headline leads with the sign statistics once powered
    for channel in s["main"]["contrast"].values():  # (and once re-feed's probes are not all bit-exact)
        if channel:
            channel.update(refeed_exact=channel["n"] - 1, b=1)
    (copy / "runs" / "tiny" / "04_statistics" / "summary.json").write_text(json.dumps(s))
    changed = closing_summary(load(REPO / "params" / "tiny.yaml"), copy, [], None)
    assert re.search(r"paper: main pooled\s+4321", changed)
    assert "Re-feed changed the sign of A at 42.9% of the 7 eligible pivots (3/7), +28.6 pp above the replica " \
           "floor of 14.3%" in changed
    assert "clustered t = 2.50 over 2 problems" in changed


@pytest.mark.parametrize("tqdm_disable", ["", "1"])
def test_a_failing_stage_says_which_why_where_and_how_to_resume(tmp_path, tqdm_disable):
    """Also with TQDM_DISABLE=1 (progress bars off), where the reason once named the bar's error."""
    bad = tmp_path / "broken.yaml"
    bad.write_text("config: broken\nmodel: 'embedded:no-such-model'\nscreen_mixed: false\nn_problems: 1\n")
    env = {**os.environ, "TQDM_DISABLE": tqdm_disable}
    proc = subprocess.run(RUN + [str(bad), "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    err = proc.stderr
    assert "stage 01_sampling FAILED" in err
    assert re.search(r"reason\s+ValueError: unknown embedded model 'no-such-model'", err)
    assert f"log        {tmp_path / 'runs' / 'broken' / '01_sampling' / 'run.log'}" in err
    assert f"resume     python -m replaylib.run {bad} --out {tmp_path}" in err
    assert (tmp_path / "runs" / "broken" / "01_sampling" / "run.log").exists()


def test_the_report_site_needs_no_network(tiny_run):
    out, _ = tiny_run
    site = out / "site" / "tiny"
    index = (site / "index.html").read_text()
    pages = [site / "index.html"] + sorted((site / "notebooks").glob("*.html"))
    assert {p.stem for p in pages[1:]} == set(RUN_ORDER)
    for page in pages:
        text = page.read_text()
        for tag in re.findall(r"<(?:script|link|img|iframe|source)\b[^>]*>", text):
            assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", tag), (page.name, tag)
    for stage in RUN_ORDER:
        assert f'href="notebooks/{stage}.html"' in index
    for name in ("fig1_quadrants", "fig2_configs", "fig3_logprob_ecdf", "figS1_margins"):
        assert f'src="figures/{name}.png"' in index and (site / "figures" / f"{name}.png").exists()
    assert "paper: main pooled" in index and "One pivot through the passes" in index
    # the paper's claims, judged on this run's records, as tab21_claims holds them
    claims = pd.read_csv(out / "tables" / "tiny" / "tab21_claims.csv", dtype=str, keep_default_na=False)
    assert "The paper's claims, on this run's records" in index and len(claims) > 5
    assert all(f"<td>{html.escape(c, quote=False)}</td>" in index for c in claims.claim)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no chromium on this machine: install it (apt-get install chromium; `make test` does so as root "
                "where apt-get is available) to run the browser test")


def test_the_report_site_renders_in_a_browser(tiny_run, tmp_path_factory):
    out, _ = tiny_run
    site = out / "site" / "tiny"
    browser = chromium()
    # the index forbids script (its Content-Security-Policy): a page of the test's own frames it and reports
    # what the browser loaded in it, under the index's policy
    check = site / "index.check.html"
    check.write_text("""<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>
<iframe id="report" src="index.html" width="1280" height="2400"></iframe>
<script>
document.getElementById("report").addEventListener("load", (event) => {
  const doc = event.target.contentDocument;
  const imgs = [...doc.images];
  const t1 = doc.querySelector("table.table1");
  document.body.setAttribute("data-check", JSON.stringify({
    images: imgs.length, loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).map(i => i.getAttribute("src")),
    table1_rows: t1 ? [...t1.querySelectorAll("tbody tr")].map(r => r.cells[0].textContent) : null,
    table1_visible: t1 ? t1.getBoundingClientRect().height > 0 : false}));
});
</script></body></html>""")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=10000"]
    dom = subprocess.run([browser, *flags, "--allow-file-access-from-files", "--dump-dom", check.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r"data-check=\"([^\"]*)\"", dom)
    assert found, dom[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"'))
    assert result["images"] >= 4 and len(result["loaded"]) == result["images"], result
    assert result["table1_visible"] and result["table1_rows"] == ["tiny", "tiny batch-invariant",
                                                                  "paper: main pooled"], result
    shot = tmp_path_factory.mktemp("screenshot") / "index.png"
    subprocess.run([browser, *flags, "--window-size=1280,2400", f"--screenshot={shot}", (site / "index.html").as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
    print(f"screenshot of the report index: {shot}")


def test_worked_examples_choose_the_pivot_and_find_sign_changes():
    recs = pd.DataFrame({"problem_id": [0, 0, 1], "rollout": [0, 1, 0], "abs_pos": [5, 6, 7], "margin": [.1, .2, .3],
                         "A_exact1": [0.5, 0.5, -0.5], "A_exact2": [0.5, 0.0, -0.5], "A_refeed": [0.5, -0.5, 0.5]})
    assert examples.choose_pivot(recs) == 1  # the first where refeed changed the sign of A
    assert examples.choose_pivot(recs, 2) == 2 and examples.choose_pivot(recs, 9) == 1
    assert examples.choose_pivot(recs.iloc[[0]]) == 0
    assert examples.sign_changes(recs).abs_pos.tolist() == [7]  # at 6 the replica changed sign too


def test_continuation_texts_are_shown_when_the_records_keep_their_tokens(tiny_run):
    out, _ = tiny_run
    from replaylib.runtime import outputs
    tiny = load(REPO / "params" / "tiny.yaml")
    records, (trunks, _, _) = outputs.load_replay(tiny, out), outputs.load_sampling(tiny, out)
    record = records.iloc[0].copy()
    passes = examples.passes_of(records)
    # this package's records keep every pass's continuation tokens: the texts regrade to the recorded wins
    real = examples.continuations(record, passes, trunks, tiny, out)
    assert len(real) == len(passes) * 2 * tiny.k
    for (name, arm), graded in real.groupby(["pass", "arm"]):
        assert graded.R.sum() == record[f"wins_{name}_{arm}"], (name, arm)
    trunk = trunks[(trunks.problem_id == record.problem_id) & (trunks.rollout == record.rollout)].iloc[0]
    cont = [int(i) for i in trunk.gen_ids[record.gen_index + 1:record.gen_index + 4]]
    for name in passes:
        record[f"continuations_{name}"] = json.dumps({"actual": [cont, cont[:1]], "alt": [cont[:2], []]})
    table = examples.continuations(record, passes, trunks, tiny, out)
    assert len(table) == len(passes) * 2 * 2 and set(table.R) <= {0, 1}
    tok = examples.tokenizer(tiny.model)
    first = table.iloc[0]
    assert (first["pass"], first.arm, first.k) == (passes[0], "actual", 0)
    assert first.continuation == tok.decode([int(trunk.gen_ids[record.gen_index])] + cont, skip_special_tokens=True)
