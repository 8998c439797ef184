"""Campaigns (replaylib.campaign) and the Ray executor (replaylib.runtime.executor), on CPU.

The tiny campaign runs twice, with executor local and with executor ray (two engine actors on
a local Ray instance): the records must be identical bit for bit, and so must they be when a
worker dies mid-stage."""
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from replaylib import campaign
from replaylib.analysis import live_vs_published
from replaylib.analysis.claims import CLAIMS
from replaylib.core.files import sha256_file
from replaylib.runtime import campaigns, params
from replaylib.runtime.campaigns import CampaignStage
from replaylib.runtime.params import STAGES
from replaylib.runtime.stagedir import StageDir, UpstreamError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "params" / "campaign-tiny.yaml"


def _ray_init():
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for executor in ("local", "ray"):
        out[executor] = tmp_path_factory.mktemp(executor)
        assert campaign.main([str(TINY), "--out", str(out[executor]), "--executor", executor,
                              "--ray-workers", "2"]) == 0
    return out


def _data_files(root: Path) -> dict:
    """Every stage output the manifests record (records, shards, trunks, pivots, states), by path."""
    files = {}
    for manifest in sorted(root.glob("runs/tiny-*/*/manifest.json")):
        stage_dir = manifest.parent
        if stage_dir.name == "04_statistics":
            continue
        for rel in json.loads(manifest.read_text())["outputs"]:
            files[f"{stage_dir.parent.name}/{stage_dir.name}/{rel}"] = stage_dir / rel
    return files


def test_ray_and_local_give_identical_records(runs):
    local, ray_ = _data_files(runs["local"]), _data_files(runs["ray"])
    assert set(local) == set(ray_) and any(k.endswith("03_three_pass_replay/records.parquet") for k in local)
    different = [k for k in local if k.endswith(".parquet") and
                 not pd.read_parquet(local[k]).equals(pd.read_parquet(ray_[k]))]
    assert different == []
    # bit for bit: every data file has the same bytes, except the saved decode-time states, whose
    # safetensors header lists its entries in an order of its own: there every tensor and every
    # metadata entry (the digests) must be bit-identical
    assert [k for k in local if not k.endswith("engine.json") and not _same_data(local[k], ray_[k])] == []


def _same_data(a: Path, b: Path) -> bool:
    """The same bytes; for saved decode-time states, every tensor and metadata entry bit-identical
    (the safetensors header lists its entries in an order of its own)."""
    if a.suffix != ".safetensors":
        return sha256_file(a) == sha256_file(b)
    from safetensors import safe_open
    with safe_open(a, "pt") as x, safe_open(b, "pt") as y:
        return x.metadata() == y.metadata() and set(x.keys()) == set(y.keys()) and all(
            x.get_tensor(n).view(-1).view(torch.uint8).equal(y.get_tensor(n).view(-1).view(torch.uint8))
            for n in x.keys())


def test_campaign_writes_its_items_and_records_them(runs):
    out = runs["local"]
    tdir, fdir = out / "tables" / "campaign-tiny", out / "figures" / "campaign-tiny"
    tab1 = pd.read_csv(tdir / "tab1_main.csv")
    assert list(tab1["configuration"]) == ["main pooled", "K=4", "second model", "batch-invariant"]
    for name in ("fig1_quadrants", "fig2_configs", "fig3_logprob_ecdf"):
        assert all((fdir / f"{name}.{ext}").exists() for ext in ("pdf", "png", "csv"))
    table = pd.read_csv(tdir / "live_vs_published.csv")
    assert len(table) == 4 * len(live_vs_published.QUANTITIES)
    # the published values are computed from data/paper-records, never typed
    main = table[(table.row == "main pooled") & (table.quantity == "n (common)")]
    from replaylib.analysis import records
    published = live_vs_published.quantities(records.load_paper_row("main pooled", live_vs_published.PAPER_RECORDS))
    assert main.published.iloc[0] == published["n (common)"] == 636
    md = (tdir / "live_vs_published.md").read_text()
    assert "mean nothing" in md  # the tiny campaign says its verdicts mean nothing
    verdicts = [line for line in md.splitlines() if line.startswith("- ")]
    marks = ("**holds**", "**does not hold**", "**underpowered**", "**not measured**")
    assert len(verdicts) == len(CLAIMS) and all(any(v in line for v in marks) for line in verdicts)
    # the tiny model is deterministic on CPU: its batch-invariant row is identical on every channel
    assert "batch-invariant rows: all passes identical on every channel: **holds**" in md
    # recorded like any stage: runs/campaign-tiny/06_campaign/ with its key, inputs and products
    stage = out / "runs" / "campaign-tiny" / "06_campaign"
    assert (stage / "DONE").exists() and (stage / "06_campaign.ipynb").exists() and (stage / "run.log").exists()
    assert json.loads((stage / "params.json").read_text())["campaign_sha256"] == sha256_file(TINY)
    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest["stage"] == "06_campaign" and manifest["config"] == "campaign-tiny"
    records = {f"{n}/03_three_pass_replay/records.parquet" for n in ("tiny-primary", "tiny-screened", "tiny-k4",
                                                                        "tiny-seed1")}
    assert records | {"tiny-primary/05_batch_invariant/records.parquet"} <= set(manifest["inputs"])
    assert all(sha256_file(out / "runs" / ref) == digest for ref, digest in manifest["inputs"].items())
    assert "tables/campaign-tiny/live_vs_published.md" in manifest["products"]
    assert all(sha256_file(out / rel) == digest for rel, digest in manifest["products"].items())
    assert len(manifest["claims"]) >= len(CLAIMS)


def test_campaign_statistics_are_stale_aware(runs, capsys, tmp_path):
    out = runs["local"]
    c = campaigns.load(TINY)
    assert StageDir(definition=CampaignStage(c, out)).staleness() is None
    assert campaign.main([str(TINY), "--out", str(out), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "statistics: up to date" in said and "would run" not in said
    md = out / "tables" / "campaign-tiny" / "live_vs_published.md"
    original = md.read_bytes()
    md.write_bytes(original + b"edited\n")
    assert "live_vs_published.md changed" in StageDir(definition=CampaignStage(c, out)).staleness()
    md.write_bytes(original)
    # records changed by hand: their configuration's stage reruns, and the statistics refuse them meanwhile
    replay = out / "runs" / "tiny-k4" / "03_three_pass_replay"
    saved = (replay / "records.parquet").read_bytes()
    (replay / "records.parquet").write_bytes(saved + b"\0")
    assert "records.parquet changed" in StageDir(c.configs["tiny-k4"], "03_three_pass_replay", out).staleness()
    with pytest.raises(UpstreamError, match="records.parquet: changed or missing since the stage finished"):
        StageDir(definition=CampaignStage(c, out)).begin()
    # records a rerun changed (its manifest says so): the statistics rerun
    manifest = (replay / "manifest.json").read_bytes()
    recorded = json.loads(manifest)
    recorded["outputs"]["records.parquet"] = sha256_file(replay / "records.parquet")
    (replay / "manifest.json").write_text(json.dumps(recorded))
    assert StageDir(definition=CampaignStage(c, out)).staleness() == "upstream tiny-k4/03_three_pass_replay outputs changed since it ran"
    (replay / "records.parquet").write_bytes(saved)
    (replay / "manifest.json").write_bytes(manifest)
    assert StageDir(definition=CampaignStage(c, out)).staleness() is None
    # another campaign file under the same name
    edited = tmp_path / "campaign-tiny.yaml"
    edited.write_text(TINY.read_text().replace("bootstrap_draws: 50", "bootstrap_draws: 60"))
    assert StageDir(definition=CampaignStage(campaigns.load(edited), out)).staleness() == "campaign file changed"


def test_executor_values_are_in_no_stage_key():
    base = params.load(REPO / "params" / "tiny.yaml")
    assert params.EXECUTOR_KEYS == params.own_keys("executor")  # the list is the parameters of that group
    other = params.make({**base.to_dict(), "executor": "ray", "ray_workers": 7, "ray_address": "auto",
                         "gpus_per_worker": 0.5, "shared_engine": False, "vllm_headroom_gib": 5.5,
                         "vllm_memory_wait_s": 12.0})
    assert set(params.EXECUTOR_KEYS) <= {k for k, v in other.to_dict().items() if v != base.to_dict()[k]}
    assert all(base.stage_key(s) == other.stage_key(s) for s in STAGES)
    for path in sorted((REPO / "params").glob("paper-*.yaml")):  # where an engine lives: no key of the paper's runs
        paper = params.load(path)
        alone = params.make({**paper.to_dict(), "shared_engine": False}, scope=())
        assert all(paper.stage_key(s) == alone.stage_key(s) for s in STAGES), path
    with pytest.raises(ValueError, match="'executor' is 'dask'"):
        params.make({"executor": "dask"})
    with pytest.raises(ValueError, match="'ray_workers' is 0"):
        params.make({"ray_workers": 0})


def test_command_line_overrides_and_paths_from_the_repository(tmp_path):
    copy = tmp_path / "elsewhere.yaml"
    shutil.copy(TINY, copy)  # paths inside resolve from the repository root, not from the file
    c = campaigns.load(copy, {"executor": "ray", "ray_workers": 3})
    assert set(c.configs) == {"tiny-primary", "tiny-screened", "tiny-k4", "tiny-seed1"}
    assert all(p.executor == "ray" and p.ray_workers == 3 for p in c.configs.values())
    assert campaigns.load(copy).executor == "local"  # the campaign file's value
    assert [r.configs for r in c.rows][0] == ["tiny-primary", "tiny-screened"]


@pytest.mark.parametrize("change, message", [
    ({"rowz": []}, "unknown key 'rowz'"),
    ({"figure1": "nope"}, "'figure1' is 'nope'"),
    ({"invariant": {"label": "inv", "params": "params/missing.yaml", "published": "batch-invariant"}},
     "'invariant' names params/missing.yaml, which does not exist"),
    ({"invariant": {"label": "inv", "params": "params/tiny-primary.yaml", "published": "K=9"}},
     "published 'K=9'; choose one of"),
    ({"rows": [{"label": "main pooled", "params": ["params/tiny-primary.yaml", "params/tiny-screened.yaml",
                                                   "params/tiny-primary.yaml"], "published": "main pooled"}]},
     re.escape("'rows[0]' lists params/tiny-primary.yaml (config 'tiny-primary') more than once; list each params "
               "file once")),
    ({"invariant": [{"label": "inv", "params": ["params/tiny-primary.yaml", "params/tiny-k4.yaml"],
                     "published": "batch-invariant"}]}, "each 'invariant' row must name one params file"),
    ({"figure3": ["params/tiny-k4.yaml", "params/tiny-k4.yaml"]},
     re.escape("'figure3' lists params/tiny-k4.yaml (config 'tiny-k4') more than once")),
])
def test_campaign_file_errors_are_one_line(tmp_path, change, message):
    data = {**yaml.safe_load(TINY.read_text()), **change}
    bad = tmp_path / "campaign-bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message) as e:
        campaigns.load(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_ray_executor_without_gpu_for_vllm_is_one_line(capsys):
    from replaylib.measure.engine import EngineUnavailable
    from replaylib.runtime.executor import make_executor
    c = campaigns.load(REPO / "params" / "campaign-gpu-embedded.yaml", {"executor": "ray"})
    p = c.configs["gpu-embedded"]
    with pytest.raises((EngineUnavailable, RuntimeError)) as e:
        make_executor(p)
    assert "\n" not in str(e.value) and ("vLLM" in str(e.value) or "GPU" in str(e.value))


def test_a_dying_worker_is_retried_and_twice_stops_the_stage(tmp_path, monkeypatch):
    """Stage 03 of one configuration on two Ray actors; the first attempt at problem 1 kills its
    worker (os._exit): the records are the same as the local run's. A problem whose worker dies on
    every attempt stops the stage in one line naming it."""
    from replaylib.runtime.executor import CRASH_ENV, UnitFailed
    from replaylib.stages import pivots, replay, sampling
    local = params.make(campaigns.load(TINY).configs["tiny-primary"].to_dict())
    src = tmp_path / "local" / "runs" / "tiny-primary"
    sampling.run(local, tmp_path / "local")
    pivots.run(local, tmp_path / "local")
    replay.run(local, tmp_path / "local")
    for stage in ("01_sampling", "02_pivot_mining"):
        shutil.copytree(src / stage, tmp_path / "runs" / "tiny-primary" / stage)
    p = params.make({**campaigns.load(TINY).configs["tiny-primary"].to_dict(), "executor": "ray", "ray_workers": 2})
    ray = _ray_init()
    try:
        monkeypatch.setenv(CRASH_ENV, "03_three_pass_replay problem 1")
        records = replay.run(p, tmp_path)
        expected = pd.read_parquet(src / "03_three_pass_replay" / "records.parquet")
        assert pd.read_parquet(tmp_path / "runs" / "tiny-primary" / "03_three_pass_replay" /
                               "records.parquet").equals(expected)
        assert len(records) == len(expected)
        monkeypatch.setenv(CRASH_ENV, "03_three_pass_replay problem 0!")
        shutil.rmtree(tmp_path / "runs" / "tiny-primary" / "03_three_pass_replay")
        with pytest.raises(UnitFailed, match="problem 0 failed twice") as e:
            replay.run(p, tmp_path)
        assert "\n" not in str(e.value)
        assert not (tmp_path / "runs" / "tiny-primary" / "03_three_pass_replay" / "DONE").exists()
    finally:
        ray.shutdown()


def test_make_campaign_runs_the_campaign_module():
    import subprocess
    dry = subprocess.run(["make", "-n", "campaign", "CAMPAIGN=tiny"], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert ".venv/bin/python -m replaylib.campaign params/campaign-tiny.yaml" in dry.stdout


def test_list_params_and_intermixed_options(capsys):
    # options before and after the file name (parse_intermixed_args); the tiny campaign needs no model fetch
    assert campaign.main(["--executor", "local", str(TINY), "--list-params", "--ray-workers", "2"]) == 0
    files = capsys.readouterr().out.split()
    assert len(files) == 4 and all(Path(f).is_file() for f in files)
    assert not any(line.startswith("model: embedded") for f in files for line in Path(f).read_text().splitlines())


def test_published_records_as_live_rows_reproduce_the_claims():
    """The comparison and the verdicts on records whose answers are known: the paper's own rows
    as the live ones. Every claim holds, and every published value lies in its interval."""
    from replaylib.analysis import records
    labels = list(records.PAPER_ROWS)
    rows = {label: records.load_paper_row(label, live_vs_published.PAPER_RECORDS) for label in labels}
    c = campaigns.Campaign(name="published", path=TINY, note="", rows=[campaigns.Row(l, [], l) for l in labels[:-1]],
                          invariants=[campaigns.Row(labels[-1], [], labels[-1])], figure1=labels[0], figure3=[],
                          configs={}, sources={}, bootstrap_draws=40, concurrent_configs=0)
    claims = live_vs_published.verdicts(c, rows)
    assert [x["verdict"] for x in claims] == ["holds"] * len(CLAIMS), claims
    table = live_vs_published.comparison_table(c, rows, n_boot=40)
    assert (table.published.fillna(-1) == table.live.fillna(-1)).all()
    measured = table[table.row != "batch-invariant"]
    assert set(measured["published inside"]) == {"yes"}
    # a live row that breaks a claim is reported as breaking it
    broken = dict(rows)
    broken["K=8"] = rows["K=8"].assign(A_refeed=rows["K=8"].A_exact1)  # refeed agrees with exact1 everywhere
    assert live_vs_published.verdicts(c, broken)[0]["verdict"] == "does not hold"
    assert "K=8" in live_vs_published.verdicts(c, broken)[0]["detail"]


def test_claims_are_judged_per_model_where_each_model_has_a_batch_invariant_row():
    """A campaign of two models, each with its batch-invariant row: each model gets its own verdicts (a model
    whose re-feed reproduces exact1 everywhere does not hold the claim, whatever the other model's rows say)."""
    from replaylib.analysis import records
    main = records.load_paper_row("main pooled", live_vs_published.PAPER_RECORDS)
    inv = records.load_paper_row("batch-invariant", live_vs_published.PAPER_RECORDS)
    vllm = {"engine": "vllm", "device": "cuda", "stop_at_answer": False}
    configs = {"a": params.make({**vllm, "config": "a", "model": "embedded:qwen2.5-coder-0.5b-instruct"}),
               "b": params.make({**vllm, "config": "b", "model": "embedded:gemma-3-270m"})}
    c = campaigns.Campaign(name="models", path=TINY, note="", rows=[campaigns.Row("qwen", ["a"], "main pooled"),
                                                                   campaigns.Row("gemma", ["b"], "main pooled")],
                          invariants=[campaigns.Row("qwen inv", ["a"], "batch-invariant"),
                                      campaigns.Row("gemma inv", ["b"], "batch-invariant")],
                          figure1="qwen", figure3=[], configs=configs, sources={}, bootstrap_draws=10,
                          concurrent_configs=0)
    rows = {"qwen": main, "gemma": main.assign(A_refeed=main.A_exact1), "qwen inv": inv, "gemma inv": inv}
    first = {x["mode"]: x["verdict"] for x in live_vs_published.verdicts(c, rows)
             if x["claim"].startswith("re-feed disagrees")}
    assert first == {"embedded:qwen2.5-coder-0.5b-instruct, vLLM multiprocess": "holds",
                     "embedded:gemma-3-270m, vLLM multiprocess": "does not hold"}
    one = campaigns.Campaign(**{**c.__dict__, "invariants": c.invariants[:1]})  # one batch-invariant row: by mode
    assert {x["mode"] for x in live_vs_published.verdicts(one, rows)} == {"vLLM multiprocess"}


def test_a_campaign_file_may_give_a_batch_invariant_row_per_model():
    c = campaigns.load(REPO / "params" / "campaign-gpu-families.yaml")
    chosen = c.invariant_configs()
    assert len(chosen) == 3 and len({c.configs[n].model for n in chosen.values()}) == 3
    assert {n for n in c.configs if "05_batch_invariant" in c.stages_needed(n)} == set(chosen.values())
    assert {f"{n}/05_batch_invariant" for n in chosen.values()} <= set(CampaignStage(c).upstreams())
    assert len({live_vs_published.row_mode(c, r) for r in c.rows + c.invariants}) == 6  # 3 models x 2 modes


def test_claims_are_judged_per_serving_mode():
    """Rows in two serving modes: each mode gets its own verdicts (an in-process row whose replica
    reproduces exact1 exactly cannot make the multi-process floor claim fail)."""
    from replaylib.analysis import records
    main = records.load_paper_row("main pooled", live_vs_published.PAPER_RECORDS)
    exact = main.assign(A_exact2=main.A_exact1, cont_diff_exact2=0, greedy_divergence_exact2=False,
                        greedy_first_logprob_delta_exact2=0.0)
    vllm = {"engine": "vllm", "device": "cuda", "stop_at_answer": False}
    configs = {"mp": params.make({**vllm, "config": "mp"}),
               "ip": params.make({**vllm, "config": "ip", "vllm_serving": "inprocess"})}
    c = campaigns.Campaign(name="modes", path=TINY, note="", rows=[campaigns.Row("a (mp)", ["mp"], "main pooled"),
                                                                  campaigns.Row("a (ip)", ["ip"], "main pooled")],
                          invariants=[campaigns.Row("inv", ["mp"], "batch-invariant")], figure1="a (mp)", figure3=[],
                          configs=configs, sources={}, bootstrap_draws=10, concurrent_configs=0)
    rows = {"a (mp)": main, "a (ip)": exact, "inv": records.load_paper_row("batch-invariant", live_vs_published.PAPER_RECORDS)}
    claims = live_vs_published.verdicts(c, rows)
    floor = {x["mode"]: x for x in claims if x["claim"].startswith("the replica floor")}
    assert set(floor) == {"vLLM multiprocess", "vLLM inprocess"}
    assert floor["vLLM multiprocess"]["verdict"] == "holds"
    assert floor["vLLM inprocess"]["verdict"] == "does not hold" and "exactly 0" in floor["vLLM inprocess"]["detail"]
    md = live_vs_published.comparison_markdown(c, live_vs_published.comparison_table(c, rows, n_boot=10), claims)
    assert "### vLLM multiprocess" in md and "### vLLM inprocess" in md


def test_an_engine_that_cannot_start_stops_in_one_line_naming_its_cause(tmp_path):
    """An actor whose engine fails to load is not a dying worker to retry: the executor waits for
    every engine to be up and reports the cause in one line."""
    from replaylib.runtime.executor import make_executor
    p = params.make({**campaigns.load(TINY).configs["tiny-primary"].to_dict(), "executor": "ray", "ray_workers": 1,
                     "model": str(tmp_path / "no-such-model")})
    ray = _ray_init()
    try:
        with pytest.raises(RuntimeError, match="failed to start") as e:
            make_executor(p)
        assert "\n" not in str(e.value) and "no-such-model" in str(e.value)
    finally:
        ray.shutdown()


def test_a_ray_engine_start_is_logged_in_the_stage(caplog):
    """An engine's start-up time shows in the stage's own output (the engine's log line stays in
    the actor's process)."""
    import logging
    import re

    from replaylib.runtime.executor import make_executor
    p = params.make({**campaigns.load(TINY).configs["tiny-primary"].to_dict(), "executor": "ray", "ray_workers": 2})
    ray = _ray_init()
    try:
        with caplog.at_level(logging.INFO, logger="replaylib"):
            make_executor(p).close()
        starts = [r.getMessage() for r in caplog.records if "started in" in r.getMessage()]
        assert len(starts) == 2 and all(re.fullmatch(r"ray executor: engine actor on \S+ \(pid \d+\) started in "
                                                     r"\d+\.\d s", m) for m in starts), starts
    finally:
        ray.shutdown()


@pytest.mark.parametrize("engine, one_at_a_time", [("vllm", True), ("hf", False)])
def test_ray_engines_on_a_gpu_start_one_at_a_time_only_for_vllm(monkeypatch, engine, one_at_a_time):
    """vLLM measures the free GPU memory as it starts, so its engines start one after the other; transformers
    engines sharing a GPU (gpus_per_worker below 1) load side by side."""
    import ray

    from replaylib.runtime import executor
    events = []

    class FakeActor:
        @classmethod
        def options(cls, **options):
            assert options["num_gpus"] == 0.25
            return cls

        @classmethod
        def remote(cls, *args):
            events.append("create")
            return object()

    monkeypatch.setattr(executor, "_actor_class", lambda: FakeActor)
    monkeypatch.setattr(executor, "ensure_ray", lambda params: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 1.0})
    monkeypatch.setattr(executor.RayExecutor, "_started", lambda self, actor: events.append("wait") or actor)
    p = params.make({**campaigns.load(TINY).configs["tiny-primary"].to_dict(), "engine": engine, "device": "cuda",
                     "stop_at_answer": False, "executor": "ray", "ray_workers": 4, "gpus_per_worker": 0.25})
    assert len(executor.RayExecutor(p).actors) == 4
    assert events == (["create", "wait"] * 4 if one_at_a_time else ["create"] * 4 + ["wait"] * 4)


def test_a_ray_actor_gets_the_stage_params_the_driver_checked():
    """An actor receives its stage's Params as the driver built them (pickled, never rebuilt), defaults
    of other stages included (stop_at_answer: true outside stage 03): a vLLM configuration arrives equal."""
    import pickle
    p = params.load(REPO / "params" / "gpu-embedded.yaml")
    for stage in params.STAGES:
        got = params.from_notebook(p.notebook_values(stage), stage)
        assert pickle.loads(pickle.dumps(got)) == got


def test_a_campaign_runs_only_the_stages_it_reads(runs):
    """Stages 1-3 of every row's configuration, stage 5 of the batch-invariant one only; no
    configuration's own statistics (they need its stage 5)."""
    c = campaigns.load(TINY)
    assert c.stages_needed("tiny-primary") == ["03_three_pass_replay", "05_batch_invariant"]
    assert c.stages_needed("tiny-k4") == ["03_three_pass_replay"]
    for executor, root in runs.items():
        done = {p.parent.relative_to(root / "runs").as_posix() for p in root.glob("runs/tiny-*/*/DONE")}
        assert done == {f"{n}/{s}" for n in c.configs for s in ("01_sampling", "02_pivot_mining",
                                                                 "03_three_pass_replay")} | {
            "tiny-primary/05_batch_invariant"}, executor


SHARED = ("01_sampling", "02_pivot_mining")


def test_a_stage_with_the_same_key_is_copied_from_the_configuration_that_ran_it(runs):
    """tiny-k4 replays tiny-screened's cohort (as the paper's K=8 row replays the screened one):
    its sampling and pivot stages are tiny-screened's, copied, not computed twice."""
    c = campaigns.load(TINY)
    assert c.shared_stages() == {("tiny-k4", s): "tiny-screened" for s in SHARED}
    from replaylib.runtime.verify import verify_run
    for executor, root in runs.items():
        for stage in SHARED:
            mine = json.loads((root / "runs" / "tiny-k4" / stage / "manifest.json").read_text())
            theirs = json.loads((root / "runs" / "tiny-screened" / stage / "manifest.json").read_text())
            assert mine["copied_from"] == f"runs/tiny-screened/{stage}", executor
            assert mine["config"] == "tiny-k4" and mine["outputs"] == theirs["outputs"]
            assert json.loads((root / "runs" / "tiny-k4" / stage / "params.json").read_text())["config"] == "tiny-k4"
        assert (root / "figures" / "tiny-k4" / "figS1_margins.png").exists()
        assert verify_run(root / "runs" / "tiny-k4") == [], executor
        assert "copied_from" not in json.loads(
            (root / "runs" / "tiny-k4" / "03_three_pass_replay" / "manifest.json").read_text())


def test_a_copied_stage_is_what_computing_it_gives(runs, tmp_path):
    """The copy is no shortcut: tiny-k4's own sampling and pivot stages, computed alone, write the
    same bytes."""
    from replaylib.stages import pivots, sampling
    p = campaigns.load(TINY).configs["tiny-k4"]
    sampling.run(p, tmp_path)
    pivots.run(p, tmp_path)
    for stage in SHARED:
        alone = json.loads((tmp_path / "runs" / "tiny-k4" / stage / "manifest.json").read_text())["outputs"]
        copied = json.loads((runs["local"] / "runs" / "tiny-k4" / stage / "manifest.json").read_text())["outputs"]
        assert set(alone) == set(copied) and len(alone) > 1
        # engine.json describes the engine that ran (on a GPU its KV block count), not the results
        assert [rel for rel in alone if rel != "engine.json" and not _same_data(
            tmp_path / "runs" / "tiny-k4" / stage / rel, runs["local"] / "runs" / "tiny-k4" / stage / rel)] == []


def test_a_source_whose_outputs_changed_is_not_copied(runs, tmp_path, capsys):
    c = campaigns.load(TINY)
    shutil.copytree(runs["local"] / "runs" / "tiny-screened", tmp_path / "runs" / "tiny-screened")
    shutil.copytree(runs["local"] / "figures" / "tiny-screened", tmp_path / "figures" / "tiny-screened")
    trunks = tmp_path / "runs" / "tiny-screened" / "01_sampling" / "trunks.parquet"
    saved = trunks.read_bytes()
    trunks.write_bytes(saved + b"\0")
    assert campaign.copy_shared_stages(c, "tiny-k4", tmp_path) == []
    assert "tiny-k4 01_sampling: not copied from tiny-screened (its outputs changed)" in capsys.readouterr().out
    assert StageDir(c.configs["tiny-k4"], "01_sampling", tmp_path).staleness() == "not run yet"
    trunks.write_bytes(saved)
    assert campaign.copy_shared_stages(c, "tiny-k4", tmp_path) == list(SHARED)
    assert all(StageDir(c.configs["tiny-k4"], s, tmp_path).staleness() is None for s in SHARED)
    assert campaign.copy_shared_stages(c, "tiny-k4", tmp_path) == []  # up to date: nothing to copy


def test_more_than_one_gpu_per_engine_is_refused_in_one_line():
    """An engine uses one GPU; reserving more would leave them idle while the run looks parallel."""
    with pytest.raises(ValueError, match="'gpus_per_worker' is 2") as e:
        params.make({"executor": "ray", "gpus_per_worker": 2})
    assert "\n" not in str(e.value)
    assert campaign.main([str(TINY), "--gpus-per-worker", "2", "--dry-run"]) == 2


def test_a_campaign_cut_off_by_the_end_of_a_lease_resumes_from_what_came_back(runs, tmp_path, capsys):
    """A lease ends while one configuration's replay runs: what came back is every finished stage
    (a vLLM stage keeps no KV state on disk) in another directory on another machine. Rerun there,
    the campaign computes only the missing stage and its statistics, keeps every finished stage as
    it came back, and ends with what an uninterrupted campaign wrote, byte for byte."""
    done, back = runs["local"], tmp_path / "back"
    cut = Path("runs") / "tiny-seed1" / "03_three_pass_replay"
    unfinished = {cut, Path("runs") / "campaign-tiny", Path("tables") / "campaign-tiny",
                  Path("figures") / "campaign-tiny", Path("site")}
    shutil.copytree(done, back, ignore=lambda d, names: [n for n in names
                                                         if (Path(d) / n).relative_to(done) in unfinished])
    kept = {p: p.read_bytes() for p in back.glob("runs/*/*/manifest.json")}
    assert kept and not (back / cut).exists()
    capsys.readouterr()
    assert campaign.main([str(TINY), "--out", str(back), "--dry-run"]) == 0
    plan = [line for line in capsys.readouterr().out.splitlines() if "would" in line]
    assert plan == ["[campaign] campaign-tiny: tiny-seed1 03_three_pass_replay: would run (not run yet)",
                    "[campaign] campaign-tiny: statistics: would run (configurations rerun)"], plan
    assert campaign.main([str(TINY), "--out", str(back)]) == 0
    assert {p: p.read_bytes() for p in kept} == kept  # the finished stages were not rerun
    ran, whole = _data_files(back), _data_files(done)
    assert set(ran) == set(whole)
    assert [rel for rel in whole if rel.rsplit("/", 1)[-1] != "engine.json" and not _same_data(ran[rel], whole[rel])] == []
    for name in ("tab1_main.csv", "live_vs_published.csv"):
        assert (back / "tables" / "campaign-tiny" / name).read_bytes() == \
            (done / "tables" / "campaign-tiny" / name).read_bytes(), name


def test_a_row_label_is_text_in_every_file_the_campaign_writes(runs, tmp_path):
    """A label holding HTML (a campaign file from someone else) is escaped in every Markdown and LaTeX file
    the campaign statistics write, and kept as it is in the CSV data."""
    out = tmp_path / "out"
    shutil.copytree(runs["local"], out)
    label = "<script>alert(1)</script> pooled"
    edited = tmp_path / "campaign-tiny.yaml"
    edited.write_text(TINY.read_text().replace("label: main pooled\n", f"label: '{label}'\n")
                      .replace("figure1: main pooled\n", f"figure1: '{label}'\n"))
    assert [r.label for r in campaigns.load(edited).rows][0] == label
    assert campaign.main([str(edited), "--out", str(out)]) == 0
    tdir = out / "tables" / "campaign-tiny"
    for name in ("live_vs_published.md", "tab1_main.md", "tab1_main.tex"):
        text = (tdir / name).read_text()
        assert "<script>" not in text and ("&lt;script>" in text or r"\textless{}script\textgreater{}" in text), name
    assert label in (tdir / "tab1_main.csv").read_text() and label in (tdir / "live_vs_published.csv").read_text()


def test_report_html_on_a_campaign_s_statistics_says_where_they_are(runs, capsys):
    """runs/campaign-<name> holds a campaign's statistics, not a configuration's run: the report names its
    tables and what to report instead, and suggests no params file."""
    from replaylib import report
    out = runs["local"]
    assert report.main(["--html", str(out / "runs" / "campaign-tiny")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "a campaign's statistics, not a configuration's run" in err
    assert f"{out / 'tables' / 'campaign-tiny'}/ (live_vs_published.md" in err
    assert "replaylib.run" not in err and "params/" not in err


def test_a_campaign_killed_outright_stops_its_runners_and_their_kernels(tmp_path):
    """SIGKILL reaches the campaign alone; its runner sees its campaign gone, stops its stage's kernel and
    itself, and says so in its log (a rerun then finds the stage free: test_safety checks the lock)."""
    import subprocess
    import sys
    import time

    import psutil
    spec = {"name": "killed", "rows": [{"label": "main pooled", "params": "params/tiny-primary.yaml",
                                        "published": "main pooled"}],
            "invariant": {"label": "batch-invariant", "params": "params/tiny-primary.yaml",
                          "published": "batch-invariant"},
            "figure1": "main pooled", "figure3": ["params/tiny-primary.yaml"], "concurrent_configs": 2}
    path = tmp_path / "campaign-killed.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "replaylib.campaign", str(path), "--out", str(out)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600  # a guard against a hang, not a speed target
    try:
        while True:  # the runner has started its stage's kernel
            children = psutil.Process(proc.pid).children(recursive=True)
            kernels = [c for c in children if "ipykernel" in " ".join(c.cmdline())]
            if kernels:
                break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        runners = [c for c in children if "replaylib.run" in c.cmdline()]
        assert len(runners) == 1
    finally:
        proc.kill()
        proc.wait()

    def ended(p) -> bool:  # exited (a zombie has, whether or not anything reaps it)
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    while not all(ended(p) for p in runners + kernels):
        assert time.monotonic() < deadline, [p.pid for p in runners + kernels if not ended(p)]
        time.sleep(0.1)
    log = (out / "runs" / "campaign-killed" / "logs" / "tiny-primary.log").read_text()
    assert "STOPPED" in log and "terminated (SIGTERM)" in log


def test_statistics_only_reads_runs_made_elsewhere_as_they_are(runs, tmp_path, capsys):
    """Stages on a GPU machine, statistics on a laptop: runs whose recorded code or files differ here (another
    Python, another conversion of the model) are named and used as they ran, no stage runs, and the tables are
    those the campaign wrote; a stage that never finished, or whose records changed, is refused in one line."""
    done, back = runs["local"], tmp_path / "back"
    shutil.copytree(done, back, ignore=lambda d, names: [n for n in names if n in ("campaign-tiny", "site")])
    replay = back / "runs" / "tiny-k4" / "03_three_pass_replay"
    manifest = json.loads((replay / "manifest.json").read_text())
    code = manifest["dependencies"]["code"]
    code[next(iter(code))] = "0" * 16  # as a definition's digest reads where the stage ran
    (replay / "manifest.json").write_text(json.dumps(manifest))
    assert StageDir(campaigns.load(TINY).configs["tiny-k4"], "03_three_pass_replay", back).staleness()
    capsys.readouterr()
    assert campaign.main([str(TINY), "--out", str(back), "--statistics-only"]) == 0
    said = capsys.readouterr().out
    assert "tiny-k4 03_three_pass_replay: used as it ran (here: " in said and "started" not in said
    assert json.loads((replay / "manifest.json").read_text()) == manifest  # not rerun
    for name in ("tab1_main.csv", "live_vs_published.csv"):
        assert (back / "tables" / "campaign-tiny" / name).read_bytes() == \
            (done / "tables" / "campaign-tiny" / name).read_bytes(), name
    (replay / "records.parquet").write_bytes((replay / "records.parquet").read_bytes() + b"\0")
    assert campaign.main([str(TINY), "--out", str(back), "--statistics-only"]) == 2
    err = capsys.readouterr().err
    assert "tiny-k4 03_three_pass_replay: its output records.parquet changed" in err and "\n" not in err.strip()
    shutil.rmtree(replay)
    assert campaign.main([str(TINY), "--out", str(back), "--statistics-only"]) == 2
    assert "tiny-k4 03_three_pass_replay: not run yet; --statistics-only" in capsys.readouterr().err
