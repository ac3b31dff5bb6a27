"""The results database: building it from workflow outputs, querying it, plotting from it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.errors import DataFormatError
from ragrl.results import build_database, plot_metrics, plot_training, query, sql_literal
from ragrl.results.database import benchmark_rule

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"

RUNS = {
    "r1": {"recipe": "search_r1", "model": "tiny", "stage": "rl", "note": "ppo", "beta": 0.001},
    "r2": {"recipe": "r1_searcher", "model": "tiny", "stage": "rl"},
    "base": {"recipe": "base", "model": "tiny", "stage": "base"},
}
# (run, dataset) -> (n, metrics); base x hotpotqa lacks the main metric on purpose.
METRICS = {
    ("r1", "nq"): (3, {"em": 0.5, "f1": 0.61, "cover_em": 0.7}),
    ("r1", "hotpotqa"): (4, {"em": 0.25, "f1": 0.4, "cover_em": 0.3}),
    ("r2", "nq"): (3, {"em": 0.75, "f1": 0.8}),
    ("r2", "hotpotqa"): (4, {"em": 0.125, "f1": 0.2}),
    ("base", "nq"): (3, {"em": 0.0, "f1": 0.1}),
    ("base", "hotpotqa"): (4, {"f1": 0.05}),
}
TRAIN = {
    "r1": [
        {"step": 0, "reward_mean": 0.1, "reward_std": 0.05, "kl": 0.0, "entropy": 1.2,
         "masked_share": 0.3, "response_length": 40.0, "searches_per_trajectory": 1.0,
         "lr": 1e-6, "step_time_s": 2.0},
        {"step": 1, "reward_mean": 0.2, "reward_std": 0.06, "kl": 0.01, "entropy": 1.1,
         "masked_share": 0.31, "response_length": 42.0, "searches_per_trajectory": 1.5,
         "lr": 1e-6, "step_time_s": 2.1},
        {"step": 2, "reward_mean": 0.35, "reward_std": 0.07, "kl": 0.02, "entropy": 1.0,
         "masked_share": 0.29, "response_length": 45.0, "searches_per_trajectory": 2.0,
         "lr": 1e-6, "step_time_s": 2.2},
    ],
    # r2 logs no kl / masked_share, and a method-specific key.
    "r2": [
        {"step": 0, "reward_mean": 0.0, "reward_std": 0.1, "entropy": 1.3, "lr": 2e-6,
         "format_reward": 0.5},
        {"step": 5, "reward_mean": 0.4, "reward_std": 0.2, "entropy": 1.2, "lr": 2e-6,
         "format_reward": 0.9},
    ],
}


def _write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def _predictions(n: int, extra_metric: str | None = None) -> pa.Table:
    cols = {
        "id": [f"q{i}" for i in range(n)],
        "question": [f"who is {i}?" for i in range(n)],
        "golden_answers": [[f"a{i}", f"b{i}"] for i in range(n)],
        "prediction": [f"a{i}" if i % 2 == 0 else "nope" for i in range(n)],
        "turns": pa.array([i + 1 for i in range(n)], pa.int32()),
        "queries": [[f"search {i}"] * (i + 1) for i in range(n)],
        "generated_tokens": [10 * (i + 1) for i in range(n)],
        "observation_tokens": [100 * (i + 1) for i in range(n)],
        "latency_s": [0.5 * (i + 1) for i in range(n)],
        "em": [1.0 if i % 2 == 0 else 0.0 for i in range(n)],
        "f1": [1.0 if i % 2 == 0 else 0.25 for i in range(n)],
    }
    if extra_metric:
        cols[extra_metric] = [0.5] * n
    return pa.table(cols)


def make_inputs(root: Path) -> dict:
    """Hand-written workflow outputs under `root`; returns the keyword arguments for the build."""
    runs = []
    for run_id, fields in RUNS.items():
        manifest = {"run_id": run_id, "config_hash": f"h{run_id}", "git_commit": "abc123",
                    "seeds": {"world": 1, "train": 7}, **fields}
        runs.append(_write_json(root / "results" / "runs" / run_id / "run.json", manifest))
    evals = []
    for (run_id, ds), (n, metrics) in METRICS.items():
        evals.append(_write_json(root / "results" / "eval" / run_id / ds / "metrics.json",
                                 {"run_id": run_id, "dataset": ds, "n": n, "metrics": metrics}))
    preds = []
    for run_id, ds, n, extra in [("r1", "nq", 3, None), ("r2", "nq", 2, "cover_em")]:
        p = root / "results" / "eval" / run_id / ds / "predictions.parquet"
        pq.write_table(_predictions(n, extra), p)
        preds.append(p)
    logs = []
    for run_id, records in TRAIN.items():
        p = root / "results" / "train" / run_id / "train_log.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in records))
        logs.append(p)
    bench = root / "benchmarks"
    (bench / "train_rl" / "search_r1").mkdir(parents=True)
    (bench / "world.tsv").write_text(BENCH_HEADER + "0.59\t0:00:00\t124.38\t1365.68\t70.45\t"
                                     "93.11\t0.96\t0.09\t0.00\t0.48\n")
    (bench / "train_rl" / "search_r1" / "r1.tsv").write_text(
        BENCH_HEADER
        + "7200.0\t2:00:00\t2048.5\t9000\t1800\t1900\t10\t20\t95.5\t6800.25\n"
        + "3600\t1:00:00\t-\t-\t-\t-\t-\t-\t-\t-\n")
    return dict(
        runs=runs, evals=evals, predictions=preds, train_logs=logs,
        benchmarks=[bench / "world.tsv", bench / "train_rl" / "search_r1" / "r1.tsv"],
        rule_gpus={"train_rl": 2, "world": 0},
        table_specs=[{"name": "main", "title": "Main", "runs": ["r2", "r1"],
                      "datasets": ["nq", "hotpotqa"], "metric": "em"}],
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    db = root / "results" / "results.duckdb"
    assert build_database(db, **make_inputs(root)) == db
    return db


def rows(db: Path, sql: str, params=None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------

def test_row_counts(built):
    assert rows(built, "SELECT count(*) FROM runs") == [(3,)]
    assert rows(built, "SELECT count(*) FROM evals") == [
        (sum(len(m) for _, m in METRICS.values()),)]
    assert rows(built, "SELECT count(*) FROM predictions") == [(5,)]
    assert rows(built, "SELECT count(*) FROM train_log") == [(5,)]
    assert rows(built, "SELECT count(*) FROM jobs") == [(3,)]


def test_runs_table_keeps_seeds_and_extra_as_json(built):
    got = rows(built, "SELECT recipe, stage, seeds ->> '$.train', extra ->> '$.note', "
                      "CAST(extra ->> '$.beta' AS DOUBLE), json_keys(extra) "
                      "FROM runs WHERE run_id = 'r1'")
    assert got == [("search_r1", "rl", "7", "ppo", 0.001, ["beta", "note"])]
    assert rows(built, "SELECT extra FROM runs WHERE run_id = 'r2'") == [("{}",)]


def test_evals_long_format(built):
    got = {(r, d, m): (v, n) for r, d, m, v, n in rows(built, "SELECT run_id, dataset, metric, value, n FROM evals")}
    want = {(r, d, m): (v, n) for (r, d), (n, ms) in METRICS.items() for m, v in ms.items()}
    assert got == want
    # These metrics.json files carry no ci95: the interval columns stay NULL.
    assert rows(built, "SELECT count(*) FROM evals WHERE ci_low IS NOT NULL OR ci_high IS NOT NULL") == [(0,)]


def test_a_metric_undefined_for_some_questions_has_their_count_as_n(tmp_path):
    # Fact precision is None for a refusal: its mean is over the others, and the database says how
    # many (it said n = every question).
    from ragrl.eval.evaluate import summarize

    preds = [{"em": 1.0, "fact_precision": None if i < 3 else 0.5, "question_type": "a" if i % 2 else "b"}
             for i in range(10)]
    metrics = summarize(preds, "r1", "nq", ("fact_precision",))
    assert metrics["counts"]["fact_precision"] == 7 and metrics["by_type"]["a"]["counts"]["fact_precision"] == 4
    assert "em" not in metrics["counts"] and metrics["counts"]["f1"] == 0  # every question has em; none f1
    run = _write_json(tmp_path / "run.json", {"run_id": "r1", "recipe": "x", "model": "m", "config_hash": "h",
                                              "git_commit": "c", "seeds": {}, "stage": "sft"})
    db = tmp_path / "db.duckdb"
    build_database(db, runs=[run], evals=[_write_json(tmp_path / "metrics.json", metrics)], predictions=[],
                   train_logs=[], benchmarks=[], rule_gpus={}, table_specs=[])
    assert dict(rows(db, "SELECT metric, n FROM evals WHERE metric IN ('em', 'fact_precision')")) == {
        "em": 10, "fact_precision": 7}
    assert rows(db, "SELECT n FROM evals_by_type WHERE metric = 'fact_precision' AND question_type = 'a'") == [(4,)]
    assert rows(db, "SELECT metric, n FROM leaderboard") == [("em", 10)]  # the main metric's n, not a count of 0
    build_database(tmp_path / "fp.duckdb", runs=[run], evals=[tmp_path / "metrics.json"], predictions=[],
                   train_logs=[], benchmarks=[], rule_gpus={}, table_specs=[], main_metric="fact_precision")
    assert rows(tmp_path / "fp.duckdb", "SELECT metric, n FROM leaderboard") == [("fact_precision", 7)]
    bad = dict(metrics, counts={"fact_precision": 11})
    with pytest.raises(ValueError, match="counts.fact_precision"):
        build_database(tmp_path / "bad.duckdb", runs=[run], evals=[_write_json(tmp_path / "bad.json", bad)],
                       predictions=[], train_logs=[], benchmarks=[], rule_gpus={}, table_specs=[])


def test_evals_carry_the_bootstrap_interval_of_metrics_json(tmp_path):
    from ragrl.eval.evaluate import summarize

    preds = [{"em": float(i % 2), "f1": 0.5, "cover_em": 0.0, "format": 1.0, "turns": 2, "searches": 1}
             for i in range(40)]
    metrics = summarize(preds, "r1", "nq")
    low, high = metrics["ci95"]["em"]
    assert low < metrics["metrics"]["em"] == 0.5 < high and high - low < 0.4
    assert metrics["ci95"]["f1"] == [0.5, 0.5]
    assert summarize(preds, "r1", "nq") == metrics  # seeded
    run = _write_json(tmp_path / "run.json", {"run_id": "r1", "recipe": "x", "model": "m", "config_hash": "h",
                                              "git_commit": "c", "seeds": {}, "stage": "sft"})
    ev = _write_json(tmp_path / "metrics.json", metrics)
    db = tmp_path / "db.duckdb"
    build_database(db, runs=[run], evals=[ev], predictions=[], train_logs=[], benchmarks=[],
                   rule_gpus={}, table_specs=[])
    assert rows(db, "SELECT ci_low, ci_high FROM evals WHERE metric = 'em'") == [(low, high)]
    from ragrl.results.tables import render_tables

    paths = render_tables(db, [{"name": "t", "title": "T", "metric": "em"}], tmp_path / "tables")
    md = next(p for p in paths if p.suffix == ".md").read_text()
    assert f"0.500 [{low:.3f}, {high:.3f}]" in md
    tex = next(p for p in paths if p.suffix == ".tex").read_text()
    assert f"0.500 [{low:.3f}, {high:.3f}]" in tex


def _one_eval_db(tmp_path: Path, extra: dict) -> Path:
    run = _write_json(tmp_path / "run.json", {"run_id": "r1", "recipe": "x", "model": "m", "config_hash": "h",
                                              "git_commit": "c", "seeds": {}, "stage": "rl"})
    evs = [_write_json(tmp_path / ds / "metrics.json",
                       {"run_id": "r1", "dataset": ds, "n": 1, "metrics": {"em": 1.0}, **extra.get(ds, {})})
           for ds in ("greedy", "sampled", "ranking")]
    db = tmp_path / "db.duckdb"
    build_database(db, runs=[run], evals=evs, predictions=[], train_logs=[], benchmarks=[],
                   rule_gpus={}, table_specs=[])
    return db


def test_decodings_tell_greedy_from_sampled_runs(tmp_path):
    from ragrl.agent.rollout import RolloutConfig
    from ragrl.eval.evaluate import decoding

    greedy, sampled = decoding(RolloutConfig(temperature=0.0, seed=5)), decoding(RolloutConfig(temperature=1.0, seed=3))
    assert greedy == {"temperature": 0.0, "seed": None} and sampled == {"temperature": 1.0, "seed": 3}
    db = _one_eval_db(tmp_path, {"greedy": {"decoding": greedy}, "sampled": {"decoding": sampled}})
    assert rows(db, "SELECT dataset, temperature, seed FROM decodings ORDER BY dataset") == [
        ("greedy", 0.0, None), ("ranking", None, None), ("sampled", 1.0, 3)]


@pytest.mark.parametrize("dec, field", [("greedy", "decoding"), ({"temperature": -0.5}, "decoding.temperature"),
                                        ({"temperature": "0"}, "decoding.temperature"),
                                        ({"temperature": 0.7, "seed": 1.5}, "decoding.seed"),
                                        ({"temperature": 0.7, "seed": True}, "decoding.seed")])
def test_a_malformed_decoding_names_its_field(tmp_path, dec, field):
    with pytest.raises(DataFormatError, match=rf"sampled/metrics\.json: field '{field}'"):
        _one_eval_db(tmp_path, {"sampled": {"decoding": dec}})
    assert not (tmp_path / "db.duckdb").exists()


def test_question_types_get_their_own_rows_and_table_columns(tmp_path):
    from ragrl.eval.evaluate import summarize
    from ragrl.results.tables import render_tables

    # 1hop: em 1, 1, 0 -> 2/3; comparison: em 0, 1 -> 1/2; overall 3/5.
    preds = [{"em": e, "f1": e, "cover_em": e, "format": 1.0, "turns": 2, "searches": 1, "question_type": t}
             for e, t in [(1.0, "1hop"), (1.0, "1hop"), (0.0, "1hop"), (0.0, "comparison"), (1.0, "comparison")]]
    metrics = summarize(preds, "r1", "world_test")
    assert metrics["metrics"]["em"] == pytest.approx(3 / 5)
    assert sorted(metrics["by_type"]) == ["1hop", "comparison"]
    assert metrics["by_type"]["1hop"]["n"] == 3
    assert metrics["by_type"]["1hop"]["metrics"]["em"] == pytest.approx(2 / 3)
    assert metrics["by_type"]["comparison"]["metrics"]["em"] == pytest.approx(1 / 2)
    # untyped questions (a real dataset) give no breakdown
    assert "by_type" not in summarize([{**p, "question_type": ""} for p in preds], "r1", "nq")
    run = _write_json(tmp_path / "run.json", {"run_id": "r1", "recipe": "x", "model": "m", "config_hash": "h",
                                              "git_commit": "c", "seeds": {}, "stage": "sft"})
    ev = _write_json(tmp_path / "metrics.json", metrics)
    db = tmp_path / "db.duckdb"
    spec = {"name": "types", "title": "By type", "metric": "em",
            "datasets": ["world_test:1hop", "world_test:comparison"]}
    build_database(db, runs=[run], evals=[ev], predictions=[], train_logs=[], benchmarks=[],
                   rule_gpus={}, table_specs=[spec])
    assert rows(db, "SELECT dataset, n FROM evals WHERE metric = 'em'") == [("world_test", 5)]
    got = {t: (n, v) for t, n, v in rows(db, "SELECT question_type, n, value FROM evals_by_type WHERE metric = 'em'")}
    assert got == {"1hop": (3, pytest.approx(2 / 3)), "comparison": (2, pytest.approx(1 / 2))}
    # the leaderboard keeps one row per run x dataset: breakdowns are not datasets of their own
    assert rows(db, "SELECT dataset, value FROM leaderboard") == [("world_test", pytest.approx(3 / 5))]
    md = next(p for p in render_tables(db, [spec], tmp_path / "tables") if p.suffix == ".md").read_text()
    assert "0.667" in md and "0.500" in md
    # a malformed breakdown names its field
    bad = _write_json(tmp_path / "bad" / "metrics.json", {**metrics, "by_type": {"1hop": {"n": -1, "metrics": {"em": 1}}}})
    with pytest.raises(DataFormatError, match="by_type.1hop.n"):
        build_database(tmp_path / "bad.duckdb", runs=[run], evals=[bad], predictions=[], train_logs=[],
                       benchmarks=[], rule_gpus={}, table_specs=[])


def test_leaderboard_one_row_per_run_and_dataset(built):
    got = rows(built, "SELECT run_id, recipe, model, dataset, metric, value FROM leaderboard")
    assert len(got) == len(METRICS)
    assert len({(r[0], r[3]) for r in got}) == len(METRICS)
    for run_id, recipe, model, ds, metric, value in got:
        assert metric == "em"
        assert (recipe, model) == (RUNS[run_id]["recipe"], RUNS[run_id]["model"])
        assert value == METRICS[run_id, ds][1].get("em")  # None where em is missing
    assert ("base", "hotpotqa") in {(r[0], r[3]) for r in got if r[5] is None}


def test_predictions_carry_run_dataset_and_union_of_metrics(built):
    got = rows(built, "SELECT run_id, dataset, id, golden_answers, turns, em, cover_em "
                      "FROM predictions ORDER BY run_id, id")
    assert [r[:3] for r in got] == [("r1", "nq", "q0"), ("r1", "nq", "q1"), ("r1", "nq", "q2"),
                                    ("r2", "nq", "q0"), ("r2", "nq", "q1")]
    assert got[1][3] == ["a1", "b1"] and got[1][4] == 2 and got[1][5] == 0.0
    assert got[0][6] is None and got[3][6] == 0.5  # cover_em only in r2's file
    cols = [r[0] for r in rows(built, "DESCRIBE predictions")]
    assert cols == ["run_id", "dataset", "id", "question", "golden_answers", "prediction",
                    "turns", "queries", "generated_tokens", "observation_tokens", "latency_s",
                    "em", "f1", "cover_em"]


def test_train_log_missing_keys_are_null(built):
    got = rows(built, "SELECT run_id, step, reward_mean, kl, masked_share, format_reward "
                      "FROM train_log ORDER BY run_id, step")
    assert got == [
        ("r1", 0, 0.1, 0.0, 0.3, None), ("r1", 1, 0.2, 0.01, 0.31, None),
        ("r1", 2, 0.35, 0.02, 0.29, None),
        ("r2", 0, 0.0, None, None, 0.5), ("r2", 5, 0.4, None, None, 0.9),
    ]


def test_jobs_gpu_hours_and_wildcards(built):
    got = rows(built, "SELECT rule, wildcards, wall_s, max_rss_mb, cpu_s, mean_load, gpu, "
                      "gpu_hours, repeat FROM jobs ORDER BY rule, repeat")
    assert got[0] == ("train_rl", "search_r1/r1", 7200.0, 2048.5, 6800.25, 95.5, 2, 4.0, 0)
    assert got[1] == ("train_rl", "search_r1/r1", 3600.0, None, None, None, 2, 2.0, 1)
    assert got[2] == ("world", "", 0.59, 124.38, 0.48, 0.0, 0, 0.0, 0)
    files = rows(built, "SELECT DISTINCT benchmark_file FROM jobs ORDER BY 1")
    assert [Path(f).name for (f,) in files] == ["r1.tsv", "world.tsv"]


def test_table_view_and_meta(built):
    got = rows(built, "SELECT label, dataset, value, best FROM table_main")
    assert got == [("r2", "nq", 0.75, True), ("r2", "hotpotqa", 0.125, False),
                   ("r1", "nq", 0.5, False), ("r1", "hotpotqa", 0.25, True)]
    assert rows(built, "SELECT value ->> '$' FROM meta WHERE key = 'main_metric'") == [("em",)]


def test_every_rules_benchmark_path_names_its_rule():
    # The jobs table reads a job's rule from its benchmark path and takes the rule's GPUs from
    # that name (GPU-hours): benchmarks/harr/train/... was filed under "harr" with 0 GPUs.
    import re

    repo = Path(__file__).resolve().parents[2]
    seen = 0
    for smk in sorted((repo / "rules").glob("*.smk")):
        for block in re.split(r"(?m)^(?=rule \w+:)", smk.read_text()):
            m = re.match(r"rule (\w+):", block)
            if not m:
                continue
            bench = re.search(r'benchmark:\s*\n\s*f?"([^"]+)"', block)
            assert bench, f"{smk.name}: rule {m.group(1)} has no benchmark"
            assert benchmark_rule(bench.group(1))[0] == m.group(1), (smk.name, m.group(1), bench.group(1))
            seen += 1
    assert seen > 25


def test_benchmark_rule_from_path():
    assert benchmark_rule("benchmarks/world.tsv") == ("world", "")
    assert benchmark_rule("benchmarks/align/nq/3.tsv") == ("align", "nq/3")
    assert benchmark_rule("/x/benchmarks/proj/benchmarks/train/a/b.tsv") == ("train", "a/b")
    assert benchmark_rule("/elsewhere/t/a.tsv", root="/elsewhere") == ("t", "a")


# --------------------------------------------------------------------------------------------
# failures leave no database
# --------------------------------------------------------------------------------------------

def _leftovers(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if "duckdb" in p.name)


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    kwargs = make_inputs(tmp_path)
    log = kwargs["train_logs"][1]
    lines = log.read_text().splitlines()
    log.write_text(lines[0] + "\n" + '{"step": 5, "reward_mean": 0.4,\n')
    db = tmp_path / "out" / "results.duckdb"
    with pytest.raises(DataFormatError) as err:
        build_database(db, **kwargs)
    assert f"{log}:2:" in str(err.value)
    assert not db.exists() and _leftovers(db.parent) == []


def test_bad_value_in_jsonl_names_field(tmp_path):
    kwargs = make_inputs(tmp_path)
    log = kwargs["train_logs"][0]
    log.write_text(log.read_text() + '{"step": 3, "kl": "high"}\n')
    with pytest.raises(DataFormatError, match=r"train_log\.jsonl:4: field 'kl'"):
        build_database(tmp_path / "r.duckdb", **kwargs)
    assert not (tmp_path / "r.duckdb").exists()


def test_failed_build_keeps_previous_database(tmp_path):
    kwargs = make_inputs(tmp_path)
    db = tmp_path / "r.duckdb"
    build_database(db, **kwargs)
    before = db.read_bytes()
    kwargs["benchmarks"][0].write_text(BENCH_HEADER + "abc\t0\t1\t1\t1\t1\t1\t1\t1\t1\n")
    with pytest.raises(DataFormatError, match=r"world\.tsv:2: field 's'"):
        build_database(db, **kwargs)
    assert db.read_bytes() == before
    assert _leftovers(tmp_path) == ["r.duckdb"]


@pytest.mark.parametrize("breakage, pattern", [
    ("missing_run_json", r"run\.json: input file not found"),
    ("eval_unknown_run", r"metrics\.json: field 'run_id': run 'ghost'"),
    ("run_without_field", r"run\.json: field 'git_commit': missing"),
    ("bad_metric", r"metrics\.json: field 'metrics\.em': expected a number"),
    ("bad_parquet", r"predictions\.parquet: not a readable parquet file"),
    ("unknown_spec_run", r"table spec 'main': run\(s\) nobody not in the database"),
])
def test_bad_inputs_fail_clearly(tmp_path, breakage, pattern):
    kwargs = make_inputs(tmp_path)
    if breakage == "missing_run_json":
        kwargs["runs"][0].unlink()
    elif breakage == "eval_unknown_run":
        path = kwargs["evals"][0]
        path.write_text(path.read_text().replace('"r1"', '"ghost"'))
    elif breakage == "run_without_field":
        obj = json.loads(kwargs["runs"][1].read_text())
        del obj["git_commit"]
        kwargs["runs"][1].write_text(json.dumps(obj))
    elif breakage == "bad_metric":
        path = kwargs["evals"][2]
        path.write_text(path.read_text().replace("0.75", '"0.75"'))
    elif breakage == "bad_parquet":
        kwargs["predictions"][0].write_bytes(b"not parquet at all")
    elif breakage == "unknown_spec_run":
        kwargs["table_specs"][0]["runs"] = ["r1", "nobody"]
    db = tmp_path / "r.duckdb"
    with pytest.raises((ValueError, FileNotFoundError), match=pattern):
        build_database(db, **kwargs)
    assert _leftovers(tmp_path) == []


def test_paths_with_quotes_load_and_literal_helper(tmp_path):
    root = tmp_path / "it's \"here\""
    kwargs = make_inputs(root)
    db = root / "o'db.duckdb"
    build_database(db, **kwargs)
    assert rows(db, "SELECT count(*) FROM predictions") == [(5,)]
    pred = kwargs["predictions"][0]
    con = duckdb.connect()
    got = con.execute(f"SELECT count(*) FROM read_parquet({sql_literal(pred)})").fetchall()
    assert got == [(3,)]
    with pytest.raises(duckdb.Error):  # the naive quoting this helper exists to avoid
        con.execute(f"SELECT count(*) FROM read_parquet('{pred}')").fetchall()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))))
def test_sql_literal_round_trips(text):
    con = duckdb.connect()
    assert con.execute(f"SELECT {sql_literal(text)}").fetchone()[0] == text


def test_sql_literal_rejects_nul():
    with pytest.raises(ValueError):
        sql_literal("a\x00b")


def test_empty_inputs_build_empty_tables(tmp_path):
    db = tmp_path / "e.duckdb"
    build_database(db, runs=[], evals=[], predictions=[], train_logs=[], benchmarks=[],
                   rule_gpus={}, table_specs=[])
    for table in ("runs", "evals", "predictions", "train_log", "jobs", "leaderboard"):
        assert rows(db, f"SELECT count(*) FROM {table}") == [(0,)]
    cols = [r[0] for r in rows(db, "DESCRIBE train_log")]
    assert cols[:4] == ["run_id", "step", "reward_mean", "reward_std"]


# --------------------------------------------------------------------------------------------
# query
# --------------------------------------------------------------------------------------------

SQL = "SELECT run_id, dataset, metric, value, n FROM evals ORDER BY run_id, dataset, metric"


def test_query_csv_round_trips(built, capsys):
    query(built, SQL, fmt="csv")
    parsed = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert parsed[0] == ["run_id", "dataset", "metric", "value", "n"]
    back = [(r, d, m, float(v), int(n)) for r, d, m, v, n in parsed[1:]]
    assert back == rows(built, SQL)


def test_query_json_and_nulls(built, tmp_path):
    out = tmp_path / "q.json"
    query(built, "SELECT run_id, dataset, value, extra FROM leaderboard "
                 "JOIN runs USING (run_id) ORDER BY run_id, dataset", fmt="json", out=out)
    got = json.loads(out.read_text())
    want = rows(built, "SELECT run_id, dataset, value FROM leaderboard ORDER BY run_id, dataset")
    assert [(g["run_id"], g["dataset"], g["value"]) for g in got] == want
    assert any(g["value"] is None for g in got)
    assert got[2]["extra"] == {"beta": 0.001, "note": "ppo"}  # JSON embedded, not a string


def test_query_parquet(built, tmp_path):
    out = tmp_path / "q.parquet"
    query(built, SQL, fmt="parquet", out=out)
    table = pq.read_table(out)
    assert [tuple(r.values()) for r in table.to_pylist()] == rows(built, SQL)
    with pytest.raises(ValueError, match="needs an output file"):
        query(built, SQL, fmt="parquet")


def test_query_table(built, capsys):
    query(built, "SELECT run_id, value FROM leaderboard WHERE dataset = 'nq' ORDER BY run_id")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run_id", "value"]
    assert [ln.split() for ln in lines[2:5]] == [["base", "0"], ["r1", "0.5"], ["r2", "0.75"]]
    assert lines[-1] == "(3 rows)"


def test_query_errors_are_one_line(built, tmp_path):
    with pytest.raises(ValueError) as err:
        query(built, "SELECT * FROM no_such_table")
    assert "no_such_table" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="query failed") as err:
        query(built, "DELETE FROM runs")  # read-only
    assert "\n" not in str(err.value)
    assert rows(built, "SELECT count(*) FROM runs") == [(3,)]
    with pytest.raises(FileNotFoundError):
        query(tmp_path / "missing.duckdb", "SELECT 1")
    with pytest.raises(ValueError, match="unknown output format"):
        query(built, "SELECT 1", fmt="xml")


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_plots_are_png(built, tmp_path):
    paths = plot_training(built, tmp_path / "plots")
    assert [p.name for p in paths] == ["r1_training.png", "r2_training.png"]
    path = plot_metrics(built, tmp_path / "plots", "em")
    assert path.name == "metrics_em.png"
    for p in paths + [path]:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 1000
    assert sorted(x.name for x in (tmp_path / "plots").iterdir()) == [
        "metrics_em.png", "r1_training.png", "r2_training.png"]  # no temp files left
    with pytest.raises(ValueError, match="metric 'bleu' not in"):
        plot_metrics(built, tmp_path / "plots", "bleu")


def test_plot_training_without_logs_writes_nothing(tmp_path):
    db = tmp_path / "e.duckdb"
    build_database(db, runs=[], evals=[], predictions=[], train_logs=[], benchmarks=[],
                   rule_gpus={}, table_specs=[])
    assert plot_training(db, tmp_path / "plots") == []
    assert not (tmp_path / "plots").exists() or not any((tmp_path / "plots").iterdir())


def test_nan_metric_stored_as_null(tmp_path):
    kwargs = make_inputs(tmp_path)
    path = kwargs["evals"][0]
    path.write_text(path.read_text().replace("0.61", "NaN"))
    db = tmp_path / "r.duckdb"
    build_database(db, **kwargs)
    (value,) = rows(db, "SELECT value FROM evals WHERE run_id='r1' AND dataset='nq' "
                        "AND metric='f1'")[0]
    assert value is None


def test_duckdb_shell_reads_the_database(built):
    """README's `duckdb results/ragrl.duckdb "select * from leaderboard"`: the duckdb-cli shell
    (an older DuckDB than the Python package that writes the file) opens it and prints every row."""
    import shutil
    import subprocess
    import sys

    shell = Path(sys.executable).with_name("duckdb")
    shell = str(shell) if shell.exists() else shutil.which("duckdb")
    assert shell, "the duckdb shell (requirements.txt: duckdb-cli) is not installed"
    proc = subprocess.run([shell, "-csv", str(built), "select run_id, dataset, value from leaderboard"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = list(csv.reader(io.StringIO(proc.stdout)))
    assert printed[0] == ["run_id", "dataset", "value"]
    expected = rows(built, "SELECT run_id, dataset, value FROM leaderboard")
    assert sorted((r[0], r[1]) for r in printed[1:]) == sorted((r[0], r[1]) for r in expected)


# --------------------------------------------------------------------------------------------
# query sandbox (issue 18, F8): a results query reads the results database and nothing else
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "COPY runs TO '{tmp}/x.csv'",
        "EXPORT DATABASE '{tmp}/export'",
        "SELECT * FROM read_text('{secret}')",
        "SELECT * FROM read_csv('{secret}')",
        "ATTACH '{tmp}/other.duckdb' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
    ],
)
def test_query_cannot_touch_other_files(built, tmp_path, sql):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read me\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="query failed") as err:
        query(built, sql.format(tmp=tmp_path, secret=secret), fmt="csv", out=tmp_path / "out.csv")
    assert "\n" not in str(err.value)
    assert "do not read me" not in str(err.value)
    if sql.startswith(("COPY", "EXPORT", "SELECT", "ATTACH")):
        assert "reads the results database only" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, not even --out
    assert rows(built, "SELECT count(*) FROM runs") == [(3,)]


def test_query_out_still_writes_the_result(built, tmp_path):
    out = tmp_path / "result.csv"
    query(built, "SELECT run_id FROM runs ORDER BY run_id", fmt="csv", out=out)
    assert out.read_text().splitlines()[0] == "run_id" and len(out.read_text().splitlines()) == 4
    query(built, "SELECT run_id FROM runs", fmt="parquet", out=tmp_path / "r.parquet")
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 3
