"""Campaign files, and the campaign statistics' stage directory (runs/campaign-<name>/06_campaign/)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..analysis import records as rec
from ..core.files import sha256_file
from ..core.paths import REPO
from . import params as params_mod
from .params import EXECUTOR_KEYS, read_mapping
from .registry import CAMPAIGN, RUN_ORDER
from .stagedir import StageDir, notebook_record

TOP_KEYS = {"name", "note", "rows", "invariant", "figure1", "figure3", "bootstrap_draws", "concurrent_configs",
            *EXECUTOR_KEYS}


ROW_KEYS = {"label", "params", "published"}


@dataclass
class Row:
    label: str
    configs: list[str]  # config names, pooled in this order
    published: str


@dataclass
class Campaign:
    name: str
    path: Path
    note: str
    rows: list[Row]
    invariants: list[Row]  # batch-invariant rows: each one configuration's stage 5
    figure1: str
    figure3: list[str]
    configs: dict  # config name -> Params (executor overrides applied)
    sources: dict  # config name -> params file it was read from
    bootstrap_draws: int
    concurrent_configs: int

    @property
    def label(self) -> str:
        return f"campaign-{self.name}"

    @property
    def executor(self) -> str:
        return next(iter(self.configs.values())).executor

    def stages_needed(self, name: str) -> list[str]:
        """The stages the campaign reads from a configuration: the replay records (stage 3) of the
        rows' and Figure 3's configurations, stage 5 of the batch-invariant one; a configuration's
        own statistics (stage 4, which needs its stage 5) are left to `python -m replaylib.run`."""
        stages = []
        if any(name in r.configs for r in self.rows) or name in self.figure3:
            stages.append("03_three_pass_replay")
        if any(name in r.configs for r in self.invariants):
            stages.append("05_batch_invariant")
        return stages

    def stages_read(self, name: str) -> list[str]:
        """stages_needed and every stage they read, in run order."""
        closure = self.configs[name].reading(self.stages_needed(name))
        return [s for s in RUN_ORDER if s in closure]

    def shared_stages(self) -> dict:
        """{(config, stage): source config}: a stage whose key (its parameters and its upstream
        stages' keys) equals an earlier configuration's is copied from it, not computed again (e.g. a
        K=8 row on the screened cohort: its sampling and pivot stages are the screened row's)."""
        first, shared = {}, {}
        for name, p in self.configs.items():
            for stage in self.stages_read(name):
                source = first.setdefault((stage, p.stage_key(stage)), name)
                if source != name:
                    shared[(name, stage)] = source
        return shared

    def replay_configs(self) -> list[str]:
        """The configurations whose replay records the statistics read: the rows', then Figure 3's."""
        names = [n for r in self.rows for n in r.configs] + self.figure3
        return list(dict.fromkeys(names))

    @property
    def invariant(self) -> Row:
        """The first batch-invariant row (Figure 3 draws it)."""
        return self.invariants[0]

    def invariant_configs(self) -> dict:
        """{batch-invariant row label: its configuration}."""
        return {r.label: r.configs[0] for r in self.invariants}


class CampaignStage:
    """The definition of a campaign's statistics' stage directory (runtime.stagedir.StageDir): its key is
    the campaign file's content, its upstream stages are the replay stages of the rows and Figure 3 and the
    batch-invariant stage of the batch-invariant row, each in its own configuration's run directory. The
    campaign copies its configurations' shared stages itself (replaylib.campaign), and a changed campaign
    file replaces its statistics."""
    copies_upstream = False
    refuses_replacing = False

    def __init__(self, campaign: Campaign, out_dir=None):
        self.campaign, self.out_dir = campaign, out_dir
        self.config, self.stage = campaign.label, CAMPAIGN.name

    def recorded_campaign(self) -> dict:
        return {"stage": self.stage, "campaign_file": self.campaign.path.name,
                "campaign_sha256": sha256_file(self.campaign.path)}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.recorded_campaign(), sort_keys=True).encode()).hexdigest()[:16]

    def notebook(self) -> dict:
        return notebook_record(self.stage)

    def upstreams(self) -> dict[str, StageDir]:
        c = self.campaign
        ups = {(n, "03_three_pass_replay") for n in c.replay_configs()}
        ups |= {(n, "05_batch_invariant") for n in c.invariant_configs().values()}
        return {f"{n}/{s}": StageDir(c.configs[n], s, self.out_dir) for n, s in sorted(ups)}

    def recorded(self) -> dict:
        return {**self.recorded_campaign(), "key": self.key(), "config": self.config}

    def why_key_differs(self, recorded: dict) -> str:
        return "campaign file changed"

    def differences(self, recorded: dict) -> str:
        return "the campaign file changed"

    def rerun_command(self) -> str:
        return f"python -m replaylib.campaign {self.campaign.path} --force"

    def uses_vllm(self) -> bool:
        return False


def _resolve(path, where: str, key: str) -> Path:
    p = Path(path)
    p = p if p.is_absolute() else REPO / p
    if not p.is_file():
        raise ValueError(f"{where}: '{key}' names {path}, which does not exist (paths resolve from the repository "
                         f"root {REPO}); fix the path")
    return p


def load(path, overrides: dict | None = None) -> Campaign:
    """Read and check a campaign file; ``overrides``: executor values from the command line."""
    path = Path(path)
    where = str(path)
    data = read_mapping(path, "campaign file not found; pick one of params/campaign-*.yaml",
                        "(name, rows, invariant, figure1, figure3, ...)")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}'; campaign keys are {', '.join(sorted(TOP_KEYS))}")
    for key in ("rows", "invariant", "figure1", "figure3"):
        if key not in data:
            raise ValueError(f"{where}: key '{key}' is missing; add it (see params/campaign-paper.yaml)")
    executor = {k: data[k] for k in EXECUTOR_KEYS if k in data}
    executor.update({k: v for k, v in (overrides or {}).items() if v is not None})
    configs, sources = {}, {}

    def config_of(file, key) -> str:
        p = _resolve(file, where, key)
        loaded = params_mod.load(p)
        try:
            merged = params_mod.make({**loaded.to_dict(), **executor}, where=f"{where} (executor values)")
        except ValueError as e:
            raise ValueError(str(e)) from None
        name = merged.config
        if name in sources and sources[name] != p:
            raise ValueError(f"{where}: '{key}': {p} and {sources[name]} both have config '{name}'; give each "
                             f"configuration its own config name")
        configs[name], sources[name] = merged, p
        return name

    def row_of(entry, key) -> Row:
        if not isinstance(entry, dict) or set(entry) - ROW_KEYS or "label" not in entry or "params" not in entry:
            raise ValueError(f"{where}: '{key}' must be a mapping with label, params (a file or a list) and published")
        files = entry["params"] if isinstance(entry["params"], list) else [entry["params"]]
        published = entry.get("published")
        if published not in rec.PAPER_ROWS:
            raise ValueError(f"{where}: '{key}' row {entry['label']!r} has published {published!r}; choose one of "
                             f"{', '.join(rec.PAPER_ROWS)}")
        return Row(str(entry["label"]), once([config_of(f, key) for f in files], files, key), published)

    def once(names: list[str], files: list, key: str) -> list[str]:
        """A row pools each configuration once: a file listed twice would count its records twice."""
        twice = next((f for f, n in zip(files, names) if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"{where}: '{key}' lists {twice} (config '{names[files.index(twice)]}') more than once; "
                             f"list each params file once")
        return names

    if not isinstance(data["rows"], list) or not data["rows"]:
        raise ValueError(f"{where}: 'rows' must be a non-empty list of rows (label, params, published)")
    rows = [row_of(r, f"rows[{i}]") for i, r in enumerate(data["rows"])]
    # one batch-invariant row, or a list of them (one per model)
    entries = data["invariant"] if isinstance(data["invariant"], list) and data["invariant"] else [data["invariant"]]
    invariants = [row_of(e, "invariant" if len(entries) == 1 else f"invariant[{i}]") for i, e in enumerate(entries)]
    if any(len(r.configs) != 1 for r in invariants):
        raise ValueError(f"{where}: each 'invariant' row must name one params file (its stage 5 is the "
                         f"batch-invariant row)")
    labels = [r.label for r in rows] + [r.label for r in invariants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}: row labels repeat ({labels}); give each row its own label")
    if data["figure1"] not in labels[:len(rows)]:
        raise ValueError(f"{where}: 'figure1' is {data['figure1']!r}; name one of the rows: {labels[:len(rows)]}")
    fig3 = data["figure3"] if isinstance(data["figure3"], list) else [data["figure3"]]
    figure3 = once([config_of(f, "figure3") for f in fig3], fig3, "figure3")
    name = params_mod.check_name(str(data.get("name") or path.stem.removeprefix("campaign-")), where, "name")

    def count(key, default, lo):
        v = data.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{where}: '{key}' is {params_mod.short(v)}; it must be an integer of at least {lo}")
        if key == "bootstrap_draws":  # the bound of the parameter of the same name
            params_mod.make({key: v}, where=where)
        return v
    return Campaign(name=name, path=path.resolve(), note=str(data.get("note", "")).strip(), rows=rows,
                    invariants=invariants, figure1=data["figure1"], figure3=figure3, configs=configs, sources=sources,
                    bootstrap_draws=count("bootstrap_draws", 1000, 1),
                    concurrent_configs=count("concurrent_configs", 0, 0))
