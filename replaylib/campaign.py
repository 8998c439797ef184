"""Campaigns: several configurations composed into the paper's items, run live and compared.

    python -m replaylib.campaign CAMPAIGN.yaml [--executor local|ray] [--ray-workers N]
                                 [--ray-address ADDR] [--gpus-per-worker G] [--out DIR] [--dry-run] [--force]
                                 [--stages-only]

A campaign file (params/campaign-*.yaml) lists Table 1 rows (a label, one or more params
files pooled as the paper pooled them, the published row it is compared with), the
batch-invariant row (one configuration's stage 5), the row drawn in Figure 1 and the
configurations pooled, undeduplicated, in Figure 3. Paths in it resolve from the
repository root, so a copy of the file elsewhere works the same.

The campaign runs every configuration's missing or stale stages that it reads (stages 1-3;
stage 5 for the batch-invariant row) through the runner (``python -m replaylib.run --upto``:
each stage is still its papermill notebook), one after the other, or side by side with
``concurrent_configs`` above 1 (with ``executor: ray``, all at once when it is 0): each runner is a
process of its own, started as soon as what it needs exists (a configuration that copies stages
from another, once those stages are finished; the batch-invariant stage, a runner of its own, once
its configuration's stage 1 is). Local vLLM engines are shared by the whole campaign: one per model
and settings serves every stage that needs it (replaylib.runtime.engine_service); Ray actors wait for free
GPUs. Then the campaign statistics notebook
(notebooks/06_campaign.ipynb) writes tables/campaign-<name>/ (tab1_main, live_vs_published)
and figures/campaign-<name>/ (Figures 1-3); it runs as a stage, in runs/campaign-<name>/06_campaign/
(executed notebook, run.log, params.json with the campaign file's sha256, manifest.json with its
inputs, the outputs of the stages it reads, and its products), and reruns only when those inputs,
the campaign file or its code change, or with --force.

A stage that two configurations compute with the same key (the same parameters, the same
upstream stages: e.g. a K=8 row on the screened cohort's problems and settings) runs
once: the later configuration gets a copy (its manifest says ``copied_from``), made only
when the source's outputs are unchanged and its inputs are the later one's.

Executor values: the command line overrides the campaign file, which overrides the params
files. None of them is in any stage key (results do not depend on where they ran).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from .core.files import atomic_write_bytes, open_new
from .core.paths import REPO, config_dir, out_root, stage_dir, tables_dir
from .runtime import params as params_mod
from .runtime.campaigns import Campaign, CampaignStage, load
from .runtime.locks import STOPS_WITH_ENV
from .runtime.provenance import changed_outputs
from .runtime.stage_copy import copy_stage
from .runtime.stagedir import StageDir


def _params_file(c: Campaign, name: str, out_dir=None) -> Path:
    """The configuration's parameters with the campaign's executor values, as the runner reads them."""
    path = config_dir(c.label, out_dir) / "params" / f"{name}.yaml"
    body = yaml.safe_dump(c.configs[name].to_dict(), sort_keys=False, allow_unicode=True)
    atomic_write_bytes(path, (f"# written by replaylib.campaign from {c.sources[name]}\n" + body).encode())
    return path


def copy_shared_stages(c: Campaign, name: str, out_dir=None) -> list[str]:
    """Copy into configuration `name` every stage it would compute that an earlier configuration of
    the campaign has finished with the same key, unchanged outputs and the same inputs; returns
    the stages copied. A stage that cannot be copied is computed as usual. The source is the
    configuration the campaign file names for that stage, wherever it was computed (a root carried
    between machines included): the campaign reads that configuration's own stages as they are."""
    copied = []
    for (dst, stage), source in c.shared_stages().items():
        if dst != name or not StageDir(c.configs[name], stage, out_dir).staleness():
            continue
        src_dir = stage_dir(source, stage, out_dir)
        try:
            manifest = json.loads((src_dir / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue  # the source has not finished it: compute it here
        intact = not changed_outputs(src_dir, manifest.get("outputs", {}))
        if intact and StageDir(c.configs[source], stage, out_dir).staleness():
            continue  # the source has not finished it (or it is stale): compute it here
        upstream = c.configs[name].data_upstream(stage)
        inputs_here = {}
        for up in upstream:
            try:
                outputs = json.loads((stage_dir(name, up, out_dir) / "manifest.json").read_text())["outputs"]
            except (OSError, json.JSONDecodeError, KeyError):
                outputs = {}
            inputs_here |= {f"{up}/{rel}": digest for rel, digest in outputs.items()}
        read_there = {k: v for k, v in manifest.get("inputs", {}).items()
                      if k.split("/", 1)[0] in upstream}
        if not intact or read_there != inputs_here:
            print(f"[campaign] {c.label}: {name} {stage}: not copied from {source} "
                  f"({'its outputs changed' if not intact else 'other inputs'}); computing it", flush=True)
            continue
        copy_stage(src_dir, stage_dir(name, stage, out_dir), name, out_dir)
        print(f"[campaign] {c.label}: {name} {stage}: copied from {source} (same parameters and inputs)",
              flush=True)
        copied.append(stage)
    return copied


@dataclass
class Job:
    """One runner process of a campaign: a configuration's stages up to ``upto``, started once the
    stages in ``waits`` ((config, stages) pairs) are finished (or the jobs making them have ended)."""
    config: str
    upto: list[str]
    waits: list
    copies: bool = True  # this job copies the configuration's shared stages from their sources

    @property
    def log_name(self) -> str:
        return self.config if self.copies else f"{self.config}-{self.upto[0]}"


INVARIANT = "05_batch_invariant"


def campaign_jobs(c: Campaign, todo: list[str], split: bool) -> list[Job]:
    """The runner processes that compute the configurations in ``todo``: one per configuration, and with
    ``split`` (side by side, not forced) the batch-invariant stage as a job of its own, beside its
    configuration's replay: it reads only stage 01 (it samples, mines and replays by itself)."""
    shared = c.shared_stages()
    jobs = []
    for name in todo:
        sources: dict[str, list] = {}
        for (dst, stage), src in shared.items():
            if dst == name and src in todo:
                sources.setdefault(src, []).append(stage)
        waits = list(sources.items())
        stages = c.stages_needed(name)
        if split and INVARIANT in stages and len(stages) > 1:
            jobs.append(Job(name, [s for s in stages if s != INVARIANT], waits))
            jobs.append(Job(name, [INVARIANT], [(name, ["01_sampling"])], copies=False))
        else:
            jobs.append(Job(name, stages, waits))
    return jobs


def _ready(c: Campaign, job: Job, done: dict, out_dir) -> bool:
    """Whether a job can start: every (config, stages) it waits for is finished, or the job making those
    stages has ended (whatever its outcome, which it reports itself): a copy need not wait for the rest
    of its source's run."""
    return all(done.get(config, False) or not any(StageDir(c.configs[config], st, out_dir).staleness()
                                                  for st in stages)
               for config, stages in job.waits)


def _run_job(c: Campaign, job: Job, out_dir, force: bool, log_to_file: bool) -> tuple[str, int, str]:
    if job.copies and not force:
        copy_shared_stages(c, job.config, out_dir)
    cmd = [sys.executable, "-m", "replaylib.run", str(_params_file(c, job.config, out_dir)),
           "--out", str(out_root(out_dir))] + (["--force"] if force else [])
    cmd += [arg for stage in job.upto for arg in ("--upto", stage)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
           STOPS_WITH_ENV: str(os.getpid())}  # the runner stops with the campaign (replaylib.run)
    if not log_to_file:
        return job.config, subprocess.run(cmd, cwd=REPO, env=env).returncode, ""
    log = config_dir(c.label, out_dir) / "logs" / f"{job.log_name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open_new(log) as f:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return job.config, rc, str(log)


def _start_ray(c: Campaign, workers: int) -> str:
    """A local Ray instance for every configuration's stages to join; returns its address."""
    from .runtime.executor import start_local_ray
    return start_local_ray(max(os.cpu_count() or 1, workers))


def run_configs(c: Campaign, todo: list[str], out_dir=None, force: bool = False) -> list[str]:
    """Run each configuration's stale stages through replaylib.run; returns the ones that failed.

    One after the other (``concurrent_configs`` 0 or 1 with ``executor: local``), or side by side
    (at most ``concurrent_configs`` runner processes; with ``executor: ray``, all of them when it is 0),
    each runner in its own process with its console in runs/campaign-<name>/logs/. Side by side, the
    batch-invariant stage runs as a job of its own (campaign_jobs). Engines of side-by-side jobs
    share the GPU (replaylib.runtime.engine_service)."""
    ray_executor = c.executor == "ray"
    width = c.concurrent_configs or (len(todo) if ray_executor else 1)
    if width <= 1 and not ray_executor:
        failed = []
        for job in campaign_jobs(c, todo, split=False):
            print(f"[campaign] {c.label}: configuration {job.config}", flush=True)
            if _run_job(c, job, out_dir, force, log_to_file=False)[1]:
                failed.append(job.config)
                break  # later configurations may be fine, but the campaign cannot finish: stop early
        return failed
    started = False
    if ray_executor and not any(c.configs[n].ray_address for n in todo):
        address = _start_ray(c, sum(c.configs[n].ray_workers for n in todo))
        started = True
        for n in todo:
            c.configs[n] = dataclasses.replace(c.configs[n], ray_address=address)
    where = "on Ray" if ray_executor else "(local executor)"
    failed = []
    try:
        failed = _side_by_side(c, campaign_jobs(c, todo, split=not force), width, out_dir, force, where)
    finally:
        if started:
            import ray
            ray.shutdown()
    return failed


def _side_by_side(c: Campaign, jobs: list[Job], width: int, out_dir, force: bool, where: str,
                  poll_s: float = 2.0) -> list[str]:
    """Run jobs in at most ``width`` threads, each as soon as it is ready (_ready), in the order given;
    returns the configurations that failed."""
    pending, running, failed = list(jobs), {}, []
    producing = {}  # config -> its jobs that copy or compute its shared stages
    for job in jobs:
        if job.copies:
            producing.setdefault(job.config, []).append(job)
    finished: set = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, width)) as pool:
        def start(job: Job) -> None:
            pending.remove(job)
            running[pool.submit(_run_job, c, job, out_dir, force, True)] = job
            print(f"[campaign] {c.label}: configuration {job.config}"
                  + ("" if job.copies else f" ({', '.join(job.upto)})") + f" started {where}", flush=True)

        while pending or running:
            ended = {config: all(id(j) in finished for j in js) for config, js in producing.items()}
            for job in list(pending):
                if len(running) >= width:
                    break
                if _ready(c, job, ended, out_dir):
                    start(job)
            if not running and pending:  # nothing running makes what the first one waits for: it makes it
                start(pending[0])
            done, _ = concurrent.futures.wait(running, timeout=poll_s,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                job = running.pop(fut)
                finished.add(id(job))
                name, rc, log = fut.result()
                print(f"[campaign] {c.label}: configuration {name} {'done' if rc == 0 else 'FAILED'} (log: {log})",
                      flush=True)
                if rc and name not in failed:
                    failed.append(name)
    return failed


def statistics_parameters(c: Campaign, out_dir=None) -> dict:
    """What the campaign statistics notebook is given: the campaign file and the output root."""
    return {"campaign": str(c.path), "out_dir": str(out_root(out_dir))}


def runs_as_they_are(c: Campaign, out) -> None:
    """--statistics-only: every stage the campaign reads finished, with its configuration's parameters and its
    outputs as it wrote them (ValueError: the first that is not); one whose code or files differ here (another
    Python, another conversion of the model) is named and used as it ran."""
    for name, p in c.configs.items():
        for stage in c.stages_read(name):
            here = StageDir(p, stage, out)
            reason = here.staleness(dependencies=False)
            if reason:
                raise ValueError(f"{c.label}: {name} {stage}: {reason}; --statistics-only reads finished runs as "
                                 f"they are: run the campaign's stages first")
            reason = here.changed_dependency()  # the rest was checked above
            if reason:
                print(f"[campaign] {c.label}: {name} {stage}: used as it ran (here: {reason})", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaylib.campaign", description=__doc__.splitlines()[0])
    ap.add_argument("campaign", help="a campaign file, e.g. params/campaign-paper.yaml")
    ap.add_argument("--executor", choices=params_mod.CHOICES["executor"], default=None)
    ap.add_argument("--ray-workers", type=int, default=None, help="engines (Ray actors) per stage")
    ap.add_argument("--ray-address", default=None, help="empty: a local Ray instance; auto or HOST:PORT: join")
    ap.add_argument("--gpus-per-worker", type=float, default=None)
    ap.add_argument("--out", default=None, help="root for runs/, figures/, tables/ (default: the repository)")
    ap.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    ap.add_argument("--force", action="store_true", help="rerun every stage and the campaign statistics")
    ap.add_argument("--list-params", action="store_true", help="print the campaign's params files, run nothing")
    ap.add_argument("--stages-only", action="store_true",
                    help="run the configurations' stages, not the campaign statistics (which can run later, "
                         "elsewhere, from the same runs/: e.g. stages on a GPU machine, statistics on a laptop)")
    ap.add_argument("--statistics-only", action="store_true",
                    help="the campaign statistics from the configurations' finished runs as they are, running no "
                         "stage (runs made elsewhere, e.g. on a GPU machine: a stage whose code or files differ "
                         "here is named and used as it ran)")
    args = ap.parse_intermixed_args(argv)
    if args.stages_only and args.statistics_only:
        ap.error("--stages-only and --statistics-only: give one of them")
    out = out_root(args.out)  # absolute, once: the runners and the statistics notebook run in the repository
    overrides = {"executor": args.executor, "ray_workers": args.ray_workers, "ray_address": args.ray_address,
                 "gpus_per_worker": args.gpus_per_worker}
    from . import run as runner
    try:
        c = load(args.campaign, overrides)
        if args.list_params:
            print("\n".join(str(p) for p in c.sources.values()))
            return 0
        if args.statistics_only:
            runs_as_they_are(c, out)
        todo = {}
        for name, p in ({} if args.statistics_only else c.configs).items():
            steps = runner.stages_to_run(p, [], args.force, out, c.stages_needed(name))
            if steps:
                todo[name] = steps
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[campaign] {c.label}: {len(c.configs)} configurations, executor {c.executor}", flush=True)
    shared = {} if args.force else c.shared_stages()
    for name, steps in todo.items():
        for stage, reason in steps:
            verb = "copy from " + shared[(name, stage)] if (name, stage) in shared else "run"
            print(f"[campaign] {c.label}: {name} {stage}: {'would ' + verb if args.dry_run else 'to ' + verb} "
                  f"({reason})")
    statistics = StageDir(definition=CampaignStage(c, out))
    if args.dry_run:
        reason = "configurations rerun" if todo else (statistics.staleness() or ("forced" if args.force else None))
        print(f"[campaign] {c.label}: statistics: " + (f"would run ({reason})" if reason else "up to date"))
        return 0
    if todo:
        from .runtime.engine_service import run_broker, wants_broker
        # one broker for the whole campaign: its configurations' stages share vLLM engines of the same settings
        with run_broker(any(wants_broker(c.configs[n], c.stages_read(n)) for n in todo), out):
            failed = run_configs(c, list(todo), out, args.force)
        if failed:
            print(f"error: {c.label}: configuration {', '.join(failed)} failed (see its stage notebook under "
                  f"runs/{failed[0]}/); fix it and rerun the campaign: finished stages are kept", file=sys.stderr)
            return 1
    if args.stages_only:
        print(f"[campaign] {c.label}: stages done; statistics left for later (python -m replaylib.campaign "
              f"{args.campaign}" + (f" --out {args.out}" if args.out else "") + ")")
        return 0
    reason = statistics.staleness() or ("forced" if args.force else None)
    if not reason:
        print(f"[campaign] {c.label}: statistics up to date")
        return 0
    print(f"[campaign] {c.label}: statistics ({reason}); log: {statistics.path / 'run.log'}", flush=True)
    try:
        output = runner.execute_dir(statistics, statistics_parameters(c, out), fresh=args.force)
    except Exception as e:  # papermill's error carries the cell's traceback; keep the console to one line
        evalue = str(getattr(e, "evalue", e)).strip().splitlines()
        print(f"error: {c.label} statistics failed: {getattr(e, 'ename', type(e).__name__)}: "
              f"{evalue[-1] if evalue else ''} (see {statistics.path / (statistics.stage + '.ipynb')})",
              file=sys.stderr)
        return 1
    tdir = tables_dir(c.label, out)
    print(f"[campaign] {c.label}: done -> {tdir / 'live_vs_published.md'}, {tdir / 'tab1_main.md'} ({output.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
