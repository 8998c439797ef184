"""The credit tool's run: read and check every rollout, then per rollout (one shard each, reused on a
rerun under the same settings) rebuild its decode-time state by forced decoding, choose its pivots and
run the passes; then write credit.parquet, summary.json and report.html, each atomically."""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from ..core import progress
from ..core.files import atomic_save, atomic_write_bytes, atomic_write_json, sha256_file
from ..measure import credit as kernel
from ..measure.engine import PassSettings
from ..runtime import rundir
from . import graders
from .inputs import BadInput, read_rollouts

TOP_K = 5  # top-k the forced decode records per step (margins and alternatives when none are recorded)
VLLM_NOT_BUILT = ("--engine vllm: the vLLM path is not built yet: resume on vLLM needs the response's blocks "
                  "written by decode steps (a forced decode through the engine), not a prefill; use --engine hf")


@dataclass
class Settings:
    """Everything that decides a shard's bytes besides the rollout itself (its key)."""
    model: str
    grader: str
    passes: list = field(default_factory=lambda: list(kernel.TOOL_PASSES))
    k: int = 4
    margin: float = 1.0
    max_pivots_per_rollout: int = 3
    max_cont_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    probe_tokens: int = 1
    stop_at_answer: bool = False
    engine: str = "hf"
    device: str = "cpu"
    dtype: str = "bfloat16"
    invariant: bool = False
    seed: int = 0
    seeds: str = "hash"
    success_above: float = 0.0

    def check(self) -> None:
        bad = [p for p in self.passes if p not in kernel.PASS_OF]
        if bad or not self.passes:
            raise BadInput(f"--passes {','.join(self.passes)}: choose among {','.join(kernel.TOOL_PASSES)}")
        if self.engine == "vllm":
            raise BadInput(VLLM_NOT_BUILT)
        for name, lo in (("k", 1), ("max_pivots_per_rollout", 1), ("max_cont_tokens", 1), ("probe_tokens", 1)):
            if getattr(self, name) < lo:
                raise BadInput(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least {lo}")
        if not 0 < self.top_p <= 1 or self.temperature < 0:
            raise BadInput("--top-p must be in (0, 1] and --temperature at least 0")
        if self.seeds not in ("hash", "replay"):
            raise BadInput(f"--seeds {self.seeds}: choose hash or replay")

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def pass_settings(self) -> PassSettings:
        return PassSettings(k=self.k, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_cont_tokens,
                            probe_tokens=self.probe_tokens, stop_at_answer=self.stop_at_answer, task="credit")


def load_engine(settings: Settings):
    from transformers.utils import logging as hf_logging

    from ..measure.engine_hf import HFEngine
    hf_logging.set_verbosity_error()  # the terminal gets the tool's lines, not the library's loading bars
    hf_logging.disable_progress_bar()
    from ..measure.models import resolve_model
    try:
        path = resolve_model(settings.model)
    except (ValueError, FileNotFoundError) as e:
        raise BadInput(f"--model {settings.model}: {e}") from None
    try:
        return HFEngine(path, settings.device, settings.dtype, invariant=settings.invariant)
    except (OSError, RuntimeError, ValueError) as e:
        raise BadInput(f"--model {settings.model}: cannot be loaded on --device {settings.device} "
                       f"({e.__class__.__name__}: {str(e)[:160]})") from None


def check_seeds(rollouts, settings: Settings, path: Path) -> None:
    if settings.seeds != "replay":
        return
    for r in rollouts:
        parts = str(r.id).split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise BadInput(f"{path}:{r.line}: field 'id' {r.id!r} is not '<problem_id>:<rollout>', which --seeds "
                           f"replay needs; use --seeds hash")


def rollout_rows(engine, r, settings: Settings, grade) -> list[dict]:
    """One rollout's rows: forced decoding, pivots, passes, certificates."""
    # as wide a top-k as was recorded, so that every recorded entry has its counterpart
    width = max([TOP_K, *(len(step) for step in r.top_logprobs or [])])
    trunks, state = engine.force_trunks({0: r.prompt_ids}, {0: r.response_ids}, width)
    trunk = trunks[0][0]
    forced_topk = [[[t, lp] for t, lp in zip(ids, lps)] for ids, lps in zip(trunk.topk_ids, trunk.topk_logprobs)]
    topk = r.top_logprobs if r.top_logprobs is not None else forced_topk
    pivots = kernel.select_pivots(r.response_ids, topk, settings.margin, settings.max_pivots_per_rollout,
                                  engine.special_ids, r.positions)
    if not pivots:
        return []
    seeds = [kernel.seeds_for(r.id, len(r.prompt_ids), p["position"], settings.k, settings.seed, settings.seeds)
             for p in pivots]
    rows = kernel.credit_rollout(engine, r.prompt_ids, r.response_ids, pivots, seeds, settings.passes,
                                 settings.pass_settings(), state[0], lambda text: grade(text, r))
    out = []
    for p, row in zip(pivots, rows):
        cert = kernel.certificate(r.top_logprobs, trunk.topk_ids, trunk.topk_logprobs, p["position"])
        out.append({"id": str(r.id), "line": r.line, **p, "margin_source": "recorded" if r.top_logprobs else "forced",
                    "k": settings.k, **row, "certificate": cert})
    return out


class Shards:
    """One parquet shard per rollout under DIR/shards/, reused only when the manifest holds its sha256
    under the same settings key and rollout digest."""

    def __init__(self, out: Path, key: str):
        self.dir, self.key = out / "shards", key
        self.manifest_path = self.dir / "manifest.json"
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError):
            manifest = {}
        self.entries = manifest.get("shards", {}) if manifest.get("key") == key else {}

    def name(self, r) -> str:
        return hashlib.sha256(f"{self.key}|{r.digest}".encode()).hexdigest()[:24] + ".parquet"

    def get(self, r) -> pd.DataFrame | None:
        path = self.dir / self.name(r)
        if self.entries.get(path.name) and path.is_file() and sha256_file(path) == self.entries[path.name]:
            return pd.read_parquet(path)
        return None

    def put(self, r, frame: pd.DataFrame) -> pd.DataFrame:
        path = self.dir / self.name(r)
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        atomic_write_bytes(path, buf.getvalue())
        self.entries[path.name] = hashlib.sha256(buf.getvalue()).hexdigest()
        atomic_write_json(self.manifest_path, {"key": self.key, "shards": dict(sorted(self.entries.items()))})
        return pd.read_parquet(path)


def versions(grader: str) -> dict:
    """The versions a manifest records (runtime.rundir.versions), with math-verify's where it grades."""
    from importlib.metadata import version
    found = rundir.versions()
    if grader == "math":
        found["math-verify"] = version("math-verify")
    return found


def summarize(frame: pd.DataFrame, settings: Settings, n_rollouts: int, engine) -> dict:
    rows = frame.to_dict("records")
    certs = frame["certificate"].value_counts().to_dict() if len(frame) else {}
    summary = {"rollouts": n_rollouts, "pivots": len(rows),
               "floor": kernel.share_differing(rows, "replica"), "refeed": kernel.share_differing(rows, "refeed"),
               "common_pivots": int(sum(any(r[f"A_{p}"] != 0 for p in settings.passes) for r in rows)),
               "certificates": {str(k): int(v) for k, v in certs.items()},
               "passes_agree": int(frame["passes_agree"].sum()) if len(frame) else 0,
               "pass_map": {p: kernel.PASS_OF[p] for p in settings.passes},
               "settings": asdict(settings), "engine": engine.describe(), "versions": versions(settings.grader)}
    if settings.invariant:  # invariant mode: every pass must agree bit for bit
        summary["invariant_ok"] = bool(frame["passes_agree"].all()) if len(frame) else True
    return summary


def run(rollouts_path, out, settings: Settings, engine=None) -> dict:
    """The tool: check everything first (BadInput: nothing written), then compute and write."""
    from .report import report_html
    settings.check()
    grader_fn = graders.load(settings.grader)
    grade = graders.scorer(grader_fn, settings.grader, settings.success_above)
    engine = engine or load_engine(settings)
    path = Path(rollouts_path)
    rollouts = read_rollouts(path, engine.model.config.vocab_size)
    check_seeds(rollouts, settings, path)
    first = rollouts[0]
    try:  # the grader on a real text before anything is written
        grade(engine.decode(first.response_ids), first)
    except graders.GraderFailed as e:
        raise BadInput(f"{path}:{first.line}: field 'ground_truth': {e}") from None
    out = Path(out)
    # the engine as it describes itself (model path, dtype, kernels) is part of what a shard was computed with
    shards = Shards(out, hashlib.sha256(f"{settings.key()}|{json.dumps(engine.describe(), sort_keys=True)}"
                                        .encode()).hexdigest())
    frames = []
    shards.dir.mkdir(parents=True, exist_ok=True)
    bar = progress.bar(shards.dir, "credit", len(rollouts), "rollout")
    for r in rollouts:
        frame = shards.get(r)
        if frame is None:
            try:
                rows = rollout_rows(engine, r, settings, grade)
            except graders.GraderFailed as e:
                raise BadInput(f"{path}:{r.line}: field 'ground_truth': {e}") from None
            frame = shards.put(r, pd.DataFrame(rows))
        frames.append(frame)
        bar.update(1)
    bar.close()
    frame = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) \
        else pd.DataFrame()
    summary = summarize(frame, settings, len(rollouts), engine)
    atomic_save(out / "credit.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
    atomic_write_json(out / "summary.json", summary)
    atomic_write_bytes(out / "report.html", report_html(frame, summary).encode())
    return summary
