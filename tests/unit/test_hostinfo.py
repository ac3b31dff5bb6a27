"""The host record in metrics.json and the results database's `hosts` table."""

from __future__ import annotations

import json
import sys

import duckdb
import pytest

from ragrl.errors import DataFormatError
from ragrl.hostinfo import cpu_model, host_info
from ragrl.results.database import build_database

AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\nflags\t\t: fpu avx512f\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nProcessor\t: ARMv8 Processor rev 1 (v8l)\n"


def test_cpu_model_reads_the_model_name_line():
    assert cpu_model(AMD) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model(ARM) == "ARMv8 Processor rev 1 (v8l)"
    assert cpu_model("flags : fpu\n")  # no model line: platform's answer, never empty


def test_host_info_names_torch_and_its_kernels(monkeypatch):
    import torch

    from ragrl.hostinfo import KERNEL_ENV

    for name in KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    info = host_info()
    assert info["torch"] == torch.__version__
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cuda_device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    assert info["env"] == {"MKL_CBWR": "AVX2"}
    json.dumps(info)  # a JSON object as it stands
    # a process that never imported torch is described without it (its numbers owe nothing to torch)
    monkeypatch.delitem(sys.modules, "torch")
    assert "torch" not in host_info() and "cpu_capability" not in host_info()


def _inputs(tmp_path, host):
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"run_id": "r1", "recipe": "x", "model": "m", "config_hash": "h", "git_commit": "c",
                               "seeds": {}, "stage": "sft"}))
    ev = tmp_path / "eval" / "r1" / "nq" / "metrics.json"
    ev.parent.mkdir(parents=True)
    obj = {"run_id": "r1", "dataset": "nq", "n": 2, "metrics": {"em": 0.5}}
    if host is not None:
        obj["host"] = host
    ev.write_text(json.dumps(obj))
    return dict(runs=[run], evals=[ev], predictions=[], train_logs=[], benchmarks=[], rule_gpus={}, table_specs=[])


def test_write_metrics_records_the_host_and_the_database_files_it(tmp_path):
    from ragrl.eval.evaluate import summarize, write_metrics

    metrics = summarize([{"em": 1.0, "f1": 1.0, "cover_em": 1.0, "format": 1.0, "turns": 1, "searches": 1}],
                        "r1", "nq")
    path = tmp_path / "eval" / "r1" / "nq" / "metrics.json"
    write_metrics(metrics, path)
    written = json.loads(path.read_text())
    assert written["host"] == json.loads(json.dumps(host_info())) and written["metrics"] == metrics["metrics"]
    kwargs = _inputs(tmp_path / "in", None)
    kwargs["evals"] = [path]
    db = tmp_path / "db.duckdb"
    build_database(db, **kwargs)
    with duckdb.connect(str(db), read_only=True) as con:
        cpu, cap, torch_version, host = con.execute(
            "SELECT cpu, cpu_capability, torch, host FROM hosts WHERE run_id = 'r1' AND dataset = 'nq'").fetchone()
    assert cpu == cpu_model() and cap == written["host"]["cpu_capability"] and torch_version == written["host"]["torch"]
    assert json.loads(host) == written["host"]


def test_metrics_without_a_host_load_with_null_columns(tmp_path):
    db = tmp_path / "db.duckdb"
    build_database(db, **_inputs(tmp_path, None))
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id, cpu, torch, host FROM hosts").fetchall() == [("r1", None, None, None)]


@pytest.mark.parametrize("host, field", [("EPYC", "host"), ({"cpu": 7}, "host.cpu"), ({"torch": ["2"]}, "host.torch")])
def test_a_malformed_host_names_its_field(tmp_path, host, field):
    db = tmp_path / "db.duckdb"
    with pytest.raises(DataFormatError, match=rf"metrics\.json: field '{field}'"):
        build_database(db, **_inputs(tmp_path, host))
    assert not db.exists()


def _model(tmp_path, name, stage, from_steps, start=None):
    from ragrl.hostinfo import read_record, segment, training_record, write_record

    d = tmp_path / name
    d.mkdir()
    write_record(d, training_record(stage, [segment(s) for s in from_steps], read_record(start) if start else None))
    return d


def test_a_model_names_the_hosts_of_its_whole_lineage(tmp_path):
    from ragrl.hostinfo import lineage, read_record

    pre = _model(tmp_path, "pre", "pretrain", [0])
    sft = _model(tmp_path, "sft", "sft", [0], start=pre)
    rl = _model(tmp_path, "rl", "rl", [0, 6], start=sft)  # killed after step 6, resumed
    rows = lineage(read_record(rl))
    assert [(r["stage"], r["segment"], r["from_step"]) for r in rows] == [
        ("pretrain", 0, 0), ("sft", 0, 0), ("rl", 0, 0), ("rl", 1, 6)]
    assert all(r["host"]["cpu"] == cpu_model() and "from_step" not in r["host"] for r in rows)
    # A start without a record (a hub checkpoint, the shipped base) ends the chain.
    assert [r["stage"] for r in lineage(read_record(_model(tmp_path, "sft2", "sft", [0], start=tmp_path)))] == ["sft"]
    assert read_record(tmp_path / "no-such-model") is None and lineage(None) == []


def test_resumed_segments_are_appended_in_order_and_lost_work_is_dropped(tmp_path):
    from ragrl.hostinfo import SEGMENTS, append_segment, read_segments

    append_segment(tmp_path, 0)
    assert [s["from_step"] for s in append_segment(tmp_path, 4)] == [0, 4]
    assert [s["from_step"] for s in read_segments(tmp_path)] == [0, 4]
    # Killed before the step-6 checkpoint and resumed from step 4 again: the lost start goes,
    # as its steps went from the training log.
    append_segment(tmp_path, 6)
    assert [s["from_step"] for s in append_segment(tmp_path, 4)] == [0, 4]
    assert [s["from_step"] for s in append_segment(tmp_path, 0)] == [0]  # checkpoints deleted: from scratch
    assert not list(tmp_path.glob(".*tmp"))
    (tmp_path / SEGMENTS).write_text('{"from_step": 0}\n{"from_step": "4"}\n')
    with pytest.raises(DataFormatError, match=r"hosts\.jsonl:2: field 'from_step'"):
        read_segments(tmp_path)


@pytest.mark.parametrize("text, field", [
    ("[]", None), ('{"segments": []}', "stage"), ('{"stage": "rl", "segments": [1]}', r"segments\[0\]"), ('{"stage": "rl", "segments": {}}', "segments"),
    ('{"stage": "rl", "segments": [{"from_step": 1.5}]}', r"segments\[0\]\.from_step"),
    ('{"stage": "rl", "segments": [], "start": {"stage": 3, "segments": []}}', r"start\.stage"),
    ('{"stage": "rl", "segments": [{"from_step": true}]}', r"segments\[0\]\.from_step"),
    ('{"stage": "rl", "segments": [{"from_step": 0, "cpu": 1}]}', r"segments\[0\]\.cpu"),
    ('{"stage": "rl", "segments": [], "start": []}', "start"),
])
def test_a_malformed_record_names_its_field(tmp_path, text, field):
    from ragrl.hostinfo import RECORD, read_record

    (tmp_path / RECORD).write_text(text)
    with pytest.raises(DataFormatError, match=rf"host\.json: field '{field}'" if field else r"host\.json: expected"):
        read_record(tmp_path)


def test_metrics_name_the_training_hosts_and_the_database_files_them(tmp_path):
    import torch  # noqa: F401  (the segments then name torch, as a training process's do)

    from ragrl.eval.evaluate import summarize, write_metrics
    from ragrl.hostinfo import trained_hosts

    rl = _model(tmp_path, "rl", "rl", [0, 2], start=_model(tmp_path, "sft", "sft", [0]))
    metrics = summarize([{"em": 1.0, "f1": 1.0, "cover_em": 1.0, "format": 1.0, "turns": 1, "searches": 1}],
                        "r1", "nq")
    path = tmp_path / "eval" / "r1" / "nq" / "metrics.json"
    written = write_metrics(metrics, path, trained=trained_hosts([rl, "org/hub-model"]))
    assert [(r["model"], r["stage"], r["from_step"]) for r in written["trained"]] == [
        (str(rl), "sft", 0), (str(rl), "rl", 0), (str(rl), "rl", 2)]
    kwargs = _inputs(tmp_path / "in", None)
    kwargs["evals"] = [path]
    db = tmp_path / "db.duckdb"
    build_database(db, **kwargs)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT seq, stage, segment, from_step, cpu, torch FROM train_hosts "
                           "WHERE run_id = 'r1' AND dataset = 'nq' ORDER BY seq").fetchall()
    assert rows == [(0, "sft", 0, 0, cpu_model(), written["host"]["torch"]), (1, "rl", 0, 0, cpu_model(),
                    written["host"]["torch"]), (2, "rl", 1, 2, cpu_model(), written["host"]["torch"])]


@pytest.mark.parametrize("trained, field", [
    ({"stage": "rl"}, "trained"), ({}, "trained"), ([3], r"trained\[0\]"),
    ([{"model": "m", "stage": "rl", "segment": 0, "from_step": True}], r"trained\[0\]\.from_step"),
    ([{"model": "m", "stage": "rl", "segment": 0, "from_step": 0, "host": {"cpu": 1}}], r"trained\[0\]\.host\.cpu"),
])
def test_a_malformed_training_host_names_its_field(tmp_path, trained, field):
    kwargs = _inputs(tmp_path, {"cpu": "x"})
    obj = json.loads(kwargs["evals"][0].read_text())
    kwargs["evals"][0].write_text(json.dumps({**obj, "trained": trained}))
    db = tmp_path / "db.duckdb"
    with pytest.raises(DataFormatError, match=rf"metrics\.json: field '{field}'"):
        build_database(db, **kwargs)
    assert not db.exists()
