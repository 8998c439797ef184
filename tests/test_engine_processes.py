"""A multi-process vLLM engine's core process: found, registered, stopped with its engine, and stopped
by the next engine start (or the runner) when its stage process died; engine starts and shutdowns on
one GPU take turns. Real processes stand in for vLLM's engine core (no GPU, no vLLM)."""
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

import psutil
import pytest

from replaylib.measure import engine_vllm
from replaylib.runtime.vllm_processes import (
    EngineProcesses,
    engine_processes,
    gpu_lifecycle_lock,
    reap_leftover_engines,
    register_engine_processes,
    registry_dir,
)

TITLE = "VLLM::EngineCore"  # what vLLM's setproctitle makes of its engine core's command line


@pytest.fixture(autouse=True)
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYLIB_ENGINE_REGISTRY", str(tmp_path / "engines"))
    return tmp_path / "engines"


SLEEP = "import time; print('up', flush=True); time.sleep(120)"  # says when it runs: its command line is its own


def _sleeper(*extra) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEP, *extra], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def _orphan_maker(tmp_path):
    """A stand-in stage process that starts an engine core, registers it as an engine start would, and
    then waits to be killed; returns (stage process, engine core pid)."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "from replaylib.runtime import vllm_processes\n"
        f"core = subprocess.Popen([sys.executable, '-c', {SLEEP!r}, {TITLE!r}], stdout=subprocess.PIPE, text=True)\n"
        "core.stdout.readline()\n"
        "procs = vllm_processes.engine_processes()\n"
        "vllm_processes.register_engine_processes(procs, 'killed-config')\n"
        "print(core.pid, flush=True)\n"
        "time.sleep(120)\n")
    stage = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return stage, int(stage.stdout.readline())


def test_engine_processes_are_the_descendants_vllm_named():
    named, plain = _sleeper(TITLE), _sleeper()
    try:
        assert {p.pid for p in engine_processes()} == {named.pid}
        assert engine_processes(exclude={named.pid}) == []
    finally:
        named.kill(), plain.kill()


def test_a_killed_stage_s_engine_core_is_stopped_by_the_next_engine_start(tmp_path, caplog):
    stage, core = _orphan_maker(tmp_path)
    assert [json.loads(p.read_text())["pid"] for p in registry_dir().glob("engine-*.json")] == [core]
    assert reap_leftover_engines() == []  # its stage still runs: not ours to stop
    assert psutil.pid_exists(core)
    stage.send_signal(signal.SIGKILL)  # as the OOM killer or a lost lease would
    stage.wait()
    assert psutil.Process(core).is_running()  # nothing stops an orphaned engine core by itself
    stopped = reap_leftover_engines()
    assert [(s["pid"], s["config"], s["stopped"]) for s in stopped] == [(core, "killed-config", True)]
    assert not psutil.pid_exists(core) or psutil.Process(core).status() == psutil.STATUS_ZOMBIE
    assert not list(registry_dir().glob("engine-*.json"))
    assert "stopped a leftover vLLM engine core" in caplog.text and "killed-config" in caplog.text


def test_the_runner_stops_what_a_dead_stage_left_behind(tmp_path):
    from replaylib.run import stop_leftover_engines
    stage, core = _orphan_maker(tmp_path)
    stage.kill()
    stage.wait()
    stop_leftover_engines()
    assert not psutil.pid_exists(core) or psutil.Process(core).status() == psutil.STATUS_ZOMBIE


def test_a_registry_entry_of_a_process_that_is_gone_or_reused_is_dropped():
    gone = _sleeper()
    gone.kill(), gone.wait()
    me = psutil.Process()
    (registry_dir() / "engine-1.json").write_text(json.dumps(
        {"pid": gone.pid, "create_time": 1.0, "parent_pid": 1, "parent_create_time": 0.0, "config": "c"}))
    # a pid whose process is another one now (its start time differs): never signalled
    (registry_dir() / "engine-2.json").write_text(json.dumps(
        {"pid": me.pid, "create_time": me.create_time() - 100, "parent_pid": 1, "parent_create_time": 0.0,
         "config": "c"}))
    (registry_dir() / "engine-3.json").write_text("{not json")
    assert reap_leftover_engines() == []
    assert not list(registry_dir().glob("engine-*.json"))


class _Core:
    """vLLM's engine_core handle: shutdown() ends (or, stuck, fails to end) the stand-in process."""

    def __init__(self, proc, stuck=False):
        self.proc, self.stuck = proc, stuck

    def shutdown(self):
        if not self.stuck:
            self.proc.terminate()


def _engine_with_core(stuck=False):
    from test_engine_vllm import FakeLLM, FakeSP
    proc = _sleeper(TITLE)
    fake = FakeLLM()
    fake.llm_engine.engine_core = _Core(proc, stuck)
    engine = engine_vllm.VLLMEngine(fake, FakeSP, config="closing", serving="multiprocess",
                                    lifecycle=EngineProcesses())
    engine.processes = engine_processes()
    engine.registered = register_engine_processes(engine.processes, "closing")
    return engine, proc


def test_closing_an_engine_waits_for_its_engine_core_and_unregisters_it(caplog):
    caplog.set_level(logging.INFO, logger="replaylib")
    engine, proc = _engine_with_core()
    assert engine.close() == [proc.pid]
    assert proc.poll() is not None and not list(registry_dir().glob("engine-*.json"))
    assert engine.close() == []  # closing twice is harmless
    assert "engine-core processes" in caplog.text


def test_an_engine_core_that_outlives_its_shutdown_is_killed_and_named(caplog):
    engine, proc = _engine_with_core(stuck=True)
    assert engine.close(timeout_s=0.5) == [proc.pid]
    proc.wait(timeout=10)  # (psutil reaped it already: the exit status is gone)
    assert not psutil.pid_exists(proc.pid)
    assert "still ran" in caplog.text and str(proc.pid) in caplog.text


def test_the_local_executor_closes_its_engine():
    from replaylib.runtime.executor import LocalExecutor
    closed = []
    ex = LocalExecutor.__new__(LocalExecutor)
    ex.engine = SimpleNamespace(close=lambda: closed.append(True))
    ex.close()
    ex.close()
    assert closed == [True] and ex.engine is None


def test_engine_starts_and_shutdowns_on_one_gpu_take_turns(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="replaylib")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    held, second_waits, order = threading.Event(), threading.Event(), []

    class Waiting(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("config second: waiting"):
                second_waits.set()

    def first():
        with gpu_lifecycle_lock("first"):
            held.set()
            # holds the GPU until the second start is seen waiting for it (the guard only ends a hang)
            order.append("first done" if second_waits.wait(300) else "the second never waited")

    handler = Waiting()
    logging.getLogger("replaylib").addHandler(handler)
    try:
        t = threading.Thread(target=first)
        t.start()
        held.wait()
        with gpu_lifecycle_lock("second"):
            order.append("second in")
        t.join()
    finally:
        logging.getLogger("replaylib").removeHandler(handler)
    assert order == ["first done", "second in"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # another GPU: no waiting on the first one's lock
    with gpu_lifecycle_lock("first"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        with gpu_lifecycle_lock("other"):
            pass
    assert "config other: waiting" not in caplog.text


def test_a_registry_directory_that_is_a_link_or_open_to_others_is_refused(tmp_path, monkeypatch):
    """Its entries decide which processes are killed: another local user must not be able to plant one."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv("REPLAYLIB_ENGINE_REGISTRY", str(shared))
    with pytest.raises(RuntimeError, match="this user's alone"):
        registry_dir()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(private)
    monkeypatch.setenv("REPLAYLIB_ENGINE_REGISTRY", str(link))
    with pytest.raises(RuntimeError, match="not a link"):
        registry_dir()
    monkeypatch.setenv("REPLAYLIB_ENGINE_REGISTRY", str(tmp_path / "new"))
    assert registry_dir().stat().st_mode & 0o777 == 0o700  # made private


def test_a_registered_process_that_is_no_engine_core_is_never_signalled():
    """An entry naming a live process without vLLM's engine-core title (a planted or stale entry whose pid
    another program now holds with the same start time cannot be told apart otherwise) is dropped, and
    the process lives on."""
    gone = _sleeper()
    gone.kill(), gone.wait()
    victim = _sleeper()
    try:
        proc = psutil.Process(victim.pid)
        (registry_dir() / "engine-9.json").write_text(json.dumps(
            {"pid": victim.pid, "create_time": proc.create_time(), "parent_pid": gone.pid,
             "parent_create_time": 1.0, "config": "planted"}))
        assert reap_leftover_engines() == []
        assert victim.poll() is None
        assert not list(registry_dir().glob("engine-*.json"))
    finally:
        victim.kill()


@pytest.mark.parametrize("engine, reaps", [("hf", False), ("vllm", True)])
def test_the_runner_looks_for_leftover_engine_cores_after_vllm_stages_only(tmp_path, monkeypatch, engine, reaps):
    import papermill

    from replaylib import run
    from replaylib.runtime import params
    from replaylib.runtime.stagedir import StageDir
    called = []
    monkeypatch.setattr(run, "stop_leftover_engines", lambda: called.append(True))
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: None)
    extra = {"stop_at_answer": False, "device": "cuda"} if engine == "vllm" else {}
    p = params.make({"config": "reap", "engine": engine, **extra})
    stage_dir = tmp_path / "runs" / "reap" / "02_pivot_mining"
    stage_dir.mkdir(parents=True)
    run._execute(StageDir(p, "02_pivot_mining", tmp_path), {}, {}, None)
    assert called == ([True] if reaps else [])
