"""The benchmark end to end on the tiny workload (tiny:0, seconds): report, last line, invariant check."""
import re

import pytest

from replaylib import bench
from replaylib.engine import ARMS, PivotOutput

LAST = re.compile(r"^speedup_vs_naive=(\S+) tokens_per_s=(\S+) naive_tokens_per_s=(\S+)$")


def test_tiny_workload_end_to_end(isolated_models, capsys):
    assert bench.main(["--device", "cpu", "--workload", "tiny", "--bandwidth-tbs", "0.05"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    match = LAST.match(lines[-1])
    assert match, lines[-1]
    ratio, ours, naive = map(float, match.groups())
    assert ratio > 0 and ours > 0 and naive > 0
    assert ratio == pytest.approx(ours / naive, rel=1e-2)
    text = "\n".join(lines)
    assert "invariant check: PASSED" in text
    for label in ("continuation tokens/s", "pivots/minute", "peak memory", "time: prefill", "time: decode",
                  "time: grading", "time: I/O"):
        assert label in text
    traffic = re.search(r"decode traffic \(ours.*: (\d+) steps.* ([\d.]+)% of the memory-bandwidth bound", text)
    assert traffic and int(traffic.group(1)) > 0 and 0 < float(traffic.group(2)) < 100


def test_decode_traffic_counts_weights_once_and_kv_per_context_token(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="bfloat16")
    traffic = bench.DecodeTraffic(model)
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
    assert bench.DecodeTraffic(tiny_engine.model).weight_bytes >= linear_fp32


def _out(conts, probe, lp):
    return PivotOutput(0, {a: [list(c) for c in conts] for a in ARMS}, {a: list(probe) for a in ARMS},
                       {a: lp for a in ARMS})


def test_compare_outputs_finds_every_channel():
    base = _out([[1, 2], [3]], [4, 5], -0.5)
    assert bench.compare_outputs([base], [_out([[1, 2], [3]], [4, 5], -0.5)]) == []
    assert bench.compare_outputs([base], [_out([[1, 2], [9]], [4, 5], -0.5)])
    assert bench.compare_outputs([base], [_out([[1, 2], [3]], [4, 6], -0.5)])
    assert bench.compare_outputs([base], [_out([[1, 2], [3]], [4, 5], -0.5 + 1e-7)])
    assert bench.compare_outputs([base], [])


def test_workloads_keep_the_configured_dtype_and_k():
    for wl in bench.WORKLOADS.values():
        assert wl.dtype == "bfloat16" and wl.k == 4
    assert bench.WORKLOADS["paper"].max_cont_tokens == 400


def test_a_mismatch_in_invariant_mode_exits_nonzero(isolated_models, monkeypatch, capsys):
    real = bench.reference_pivot

    def perturbed(engine, job, settings):
        out = real(engine, job, settings)
        out.probe_ids["alt"] = out.probe_ids["alt"][:-1] + [out.probe_ids["alt"][-1] + 1]
        return out
    monkeypatch.setattr(bench, "reference_pivot", perturbed)
    assert bench.main(["--workload", "tiny", "--naive-pivots", "1"]) == 1
    out = capsys.readouterr().out
    assert "invariant check: FAILED" in out and LAST.match(out.strip().splitlines()[-1])
