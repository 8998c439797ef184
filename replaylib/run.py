"""Run stage notebooks headless: python -m replaylib.run PARAMS.yaml [STAGE ...] [--force] [--out DIR] [--html]
[--set KEY=VALUE ...] [--preview]

With no stage named, runs every stage that is missing or stale: its parameters, the code that
ran when it was computed or a file it read (its record, replaylib.core.recording), or an upstream
stage's outputs changed since it finished. A named stage runs the same way, with whatever of
its upstream stages is missing or stale (an up-to-date one is left as it is, as its notebook
would leave it); --force recomputes the named stages (every stage when none is named), reusing no
partial result, and a stage between them reruns only where what it reads changed. A stage
killed midway resumes from its finished shards when nothing they used changed. Each stage is its notebook,
executed by papermill into runs/<config>/<stage>/<stage>.ipynb with only the
parameters that notebook declares. Options and stage names mix in any order. A vLLM
engine is started once for the stages that share its settings and stopped at the end
(replaylib.runtime.engine_service). --set KEY=VALUE changes a value for this run, which then goes to a
run directory of its own (runs/<config>-<key><value>/); stages it has not run that another configuration
finished with the same parameters are copied, not recomputed. --preview has each notebook run its first
unit on its own before the stage, as in Jupyter.

The terminal shows one progress line per stage (drawn from the progress file the stage
writes, replaylib.core.progress); the kernel's and third-party output goes to
runs/<config>/<stage>/run.log. At the end a short summary: what ran and how long, the
run's Table 1 row beside the paper's, and where the tables, figures and report are.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from unittest import mock

from tqdm import tqdm

from .core import progress
from .core.files import atomic_write_json, open_new
from .core.paths import config_dir, figures_dir, notebook_path, out_root, tables_dir
from .core.processes import stop_with_parent
from .runtime.locks import LOCK_TOKEN_ENV, STOPS_WITH_ENV, StageLock
from .runtime.params import Params, load
from .runtime.registry import ALIASES, STAGES
from .runtime.notebook import execute_notebook
from .runtime.registry import RUN_ORDER
from .runtime.stage_copy import copy_stage, find_stage_elsewhere
from .runtime.stagedir import PARAMS_FILE_ENV, StageDir


def declared_parameters(stage: str) -> list[str]:
    import papermill
    return list(papermill.inspect_notebook(str(notebook_path(stage))).keys())


def resolve_stage(name: str) -> str:
    if name in STAGES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    raise ValueError(f"unknown stage '{name}'; stages: {', '.join(STAGES)} (or {', '.join(sorted(ALIASES))})")


def wanted_stages(params: Params, named: list[str], upto: list[str] | None = None) -> list[str]:
    wanted = named or ([s for s in STAGES if s == "04_statistics"] if params.records == "published" else STAGES)
    if upto and not named:
        closure = params.reading(upto)
        wanted = [s for s in wanted if s in closure]
    return wanted


def stages_to_copy(params: Params, named: list[str], force: bool, out_dir, upto: list[str] | None = None
                   ) -> dict[str, Path]:
    """{stage: source}: stages this configuration has not run that another configuration of this user
    finished with the same key (a run of its own for changed values starts from them); none when forced."""
    if force:
        return {}
    found = {}
    for stage in [s for s in RUN_ORDER if s in params.reading(wanted_stages(params, named, upto))]:
        if StageDir(params, stage, out_dir).staleness() != "not run yet":
            continue
        src = find_stage_elsewhere(params, stage, out_dir, exclude=params.config)
        if src is not None:
            found[stage] = src
    return found


def stages_to_run(params: Params, named: list[str], force: bool, out_dir, upto: list[str] | None = None,
                  copied: dict | None = None) -> list[tuple[str, str]]:
    """(stage, reason) in order: named stages and what they need, or every stale stage (with upto:
    every stale stage among those stages and what they need, nothing after them); copied: stages that
    are about to be copied in (up to date once they are)."""
    wanted = wanted_stages(params, named, upto)
    todo: dict[str, str] = {}

    def need(stage: str, explicit: bool):
        for up in params.data_upstream(stage):
            need(up, False)
        reason = None if stage in (copied or {}) else StageDir(params, stage, out_dir).staleness()
        if any(up in todo for up in params.data_upstream(stage)):
            reason = reason or "upstream reruns"
        if explicit and force:
            reason = reason or "forced"
        if reason and stage not in todo:
            todo[stage] = reason

    for stage in wanted:
        need(stage, True)
    return [(s, todo[s]) for s in RUN_ORDER if s in todo]


@contextlib.contextmanager
def quiet(log_path: Path):
    """Send everything written to file descriptors 1 and 2 (the kernel's warnings, third-party
    messages) to log_path; yields a stream on the original stderr for the progress line."""
    sys.stdout.flush(), sys.stderr.flush()
    log = open_new(log_path)
    saved = os.dup(1), os.dup(2)
    term = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
    try:
        yield term
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        log.close(), term.close()


class StageLine:
    """The stage's one terminal line: a tqdm bar drawn from the progress file the stage writes. On a stream
    that is not a terminal (a log file, a pipe) tqdm's redraws (each a carriage return) would make one very
    long line: there it writes plain lines instead, at most one every 30 s, and the last."""

    def __init__(self, stage: str, stage_dir: Path, term):
        import io
        self.stage, self.stage_dir, self.tty, self.term = stage, stage_dir, term.isatty(), term
        # a terminal's width (a pty of unknown size reports 0: the fallback); a log file's lines are not cut
        width = min(shutil.get_terminal_size((120, 24)).columns, 160) if self.tty else None
        # off a terminal the bar only formats the line: what tqdm draws itself goes nowhere
        self.bar = tqdm(desc=stage, file=term if self.tty else io.StringIO(), bar_format="{desc} [{elapsed}]",
                        leave=True, ncols=width)
        self.last_draw = 0.0

    def poll(self, final: bool = False, failed: bool = False) -> None:
        state = progress.read(self.stage_dir)
        if state and state.get("total"):
            n, total = state["n"], state["total"]
            now = time.time() if not state["done"] else state["updated"]
            phase = max(now - state["started"], 1e-9)
            extra = [f"{state['tokens']:,} tok, {state['tokens'] / phase:.1f} tok/s"] if state["tokens"] else []
            if n and n < total and not final:
                extra.insert(0, f"about {tqdm.format_interval(phase * (total - n) / n)} left")
            self.bar.bar_format = ("{desc} {percentage:3.0f}%|{bar:20}| {n}/{total} " + state["unit"] + " [{elapsed}"
                                   + "".join(f", {e}" for e in extra) + "]")
            self.bar.total, self.bar.n = total, min(n, total)
            self.bar.desc = f"{self.stage} {state['desc']}"
        if failed:  # getattr: a bar disabled by TQDM_DISABLE has no desc until one is set
            self.bar.desc = f"{getattr(self.bar, 'desc', '') or self.stage} FAILED"
        if self.tty:
            self.bar.refresh()
        elif final or time.time() - self.last_draw > 30:  # a log file gets a line every 30 s, and the last
            if not self.bar.disable:  # TQDM_DISABLE: no line, as on a terminal
                self.term.write(f"{self.bar}\n")
            self.last_draw = time.time()

    def follow(self, stop: threading.Event) -> None:
        while not stop.wait(0.25):
            self.poll()


def execute(params: Params, stage: str, out_dir, fresh: bool = False, params_file=None, preview: bool = False
            ) -> Path:
    """Run one stage of a configuration: its notebook given the parameters it declares (execute_dir)."""
    return execute_dir(StageDir(params, stage, out_dir), notebook_parameters(params, stage, out_dir, preview), fresh,
                       params_file)


def notebook_parameters(params: Params, stage: str, out_dir, preview: bool = False) -> dict:
    """The values a stage's notebook declares, from these parameters (its own, ``upstream``, ``out_dir``,
    ``preview``: whether it runs its first unit on its own first)."""
    from .runtime.params import own_keys
    declared = declared_parameters(stage)
    missing = [k for k in ["config", "upstream", "preview", *own_keys(stage)] if k not in declared]
    if missing:
        raise ValueError(f"{notebook_path(stage)}: parameters cell lacks {missing}; "
                         f"declare them with their defaults")
    values = {**params.to_dict(), **params.notebook_values(stage), "out_dir": str(out_root(out_dir)),
              "preview": preview}
    return {k: values[k] for k in declared if k in values}


def execute_dir(sd: StageDir, parameters: dict, fresh: bool = False, params_file=None) -> Path:
    """Run a stage directory's notebook with papermill; returns the executed notebook's path.

    The kernel's and papermill's output goes to <stage dir>/run.log; the stage's progress is
    drawn on the terminal (stderr) as one tqdm line. fresh (--force, a named stage): recompute
    everything, reusing no partial result (after checking that its upstream stages can be read:
    a rerun that would be refused deletes nothing)."""
    sd.path.mkdir(parents=True, exist_ok=True)
    # one runner per stage: held from here to the kernel's end, and handed to the kernel by a token
    token = uuid.uuid4().hex
    lock = StageLock(out_root(sd.out_dir), sd.config, sd.stage).acquire(token)
    try:
        if fresh:  # only once its upstream stages are known to be usable
            for name in sd.upstreams():
                sd.check_upstream(name)
            sd.clear()
        return _execute(sd, parameters, {LOCK_TOKEN_ENV: token}, params_file)
    finally:
        lock.release()


def _execute(sd: StageDir, parameters: dict, env: dict, params_file) -> Path:
    output = sd.path / f"{sd.stage}.ipynb"
    (sd.path / progress.FILE).unlink(missing_ok=True)
    start = time.time()
    # the kernel inherits the environment: no bar of ours, nor the hub's or transformers', inside the notebook
    no_bars = {progress.RUNNER_ENV: "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", **env}
    if params_file:
        no_bars[PARAMS_FILE_ENV] = str(params_file)
    with mock.patch.dict(os.environ, no_bars), quiet(sd.path / "run.log") as term:
        line, stop, failed = StageLine(sd.stage, sd.path, term), threading.Event(), True
        follower = threading.Thread(target=line.follow, args=(stop,), daemon=True)
        follower.start()
        try:
            off_the_main_thread(lambda: execute_notebook(notebook_path(sd.stage), output, parameters))
            failed = False
        finally:
            stop.set()
            follower.join()
            line.poll(final=True, failed=failed)
            line.bar.close()
            if sd.uses_vllm():
                stop_leftover_engines()
    atomic_write_json(sd.path / "runner.json", {"seconds": round(time.time() - start, 1),
                                                "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return output


def off_the_main_thread(execute) -> None:
    """Run a notebook's execution in a worker thread while the main thread waits, so that Ctrl-C and
    SIGTERM reach the runner at any moment of a stage: on the main thread, nbclient's own signal handlers,
    installed while it starts the kernel, would swallow a signal arriving then. On either signal the
    stage's kernel and what it started are stopped before the interruption goes on to the stop summary."""
    outcome = {}

    def work():
        try:
            execute()
        except BaseException as e:  # handed to the main thread, which raises it
            outcome["error"] = e

    worker = threading.Thread(target=work, name="notebook", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        stop_child_processes()
        worker.join(30)
        raise
    if "error" in outcome:
        raise outcome["error"]


def stop_child_processes(grace_s: float = 5.0) -> None:
    """Terminate this process's children (the stage's kernel and whatever it started), then kill
    those still there after ``grace_s``."""
    import psutil
    children = psutil.Process().children(recursive=True)
    for proc in children:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def stop_leftover_engines() -> None:
    """A stage's kernel that died (killed, out of memory) leaves a multi-process vLLM engine core
    behind, holding GPU memory: stop it now, before the next stage starts an engine."""
    from .runtime.vllm_processes import reap_leftover_engines, registry_dir
    if registry_dir().is_dir():
        reap_leftover_engines()


def shown(path: Path) -> str:
    """A path as the user can type it: relative to the working directory when inside it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def command(args) -> str:
    """The command that runs this again, each argument quoted as the shell needs it."""
    words = ["python", "-m", "replaylib.run", str(args.params)] + [w for a in args.set for w in ("--set", a)] \
        + [w for u in args.upto or [] for w in ("--upto", u)] + (["--out", str(args.out)] if args.out else [])
    return shlex.join(words)


def assignments(text: str) -> list[str]:
    """KEY=VALUE assignments written in one text (make's SET): each starts where a word is followed by '=', so a
    value may hold spaces ("instruction=two words k=2" is two)."""
    return [a for a in re.split(r"\s+(?=[A-Za-z_][A-Za-z0-9_]*=)", text.strip()) if a]


def with_values(params: Params, assignments: list[str], where: str, out_dir=None) -> Params:
    """These parameters with --set KEY=VALUE applied (VALUE read as YAML: 2, 0.5, true, [a, b]); values that
    change what a stage computes give the run a name of its own (runtime.tweaks: what differs, and a digest
    of the values where that name holds a run of other values), unless config is set."""
    import yaml

    from .runtime.params import make
    from .runtime.tweaks import own_name
    values = {}
    for a in assignments:
        key, sep, text = a.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {a}: write KEY=VALUE, e.g. --set k=2")
        try:
            values[key.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            raise ValueError(f"--set {a}: the value is not a number, true/false, text or [list]; fix it") from None
    changed = make({**params.to_dict(), **values}, where=f"{where} --set")
    computing = {k for stage in STAGES for k in Params.keys_for(stage)}
    differing = {k: getattr(changed, k) for k in values if k in computing and k != "config"
                 and getattr(params, k) != getattr(changed, k)}
    name = changed.config if "config" in values or not differing else None
    if name is None:
        name, taken = own_name(params.config, changed, differing, out_dir)
        if taken:
            print(taken, flush=True)
    return Params(**{**changed.to_dict(), "config": name})


class Terminated(Exception):
    """SIGTERM, turned into an exception so that the stage stops as a Ctrl-C would."""


def _terminated(signum, frame):
    raise Terminated()


def unwritable(runs: Path) -> str | None:
    """Why the run directory cannot be written, or None."""
    try:
        runs.mkdir(parents=True, exist_ok=True)
        probe = runs / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        return (f"{runs}: cannot write the run directory ({e.strerror or e}); choose another --out or set "
                f"REPLAYLIB_OUT")
    return None


def stop_summary(params: Params, stage: str, what: str, reason: str, start: float, ran: list, args, runs: Path) -> str:
    """The lines a stopped run ends with: the stage, why, where to look, what finished, how to resume."""
    lines = [f"=== replaylib: config {params.config}: stage {stage} {what} after {time.time() - start:.0f} s ===",
             f"reason     {reason}"]
    log, nb = runs / stage / "run.log", runs / stage / f"{stage}.ipynb"
    if log.exists() and log.stat().st_mtime >= start - 1:  # written by this attempt
        lines.append(f"log        {shown(log)}")
    if nb.exists() and nb.stat().st_mtime >= start - 1:
        lines.append(f"notebook   {shown(nb)} (the failing cell and its traceback)")
    lines += ["before it  " + (", ".join(f"{s} {t:.0f} s" for s, t in ran) or "nothing ran"),
              f"resume     {command(args)} (finished stages and replayed problems are kept)"]
    return "\n".join(lines)


def closing_summary(params: Params, out_dir, ran: list[tuple[str, float]], site_index: Path | None,
                    rerun: str | None = None) -> str:
    """What ran, the run's headline numbers beside the paper's, and where the outputs are (read from files);
    rerun: the command that runs this configuration (for a run with --set values)."""
    from .display import headline as examples
    root = out_root(out_dir)
    lines = [f"=== replaylib: config {params.config} " + "=" * max(3, 60 - len(params.config))]
    if ran:
        lines.append("ran        " + ", ".join(f"{s} {t:.0f} s" for s, t in ran) +
                     f" (total {tqdm.format_interval(sum(t for _, t in ran))})")
    else:
        lines.append("ran        nothing: every stage was up to date")
    try:
        lines += examples.headline_block(params.config, root)
    except FileNotFoundError as e:
        why = str(e) if rerun is None else f"{str(e).split(';')[0]}; run the statistics stage: {rerun} 04"
        lines.append(f"numbers    not available: {why}")
    lines.append(f"tables     {shown(tables_dir(params.config, root))}/ (tab1_main.md is Table 1)")
    lines.append(f"figures    {shown(figures_dir(params.config, root))}/")
    lines.append(f"stages     {shown(config_dir(params.config, root))}/<stage>/ (executed notebook, run.log, manifest.json)")
    if site_index:
        lines.append(f"report     {shown(site_index)}")
    else:
        lines.append(f"report     python -m replaylib.report --html {shown(config_dir(params.config, root))}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaylib.run", description=__doc__.splitlines()[0])
    ap.add_argument("params", help="a params YAML file, e.g. params/embedded.yaml")
    ap.add_argument("stages", nargs="*", help=f"stages to run ({', '.join(STAGES)}); default: all missing or stale")
    ap.add_argument("--force", action="store_true", help="recompute the named stages (or every stage) even if up "
                                                         "to date, reusing no partial result")
    ap.add_argument("--upto", action="append", metavar="STAGE",
                    help="run the missing or stale stages up to STAGE and what it needs, nothing after (repeatable)")
    ap.add_argument("--out", default=None, help="root for runs/, figures/, tables/ (default: the repository)")
    ap.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    ap.add_argument("--html", action="store_true", help="then build the report site, site/<config>/index.html")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="change a parameter for this run (repeatable): the run goes to runs/<config>-<key><value>/, "
                         "starting from the finished stages it shares with others")
    ap.add_argument("--sets", default="", metavar="'KEY=VALUE ...'",
                    help="several --set in one argument (make stage SET=...): each assignment starts at a word "
                         "followed by '=', so values may hold spaces")
    ap.add_argument("--preview", action="store_true",
                    help="each stage's notebook first runs one unit on its own, to look at (as in Jupyter)")
    args = ap.parse_intermixed_args(argv)
    args.set += assignments(args.sets)
    out = out_root(args.out)  # absolute, once: the stages' kernels run in the repository
    try:
        params = load(args.params)
        if args.set:
            params = with_values(params, args.set, args.params, out)
        named = [resolve_stage(s) for s in args.stages]
        upto = [resolve_stage(s) for s in args.upto or []]
        copies = stages_to_copy(params, named, args.force, out, upto)
        todo = stages_to_run(params, named, args.force, out, upto, copies)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs = config_dir(params.config, out)
    if args.dry_run:
        for stage, src in copies.items():
            print(f"[replaylib] config {params.config}, stage {stage}: would copy {shown(src)} (same parameters)")
        for stage, reason in todo:
            print(f"[replaylib] config {params.config}, stage {stage}: would run ({reason})")
        if not todo:
            print(f"[replaylib] config {params.config}: every stage is up to date")
        return 0
    if todo or copies:
        problem = unwritable(runs)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    for stage, src in copies.items():
        copy_stage(src, runs / stage, params.config, out)
        print(f"[replaylib] config {params.config}, stage {stage}: copied from {shown(src)} (same parameters)",
              flush=True)
    if todo:
        print(f"[replaylib] config {params.config}: running " + ", ".join(f"{s} ({r})" for s, r in todo) +
              f"; each stage's log: {shown(runs)}/<stage>/run.log", flush=True)
    ran = []
    previous = signal.signal(signal.SIGTERM, _terminated)
    campaign = os.environ.get(STOPS_WITH_ENV, "")
    if campaign.isdigit():  # a campaign's runner: it stops its stage when the campaign ends, killed outright too
        stop_with_parent(int(campaign))
    try:
        from .runtime.engine_service import run_broker, wants_broker
        with run_broker(wants_broker(params, [s for s, _ in todo]), out):  # the run's stages share its vLLM engines
            # --force recomputes the named stages (or every one); a stage after them reruns only if their outputs
            # changed (it reads itself when up to date)
            forced = set(named or RUN_ORDER) if args.force else set()
            stopped = _run_stages(params, todo, args, runs, ran, out, forced)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return stopped if stopped is not None else _finish(params, args, ran, out)


def _run_stages(params: Params, todo, args, runs: Path, ran: list, out: Path, forced: set) -> int | None:
    """Each stage in turn; an exit code when one stops the run, else None."""
    for stage, reason in todo:
        start = time.time()
        try:
            execute(params, stage, out, fresh=stage in forced,
                    params_file=shlex.join([str(args.params)] + [w for a in args.set for w in ("--set", a)]),
                    preview=args.preview)
        except (KeyboardInterrupt, Terminated) as e:
            why = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
            print(stop_summary(params, stage, "STOPPED", why, start, ran, args, runs), file=sys.stderr)
            return 130 if isinstance(e, KeyboardInterrupt) else 143
        except Exception as e:  # papermill raises with the cell's traceback; keep the console to a few lines
            ename = getattr(e, "ename", type(e).__name__)
            evalue = str(getattr(e, "evalue", e)).strip().splitlines()
            reason_line = f"{ename}: {evalue[-1] if evalue else ''}"
            print(stop_summary(params, stage, "FAILED", reason_line, start, ran, args, runs), file=sys.stderr)
            return 1
        ran.append((stage, time.time() - start))
    return None


def _finish(params: Params, args, ran: list, out: Path) -> int:
    """The report site (with --html) and the closing summary."""
    index = None
    if args.html:
        from .display import site
        try:
            index = site.build(params.config, out)
        except (ValueError, OSError) as e:
            print(f"error: report site: {e}", file=sys.stderr)
            return 1
    print(closing_summary(params, out, ran, index, command(args) if args.set else None), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
