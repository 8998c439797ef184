"""Parameters: validation with one-line errors, YAML files, per-stage keys."""
import json

import pytest
import yaml

from replaylib.core.paths import REPO
from replaylib.runtime import params
from replaylib.runtime.params import STAGES, Params


def test_defaults_are_the_embedded_file(tmp_path):
    repo = REPO
    embedded = params.load(repo / "params" / "embedded.yaml")
    assert embedded == Params()  # the file spells out the defaults


def test_every_params_file_loads():
    repo = REPO
    files = sorted(f for f in (repo / "params").glob("*.yaml") if not f.name.startswith("campaign-"))
    assert len(files) >= 3
    for f in files:
        assert params.load(f).config == f.stem
    from replaylib.runtime import campaigns as campaign
    for f in sorted((repo / "params").glob("campaign-*.yaml")):
        assert campaign.load(f).configs


def test_unknown_key_is_refused_with_a_suggestion(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("margn_threshold: 0.5\n")
    with pytest.raises(ValueError) as e:
        params.load(f)
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg and "'margn_threshold'" in msg and "margin_threshold" in msg


@pytest.mark.parametrize("key, value, fragment", [
    ("k", "4x", "must be int"),
    ("k", True, "must be int"),
    ("screen_mixed", "yes", "must be bool"),
    ("engine", "tensorrt", "choose one of"),
    ("passes", ["refeed", "exact1"], "must start with 'exact1'"),
])
def test_wrong_type_or_value_is_refused(key, value, fragment):
    with pytest.raises(ValueError, match=fragment):
        params.make({key: value}, where="test")


def test_int_is_accepted_for_float():
    assert params.make({"temperature": 1}).temperature == 1.0


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="params file not found"):
        params.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("k: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        params.load(bad)
    (tmp_path / "list.yaml").write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ValueError, match="mapping"):
        params.load(tmp_path / "list.yaml")


def test_a_change_invalidates_its_stage_and_downstream_only():
    base = Params()
    changed = params.make({"k": 8})
    same = {s for s in STAGES if base.stage_key(s) == changed.stage_key(s)}
    assert same == {"01_sampling", "02_pivot_mining"}
    sampled = params.make({"temperature": 0.5})
    assert all(base.stage_key(s) != sampled.stage_key(s) for s in STAGES)
    stats_only = params.make({"bootstrap_draws": 10})
    assert {s for s in STAGES if base.stage_key(s) != stats_only.stage_key(s)} == {"04_statistics"}
    assert params.make({"config": "other"}).stage_key("03_three_pass_replay") == base.stage_key("03_three_pass_replay")


def test_from_notebook_reads_declared_names_only(tmp_path):
    """A notebook's own keys come from its parameters cell, the upstream stages' from ``upstream`` (or
    their params.json): an undeclared name in the namespace is not read."""
    ns = {"config": "c", "k": 8, "unrelated": 1, "margin_threshold": 0.9, "upstream": {"margin_threshold": 0.5}}
    p = params.from_notebook(ns, "03_three_pass_replay")
    assert (p.config, p.k, p.margin_threshold) == ("c", 8, 0.5)
    # in Jupyter, without ``upstream``: the upstream stages' params.json, or a one-line error naming the fix
    ns = {"config": "c", "k": 8, "margin_threshold": 0.9, "out_dir": str(tmp_path)}
    with pytest.raises(ValueError, match="run 01_sampling first"):
        params.from_notebook(ns, "03_three_pass_replay")
    for stage, values in (("01_sampling", {"temperature": 0.5}), ("02_pivot_mining", {"margin_threshold": 0.25})):
        d = tmp_path / "runs" / "c" / stage
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"config": "c", "params": values}))
    p = params.from_notebook(ns, "03_three_pass_replay")
    assert (p.k, p.margin_threshold, p.temperature) == (8, 0.25, 0.5)


def test_block16_with_the_vllm_engine_is_refused_when_the_params_are_read():
    with pytest.raises(ValueError, match="block16.*engine: hf"):
        params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False,
                     "passes": ["exact1", "exact2", "refeed", "block16"]}, where="x.yaml")
    ok = params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False,
                      "passes": ["exact1", "exact2", "refeed", "serial"]})
    assert ok.passes[-1] == "serial"


def test_extends_takes_another_file_s_values_and_keeps_its_own_name(tmp_path):
    (tmp_path / "base.yaml").write_text("config: base\nk: 8\nn_rollouts: 5\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nn_rollouts: 6\n")
    (tmp_path / "grandchild.yaml").write_text("extends: child\nconfig: gc\nmargin_threshold: 0.5\n")
    child, gc = params.load(tmp_path / "child.yaml"), params.load(tmp_path / "grandchild.yaml")
    assert (child.config, child.k, child.n_rollouts) == ("child", 8, 6)  # a name is never inherited
    assert (gc.config, gc.k, gc.n_rollouts, gc.margin_threshold) == ("gc", 8, 6, 0.5)
    (tmp_path / "loop.yaml").write_text("extends: loop2.yaml\n")
    (tmp_path / "loop2.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ValueError, match="makes a cycle") as e:
        params.load(tmp_path / "loop.yaml")
    assert "\n" not in str(e.value)
    (tmp_path / "orphan.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(FileNotFoundError, match="'extends' names missing.yaml, which does not exist"):
        params.load(tmp_path / "orphan.yaml")
    (tmp_path / "odd.yaml").write_text("extends: [a, b]\n")
    with pytest.raises(ValueError, match="'extends' must name another params file"):
        params.load(tmp_path / "odd.yaml")


def test_files_written_on_extends_keep_their_stage_keys():
    """The paper's files, once spelled out in full (tests/data/params-before-extends), now say only what
    differs from paper-primary.yaml: the same parameters, so the same stage keys."""
    repo = REPO
    before = sorted((repo / "tests" / "data" / "params-before-extends").glob("paper-*.yaml"))
    assert len(before) == 6
    for old in before:
        new = params.load(repo / "params" / old.name)
        assert new == params.load(old), old.name
        assert all(new.stage_key(s) == params.load(old).stage_key(s) for s in STAGES)
        assert "extends: paper-primary.yaml" in (repo / "params" / old.name).read_text()


def test_the_repr_is_config_and_the_values_that_differ_from_the_defaults():
    """A notebook's set-up cell shows P: the configuration's name and what it changes, still Python."""
    tiny = params.load(REPO / "params" / "tiny.yaml")
    shown = repr(tiny)
    assert shown.startswith("Params(config='tiny', model='tiny:0', n_problems=2, screen_mixed=False, ")
    assert len(shown) < 400 and eval(shown, {"Params": Params}) == tiny
    assert repr(Params()) == "Params(config='embedded')"
