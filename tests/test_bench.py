"""The benchmark end to end on the tiny workload (tiny:0, seconds): report and last line; and the
exactness of the fast path: in invariant mode, record for record and bit for bit what a deliberately
slow reference gives (every row prefilled and decoded alone)."""
import re
import sys
from types import SimpleNamespace

import pytest
import torch

from replaylib import bench
from replaylib.bench import measure, paper7b, workloads
from replaylib.measure.engine import ARMS, PassSettings, PivotOutput

LAST = re.compile(r"^speedup_vs_naive=(\S+) tokens_per_s=(\S+) naive_tokens_per_s=(\S+)$")


def test_tiny_workload_end_to_end(isolated_models, capsys):
    assert bench.main(["--device", "cpu", "--workload", "tiny", "--bandwidth-tbs", "0.05"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    match = LAST.match(lines[-1])
    assert match, lines[-1]
    ratio, ours, naive = map(float, match.groups())
    assert ours > 0 and naive > 0
    assert ratio == pytest.approx(ours / naive, rel=1e-2)
    text = "\n".join(lines)
    for label in ("continuation tokens/s", "pivots/minute", "peak memory", "time: prefill", "time: decode",
                  "time: grading", "time: I/O"):
        assert label in text
    traffic = re.search(r"decode traffic \(ours.*: (\d+) steps.* that is ([\d.]+) s against ([\d.]+) s measured: "
                        r"([\d.]+)% of the memory-bandwidth bound", text)
    assert traffic and int(traffic.group(1)) > 0
    ideal, measured, share = map(float, traffic.groups()[1:])
    # the share is 100 * ideal / measured, up to the rounding of the printed numbers
    assert 100 * (ideal - 5e-4) / (measured + 5e-3) - 5e-3 <= share <= 100 * (ideal + 5e-4) / max(measured - 5e-3, 1e-9) + 5e-3


def test_engines_side_by_side_share_the_workload_by_problem(isolated_models, monkeypatch, capsys):
    """--workers N replays the workload on N engines in processes of their own, a problem on one engine, and
    prints their aggregate rate."""
    from replaylib.bench import side_by_side
    jobs = [SimpleNamespace(problem_id=p, pivot_id=i) for i, p in enumerate([3, 1, 1, 2, 3, 3])]
    parts = side_by_side.shares(jobs, 2)
    assert [[j.pivot_id for j in part] for part in parts] == [[1, 2, 0, 4, 5], [3]]
    assert len(side_by_side.shares(jobs, 8)) == 3
    monkeypatch.setitem(workloads.WORKLOADS, "tiny", workloads.WORKLOADS["tiny"].__class__(
        **{**workloads.WORKLOADS["tiny"].__dict__, "problems": (1, 2)}))
    assert bench.main(["--device", "cpu", "--workload", "tiny", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"^side_by_side_tokens_per_s=(\S+) engines=(\d+)$", out, re.M)
    assert line and float(line.group(1)) > 0 and line.group(2) == "2", out[-2000:]
    assert LAST.match(out.strip().splitlines()[-1])
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--workload", "tiny", "--workers", "0"])


def test_decode_traffic_counts_weights_once_and_kv_per_context_token(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="bfloat16")
    traffic = measure.DecodeTraffic(model)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert traffic.kv_bytes_per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2
    unique = {p.data_ptr(): p.numel() * 2 for p in model.parameters()}
    assert traffic.weight_bytes >= sum(unique.values()) - (0 if cfg.tie_word_embeddings
                                                          else model.get_input_embeddings().weight.numel() * 2)
    traffic.add_step(rows=3, context=10)
    traffic.add_step(rows=2, context=11)
    expected = 2 * traffic.weight_bytes + (30 + 22) * traffic.kv_bytes_per_token
    assert traffic.ideal_seconds(1e9) == pytest.approx(expected / 1e9)
    assert "2 steps, 2.5 rows" in traffic.describe(1.0, 1e9, "x")


def test_decode_traffic_counts_the_fp32_copies_of_swapped_linears(tiny_engine):
    if tiny_engine.linear_kernel != "fp32-accumulate":
        pytest.skip("this CPU runs native bf16 linears")
    linear_fp32 = sum(m.weight32.numel() * 4 for m in tiny_engine.model.modules() if hasattr(m, "weight32"))
    assert linear_fp32 > 0
    assert measure.DecodeTraffic(tiny_engine.model).weight_bytes >= linear_fp32


# ---------------------------------------------------------------- the exactness reference
def reference_pivot(engine, job, settings: PassSettings) -> PivotOutput:
    """The slow reference: every row prefilled from scratch and decoded alone (invariant engine)."""
    from replaylib.measure.engine_hf import _Rows
    conts, probe_ids, probe_lp = {a: [] for a in ARMS}, {}, {}
    for arm, kind in job.requests(settings.k):
        text = engine.decode(job.gen_prefix + [job.forced[arm]]) if settings.stop_at_answer else None
        greedy = kind == "probe"
        logits, cache, mask, _ = engine._prefill([job.prefix_ids(arm)])
        stop = settings.stop_at_answer and not greedy  # continuations may stop at the answer; probes are fixed
        rows = _Rows(seeds=[0 if greedy else job.seeds[arm][kind]], temperature=[0.0 if greedy else settings.temperature],
                     top_p=[1.0 if greedy else settings.top_p],
                     max_new=[settings.probe_tokens if greedy else settings.max_tokens],
                     stop_at_answer=stop, prefix_text=[text] if stop else None)
        tokens = engine._decode(logits, cache, mask, [job.abs_pos + 1], rows)[0][0]
        if greedy:
            probe_ids[arm] = tokens[:settings.probe_tokens]
            probe_lp[arm] = float(torch.log_softmax(logits, dim=-1)[0, tokens[0]])
        else:
            conts[arm].append(tokens)
    return PivotOutput(job.pivot_id, conts, probe_ids, probe_lp, {})


def compare_outputs(fast: list, slow: list) -> list[str]:
    """Differences between two passes' outputs, one line each (empty: identical)."""
    if len(fast) != len(slow):
        return [f"{len(fast)} fast records against {len(slow)} slow ones"]
    problems = []
    for a, b in zip(fast, slow):
        for arm in ARMS:
            if a.continuations[arm] != b.continuations[arm]:
                problems.append(f"pivot {a.pivot_id} {arm} continuations differ")
            if a.probe_ids[arm] != b.probe_ids[arm]:
                problems.append(f"pivot {a.pivot_id} {arm} probe ids differ")
            if a.probe_first_logprob[arm] != b.probe_first_logprob[arm]:
                problems.append(f"pivot {a.pivot_id} {arm} probe logprob {a.probe_first_logprob[arm]!r} != "
                                f"{b.probe_first_logprob[arm]!r}")
    return problems


def _out(conts, probe, lp):
    return PivotOutput(0, {a: [list(c) for c in conts] for a in ARMS}, {a: list(probe) for a in ARMS},
                       {a: lp for a in ARMS})


def test_compare_outputs_finds_every_channel():
    base = _out([[1, 2], [3]], [4, 5], -0.5)
    assert compare_outputs([base], [_out([[1, 2], [3]], [4, 5], -0.5)]) == []
    assert compare_outputs([base], [_out([[1, 2], [9]], [4, 5], -0.5)])
    assert compare_outputs([base], [_out([[1, 2], [3]], [4, 6], -0.5)])
    assert compare_outputs([base], [_out([[1, 2], [3]], [4, 5], -0.5 + 1e-7)])
    assert compare_outputs([base], [])


def test_the_fast_path_is_the_slow_reference_bit_for_bit_in_invariant_mode(isolated_models, tiny_model_dir):
    """run_pass (one prefill per arm, rows assembled from it, batched decode) against every row alone."""
    from replaylib.measure.engine_hf import HFEngine
    wl = workloads.WORKLOADS["tiny"]
    engine = HFEngine(tiny_model_dir, "cpu", wl.dtype, invariant=True)
    jobs, _, _ = workloads.build_workload(engine, wl, log=lambda *_: None)
    assert jobs
    settings = workloads.pass_settings(wl, 8)
    fast = engine.run_pass(jobs[:2], "refeed", settings, None)
    assert compare_outputs(fast, [reference_pivot(engine, job, settings) for job in jobs[:2]]) == []
    # and the comparison sees a one-token change
    slow = [reference_pivot(engine, job, settings) for job in jobs[:2]]
    slow[0].probe_ids["alt"] = slow[0].probe_ids["alt"][:-1] + [slow[0].probe_ids["alt"][-1] + 1]
    assert compare_outputs(fast, slow)


def _phase(tokens, seconds, pivots=3):
    return measure.PhaseResult("x", pivots, 0, tokens, seconds, {}, 0, 0, "RSS")


def test_rates_and_speedup_on_a_known_case():
    fast, naive = _phase(300, 2.0), _phase(100, 4.0, pivots=1)
    assert (fast.tokens_per_s, fast.pivots_per_min) == (150.0, 90.0)
    assert (naive.tokens_per_s, naive.pivots_per_min) == (25.0, 15.0)
    assert measure.speedup(fast, naive) == 6.0
    assert measure.speedup(fast, _phase(0, 0.0)) == float("inf") and _phase(5, 0.0).tokens_per_s == 0.0


class _Toy(torch.nn.Module):
    """Embedding 10 x 4 and an output layer 4 -> 10 in bf16; 2 layers, 1 KV head of dim 2."""

    def __init__(self, tied):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, dtype=torch.bfloat16)
        self.head = torch.nn.Linear(4, 10, bias=False, dtype=torch.bfloat16)
        if tied:
            self.head.weight = self.emb.weight
        self.config = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=1, hidden_size=4,
                                      num_attention_heads=2, head_dim=None)

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head


def test_decode_traffic_arithmetic_on_a_known_case():
    untied, tied = measure.DecodeTraffic(_Toy(tied=False)), measure.DecodeTraffic(_Toy(tied=True))
    # untied: the head's 40 bf16 weights are read each step, the embedding is a lookup: 80 bytes; tied: the one table
    assert untied.weight_bytes == tied.weight_bytes == 80
    assert untied.kv_bytes_per_token == 2 * 2 * 1 * 2 * 2  # K and V, layers, KV heads, head dim, bf16 bytes
    untied.add_step(rows=3, context=10)
    untied.add_step(rows=2, context=11)
    assert untied.bytes_read() == 2 * 80 + (3 * 10 + 2 * 11) * 16 == 992
    assert untied.ideal_seconds(496.0) == 2.0
    line = untied.describe(8.0, 496.0, "x")
    assert "2 steps, 2.5 rows and 10 context tokens per row" in line
    assert line.endswith("that is 2.000 s against 8.00 s measured: 25.00% of the memory-bandwidth bound")


def test_pass_settings_carry_the_workload():
    wl = workloads.WORKLOADS["paper"]
    s = workloads.pass_settings(wl)
    assert (s.k, s.temperature, s.top_p, s.max_tokens, s.probe_tokens, s.stop_at_answer) == (
        wl.k, wl.temperature, wl.top_p, wl.max_cont_tokens, wl.probe_tokens, wl.stop_at_answer)
    assert workloads.pass_settings(wl, max_tokens=7).max_tokens == 7


# ---------------------------------------------------------------- paper7b (vLLM, 7B): logic against a stand-in
def test_paper_requests_are_counted_from_the_published_records():
    import json
    from pathlib import Path
    rows = {r["config"]: r for r in paper7b.paper_requests()}
    assert sorted(rows) == sorted(paper7b.PAPER_CONFIG_RECORDS)
    base = Path(paper7b.__file__).resolve().parents[2] / "data" / "paper-records"
    for config, row in rows.items():
        data = json.loads((base / paper7b.PAPER_CONFIG_RECORDS[config]).read_text())
        assert row["pivots"] == data["aggregate"]["n_pivots"] == len(data["pivots"])
        assert row["k"] == data["config"]["k"]
        assert row["problems"] == len({p["problem_id"] for p in data["per_problem"]})
        assert row["continuation_tokens"] == 3 * row["pivots"] * 2 * (row["k"] * 400 + 32)
    assert rows["paper-primary"]["problems"] == 20 and rows["paper-k16"]["k"] == 16
    per_stage = paper7b.project_campaign(list(rows.values()), tokens_per_s=1000.0, trunk_tokens_per_s=500.0,
                                         startup_s=10.0, warm_startup_s=4.0, shared_engines=False)
    # the trunks are sampled once at the sampling rate (the replay's rate already includes regenerating them);
    # with an engine per stage the campaign's first start-up is cold, every later one warm
    first, second = per_stage[0], per_stage[1]
    assert first["trunk_tokens"] == 2 * first["trunks"] * 512
    assert first["projected_s"] == pytest.approx(first["continuation_tokens"] / 1000 + first["trunks"] * 512 / 500 + 14)
    assert second["projected_s"] == pytest.approx(second["continuation_tokens"] / 1000 + second["trunks"] * 512 / 500 + 8)
    # one engine per model for all its stages and configurations: one cold start-up per model
    shared = paper7b.project_campaign(list(rows.values()), tokens_per_s=1000.0, trunk_tokens_per_s=500.0,
                                      startup_s=10.0, warm_startup_s=4.0)
    models = {r["model"] for r in rows.values()}
    assert sum(r["startup_s"] for r in shared) == pytest.approx(10.0 * len(models)) and len(models) == 3


def test_project_only_needs_no_gpu(capsys):
    assert bench.main(["--workload", "paper7b", "--project-only", "--tokens-per-s", "1000", "--trunk-tokens-per-s",
                       "500", "--startup-s", "10", "--warm-startup-s", "4"]) == 0
    out = capsys.readouterr().out
    assert "paper-k16" in out and "seven configurations:" in out


def test_qwen7b_config_sizes():
    cfg = paper7b.QWEN25_7B_INSTRUCT_CONFIG
    # Qwen2.5-7B-Instruct: 7.62e9 parameters; a step reads all but the input embedding table
    assert measure.weight_bytes_per_step(cfg) + 2 * cfg["vocab_size"] * cfg["hidden_size"] == 2 * 7_615_616_512
    assert measure.kv_bytes_per_token(cfg) == 2 * 28 * 4 * 128 * 2


def test_paper7b_against_a_stand_in_llm(tmp_path, monkeypatch, capsys):
    """The paper7b benchmark's orchestration on the vLLM engine's stand-in (tests/test_engine_vllm.py): every
    exact request verified from the cache, the plain call carries the same requests, the last line."""
    from tests.test_engine_vllm import FakeLLM, FakeSP

    class SP(FakeSP):
        def __init__(self, ignore_eos=False, **kw):
            super().__init__(**kw)
            self.ignore_eos = ignore_eos

    fake = FakeLLM(block_size=4, num_gpu_blocks=100_000)
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=SP, __version__="stand-in"))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the stand-in "was imported" for the in-process mode
    monkeypatch.setattr(paper7b, "vllm_dummy_llm", lambda *a, **k: fake)
    monkeypatch.setattr(paper7b, "PAPER7B", {**paper7b.PAPER7B, "rollouts": 2, "trunk_tokens": 24, "cont_tokens": 6,
                                           "probe_tokens": 3, "prompt_tokens": 10, "block_size": 4})
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert bench.main(["--device", "cuda", "--engine", "vllm", "--workload", "paper7b", "--problems", "2",
                       "--out", str(tmp_path / "run")]) == 0
    text = capsys.readouterr().out
    lines = text.strip().splitlines()
    ratio = re.match(r"^overhead_vs_plain_generate=(\S+)$", lines[-1])
    assert ratio and float(ratio.group(1)) > 0
    verified = re.search(r"verified from the cache on (\d+)/(\d+) pivot-passes", text)
    assert verified and verified.group(1) == verified.group(2) and int(verified.group(2)) > 0
    assert "seven configurations:" in text and "engine start-up:" in text and "memory-bandwidth bound" in text
    assert (tmp_path / "run" / "qwen2.5-7b-instruct-config" / "config.json").is_file()
    # the plain call: one generate with the trunk requests once and every pass's requests
    plain_prompts, plain_params = fake.calls[-1]
    replay_calls = fake.calls[2:-1]  # after the two problems' sampling calls
    pass_requests = sum(len(p) for p, sps in replay_calls if sps[0].logprobs != 5)
    assert len(plain_prompts) == 2 * 2 + pass_requests
    assert all(getattr(sp, "ignore_eos", False) for _, sps in fake.calls for sp in sps)
