"""Three model families through the transformers engine: tiny random-weight Llama and Gemma 3 models (the
architectures of the embedded SmolLM2 and Gemma 3) replica-exact as the tiny Qwen2 is, Gemma 3's
sliding-window layers resumed past their window; the embedded models' conversion checked tensor by tensor
against the gguf library's reference dequantizer; a base model's plain few-shot prompt."""
import json
import os
from pathlib import Path

import pytest
import torch
from test_engine_hf import QUESTION, SETTINGS, job_for, resume_at, sample
from transformers import DynamicCache

from replaylib.measure import models
from replaylib.measure.arith import generate as arith_problems
from replaylib.measure.engine import chat_prompt_ids, few_shot_examples, plain_prompt
from replaylib.measure.engine_hf import HFEngine, _Rows
from replaylib.measure.hf_sampling import raw_topk
from replaylib.measure.models import TINY_SLIDING_WINDOW, build_tiny_model
from replaylib.runtime.params import BOXED_INSTRUCTION

FAMILIES = ["llama", "gemma3"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=FAMILIES)
def family_engine(request, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp(request.param) / "m", seed=0, family=request.param)
    return HFEngine(str(path), "cpu", "bfloat16")


@pytest.fixture(scope="module")
def gemma_fp32(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("gemma3") / "m", seed=0, family="gemma3")
    return HFEngine(str(path), "cpu", "float32")


def test_each_family_is_its_architecture(family_engine):
    config = family_engine.model.config
    assert config.model_type == {"LlamaForCausalLM": "llama", "Gemma3ForCausalLM": "gemma3_text"}[
        type(family_engine.model).__name__]
    if config.model_type == "gemma3_text":
        assert config.layer_types == ["sliding_attention", "full_attention"]
        assert config.sliding_window == TINY_SLIDING_WINDOW


def test_resume_reproduces_decode_logits_bit_for_bit_past_the_window(family_engine):
    trunks, state = sample(family_engine)
    i = min(len(t.gen_ids) for t in trunks) - 2
    length = len(trunks[0].prompt_ids) + i
    assert length > 2 * TINY_SLIDING_WINDOW  # the resumed prefix is longer than a sliding layer's window
    # the decode-time state keeps every position in every layer, the sliding-window layer's too
    assert all(state[r][0].shape[2] == len(trunks[r].prompt_ids) + len(trunks[r].gen_ids) - 1 for r in state)
    rows = range(len(trunks))
    logits, cache, _ = resume_at(family_engine, trunks, state, i)
    values, ids = raw_topk(logits, 5)
    for r in rows:
        assert ids[r].tolist() == trunks[r].topk_ids[i + 1]
        assert values[r].tolist() == trunks[r].topk_logprobs[i + 1]  # exact float equality
    # and a resumed trunk regenerates itself from there
    spec = _Rows(seeds=[t.seed for t in trunks], temperature=[0.7] * 3, top_p=[0.95] * 3,
                 max_new=[len(t.gen_ids) - i - 1 for t in trunks])
    tokens, *_ = family_engine._decode(logits, cache, None, [length + 1] * 3, spec)
    assert [tokens[r] for r in rows] == [trunks[r].gen_ids[i + 1:] for r in rows]


def test_exact2_replicates_exact1_and_refeed_differs(family_engine):
    trunks, state = sample(family_engine)
    at = min(len(t.gen_ids) for t in trunks) - 4
    jobs = [job_for(trunks[r], at, pivot_id=r) for r in range(3)]
    assert all(j.abs_pos > TINY_SLIDING_WINDOW for j in jobs)
    e1 = family_engine.run_pass(jobs, "exact1", SETTINGS, state)
    e2 = family_engine.run_pass(jobs, "exact2", SETTINGS, state)
    rf = family_engine.run_pass(jobs, "refeed", SETTINGS, None)
    for a, b in zip(e1, e2):
        assert (a.continuations, a.probe_ids, a.probe_first_logprob) == (b.continuations, b.probe_ids,
                                                                        b.probe_first_logprob)
        assert a.resume.state_ok is b.resume.state_ok is True and a.resume.first_step_exact
    assert all(o.resume.state_ok is None for o in rf)
    # re-feeding is another computation: a fresh prefill's next-token logprobs differ from the decode's
    trunk = trunks[1]
    refed = [raw_topk(family_engine._prefill([trunk.prompt_ids + trunk.gen_ids[:i + 1]])[0], 5)[0][0].tolist()
             for i in range(1, len(trunk.gen_ids) - 1)]
    assert any(lps != trunk.topk_logprobs[i + 1] for i, lps in enumerate(refed, start=1))


def test_a_sliding_window_layer_attends_to_its_window_from_a_whole_cache(gemma_fp32):
    """Every position kept, the window applied by the attention mask: step by step through the engine's cache,
    the logits are a full forward's (float32), past the window too; a model without the window differs there."""
    ids = list(range(5, 5 + 3 * TINY_SLIDING_WINDOW))
    engine = gemma_fp32

    def stepwise(cache):
        out = []
        for t, token in enumerate(ids):
            logits, cache = engine._forward(torch.tensor([[token]]), torch.tensor([[t]]), cache, None)
            out.append(logits[0])
        return torch.stack(out), cache

    with torch.inference_mode():
        full = engine.model(input_ids=torch.tensor([ids])).logits[0].float()
        ours, cache = stepwise(engine._new_cache())
        theirs, cropped = stepwise(DynamicCache(config=engine.model.config))
    assert [layer.keys.shape[2] for layer in cache.layers] == [len(ids)] * 2
    assert [layer.keys.shape[2] for layer in cropped.layers] == [TINY_SLIDING_WINDOW - 1, len(ids)]
    assert (ours - full).abs().max() < 1e-4 and (theirs - full).abs().max() < 1e-4
    engine.model.config.sliding_window = 10 ** 6
    try:
        with torch.inference_mode():
            unwindowed = engine.model(input_ids=torch.tensor([ids])).logits[0].float()
    finally:
        engine.model.config.sliding_window = TINY_SLIDING_WINDOW
    assert (unwindowed[:TINY_SLIDING_WINDOW] - full[:TINY_SLIDING_WINDOW]).abs().max() < 1e-4
    assert (unwindowed[TINY_SLIDING_WINDOW:] - full[TINY_SLIDING_WINDOW:]).abs().max() > 0.1


def test_a_base_model_without_a_chat_template_gets_a_few_shot_plain_prompt(family_engine):
    """The tiny Gemma 3 has a base model's tokenizer (no chat template), the tiny Llama a chat model's."""
    tok = family_engine.tok
    ids = chat_prompt_ids(tok, QUESTION, BOXED_INSTRUCTION)
    if family_engine.model.config.model_type == "llama":
        assert tok.chat_template and ids != tok(plain_prompt(QUESTION, BOXED_INSTRUCTION))["input_ids"]
        return
    assert not tok.chat_template
    text = tok.decode(ids)
    assert text == plain_prompt(QUESTION, BOXED_INSTRUCTION)
    assert text.count("Question: ") == 4 and text.endswith(f"Question: {QUESTION}{BOXED_INSTRUCTION}\nSolution:")
    assert "<<" not in text and "####" not in text and text.count("The final answer is \\boxed{") == 3
    # the arith task's own worked examples (generated from their seed), not GSM8K's
    arith = tok.decode(chat_prompt_ids(tok, QUESTION, BOXED_INSTRUCTION, task="arith"))
    shots = few_shot_examples("arith")
    assert [row["question"] for row in shots] == [row["question"] for row in arith_problems(seed=1, n=3)]
    assert all(f"Question: {row['question']}" in arith for row in shots) and "Natalia" not in arith
    assert "Natalia" in text  # GSM8K's first training problem


def _blank_line_ids(tok) -> set:
    return {i for i in range(len(tok)) if "\n\n" in tok.decode([i], skip_special_tokens=False)}


def test_a_base_model_s_answer_ends_at_a_blank_line(family_engine):
    """A plain prompt's examples end at a blank line, so the base model's answer does: the blank-line tokens
    stop it as EOS does (and are never a pivot); a chat model's turn ends at its EOS alone."""
    blank = _blank_line_ids(family_engine.tok)
    if family_engine.model.config.model_type == "llama":
        assert not blank & family_engine.stop_ids
        return
    assert blank and blank <= family_engine.stop_ids <= family_engine.special_ids
    hook = family_engine.model.lm_head.register_forward_hook(
        lambda module, args, out: out.index_fill(-1, torch.tensor(sorted(blank)), 100.0))
    try:
        trunks, _ = sample(family_engine)
    finally:
        hook.remove()
    assert [(t.gen_ids, t.finish_reason) for t in trunks] == [([min(blank)], "eos")] * 3


@pytest.mark.parametrize("family", FAMILIES)
def test_a_short_run_of_each_family_through_every_stage(family, tmp_path):
    """params/tiny-<family>.yaml through the runner: every stage finishes, every pivot resumed its verified
    decode-time state, the replica is exact and the batch-invariant passes identical; the Gemma 3's pivots
    lie past its sliding-window layer's window, after a plain prompt."""
    import pandas as pd

    from replaylib.analysis.records import load_records
    from replaylib.run import main
    from replaylib.runtime.params import STAGES
    assert main([str(REPO / "params" / f"tiny-{family}.yaml"), "--out", str(tmp_path)]) == 0
    run = tmp_path / "runs" / f"tiny-{family}"
    assert all((run / stage / "manifest.json").is_file() for stage in STAGES)
    recs = load_records(run / "03_three_pass_replay" / "records.parquet")
    assert len(recs) > 0 and recs.exact_ok.all() and (recs.A_exact1 == recs.A_exact2).all()
    assert json.loads((run / "05_batch_invariant" / "invariant.json").read_text())["all_identical"] is True
    trunks = pd.read_parquet(run / "01_sampling" / "trunks.parquet")
    prompt = models_tokenizer(family).decode(list(trunks.prompt_ids.iloc[0]))
    assert prompt.startswith("Question: ") == (family == "gemma3")
    if family == "gemma3":
        assert (recs.gen_index + len(trunks.prompt_ids.iloc[0]) > TINY_SLIDING_WINDOW).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_credit_tool_and_the_estimator_certify_each_family(family, tmp_path):
    """--model tiny-<family>:0 (the command loads the model by its spec) and an Estimator on the same spec: the
    model's own rollouts (of a plain prompt, for the Gemma 3) certified bit for bit, resume equal to its replica."""
    import pandas as pd
    from test_credit import FAST, sampled_rollouts, write

    from replaylib.credit import Estimator
    from replaylib.credit.tool import Settings, run
    spec = f"tiny-{family}:0"
    engine = HFEngine(models.resolve_model(spec), "cpu", "bfloat16")
    rows = sampled_rollouts(engine, n=2, max_new=12, prompt=engine.prompt_ids(QUESTION, BOXED_INSTRUCTION))
    summary = run(write(tmp_path / "r.jsonl", rows), tmp_path / "out", Settings(model=spec, grader="gsm8k", **FAST))
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert summary["pivots"] == len(frame) > 0 and set(frame.certificate) == {"bit-exact"}
    assert (frame.continuations_resume == frame.continuations_replica).all()
    estimator = Estimator(model=spec, grader="gsm8k", **FAST)
    try:
        again = estimator(rows)
    finally:
        estimator.close()
    assert set(again.certificate) == {"bit-exact"} and list(again.A_resume) == list(frame.A_resume)


def models_tokenizer(family):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(models.resolve_model(f"tiny-{family}:0"))


def test_the_embedded_families_are_pinned():
    for name in ("smollm2-135m-instruct", "gemma-3-270m"):
        spec = models.EMBEDDED_MODELS[name]
        assert spec["dequantizer"] == "gguf" and len(spec["sha256"]) == 64 and spec["size"] > 0
    assert "Gemma Terms of Use" in models.EMBEDDED_MODELS["gemma-3-270m"]["license"]
    json.dumps(models.EMBEDDED_MODELS)  # SOURCE.json takes it as it is


def _llama_cpp_gguf(model_dir, arch: str, out, quantized: str):
    """A GGUF of a tiny model in llama.cpp's layout (its convert_hf_to_gguf): Llama's query and key rows in
    rotary order, Gemma's norm weights plus 1, everything F32 but the ``quantized`` tensor (Q8_0)."""
    import gguf
    import numpy as np
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    kind = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}[arch]
    names = gguf.get_tensor_name_map(kind, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    originals = {}
    for name, tensor in model.state_dict().items():
        w = tensor.numpy().copy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = (np.round(w * 64) / 64).astype(np.float32)  # exactly w after +1 and -1 in float32
        originals[name] = w.copy()
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if arch == "llama" and target.endswith(("attn_q.weight", "attn_k.weight")):
            n = config.num_attention_heads if target.endswith("attn_q.weight") else config.num_key_value_heads
            w = w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if arch == "gemma3" and target.endswith("norm.weight"):
            w = w + np.float32(1)
        if target == quantized:
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(target, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            originals[name] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape)
        else:
            writer.add_tensor(target, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return originals


@pytest.mark.parametrize("family", FAMILIES)
def test_a_gguf_in_llama_cpp_s_layout_reads_back_as_the_model_it_came_from(family, tmp_path):
    """The reference conversion undoes llama.cpp's layout: every tensor of a tiny model written as llama.cpp
    writes it reads back as it was (F32 bit for bit; the Q8_0 one as gguf's reference dequantizer reads it)."""
    model_dir = build_tiny_model(tmp_path / "m", seed=0, family=family)
    originals = _llama_cpp_gguf(model_dir, family, tmp_path / "m.gguf", quantized="blk.0.ffn_up.weight")
    read = dict(models.reference_tensors(tmp_path / "m.gguf"))
    assert set(read) == set(originals)
    assert [n for n in read if not torch.equal(read[n], torch.from_numpy(originals[n]))] == []


EMBEDDED_FAMILIES = ["smollm2-135m-instruct", "gemma-3-270m"]


def _fetched(name: str):
    from replaylib.core.paths import models_dir
    path = models_dir() / name
    if not models.is_valid_model_dir(path):
        pytest.skip(f"embedded:{name} is not fetched here (python -m replaylib.models fetch {name})")
    return path


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REPLAYLIB_SLOW") != "1", reason="set REPLAYLIB_SLOW=1")
@pytest.mark.parametrize("name", EMBEDDED_FAMILIES)
def test_an_embedded_family_is_its_gguf_as_transformers_reads_it_too(name, tmp_path):
    """Downloaded again and assembled: every tensor the reference conversion reads (gguf's dequantizer) is the
    tensor transformers' own GGUF reading gives, bit for bit in float32, and the fetched model holds it in bf16."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GgufConfig
    path = _fetched(name)
    spec = models.EMBEDDED_MODELS[name]
    gguf_path = models.assemble_gguf(models.download_wheels(spec, tmp_path / "wheels"), spec, tmp_path / "m.gguf")
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True)).state_dict()
    saved = load_file(path / "model.safetensors")
    differ = []
    for hf, tensor in models.reference_tensors(gguf_path):
        if not torch.equal(theirs[hf], tensor) or not torch.equal(saved[hf], tensor.to(torch.bfloat16)):
            differ.append(hf)
    assert differ == []


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REPLAYLIB_SLOW") != "1", reason="set REPLAYLIB_SLOW=1")
@pytest.mark.parametrize("name", EMBEDDED_FAMILIES)
def test_an_embedded_family_resumes_its_own_trunks_exactly(name):
    """Gemma 3's pivots lie past its sliding-window layers' 512 positions: its few-shot prompt (about 420
    tokens) holds a long question (three GSM8K test problems' texts before the one it asks)."""
    from replaylib.measure.data import load_problems
    engine = HFEngine(str(_fetched(name)), "cpu", "bfloat16")
    long_question = " ".join(p.question for p in load_problems("gsm8k")[:3]) + " " + QUESTION
    trunks, state = sample(engine, n=2, max_new=120, question=long_question)
    at = min(len(t.gen_ids) for t in trunks) - 4
    jobs = [job_for(trunks[r], at, pivot_id=r) for r in range(2)]
    window = getattr(engine.model.config, "sliding_window", None)
    assert window is None or all(j.abs_pos > window for j in jobs)
    e1 = engine.run_pass(jobs, "exact1", SETTINGS, state)
    e2 = engine.run_pass(jobs, "exact2", SETTINGS, state)
    # (the first step after the pivot need not be the trunk's own bit for bit: the pass batches other rows
    # than the trunk's decode did, and CPU kernels sum in a shape-dependent order)
    assert all(a.resume.state_ok and b.resume.state_ok for a, b in zip(e1, e2))
    assert [(a.continuations, a.probe_first_logprob) for a in e1] == [(b.continuations, b.probe_first_logprob)
                                                                      for b in e2]
