"""[ours] Cache transplantation, the prefix-precision control and the layer profile."""

import pytest
import torch
from test_engine_hf import SETTINGS, channels, job_for, sample

from replaylib.core.paths import REPO
from replaylib.measure.engine import ARMS
from replaylib.measure.engine_hf import HFEngine


def outputs(outs):
    return [channels(o) for o in outs]


@pytest.fixture(scope="module")
def trunks_state(tiny_engine):
    trunks, state = sample(tiny_engine)
    jobs = [job_for(trunks[r], 4 + 2 * r, pivot_id=r) for r in range(3)]
    return trunks, state, jobs


def test_xplant_refeed_kv_given_the_decode_time_state_is_exact1(tiny_engine, trunks_state):
    _, state, jobs = trunks_state
    decode_kv = {j.pivot_id: (state[j.rollout][0][:, :, :j.abs_pos], state[j.rollout][1][:, :, :j.abs_pos])
                 for j in jobs}
    e1 = tiny_engine.run_pass(jobs, "exact1", SETTINGS, state)
    xr = tiny_engine.run_pass(jobs, "xplant_refeed_kv", SETTINGS, state, prefix_state=decode_kv)
    assert outputs(xr) == outputs(e1)  # bit for bit, every channel


def test_xplant_decode_kv_given_refeeds_own_state_is_refeed(tiny_engine, trunks_state):
    _, state, jobs = trunks_state
    own = {}
    for j in jobs:
        _, cache, _, _ = tiny_engine._prefill([j.prefix_ids(a) for a in ARMS])
        k = torch.stack([layer.keys[0, :, :j.abs_pos] for layer in cache.layers])
        v = torch.stack([layer.values[0, :, :j.abs_pos] for layer in cache.layers])
        # causal: both arms' prefix rows are the same computation
        assert torch.equal(k, torch.stack([layer.keys[1, :, :j.abs_pos] for layer in cache.layers]))
        own[j.pivot_id] = (k, v)
    rf = tiny_engine.run_pass(jobs, "refeed", SETTINGS, None)
    xd = tiny_engine.run_pass(jobs, "xplant_decode_kv", SETTINGS, None, prefix_state=own)
    assert outputs(xd) == outputs(rf)


def test_transplants_by_default_move_the_other_state(tiny_engine, trunks_state):
    """Defaults: xplant_refeed_kv resumes the re-fed prefix, xplant_decode_kv the decode-time one;
    each differs from the pass whose procedure it borrows (bf16 prefill and decode round differently)."""
    _, state, jobs = trunks_state
    e1 = tiny_engine.run_pass(jobs, "exact1", SETTINGS, state)
    rf = tiny_engine.run_pass(jobs, "refeed", SETTINGS, None)
    xr = tiny_engine.run_pass(jobs, "xplant_refeed_kv", SETTINGS, state)
    xd = tiny_engine.run_pass(jobs, "xplant_decode_kv", SETTINGS, state)
    lp = lambda outs: [o.probe_first_logprob for o in outs]
    assert lp(xr) != lp(e1)
    assert lp(xd) != lp(rf)
    assert [o.resume.min_cached_tokens for o in xd] == [j.abs_pos for j in jobs]
    assert [o.resume.min_cached_tokens for o in xr] == [0, 0, 0]
    assert all(o.resume.state_ok for o in xd)
    # the injected default equals the state a fresh prefix prefill gives
    fresh = {j.pivot_id: tiny_engine.fresh_prefix_state(j) for j in jobs}
    again = tiny_engine.run_pass(jobs, "xplant_refeed_kv", SETTINGS, state, prefix_state=fresh)
    assert outputs(again) == outputs(xr)


def test_invariant_mode_makes_the_transplants_identical_too(tiny_invariant_engine):
    trunks, state = sample(tiny_invariant_engine, n=2, max_new=24)
    jobs = [job_for(trunks[0], 3, pivot_id=0), job_for(trunks[1], 6, pivot_id=1)]
    outs = {name: tiny_invariant_engine.run_pass(jobs, name, SETTINGS, state)
            for name in ("exact1", "xplant_refeed_kv", "xplant_decode_kv")}
    for name in ("xplant_refeed_kv", "xplant_decode_kv"):
        assert outputs(outs[name]) == outputs(outs["exact1"])


def test_float32_prefix_changes_the_prefix_state_and_nothing_else(tiny_model_dir, tiny_engine, trunks_state):
    _, state, jobs = trunks_state
    e32 = HFEngine(tiny_model_dir, "cpu", "bfloat16", max_batch_rows=64, prefix_precision="float32")
    assert e32.describe()["prefix_precision"] == "float32"
    job = jobs[0]
    k_native, v_native = tiny_engine.fresh_prefix_state(job)
    k32, v32 = e32.fresh_prefix_state(job)
    assert k32.dtype == k_native.dtype == torch.bfloat16  # rounded to the run's dtype
    assert not torch.equal(k32, k_native) or not torch.equal(v32, v_native)
    # decode unchanged: exact passes are bit for bit the native engine's
    assert outputs(e32.run_pass(jobs, "exact1", SETTINGS, state)) == outputs(
        tiny_engine.run_pass(jobs, "exact1", SETTINGS, state))
    assert outputs(e32.run_pass(jobs, "xplant_decode_kv", SETTINGS, state)) == outputs(
        tiny_engine.run_pass(jobs, "xplant_decode_kv", SETTINGS, state))
    # ... and the same decode path: the native engine given the float32 prefix state is the float32 pass
    fp32_state = {j.pivot_id: e32.fresh_prefix_state(j) for j in jobs}
    assert outputs(e32.run_pass(jobs, "xplant_refeed_kv", SETTINGS, state)) == outputs(
        tiny_engine.run_pass(jobs, "xplant_refeed_kv", SETTINGS, state, prefix_state=fp32_state))
    rf32 = e32.run_pass(jobs, "refeed", SETTINGS, None)
    assert [o.probe_first_logprob for o in rf32] != [o.probe_first_logprob
                                                     for o in tiny_engine.run_pass(jobs, "refeed", SETTINGS, None)]
    # invariant mode keeps one computation for everything
    inv = HFEngine(tiny_model_dir, "cpu", "bfloat16", invariant=True, prefix_precision="float32")
    assert inv.prefix_precision == "native"


def test_layer_profile(tiny_engine, trunks_state):
    _, state, jobs = trunks_state
    rows = tiny_engine.layer_profile(jobs, state)
    layers = tiny_engine.model.config.num_hidden_layers
    assert len(rows) == len(jobs) * layers * 2
    assert {r["tensor"] for r in rows} == {"k", "v"}
    assert any(r["max_abs_diff"] > 0 for r in rows)  # bf16 decode and prefill round differently
    for r in rows:
        assert r["max_abs_diff"] == max(r["max_abs_diff_prompt"], r["max_abs_diff_generated"], r["max_abs_diff_last"])
        assert (r["first_diff_pos"] == -1) == (r["max_abs_diff"] == 0)
    # a state against itself differs nowhere
    from replaylib.measure.state import ResidentState
    same = ResidentState.produced({j.rollout: tuple(t.clone() for t in tiny_engine.fresh_prefix_state(j))
                                   for j in jobs[:1]})
    assert all(r["max_abs_diff"] == 0 for r in tiny_engine.layer_profile(jobs[:1], same))


def synthetic_records():
    """Six pivots on two problems: xplant_refeed_kv copies refeed, xplant_decode_kv copies exact1."""
    import json

    import pandas as pd
    a1 = [0.5, 0.0, -0.25, 0.0, 0.25, 0.0]
    a2 = [0.5, 0.0, -0.25, 0.0, 0.0, 0.0]
    rf = [0.0, 0.25, -0.25, 0.0, -0.25, 0.0]
    probe = lambda lp: json.dumps({"actual": [5, lp], "alt": [6, lp - 1]})
    rows = []
    for i in range(6):
        rows.append({"problem_id": i // 3, "rollout": i % 3, "abs_pos": 100 + i, "margin": 0.5, "exact_ok": True,
                     "A_exact1": a1[i], "A_exact2": a2[i], "A_refeed": rf[i], "A_xplant_refeed_kv": rf[i],
                     "A_xplant_decode_kv": a1[i], "greedy_first_exact1": probe(-0.5),
                     "greedy_first_exact2": probe(-0.5), "greedy_first_refeed": probe(-0.5 - 0.01 * (i + 1)),
                     "greedy_first_xplant_refeed_kv": probe(-0.5 - 0.01 * (i + 1)),
                     "greedy_first_xplant_decode_kv": probe(-0.5 if i else -0.4)})
    return pd.DataFrame(rows)


def test_transplant_statistics_follow_table1():
    import pandas as pd

    from replaylib.analysis import stats, stats_extras
    t = stats_extras.transplant(synthetic_records()).set_index("pass")
    assert list(t.index) == ["exact2", "refeed", "xplant_refeed_kv", "xplant_decode_kv"]
    assert (t["n"] == 4).all()  # common set: pivots 0, 1, 2, 4
    assert t.loc["exact2", "flips"] == 1 and t.loc["refeed", "flips"] == 3
    assert t.loc["refeed", "excess_pp"] == pytest.approx(50.0)
    assert t.loc["xplant_refeed_kv", ["flips", "polarity", "mcnemar_b", "mcnemar_c"]].tolist() == \
        t.loc["refeed", ["flips", "polarity", "mcnemar_b", "mcnemar_c"]].tolist()
    assert t.loc["xplant_decode_kv", "flips"] == 0 and t.loc["xplant_decode_kv", "excess_pp"] == pytest.approx(-25.0)
    assert t.loc["xplant_refeed_kv", "flips_vs_refeed"] == 0 and t.loc["xplant_decode_kv", "flips_vs_refeed"] == 3
    # against refeed as against exact1, beside the same replica floor (exact2 against exact1: 1 flip of 4)
    assert t.loc["xplant_refeed_kv", "excess_pp_vs_refeed"] == pytest.approx(-25.0)
    assert t.loc["xplant_refeed_kv", "mcnemar_z_vs_refeed"] == pytest.approx(-1.0)
    assert t.loc["xplant_decode_kv", ["excess_pp_vs_refeed", "mcnemar_z_vs_refeed", "clustered_t_vs_refeed"]].tolist() \
        == pytest.approx(t.loc["refeed", ["excess_pp", "mcnemar_z", "clustered_t"]].tolist())
    assert t.loc["refeed", "excess_pp_vs_refeed"] is None or pd.isna(t.loc["refeed", "excess_pp_vs_refeed"])
    # with refeed's own replica in the run, its floor is refeed2 against refeed (here exact: 0 flips)
    with_replica = synthetic_records().assign(A_refeed2=lambda d: d["A_refeed"])
    t2 = stats_extras.transplant(with_replica).set_index("pass")
    assert t2.loc["xplant_refeed_kv", "excess_pp_vs_refeed"] == pytest.approx(0.0)
    assert t2.loc["xplant_decode_kv", "excess_pp_vs_refeed"] == pytest.approx(75.0)
    assert t.loc["exact2", "probe_equal_exact1"] == 1.0 and t.loc["refeed", "probe_equal_exact1"] == 0.0
    assert t.loc["xplant_refeed_kv", "probe_equal_refeed"] == 1.0
    assert t.loc["xplant_decode_kv", "probe_equal_exact1"] == pytest.approx(5 / 6)
    # the rows of Table 1's comparison are the same numbers
    r = stats.disagreement(stats.common_set(synthetic_records()), "refeed")
    assert r["flips"] == t.loc["refeed", "flips"]
    assert stats_extras.transplant(synthetic_records().drop(columns=["A_xplant_refeed_kv", "A_xplant_decode_kv"])).empty


def test_transplant_table_and_figures(tiny_engine, trunks_state, tmp_path):
    import pandas as pd

    from replaylib.analysis import plotting, stats_extras, tables
    tab = tables.table_transplant(synthetic_records())
    assert list(tab["pass"]) == ["exact2", "refeed", "xplant_refeed_kv", "xplant_decode_kv"]
    assert tab.loc[1, "excess pp"] == "+50.0"
    fig, _ = plotting.fig5_transplant(stats_extras.transplant(synthetic_records()))
    assert plotting.save_figure(fig, "fig5", tmp_path)[0].stat().st_size > 0
    _, state, jobs = trunks_state
    profile = pd.DataFrame(tiny_engine.layer_profile(jobs, state))
    summary = stats_extras.layer_profile_summary(profile)
    assert len(summary) == 2 * tiny_engine.model.config.num_hidden_layers
    assert summary["share_differing"].between(0, 1).all()
    fig, _ = plotting.fig6_layer_profile(profile)
    assert plotting.save_figure(fig, "fig6", tmp_path, profile)[0].stat().st_size > 0


def test_params_accept_the_transplants_on_hf_and_refuse_them_on_vllm():
    from replaylib.runtime import params
    p = params.make({"passes": ["exact1", "exact2", "refeed", "xplant_refeed_kv", "xplant_decode_kv"],
                     "prefix_precision": "float32", "layer_profile": True})
    assert p.layer_profile and p.prefix_precision == "float32"
    assert {"prefix_precision", "layer_profile"} <= set(params.own_keys("03_three_pass_replay"))
    with pytest.raises(ValueError, match="prefix_precision"):
        params.make({"prefix_precision": "fp64"})
    assert params.make({"trunk_prefill": "alone"}).trunk_prefill == "alone"
    assert "trunk_prefill" in params.own_keys("01_sampling")
    for extra in ({"passes": ["exact1", "exact2", "refeed", "xplant_decode_kv"]}, {"layer_profile": True},
                  {"prefix_precision": "float32"}, {"trunk_prefill": "alone"}):
        with pytest.raises(ValueError) as e:
            params.make({"engine": "vllm", "stop_at_answer": False, **extra})
        assert "\n" not in str(e.value) and "engine: hf" in str(e.value)


def test_the_gpu_transplant_study_and_its_controls_share_what_they_should():
    """params/gpu-embedded-xplant*.yaml: the float32 control reuses the main run's trunks and pivots (its
    stages 01-02 have the same keys, so copied ones are current) and changes only the replay; the
    prompt-batching control changes the trunks themselves."""
    from replaylib.runtime import params
    main, fp32, alone = (params.load(REPO / "params" / f"gpu-embedded-xplant{s}.yaml") for s in ("", "-fp32", "-alone"))
    assert main.engine == "hf" and main.device == "cuda" and {"xplant_refeed_kv", "xplant_decode_kv"} <= set(main.passes)
    assert [main.stage_key(s) == fp32.stage_key(s) for s in params.STAGES[:3]] == [True, True, False]
    assert fp32.prefix_precision == "float32" and alone.trunk_prefill == "alone"
    assert main.stage_key("01_sampling") != alone.stage_key("01_sampling")
