"""Loading, validating and pooling per-pivot records (docs/protocol.md section 6)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from replaylib.analysis import records

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "data" / "paper-records"


def pivot(**over):
    rec = {"problem_id": 3, "rollout": 1, "abs_pos": 130, "gen_index": 14, "margin": 0.5,
           "rollout_correct": 1, "A_exact1": 0.25, "A_exact2": 0.0, "A_refeed": -0.25}
    rec.update(over)
    return rec


def write_json(path, pivots):
    path.write_text(json.dumps({"config": {"k": 4}, "pivots": pivots}))
    return path


def test_published_file_columns():
    df = records.load_records(PAPER / "2026-06-11" / "primary.json")
    assert list(df.columns) == list(records.COLUMNS) + ["source"]
    assert len(df) == 784 and (df["source"] == "primary").all()
    assert df["A_refeed"].dtype == "float64" and df["problem_id"].dtype == "int64"
    first = df.iloc[0]
    assert first["greedy_first_exact1"]["actual"][0] == 93210
    assert df.attrs["configs"]["primary"]["k"] == 4


def test_first_campaign_keeps_missing_fields():
    df = records.load_records(PAPER / "2026-06-10" / "grpo.json")
    assert df["cache_ok_exact1"].isna().all() and df["cache_ok_exact2"].isna().all()
    assert df["greedy_first_refeed"].isna().all()
    assert df["greedy_divergence_refeed"].notna().all()


def test_paper_rows_and_pooling():
    assert list(records.PAPER_ROWS) == ["main pooled", "K=8", "K=16", "greedy continuations",
                                        "GRPO checkpoint", "Phi-4-mini", "batch-invariant"]
    for label, meta in records.PAPER_ROWS.items():
        assert {"files", "batch_invariant"} <= set(meta)
        assert all((PAPER / f).is_file() for f in meta["files"]), label
    main = records.load_paper_row("main pooled", PAPER)
    assert len(main) == 1567 and set(main["source"]) == {"primary", "screened"}
    assert set(main.attrs["configs"]) == {"primary", "screened"}
    with pytest.raises(ValueError, match="unknown Table 1 row"):
        records.load_paper_row("K=32", PAPER)


def test_pool_dedupes_keeping_first(tmp_path):
    a = records.load_records(write_json(tmp_path / "a.json", [pivot(), pivot(abs_pos=146)]))
    b = records.load_records(write_json(tmp_path / "b.json", [pivot(A_exact1=1.0), pivot(abs_pos=162)]))
    pooled = records.pool([a, b])
    assert len(pooled) == 3
    assert pooled.loc[pooled["abs_pos"] == 130, "source"].item() == "a"
    assert pooled.loc[pooled["abs_pos"] == 130, "A_exact1"].item() == 0.25
    assert pooled.attrs["dropped"] == {str(tmp_path / "b.json"): (1, 2)}  # said, not silent


def test_the_paper_rows_pool_without_dropping_anything():
    main = records.load_paper_row("main pooled", PAPER)
    assert len(main) == 784 + 783 and main.attrs["dropped"] == {}


@pytest.mark.parametrize("a,b,words", [
    ("2026-06-11/screened.json", "2026-06-11/k8.json", "(k 4 vs 8)"),
    ("2026-06-11/primary.json", "2026-06-11/phi.json",
     "(model 'Qwen/Qwen2.5-7B-Instruct' vs 'microsoft/Phi-4-mini-instruct')"),
    ("2026-06-11/primary.json", "2026-06-10/temp0.json", "(k 4 vs 1)"),
    ("2026-06-10/grpo.json", "2026-06-11/screened.json", "(model 'hkust-nlp/Qwen-2.5-7B-SimpleRL-Zoo' vs"),
])
def test_pool_refuses_published_files_of_different_protocols(a, b, words):
    with pytest.raises(ValueError) as e:
        records.pool([records.load_records(PAPER / a), records.load_records(PAPER / b)])
    msg = str(e.value)
    assert "\n" not in msg and str(PAPER / a) in msg and str(PAPER / b) in msg and words in msg


def test_published_null_cont_temp_is_the_trunk_temperature(tmp_path):
    a = write_json(tmp_path / "a.json", [pivot()])
    a.write_text(json.dumps({"config": {"k": 4, "temperature": 0.7, "cont_temp": None}, "pivots": [pivot()]}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"config": {"k": 4, "temperature": 0.7, "cont_temp": 0.7}, "pivots": [pivot(abs_pos=9)]}))
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"config": {"k": 4, "temperature": 0.7, "cont_temp": 0.0}, "pivots": [pivot(abs_pos=9)]}))
    assert len(records.pool([records.load_records(a), records.load_records(b)])) == 2
    with pytest.raises(ValueError, match=r"different protocols \(cont_temp 0.7 vs 0.0\)"):
        records.pool([records.load_records(a), records.load_records(c)])


def _own_run(root, stage, rows, **over):
    """A stage directory of this package's own: records.parquet beside the stage's params.json (K = 2:
    estimates are multiples of 1/2)."""
    rows = [{**r, **{a: 2 * r[a] for a in ("A_exact1", "A_exact2", "A_refeed")}} for r in rows]
    p = {"model": "tiny:0", "engine": "hf", "temperature": 0.7, "k": 2, "cont_temperature": 0.7,
         "max_cont_tokens": 12, "invariant_max_cont_tokens": 8, **over}
    d = root / stage
    (d / "shards").mkdir(parents=True)
    (d / "params.json").write_text(json.dumps({"stage": stage, "key": "x", "params": p, "config": root.name}))
    pd.DataFrame(rows).to_parquet(d / "records.parquet")
    pd.DataFrame(rows).to_parquet(d / "shards" / "problem_00003.parquet")
    return d / "records.parquet"


def test_pool_refuses_own_records_of_different_protocols(tmp_path):
    main = _own_run(tmp_path / "a", "03_three_pass_replay", [pivot(config="a")])
    df = records.load_records(main)
    assert df.attrs["configs"]["records"] == {"model": "tiny:0", "k": 2, "cont_temp": 0.7, "max_cont_tokens": 12,
                                              "temperature": 0.7, "engine": "hf", "batch_invariant": False,
                                              "problems": 1}
    same = _own_run(tmp_path / "b", "03_three_pass_replay", [pivot(abs_pos=9, config="b")])
    assert len(records.pool([df, records.load_records(same)])) == 2
    shard = main.parent / "shards" / "problem_00003.parquet"  # params.json two directories up
    assert records.load_records(shard).attrs["configs"]["problem_00003"]["k"] == 2
    for other, words in [
        (_own_run(tmp_path / "a", "05_batch_invariant", [pivot(config="a (invariant)")], invariant_max_cont_tokens=0),
         "(batch_invariant False vs True)"),  # 0: the invariant stage continues as far as max_cont_tokens
        (_own_run(tmp_path / "e", "05_batch_invariant", [pivot(config="e (invariant)")]), "(max_cont_tokens 12 vs 8)"),
        (_own_run(tmp_path / "c", "03_three_pass_replay", [pivot(config="c")], engine="vllm"), "(engine 'hf' vs 'vllm')"),
        (_own_run(tmp_path / "d", "03_three_pass_replay", [pivot(config="d")], max_cont_tokens=400),
         "(max_cont_tokens 12 vs 400)"),
    ]:
        with pytest.raises(ValueError) as e:
            records.pool([records.load_records(shard), records.load_records(other)])
        assert str(shard) in str(e.value) and str(other) in str(e.value) and words in str(e.value)
    # without a params.json, the config column still tells the batch-invariant stage apart
    loose = tmp_path / "loose"
    loose.mkdir()
    pd.DataFrame([pivot(config="a (invariant)")]).to_parquet(loose / "inv.parquet")
    with pytest.raises(ValueError, match=r"\(batch_invariant False vs True\)"):
        records.pool([df, records.load_records(loose / "inv.parquet")])


def test_a_key_repeated_inside_one_file_is_refused(tmp_path):
    path = write_json(tmp_path / "x.json", [pivot(), pivot(abs_pos=146), pivot(A_exact1=1.0)])
    with pytest.raises(ValueError) as e:
        records.load_records(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "problem_id=3, rollout=1, abs_pos=130" in msg and "record 2" in msg
    frame = pd.DataFrame([pivot(), pivot()]).assign(source="hand")  # a frame built in code, not read
    with pytest.raises(ValueError, match="hand: duplicate record key"):
        records.pool([frame])


def test_missing_required_field(tmp_path):
    bad = pivot()
    del bad["A_refeed"]
    path = write_json(tmp_path / "x.json", [pivot(), bad])
    with pytest.raises(ValueError) as e:
        records.load_records(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(path) in msg and "pivot 1" in msg and "'A_refeed'" in msg and "docs/protocol.md section 6" in msg


@pytest.mark.parametrize("field,value,words", [
    ("A_exact1", "abc", "non-numeric"),
    ("A_exact2", 1.5, "outside [-1, 1]"),
    ("problem_id", 2.5, "non-integer"),
    ("margin", None, "no field"),
    ("cache_ok_exact1", "yes", "non-boolean"),
    ("greedy_first_exact1", "{not json", "malformed JSON"),
    ("greedy_first_exact2", {"actual": 5}, "first token id"),
])
def test_malformed_values(tmp_path, field, value, words):
    path = write_json(tmp_path / "x.json", [pivot(), pivot(), pivot(**{field: value})])
    with pytest.raises(ValueError) as e:
        records.load_records(path)
    msg = str(e.value)
    assert str(path) in msg and "pivot 2" in msg and f"'{field}'" in msg and words in msg


def test_unreadable_files(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    wrong = tmp_path / "list.json"
    wrong.write_text("[1, 2]")
    lines = tmp_path / "r.jsonl"
    lines.write_text(json.dumps(pivot()) + "\n{oops\n")
    for path, words in [(bad, "not a readable JSON"), (wrong, "'pivots' list"), (lines, "line 2"),
                        (tmp_path / "absent.json", "no such file"), (tmp_path / "x.csv", "unknown records format")]:
        with pytest.raises(ValueError) as e:
            records.load_records(path)
        assert str(path) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="junk.parquet: cannot read records"):
        records.load_records(junk)


def test_own_records_parquet_and_jsonl(tmp_path):
    probe = {"actual": [11, -0.5], "alt": [12, -1.25]}
    rows = [
        pivot(exact_ok=True, flagged=False, config="main", pass_order="e1,e2,rf", A_serial=0.25,
              greedy_first_exact1=json.dumps(probe), greedy_divergence_refeed=True),
        pivot(abs_pos=146, exact_ok=False, flagged=True, config="main", pass_order="rf,e1,e2", A_serial=0.0,
              greedy_first_exact1=json.dumps(probe), greedy_divergence_refeed=False),
    ]
    pq = tmp_path / "run1.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    df = records.load_records(pq)
    assert list(df.columns)[: len(records.COLUMNS)] == list(records.COLUMNS)
    assert {"exact_ok", "flagged", "config", "pass_order", "A_serial", "source"} <= set(df.columns)
    assert df["greedy_first_exact1"].iloc[0] == probe  # JSON string parsed
    assert df["exact_ok"].tolist() == [True, False] and (df["source"] == "run1").all()
    assert df["cache_ok_exact1"].isna().all()  # absent: missing, not invented

    jl = tmp_path / "run2.jsonl"
    jl.write_text("\n".join(json.dumps(dict(r, greedy_first_exact1=probe)) for r in rows) + "\n\n")
    df2 = records.load_records(jl)
    assert len(df2) == 2 and df2["greedy_first_exact1"].iloc[1] == probe
    assert df2["A_serial"].tolist() == [0.25, 0.0]
