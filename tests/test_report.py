"""The report command line, end to end on published records."""

import json
import subprocess
import sys
from pathlib import Path

from replaylib import report

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "data" / "paper-records"
KEYS = {
    "n_records": None, "n_problems": None,
    "common": {"n", "refeed", "floor"},
    "exact1_conditioned": {"n", "refeed", "floor"},
    "excess_pp": None, "excess_pp_exact1": None,
    "eligibility": {"exact1_nonzero", "only_refeed", "only_replica"},
    "bias": {"mean", "t", "ci95", "n"},
    "mcnemar": {"b", "c", "z"},
    "clustered": {"n_problems", "mean_excess", "t", "refeed_worse", "floor_worse", "equal"},
    "jaccard": {"0.5", "0.75"},
    "margin": {"split", "lt", "ge"},
    "probes": {"n", "refeed", "replica"},
    "contrast": {"probe", "continuations"},
    "cache": {"n", "exact1_ok_rate", "exact2_ok_rate"},
}
RATE_KEYS = {"flips", "rate", "zero_crossings", "polarity", "polarity_rate"}


def test_cli_two_published_files(tmp_path, capsys):
    out = tmp_path / "out" / "main.json"
    files = [str(PAPER / "2026-06-11" / "primary.json"), str(PAPER / "2026-06-11" / "screened.json")]
    assert report.main(["--records", *files, "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert list(s) == list(KEYS)
    for key, sub in KEYS.items():
        if sub is not None:
            assert set(s[key]) == sub, key
    for part in ("common", "exact1_conditioned"):
        assert set(s[part]["refeed"]) == set(s[part]["floor"]) == RATE_KEYS
    assert set(s["jaccard"]["0.5"]) == {"n_exact1", "refeed", "replica"}
    assert set(s["margin"]["lt"]) == {"n", "refeed_rate", "floor_rate"}
    assert set(s["probes"]["refeed"]) == {"divergence_rate", "bit_exact_rate", "median_nonzero", "p90"}
    assert s["common"]["n"] == 636 and s["common"]["refeed"]["flips"] == 215
    assert out.read_text().startswith('{\n  "n_records": 1567')
    printed = capsys.readouterr().out
    assert "215/636" in printed and "5.51" in printed
    assert [p.name for p in out.parent.iterdir()] == ["main.json"]  # no temp files left


def test_cli_first_campaign_nulls(tmp_path):
    out = tmp_path / "grpo.json"
    assert report.main(["--records", str(PAPER / "2026-06-10" / "grpo.json"), "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["cache"] is None and s["probes"]["n"] == 779


def test_cli_error_one_line_no_output(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"pivots": [{"problem_id": 1}]}))
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "replaylib.report", "--records", str(PAPER / "2026-06-11" / "k16.json"),
         str(bad), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0] and "pivot 0" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_cli_usage_error(capsys):
    assert _exit_code(lambda: report.main([])) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _exit_code(fn):
    try:
        return fn()
    except SystemExit as e:
        return e.code


def _report(*args):
    return subprocess.run([sys.executable, "-m", "replaylib.report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


def test_cli_refuses_files_of_different_protocols(tmp_path):
    out = tmp_path / "out.json"
    screened, k8 = PAPER / "2026-06-11" / "screened.json", PAPER / "2026-06-11" / "k8.json"
    proc = _report("--records", screened, k8, "--json", out)
    assert proc.returncode == 2 and not out.exists()
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "screened.json" in err[0] and "k8.json" in err[0] and "(k 4 vs 8)" in err[0]


def _published(path, config, keys):
    pivots = [{"problem_id": p, "rollout": r, "abs_pos": a, "margin": 0.5, "A_exact1": 0.5, "A_exact2": 0.5,
               "A_refeed": -0.5} for p, r, a in keys]
    path.write_text(json.dumps({"config": config, "pivots": pivots}))
    return path


def test_cli_says_how_many_overlapping_records_it_dropped_from_which_file(tmp_path):
    config = {"model": "m", "k": 4, "temperature": 0.7, "cont_temp": None}
    a = _published(tmp_path / "a.json", config, [(0, 0, 10), (0, 1, 10), (1, 0, 10)])
    b = _published(tmp_path / "b.json", config, [(0, 0, 10), (1, 0, 10), (2, 0, 10), (2, 1, 10)])
    out = tmp_path / "out.json"
    proc = _report("--records", a, b, "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"report: {b}: 2 of its 4 records dropped (an earlier file holds the same problem_id, rollout, abs_pos; "
        f"the first is kept)"]
    assert json.loads(out.read_text())["n_records"] == 5


def test_cli_refuses_a_file_that_repeats_a_key(tmp_path):
    config = {"model": "m", "k": 4}
    bad = _published(tmp_path / "bad.json", config, [(0, 0, 10), (0, 1, 10), (0, 1, 10)])
    out = tmp_path / "out.json"
    proc = _report("--records", bad, "--json", out)
    assert proc.returncode == 2 and not out.exists()
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "problem_id=0, rollout=1, abs_pos=10" in err[0]


def test_cli_main_row_pools_quietly():
    proc = _report("--records", PAPER / "2026-06-11" / "primary.json", PAPER / "2026-06-11" / "screened.json")
    assert proc.returncode == 0 and proc.stderr == "" and "215/636" in proc.stdout
