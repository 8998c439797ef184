"""The replay stage on the tiny bf16 model: only the prefix state differs between passes, the cache
checks observe the state actually resumed, and a run without pivots says so in one line."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from replaylib.measure import mining
from replaylib.runtime import params
from replaylib.stages import pivots, replay, sampling

REPO = Path(__file__).resolve().parents[1]
# batches of at most 18 rows: a problem's pivots run in several chunks, as a full-size run's do
TINY = {**params.load(REPO / "params" / "tiny.yaml").to_dict(), "max_batch_rows": 18}


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """Stages 1 and 2 of the tiny configuration (three trunks per problem, several pivots per trunk)."""
    out = tmp_path_factory.mktemp("sampled")
    p = params.make({**TINY, "n_problems": 3, "max_pivots_per_rollout": 3})
    sampling.run(p, out)
    pivots.run(p, out)
    return out


def replay_into(sampled: Path, dest: Path, **overrides) -> pd.DataFrame:
    shutil.copytree(sampled, dest)
    return replay.run(params.make({**TINY, "n_problems": 3, "max_pivots_per_rollout": 3, **overrides}), dest)


def measured_columns(df: pd.DataFrame) -> list[str]:
    prefixes = ("A_", "wins_", "cont_tokens_", "continuations_", "cont_diff_", "greedy_first_", "greedy_divergence_",
                "greedy_first_logprob_delta_")
    return [c for c in df.columns if c.startswith(prefixes)]


def test_the_regeneration_check_does_not_change_what_the_passes_measure(sampled, tmp_path):
    """verify_regeneration adds a diagnostic; the passes' batches must stay what they are without it."""
    on = replay_into(sampled, tmp_path / "on", verify_regeneration=True)
    off = replay_into(sampled, tmp_path / "off", verify_regeneration=False)
    assert len(on) >= 6
    cols = measured_columns(on)
    assert {"A_exact1", "A_refeed", "greedy_first_refeed", "cont_diff_refeed"} <= set(cols)
    pd.testing.assert_frame_equal(on[cols], off[cols])
    assert on.regenerates_trunk.notna().all() and off.regenerates_trunk.isna().all()


def test_every_pass_decodes_the_same_batches(sampled, tmp_path, monkeypatch):
    """The one manipulated variable is the prefix state: with the regeneration check on, every pass
    of a problem still decodes batches of the same rows at the same positions and padding."""
    from replaylib.measure.engine_hf import HFEngine
    seen, current = [], [None]
    run_pass, decode = HFEngine.run_pass, HFEngine._decode

    def tagged_run_pass(self, jobs, name, *args, **kwargs):
        current[0] = name
        try:
            return run_pass(self, jobs, name, *args, **kwargs)
        finally:
            current[0] = None

    def recorded_decode(self, logits, cache, mask, next_pos, rows, keep_state=False):
        seen.append((current[0], len(next_pos), tuple(next_pos), None if mask is None else tuple(mask.shape),
                     tuple(rows.max_new)))
        return decode(self, logits, cache, mask, next_pos, rows, keep_state)

    monkeypatch.setattr(HFEngine, "run_pass", tagged_run_pass)
    monkeypatch.setattr(HFEngine, "_decode", recorded_decode)
    replay_into(sampled, tmp_path / "out", verify_regeneration=True)
    batches = {name: [b[1:] for b in seen if b[0] == name] for name in ("exact1", "exact2", "refeed")}
    assert len(batches["exact1"]) >= 3  # several problems, several chunks
    assert batches["exact1"] == batches["exact2"] == batches["refeed"]
    assert any(b[0] is None for b in seen)  # the check ran, outside the passes


def test_a_forged_saved_state_is_caught_by_the_digest_taken_at_sampling(sampled, tmp_path):
    """Corrupt a saved state and make the file (its metadata) and the stage's file hash consistent
    with the corruption: the replay still flags that rollout's pivots, because it checks the
    tensors it resumes against the digest taken when the sampling stage produced them."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from replaylib.core.files import sha256_file
    from replaylib.measure.state import state_digest
    out = tmp_path / "out"
    shutil.copytree(sampled, out)
    stage = out / "runs" / "tiny" / "01_sampling"
    path = sorted((stage / "state").glob("*.safetensors"))[0]
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors["r0.keys"][0, 0, 0, 0] += 1
    meta["digest.r0"] = state_digest(tensors["r0.keys"], tensors["r0.values"])
    save_file(tensors, str(path), metadata=meta)
    manifest = json.loads((stage / "manifest.json").read_text())
    manifest["outputs"][str(path.relative_to(stage))] = sha256_file(path)
    (stage / "manifest.json").write_text(json.dumps(manifest))
    recs = replay.run(params.make({**TINY, "n_problems": 3, "max_pivots_per_rollout": 3}), out)
    problem = int(path.stem.split("_")[1])
    forged = (recs.problem_id == problem) & (recs.rollout == 0)
    assert forged.any() and (~forged).any()
    assert not recs.loc[forged, ["cache_ok_exact1", "cache_ok_exact2", "exact_ok"]].any().any()
    assert recs.loc[~forged, ["cache_ok_exact1", "cache_ok_exact2", "exact_ok"]].all().all()


def test_records_carry_the_numbers_behind_the_cache_check(sampled, tmp_path):
    recs = replay_into(sampled, tmp_path / "out")
    assert (recs.min_cached_tokens_exact1 == recs.abs_pos).all()  # the whole prefix came from the saved state
    assert (recs.min_cached_tokens_refeed == 0).all()
    assert str(recs.min_cached_tokens_exact2.dtype) == "Int64"
    assert recs.preemptions_exact1.isna().all()  # the transformers engine has no preemption counter


def test_no_pivot_stops_stage_two_in_one_line_naming_the_parameter(sampled, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(sampled, out)
    # under its own name (the finished tiny run is kept): its sampling stage is copied from tiny's
    confident = params.make({**TINY, "n_problems": 3, "margin_threshold": 0.0, "config": "tiny-confident"})
    with pytest.raises(mining.NoPivots, match="no pivot found.*raise margin_threshold") as err:
        pivots.run(confident, out)
    assert "\n" not in str(err.value)
    assert not (out / "runs" / "tiny-confident" / "02_pivot_mining" / "DONE").exists()


def test_vllm_with_stop_at_answer_is_refused_when_the_params_are_read():
    with pytest.raises(ValueError, match="stop_at_answer.*set stop_at_answer: false"):
        params.make({"engine": "vllm", "stop_at_answer": True})


def test_a_vllm_config_reads_in_every_stage_notebook():
    """A stage notebook sees only its own keys; a key it does not declare keeps its default (the
    transformers engine's stop_at_answer: true) and must not trip a check meant for the stage that
    uses it."""
    for name in ("gpu-embedded.yaml", "paper-primary.yaml"):
        p = params.load(REPO / "params" / name)
        for stage in params.STAGES:
            got = params.from_notebook(p.notebook_values(stage), stage)
            assert got.engine == "vllm"
