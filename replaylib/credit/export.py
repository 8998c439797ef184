"""Export a run's stage-01 trunks as credit-tool rollouts (one JSON object a line): id
"<problem_id>:<rollout>" (what --seeds replay reads), prompt and response ids, the gold answer, the
recorded top-k, and with pivots the stage-02 pivots' positions."""
from __future__ import annotations

import json
from pathlib import Path

from ..core.files import atomic_write_bytes
from ..measure.data import load_problems
from ..runtime.outputs import PIVOTS, SAMPLING, kept_trunks, read_pivots
from .inputs import BadInput


def rollout_lines(run_dir: Path, with_pivots: bool = False) -> list[str]:
    run_dir = Path(run_dir)
    trunks_path, params_path = run_dir / SAMPLING / "trunks.parquet", run_dir / SAMPLING / "params.json"
    if not trunks_path.is_file() or not params_path.is_file():
        raise BadInput(f"{run_dir}: no finished stage 01 ({trunks_path.name}, {params_path.name}); give runs/<config>")
    task = json.loads(params_path.read_text())["params"]["task"]
    gold = {p.problem_id: p.gold for p in load_problems(task)}
    positions = {}
    try:  # the run's tables as every reader checks them (a malformed one: one line naming the file)
        trunks = kept_trunks(run_dir / SAMPLING)
        if with_pivots:
            pivots_path = run_dir / PIVOTS / "pivots.parquet"
            if not pivots_path.is_file():
                raise BadInput(f"{run_dir}: --with-pivots needs a finished stage 02 ({pivots_path})")
            for p in read_pivots(pivots_path).itertuples(index=False):
                positions.setdefault((int(p.problem_id), int(p.rollout)), []).append(int(p.gen_index))
    except ValueError as e:
        raise BadInput(str(e)) from None
    lines = []
    for t in trunks.itertuples(index=False):
        key = (int(t.problem_id), int(t.rollout))
        if with_pivots and key not in positions:
            continue
        row = {"id": f"{key[0]}:{key[1]}", "prompt_ids": [int(i) for i in t.prompt_ids],
               "response_ids": [int(i) for i in t.gen_ids], "ground_truth": gold[key[0]], "data_source": task,
               "top_logprobs": [[[int(i), float(lp)] for i, lp in zip(ids, lps)]
                                for ids, lps in zip(t.topk_ids, t.topk_logprobs)]}
        if with_pivots:
            row["positions"] = positions[key]
        lines.append(json.dumps(row))
    return lines


def export(run_dir, out, with_pivots: bool = False) -> int:
    lines = rollout_lines(Path(run_dir), with_pivots)
    atomic_write_bytes(Path(out), ("\n".join(lines) + "\n").encode())
    return len(lines)
