"""Run stage notebooks headless: python -m replaylib.run PARAMS.yaml [STAGE ...] [--force] [--out DIR]

With no stage named, runs every stage that is missing or stale (its parameters, its
notebook, a library module it imports directly or indirectly, or an upstream stage's
outputs changed since it finished). A named stage always reruns from scratch, after
whatever of its upstream stages is missing or stale; --force recomputes every stage it
runs, reusing no partial result. A stage killed midway resumes from its finished shards
when nothing it depends on changed. Each stage is its notebook,
executed by papermill into runs/<config>/<stage>/<stage>.ipynb with only the
parameters that notebook declares.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .params import RUN_ORDER, STAGES, Params, load
from .rundir import REPO, StageDir, code_fingerprint, is_done, notebook_path, out_root

ALIASES = {"sampling": "01_sampling", "pivots": "02_pivot_mining", "pivot_mining": "02_pivot_mining",
           "replay": "03_three_pass_replay", "statistics": "04_statistics", "stats": "04_statistics",
           "invariant": "05_batch_invariant", "batch_invariant": "05_batch_invariant"}
ALIASES.update({s[:2]: s for s in STAGES})
ALIASES.update({str(int(s[:2])): s for s in STAGES})


def notebook(stage: str) -> Path:
    return notebook_path(stage)


def declared_parameters(stage: str) -> list[str]:
    import papermill
    return list(papermill.inspect_notebook(str(notebook(stage))).keys())


def resolve_stage(name: str) -> str:
    if name in STAGES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    raise ValueError(f"unknown stage '{name}'; stages: {', '.join(STAGES)} (or {', '.join(sorted(ALIASES))})")


def staleness(params: Params, stage: str, out_dir) -> str | None:
    """Why a stage must run, or None when it is up to date."""
    path = out_root(out_dir) / "runs" / params.config / stage
    if not (path / "DONE").exists():
        return "not run yet"
    if not is_done(params, stage, out_dir):
        return "parameters changed"
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "no readable manifest"
    if manifest.get("code") != code_fingerprint(stage):
        return "notebook or library code changed"
    for up in params.data_upstream(stage):
        try:
            outputs = json.loads((path.parent / up / "manifest.json").read_text())["outputs"]
        except (OSError, json.JSONDecodeError, KeyError):
            return f"upstream {up} has no readable manifest"
        read = {k.split("/", 1)[1]: v for k, v in manifest.get("inputs", {}).items() if k.startswith(f"{up}/")}
        if read != outputs:
            return f"upstream {up} outputs changed since it ran"
    return None


def plan(params: Params, named: list[str], force: bool, out_dir) -> list[tuple[str, str]]:
    """(stage, reason) in order: named stages and what they need, or every stale stage."""
    wanted = named or ([s for s in STAGES if s == "04_statistics"] if params.records == "published" else STAGES)
    todo: dict[str, str] = {}

    def need(stage: str, explicit: bool):
        for up in params.data_upstream(stage):
            need(up, False)
        reason = staleness(params, stage, out_dir)
        if any(up in todo for up in params.data_upstream(stage)):
            reason = reason or "upstream reruns"
        if explicit and (named or force):
            reason = reason or ("named" if named else "forced")
        if reason and stage not in todo:
            todo[stage] = reason

    for stage in wanted:
        need(stage, True)
    return [(s, todo[s]) for s in RUN_ORDER if s in todo]


def execute(params: Params, stage: str, out_dir, fresh: bool = False) -> Path:
    """Run one stage's notebook with papermill; returns the executed notebook's path."""
    import papermill
    declared = declared_parameters(stage)
    values = {**params.to_dict(), "out_dir": str(out_root(out_dir))}
    parameters = {k: values[k] for k in declared if k in values}
    missing = [k for k in Params.keys_for(stage) if k not in declared]
    if missing or "config" not in declared:
        raise ValueError(f"{notebook(stage)}: parameters cell lacks {missing or ['config']}; "
                         f"declare them with their defaults")
    stage_dir = out_root(out_dir) / "runs" / params.config / stage
    stage_dir.mkdir(parents=True, exist_ok=True)
    if fresh:  # --force or a named stage: recompute everything, reuse no partial result
        StageDir(params, stage, out_dir).clear()
    output = stage_dir / f"{stage}.ipynb"
    papermill.execute_notebook(str(notebook(stage)), str(output), parameters=parameters, cwd=str(REPO),
                               kernel_name="python3", progress_bar=False, log_output=False)
    return output


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaylib.run", description=__doc__.splitlines()[0])
    ap.add_argument("params", help="a params YAML file, e.g. params/embedded.yaml")
    ap.add_argument("stages", nargs="*", help=f"stages to run ({', '.join(STAGES)}); default: all missing or stale")
    ap.add_argument("--force", action="store_true", help="rerun the stages even if up to date")
    ap.add_argument("--out", default=None, help="root for runs/, figures/, tables/ (default: the repository)")
    ap.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    args = ap.parse_args(argv)
    try:
        params = load(args.params)
        named = [resolve_stage(s) for s in args.stages]
        todo = plan(params, named, args.force, args.out)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not todo:
        print(f"[replaylib] config {params.config}: every stage is up to date")
    for stage, reason in todo:
        print(f"[replaylib] config {params.config}, stage {stage}: {'would run' if args.dry_run else 'running'} "
              f"({reason})", flush=True)
        if args.dry_run:
            continue
        start = time.time()
        try:
            output = execute(params, stage, args.out, fresh=args.force or reason == "named")
        except Exception as e:  # papermill raises with the cell's traceback; keep the console to one line
            ename = getattr(e, "ename", type(e).__name__)
            evalue = str(getattr(e, "evalue", e)).strip().splitlines()
            where = out_root(args.out) / "runs" / params.config / stage / f"{stage}.ipynb"
            print(f"error: stage {stage} failed: {ename}: {evalue[-1] if evalue else ''} (see {where})",
                  file=sys.stderr)
            return 1
        print(f"[replaylib] config {params.config}, stage {stage}: done in {time.time() - start:.0f} s -> "
              f"{output.relative_to(out_root(args.out)) if output.is_relative_to(out_root(args.out)) else output}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
