"""One vLLM engine per model and settings for the stages of a run or a campaign
(replaylib.runtime.engine_service), on the CPU: the engine servers build the vLLM engine on the stand-in LLM
(tests/vllm_standin.py) through the engine factory's test hook."""
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pandas as pd
import psutil
import pytest
import yaml

from replaylib.core import progress
from replaylib.measure.engines import FACTORY_ENV
from replaylib.runtime import params
from replaylib.runtime.engine_service import (
    EngineBroker,
    EngineServiceError,
    ServedExecutor,
)

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

FAKE = {"model": "tiny:0", "engine": "vllm", "device": "cuda", "vllm_serving": "inprocess", "kv_cache_gib": 1.0,
        "stop_at_answer": False, "task": "gsm8k", "n_problems": 2, "screen_mixed": False, "n_rollouts": 3,
        "max_trunk_tokens": 24, "top_logprobs": 3, "block_size": 4, "boundary_slack": 2, "pivot_window": 0,
        "max_pivots_per_rollout": 2, "min_rollout_tokens": 8, "k": 2, "max_cont_tokens": 10, "probe_tokens": 4,
        "invariant_problems": 1, "invariant_rollouts": 2, "invariant_pivots": 2, "invariant_max_cont_tokens": 8,
        "invariant_max_trunk_tokens": 0, "bootstrap_draws": 20}


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """Engines built on the stand-in LLM, in this process and in the servers (which import it)."""
    monkeypatch.setenv(FACTORY_ENV, "vllm_standin:make_engine")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(REPO)] +
                                                     [p for p in [os.environ.get("PYTHONPATH")] if p]))
    monkeypatch.setenv("REPLAYLIB_ENGINE_REGISTRY", str(tmp_path / "registry"))
    return tmp_path


def fake_params(**changes):
    return params.make({"config": "fake", **FAKE, **changes})


def _engines_json(root: Path) -> dict:
    found = sorted(root.glob("runs/.engines/*/engines.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def _gone(pid: int, within_s: float = 300.0) -> bool:
    """Whether the process has ended; the wait is a guard against a hang, not a speed target."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def _wait_for(predicate, what: str, guard_s: float = 300.0):
    """Wait for an event; the guard only stops a test that would otherwise hang (it is no speed target)."""
    deadline = time.monotonic() + guard_s
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_a_leased_engine_runs_units_with_their_progress_logs_and_errors(standin, caplog):
    import vllm_standin
    caplog.set_level(logging.INFO, logger="replaylib")
    stage_dir = standin / "stage"
    stage_dir.mkdir()
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        ex = ServedExecutor(fake_params(), stage="01_sampling")
        assert ex.lease_info["started_for_this_stage"] is True and ex.lease_info["server_pid"] != os.getpid()
        bar = progress.bar(stage_dir, "units", 3, "unit")
        answer = ex.call(vllm_standin.echo_unit, 7)
        assert answer["pid"] == ex.lease_info["server_pid"] and answer["x"] == 7 and answer["config"] == "fake"
        assert "unit 7 on config fake" in caplog.text  # the server's log line, in the stage
        assert [r for _, r in ex.map(vllm_standin.echo_unit, [("a", (1,)), ("b", (2,))])][1]["x"] == 2
        bar.close()
        assert progress.read(stage_dir)["n"] == 3  # every unit's progress.update(1) reached the stage's bar
        with pytest.raises(ValueError, match="unit 3 failed as asked") as raised:
            ex.call(vllm_standin.echo_unit, 3, True)
        assert any("engine server traceback" in n for n in raised.value.__notes__)
        assert ex.call(vllm_standin.echo_unit, 4)["x"] == 4  # an error in a unit leaves the engine serving
        with pytest.raises(ValueError, match="importable module"):
            ex.call(lambda engine: engine)
        ex.close()
        again = ServedExecutor(fake_params(config="other", max_trunk_tokens=20), stage="03_three_pass_replay")
        assert again.lease_info["server_pid"] == ex.lease_info["server_pid"]  # the same engine, reconfigured
        assert again.lease_info["started_for_this_stage"] is False
        assert again.call(vllm_standin.echo_unit, 0)["trunk_settings"]["max_new_tokens"] == 20
        assert again.call(vllm_standin.echo_unit, 0)["config"] == "other"
        invariant = ServedExecutor(fake_params(), invariant=True, stage="05_batch_invariant")
        inprocess_pid = again.lease_info["server_pid"]
        assert invariant.lease_info["server_pid"] != inprocess_pid  # another identity: another engine
        again.close(), invariant.close()
    assert _gone(inprocess_pid) and _gone(invariant.lease_info["server_pid"])
    record = _engines_json(standin / "out")
    assert [len(s["leases"]) for s in record["servers"]] == [2, 1]
    assert [s["identity"]["batch_invariant"] for s in record["servers"]] == [False, True]
    assert all(s["exit_code"] == 0 and s["stop_s"] >= 0 for s in record["servers"])


def test_a_stage_refuses_an_engine_of_another_mode_or_model(standin, monkeypatch):
    import vllm_standin
    engine = vllm_standin.make_engine(fake_params())
    for change in ({"vllm_serving": "multiprocess"}, {"model": "embedded:qwen2.5-coder-0.5b-instruct"},
                   {"kv_cache_gib": 2.0}):
        with pytest.raises(ValueError, match="built with other settings"):
            engine.configure(fake_params(**change))
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        real_lease = ServedExecutor._lease

        def wrong_lease(self, p, invariant, stage):
            info = real_lease(self, p, invariant, stage)
            return {**info, "identity": {**info["identity"], "serving": "multiprocess"}}
        monkeypatch.setattr(ServedExecutor, "_lease", wrong_lease)
        with pytest.raises(EngineServiceError, match="another identity.*serving"):
            ServedExecutor(fake_params(), stage="03_three_pass_replay")


def test_an_engine_that_cannot_start_is_the_stage_s_one_line_error(standin, monkeypatch):
    monkeypatch.delenv(FACTORY_ENV)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        from replaylib.measure.engine import EngineUnavailable
        with pytest.raises(EngineUnavailable, match="engine 'vllm' needs"):
            ServedExecutor(fake_params(), stage="01_sampling")


def test_idle_engines_make_room_for_an_engine_that_would_not_fit(standin, monkeypatch):
    """An idle engine holds GPU memory that a new engine of another identity would wait for in vain: the broker
    stops idle engines, least recently used first, until the new one's need fits the free memory; where it fits,
    none is stopped."""
    from replaylib.measure import gpu_memory
    from replaylib.measure import vllm_setup
    gib = gpu_memory.GIB
    free = {"now": 1 * gib}
    monkeypatch.setattr(gpu_memory, "free_bytes_now", lambda: free["now"])
    monkeypatch.setattr(vllm_setup, "engine_need", lambda p: int(p.kv_cache_gib * gib) + gib, raising=False)
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        first = ServedExecutor(fake_params(kv_cache_gib=1.0), stage="01")
        first.close()
        second = ServedExecutor(fake_params(kv_cache_gib=1.5), stage="01")
        second.close()
        a, b = first.lease_info["server_pid"], second.lease_info["server_pid"]
        assert _gone(a) and psutil.pid_exists(b)  # 1 GiB free, 2.5 needed: the idle one (2 GiB) made room
        free["now"] = 10 * gib
        third = ServedExecutor(fake_params(kv_cache_gib=2.0), stage="01")
        assert psutil.pid_exists(b)  # it fits beside: nothing stopped
        third.close()
        c = third.lease_info["server_pid"]
        free["now"] = 0
        fourth = ServedExecutor(fake_params(kv_cache_gib=0.5), stage="01")  # 1.5 GiB: b (2.5) is enough
        assert _gone(b) and psutil.pid_exists(c)
        fourth.close()
    stopped = [s.get("stopped_for_room", False) for s in _engines_json(standin / "out")["servers"]]
    assert stopped == [True, True, False, False]


def _lease_in_thread(results: dict, name: str, p, **kwargs):
    import threading

    def lease():
        try:
            results[name] = ServedExecutor(p, stage="01", **kwargs)
        except Exception as e:  # noqa: BLE001 - the test reads it
            results[name] = e
    thread = threading.Thread(target=lease)
    thread.start()
    return thread


def test_two_engine_starts_never_count_on_the_same_free_memory(standin, monkeypatch):
    """vLLM checks the free memory as it starts: two engines that fit the free memory one at a time but not
    together start one after the other (on an H100, four such starts side by side failed at vLLM's check)."""
    from replaylib.measure import gpu_memory, vllm_setup
    monkeypatch.setattr(gpu_memory, "free_bytes_now", lambda: 3 * gpu_memory.GIB)
    monkeypatch.setattr(vllm_setup, "engine_need", lambda p: 2 * gpu_memory.GIB, raising=False)
    results = {}
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        threads = [_lease_in_thread(results, "plain", fake_params()),
                   _lease_in_thread(results, "invariant", fake_params(), invariant=True)]  # another compilation
        for t in threads:
            t.join()
        assert all(isinstance(r, ServedExecutor) for r in results.values()), results
        for r in results.values():
            r.close()
    first, second = _engines_json(standin / "out")["servers"]
    assert first["ready"] <= second["start_began"]


def test_a_start_that_does_not_fit_waits_for_a_busy_engine_then_stops_it_for_room(standin, monkeypatch, caplog):
    """A busy engine holds the memory a new engine needs: the new one waits in the broker until it is released,
    then stops it for room, instead of starting to wait in vain for memory an idle engine keeps; the wait is
    bounded by vllm_memory_wait_s."""
    from replaylib.measure import gpu_memory, vllm_setup
    caplog.set_level(logging.INFO, logger="replaylib")
    monkeypatch.setattr(gpu_memory, "free_bytes_now", lambda: 1 * gpu_memory.GIB)
    monkeypatch.setattr(vllm_setup, "engine_need", lambda p: 2 * gpu_memory.GIB, raising=False)
    results = {}
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        busy = ServedExecutor(fake_params(), stage="03")
        waiting = _lease_in_thread(results, "new", fake_params(), invariant=True)
        _wait_for(lambda: "waits for engines starting or busy" in caplog.text or not waiting.is_alive(),
                  "the new engine waits or starts")
        assert waiting.is_alive() and len(broker.servers) == 1  # waiting, not started beside the busy one
        busy.close()
        waiting.join()
        assert _gone(busy.lease_info["server_pid"])
        bounded = ServedExecutor(fake_params(vllm_memory_wait_s=0.5, kv_cache_gib=2.0), stage="01")
        assert len(broker.servers) == 3  # past its bound it starts beside the busy one (its server then says)
        assert psutil.pid_exists(results["new"].lease_info["server_pid"])
        results["new"].close(), bounded.close()
    first, second, _ = _engines_json(standin / "out")["servers"]
    assert first["stopped_for_room"] and second["start_began"] >= first["leases"][-1]["released"]


def test_an_engine_whose_start_finds_its_memory_taken_starts_again_within_its_bound(standin, monkeypatch):
    """Another process (a test, a second campaign) can take the memory between a start's wait for it and vLLM's
    own check of it: that start fails at the check and the broker starts the engine again; past
    vllm_memory_wait_s the stage gets vLLM's error."""
    import vllm_standin
    monkeypatch.setenv(vllm_standin.RACED_STARTS_ENV, f"{standin / 'raced'}:1")
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        ex = ServedExecutor(fake_params(), stage="01")
        assert ex.call(vllm_standin.echo_unit, 1)["x"] == 1
        ex.close()
    assert ["ready" in s for s in _engines_json(standin / "out")["servers"]] == [False, True]
    monkeypatch.setenv(vllm_standin.RACED_STARTS_ENV, f"{standin / 'always'}:1000")
    with EngineBroker(standin / "bounded") as broker, mock.patch.dict(os.environ, broker.env()):
        with pytest.raises(EngineServiceError, match="on startup is less than desired GPU memory utilization"):
            ServedExecutor(fake_params(vllm_memory_wait_s=3.0), stage="01")
    assert int((standin / "always").read_text()) >= 1


def _client_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "client.py"
    script.write_text("import os, sys, time\nsys.path[:0] = [%r, %r]\n" % (str(TESTS), str(REPO)) +
                      "from replaylib.runtime import params\nfrom replaylib.runtime.engine_service import EngineBroker, ServedExecutor\n"
                      "import vllm_standin\n"
                      f"p = params.make({{'config': 'fake', **{FAKE!r}}})\n" + body)
    return script


def test_a_stage_killed_mid_unit_leaves_its_engine_to_the_next_stage(standin):
    ready, release = standin / "ready", standin / "release"
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        script = _client_script(standin, f"ex = ServedExecutor(p, stage='03')\nprint(ex.lease_info['server_pid'], "
                                         f"flush=True)\nex.call(vllm_standin.held_unit, {str(ready)!r}, "
                                         f"{str(release)!r})\n")
        stage = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        server = int(stage.stdout.readline())
        _wait_for(ready.exists, "the unit has begun")
        stage.kill()  # as the OOM killer would, in the middle of the unit (it runs until released)
        stage.wait()
        release.write_text("go")  # the server's unit ends; its result has no one to go to
        nxt = ServedExecutor(fake_params(), stage="03")  # waits for the unit to end, then gets the same engine
        assert nxt.lease_info["server_pid"] == server and nxt.lease_info["started_for_this_stage"] is False
        assert nxt.call(__import__("vllm_standin").echo_unit, 1)["x"] == 1
        nxt.close()
    assert _gone(server)


def test_an_engine_server_stops_itself_when_its_run_is_killed(standin):
    script = _client_script(standin, f"b = EngineBroker({str(standin / 'out')!r})\n"
                                     "os.environ.update(b.env())\nex = ServedExecutor(p, stage='01')\n"
                                     "print(ex.lease_info['server_pid'], flush=True)\ntime.sleep(120)\n")
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server = int(run.stdout.readline())
    assert psutil.pid_exists(server)
    run.send_signal(signal.SIGKILL)  # the runner or campaign killed outright: nothing stops its engines...
    run.wait()
    assert _gone(server)  # ...but the server watches the process that started it


# --------------------------------------------------------------------------- through the runner and campaigns

def _write_params(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def _run(args: list, env_root: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=os.environ.copy(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_a_run_s_stages_share_one_engine_and_compute_what_engines_of_their_own_compute(standin):
    shared = _write_params(standin / "fake-shared.yaml", {"config": "fake", **FAKE})
    own = _write_params(standin / "fake-own.yaml", {"config": "fake", **FAKE, "shared_engine": False})
    for path, out in ((shared, "A"), (own, "B")):
        _run(["replaylib.run", str(path), "--upto", "03", "--out", str(standin / out)], standin)
    record = _engines_json(standin / "A")
    assert len(record["servers"]) == 1  # stages 01 and 03 on one engine, started once
    assert [lease["stage"] for lease in record["servers"][0]["leases"]] == ["fake 01_sampling",
                                                                            "fake 03_three_pass_replay"]
    assert not (standin / "B" / "runs" / ".engines").exists()
    for stage, started in (("01_sampling", True), ("03_three_pass_replay", False)):
        manifest = json.loads((standin / "A" / "runs" / "fake" / stage / "manifest.json").read_text())
        assert manifest["engine_lease"]["started_for_this_stage"] is started
        # what ran in the engine's own process (the unit, and what built the engine) is in the stage's record
        used = set(manifest["dependencies"]["code"])
        assert {"replaylib.measure.engine_vllm:VLLMEngine.__init__", "replaylib.measure.engines:make_engine"} <= used
        assert not any(d.startswith("replaylib.measure.engine_hf:") for d in used)
    replayed = json.loads((standin / "A" / "runs" / "fake" / "03_three_pass_replay" / "manifest.json").read_text())
    assert "replaylib.measure.engine_vllm:VLLMEngine.run_pass" in replayed["dependencies"]["code"]
    for stage, name in (("01_sampling", "trunks.parquet"), ("02_pivot_mining", "pivots.parquet"),
                        ("03_three_pass_replay", "records.parquet")):
        a, b = (standin / out / "runs" / "fake" / stage / name for out in "AB")
        assert a.read_bytes() == b.read_bytes(), name
    records = pd.read_parquet(standin / "A" / "runs" / "fake" / "03_three_pass_replay" / "records.parquet")
    assert len(records) > 0 and records.exact_ok.all()
    assert (records.state_established == "regenerated, identical").all()


def test_a_campaign_shares_engines_across_configurations_each_with_its_own_trunks(standin):
    """Two configurations with the same engine settings and different trunk lengths, side by side, and the
    first one's batch-invariant stage as a job of its own: every pivot of the second must resume the trunks
    it sampled itself (its replay re-establishes them with its own trunk settings, on an engine another
    configuration may have configured last)."""
    a = _write_params(standin / "fake-a.yaml", {"config": "fake-a", **FAKE})
    b = _write_params(standin / "fake-b.yaml", {"config": "fake-b", **FAKE, "max_trunk_tokens": 20,
                                                "problem_start": 2})
    spec = {"name": "fake", "rows": [{"label": "main pooled", "params": [str(a), str(b)], "published": "main pooled"}],
            "invariant": {"label": "batch-invariant", "params": str(a), "published": "batch-invariant"},
            "figure1": "main pooled", "figure3": [str(a)], "bootstrap_draws": 20, "concurrent_configs": 3}
    path = standin / "campaign-fake.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = standin / "out"
    _run(["replaylib.campaign", str(path), "--out", str(out), "--stages-only"], standin)
    for config in ("fake-a", "fake-b"):
        records = pd.read_parquet(out / "runs" / config / "03_three_pass_replay" / "records.parquet")
        assert len(records) > 0 and records.exact_ok.all(), config
        assert (records.state_established == "regenerated, identical").all(), config
    trunks = pd.read_parquet(out / "runs" / "fake-b" / "01_sampling" / "trunks.parquet")
    assert trunks.n_tokens.max() <= 20
    assert (out / "runs" / "campaign-fake" / "logs" / "fake-a-05_batch_invariant.log").exists()
    assert json.loads((out / "runs" / "fake-a" / "05_batch_invariant" / "invariant.json").read_text())["all_identical"]
    record = _engines_json(out)
    stock = [s for s in record["servers"] if not s["identity"]["batch_invariant"]]
    invariant = [s for s in record["servers"] if s["identity"]["batch_invariant"]]
    leases = sorted(lease["stage"] for s in stock for lease in s["leases"])
    assert leases == ["fake-a 01_sampling", "fake-a 03_three_pass_replay", "fake-b 01_sampling",
                      "fake-b 03_three_pass_replay"]
    assert len(stock) <= 2 < len(leases)  # shared across stages and configurations
    assert [lease["stage"] for s in invariant for lease in s["leases"]] == ["fake-a 05_batch_invariant"]


# --------------------------------------------------------------------------- the broker's socket

def test_a_connection_that_never_sends_its_key_delays_no_lease(standin, monkeypatch):
    """One connection holds the broker's attention without ever answering its challenge; a stage connecting
    after it still gets its engine, while the silent one is still open (and unanswered)."""
    import socket
    import threading

    import vllm_standin

    from replaylib.runtime import engine_service
    monkeypatch.setattr(engine_service, "AUTH_TIMEOUT_S", 3600.0)  # the silent one outlives this test
    with EngineBroker(standin / "out") as broker, mock.patch.dict(os.environ, broker.env()):
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(broker.address)
        silent.settimeout(300)  # a guard against a hang, not a speed target
        assert silent.recv(1)  # the broker took it up: it sent its challenge, which goes unanswered
        leased = {}

        def lease():
            ex = ServedExecutor(fake_params(), stage="01_sampling")
            leased["x"] = ex.call(vllm_standin.echo_unit, 5)["x"]
            ex.close()
        stage = threading.Thread(target=lease, daemon=True)
        stage.start()
        _wait_for(lambda: not stage.is_alive(), "the second client's lease")
        assert leased == {"x": 5}
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):  # still open and waiting: the lease did not wait for it to close
            while silent.recv(4096):
                pass
        silent.close()


def test_a_connection_that_never_sends_its_key_is_hung_up(standin, monkeypatch):
    import socket

    from replaylib.runtime import engine_service
    monkeypatch.setattr(engine_service, "AUTH_TIMEOUT_S", 0.5)
    with EngineBroker(standin / "out") as broker:
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(broker.address)
        silent.settimeout(300)  # a guard against a hang, not a speed target
        while silent.recv(4096):  # the challenge, then the end of the connection
            pass
        silent.close()


def test_a_broker_killed_outright_leaves_nothing_a_later_one_keeps(standin, monkeypatch):
    """SIGKILL leaves the broker's private directory and its socket behind; the next broker removes it."""
    import shutil
    import tempfile
    temp = Path(tempfile.mkdtemp(prefix="rl-", dir="/tmp"))  # short: a Unix socket's path has at most 107 bytes
    try:
        code = ("import sys, time; from replaylib.runtime.engine_service import EngineBroker; "
                "b = EngineBroker(sys.argv[1]); print(b.private, flush=True); time.sleep(600)")
        killed = subprocess.Popen([sys.executable, "-c", code, str(standin / "out")], cwd=REPO, text=True,
                                  stdout=subprocess.PIPE, env={**os.environ, "TMPDIR": str(temp)})
        private = Path(killed.stdout.readline().strip())
        assert private.parent == temp and (private / "broker.sock").exists()
        killed.kill()
        killed.wait()
        assert (private / "broker.sock").exists()  # what a runner killed outright leaves
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        with EngineBroker(standin / "out") as later:
            assert later.private.parent == temp and not private.exists()
        assert list(temp.iterdir()) == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)
