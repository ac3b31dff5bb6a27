"""Build the results database: one DuckDB file holding every run, score, prediction, training
curve and job cost of a workflow run, so that tables, plots and ad-hoc questions are SQL queries.

Inputs (written by the workflow; see the module functions for the exact checks):

* run manifests ``results/runs/{run}/run.json``
* evaluation summaries ``results/eval/{run}/{dataset}/metrics.json``
* predictions ``results/eval/{run}/{dataset}/predictions.parquet`` (run and dataset are taken
  from the two parent directory names)
* training logs ``results/train/{run}/train_log.jsonl`` (run from the parent directory name)
* Snakemake benchmark files ``benchmarks/{rule}.tsv`` or ``benchmarks/{rule}/{w1}/{w2}.tsv``
* optionally each run's lineage (the workflow's ``--lineage``, `ragrl.results.paired`): its family,
  step, and the runs it started from / varies / ablates

Tables::

    runs        (run_id, recipe, model, config_hash, git_commit, seeds JSON, stage, extra JSON,
                 family, step, start_run, variant_of, ablation_of)  -- lineage; a run the lineage
                 does not name: family = recipe, step = stage, no links
    evals       (run_id, dataset, metric, value DOUBLE, n BIGINT, ci_low DOUBLE, ci_high DOUBLE)
                 -- run x dataset x metric; n: the questions its mean is over (metrics.json
                 "counts", else its n); ci_*: 95% bootstrap interval (NULL if not given)
    evals_by_type (run_id, dataset, question_type, metric, value, n, ci_low, ci_high) -- the same
                 per question type, for QA sets whose rows have one (the world's 1hop / bridge /
                 comparison: metrics.json "by_type"); a table spec names such a column
                 "<dataset>:<type>"
    predictions (run_id, dataset, <the parquet columns: id, question, golden_answers, prediction,
                 turns, queries, generated_tokens, observation_tokens, latency_s, em, f1, ...>)
    train_log   (run_id, step BIGINT, reward_mean, reward_std, kl, entropy, masked_share,
                 response_length, searches_per_trajectory, lr, step_time_s, <other logged keys>)
    jobs        (rule, wildcards, wall_s, max_rss_mb, cpu_s, mean_load, gpu INTEGER,
                 gpu_hours, benchmark_file, repeat INTEGER)  -- one row per benchmark data row
    paired      (run_id, baseline, relation, family, dataset, metric, n BIGINT, mean_run, mean_baseline,
                 diff, ci_low, ci_high)  -- run - baseline over the n questions both answered with a
                 value; ci_*: 95% paired bootstrap interval (meta paired_bootstrap: resamples, seed);
                 dataset "<dataset>:<type>" per question type; which pairs and metrics: paired.py
    hosts       (run_id, dataset, cpu, cpu_capability, torch, cuda_device, host JSON) -- the
                 machine that evaluated each run x dataset (metrics.json "host",
                 `ragrl.hostinfo`): one commit's results differ by float rounding between CPU
                 kinds and torch builds; NULL columns where a metrics.json has no host
    train_hosts (run_id, dataset, model, seq INTEGER, stage, segment INTEGER, from_step BIGINT, cpu,
                 cpu_capability, torch, cuda_device, host JSON) -- the machines that trained the
                 evaluated model, from its pretraining to its last stage (metrics.json "trained":
                 the model directory's host.json chain), one row per start of a training (a job
                 resumed on another node adds one); none for a model without a record
    decodings   (run_id, dataset, temperature DOUBLE, seed BIGINT) -- how each run x dataset was
                 decoded (metrics.json "decoding"): temperature 0 greedy (what every table of the
                 workflow reports), above 0 sampled with `seed`; NULL columns where a metrics.json
                 has none (a graph ranking generates nothing; files from before the field)
    meta        (key, value JSON)              -- main_metric, table_specs, paired_bootstrap

Views::

    leaderboard (run_id, recipe, model, dataset, metric, value, n)  -- main metric; exactly one
                 row per run x dataset that has an evaluation (value NULL if it lacks the metric)
    table_<name> (row_idx, label, run_id, col_idx, dataset, metric, value, best, ci_low, ci_high)
                 -- per table spec

How inputs get in: parquet and TSV files are read by DuckDB's own readers (`read_parquet`,
`read_csv`) with the file paths passed as prepared-statement parameters. The JSON inputs are small
and must be checked record by record (a bad line must be reported as `file:line`), so they are
parsed and validated in Python and inserted as parameters / Arrow tables. No file content is ever
spliced into SQL text; the only literals in SQL (in the view definitions: the main metric and the
table specs from the config) go through `sql_literal`.

Failure semantics: every input is validated before the database is created; a missing file raises
`FileNotFoundError`, a malformed one `ragrl.errors.DataFormatError` (``path[:line]: ...``). The
database is built in a temporary directory next to `db_path` and renamed into place only when
complete, so a failed build leaves no database (or the previous one untouched).

Conventions: NaN metric values and NaN/inf training-log values are stored as NULL; a benchmark
value ``-`` is NULL; a benchmark file's data rows are all kept (`repeat` = 0-based row index);
`gpu` comes from `rule_gpus` (0 for rules not listed) and `gpu_hours = wall_s / 3600 * gpu`.
Files referring to a run without a run manifest among the inputs are errors, as are two files for
the same run (x dataset), a repeated training step, and parquet/TSV paths containing glob
characters (``*?[]{}``; DuckDB's readers would expand them). A benchmark file's rule and wildcards
come from its path relative to `benchmarks_root` (default: the path's ``benchmarks`` component):
``benchmarks/train_rl/search_r1/0.tsv`` -> rule ``train_rl``, wildcards ``search_r1/0``; a file
directly under the root has wildcards ``""``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ragrl.errors import DataFormatError, InputError
from ragrl.hostinfo import HOST_FIELDS, check_host, check_trained_row
from ragrl.results import paired
from ragrl.results.query import one_line, quote_ident, sql_literal
from ragrl.results.tables import TableSpec, check_spec, normalize_spec, table_sql

PathLike = str | os.PathLike

RUN_STR_FIELDS = ("run_id", "recipe", "model", "config_hash", "git_commit", "stage")
TRAIN_KEYS = ("reward_mean", "reward_std", "kl", "entropy", "masked_share", "response_length",
              "searches_per_trajectory", "lr", "step_time_s")
PREDICTION_COLUMNS = ("id", "question", "golden_answers", "prediction", "turns", "queries",
                      "generated_tokens", "observation_tokens", "latency_s")
BENCH_NUMERIC = ("s", "max_rss", "max_vms", "max_uss", "max_pss", "io_in", "io_out",
                 "mean_load", "cpu_time")
_GLOB_CHARS = set("*?[]{}")

_SCHEMA = """
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, recipe VARCHAR NOT NULL, model VARCHAR NOT NULL,
    config_hash VARCHAR NOT NULL, git_commit VARCHAR NOT NULL, seeds JSON NOT NULL,
    stage VARCHAR NOT NULL, extra JSON NOT NULL, family VARCHAR NOT NULL, step VARCHAR NOT NULL,
    start_run VARCHAR, variant_of VARCHAR, ablation_of VARCHAR);
CREATE TABLE evals (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, metric VARCHAR NOT NULL, value DOUBLE,
    n BIGINT NOT NULL, ci_low DOUBLE, ci_high DOUBLE, PRIMARY KEY (run_id, dataset, metric));
CREATE TABLE evals_by_type (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, question_type VARCHAR NOT NULL, metric VARCHAR NOT NULL,
    value DOUBLE, n BIGINT NOT NULL, ci_low DOUBLE, ci_high DOUBLE,
    PRIMARY KEY (run_id, dataset, question_type, metric));
CREATE TABLE jobs (
    rule VARCHAR NOT NULL, wildcards VARCHAR NOT NULL, wall_s DOUBLE, max_rss_mb DOUBLE,
    cpu_s DOUBLE, mean_load DOUBLE, gpu INTEGER NOT NULL, gpu_hours DOUBLE,
    benchmark_file VARCHAR NOT NULL, "repeat" INTEGER NOT NULL);
CREATE TABLE paired (
    run_id VARCHAR NOT NULL, baseline VARCHAR NOT NULL, relation VARCHAR NOT NULL, family VARCHAR NOT NULL,
    dataset VARCHAR NOT NULL, metric VARCHAR NOT NULL, n BIGINT NOT NULL, mean_run DOUBLE, mean_baseline DOUBLE,
    diff DOUBLE, ci_low DOUBLE, ci_high DOUBLE, PRIMARY KEY (run_id, baseline, dataset, metric));
CREATE TABLE hosts (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, cpu VARCHAR, cpu_capability VARCHAR, torch VARCHAR,
    cuda_device VARCHAR, host JSON, PRIMARY KEY (run_id, dataset));
CREATE TABLE train_hosts (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, model VARCHAR NOT NULL, seq INTEGER NOT NULL,
    stage VARCHAR NOT NULL, segment INTEGER NOT NULL, from_step BIGINT NOT NULL, cpu VARCHAR,
    cpu_capability VARCHAR, torch VARCHAR, cuda_device VARCHAR, host JSON, PRIMARY KEY (run_id, dataset, seq));
CREATE TABLE decodings (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, temperature DOUBLE, seed BIGINT,
    PRIMARY KEY (run_id, dataset));
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value JSON);
"""

_EMPTY_PREDICTIONS = """
CREATE TABLE predictions (
    run_id VARCHAR, dataset VARCHAR, id VARCHAR, question VARCHAR, golden_answers VARCHAR[],
    prediction VARCHAR, turns BIGINT, queries VARCHAR[], generated_tokens BIGINT,
    observation_tokens BIGINT, latency_s DOUBLE)
"""

# The file format of DuckDB 1.5: the `duckdb` command-line shell on PyPI (duckdb-cli 1.5.x, in
# requirements.txt) and DuckDB 1.5 clients elsewhere cannot open files written in 2.0's newer
# format, and the results database is meant to be opened by anyone's SQL client.
STORAGE_VERSION = "v1.5.0"


# --------------------------------------------------------------------------------------------
# reading and checking inputs (pure Python; nothing is written until all of it passed)
# --------------------------------------------------------------------------------------------

def _require_file(path: Path, *, duckdb_reader: bool = False) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: input file not found")
    if duckdb_reader and _GLOB_CHARS & set(str(path)):
        # DuckDB's readers expand glob patterns; a literal '[' could silently read another file.
        raise DataFormatError(path, "file path contains a glob character (one of *?[]{}), "
                                    "which DuckDB's readers would expand; rename it")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _finite_or_none(v: float | int) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _read_json_object(path: Path) -> dict[str, Any]:
    _require_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, f"not UTF-8 text ({exc.reason})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"invalid JSON: {exc.msg} (column {exc.colno})",
                              line=exc.lineno) from None
    if not isinstance(obj, dict):
        raise DataFormatError(path, f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _read_run(path: Path) -> dict[str, Any]:
    obj = _read_json_object(path)
    row: dict[str, Any] = {}
    for key in RUN_STR_FIELDS:
        if key not in obj:
            raise DataFormatError(path, "missing", field=key)
        if not isinstance(obj[key], str) or (key == "run_id" and not obj[key]):
            raise DataFormatError(path, f"expected a non-empty string, got {obj[key]!r}"
                                  if key == "run_id" else f"expected a string, got {obj[key]!r}",
                                  field=key)
        row[key] = obj[key]
    seeds = obj.get("seeds")
    if not isinstance(seeds, dict):
        raise DataFormatError(path, "missing or not an object of name -> integer", field="seeds")
    for name, seed in seeds.items():
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DataFormatError(path, f"expected an integer, got {seed!r}", field=f"seeds.{name}")
    row["seeds"] = json.dumps(seeds, sort_keys=True)
    extra = {k: v for k, v in obj.items() if k not in RUN_STR_FIELDS and k != "seeds"}
    row["extra"] = json.dumps(_nan_to_none(extra), sort_keys=True, ensure_ascii=False)
    return row


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def _read_ci95(path: Path, obj: dict) -> dict[str, tuple[float | None, float | None]]:
    """metrics.json's optional "ci95": metric -> [low, high] (or null)."""
    ci = obj.get("ci95") or {}
    if not isinstance(ci, dict):
        raise DataFormatError(path, "expected an object of name -> [low, high]", field="ci95")
    out = {}
    for name, pair in ci.items():
        if pair is None:
            continue
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_number(v) for v in pair)):
            raise DataFormatError(path, f"expected [low, high], got {pair!r}", field=f"ci95.{name}")
        out[name] = (_finite_or_none(pair[0]), _finite_or_none(pair[1]))
    return out


def _read_eval_object(path: Path, obj: dict, prefix: str = "") -> tuple[str, str, int, dict[str, float | None]]:
    for key in ("run_id", "dataset"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise DataFormatError(path, f"missing or not a non-empty string: {obj.get(key)!r}",
                                  field=prefix + key)
    n = obj.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise DataFormatError(path, f"missing or not a non-negative integer: {n!r}", field=prefix + "n")
    metrics = obj.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise DataFormatError(path, "missing or not a non-empty object of name -> number",
                              field=prefix + "metrics")
    values: dict[str, float | None] = {}
    for name, value in metrics.items():
        if not name:
            raise DataFormatError(path, "empty metric name", field=prefix + "metrics")
        if value is not None and not _is_number(value):
            raise DataFormatError(path, f"expected a number or null, got {value!r}",
                                  field=f"{prefix}metrics.{name}")
        values[name] = None if value is None else _finite_or_none(value)
    return obj["run_id"], obj["dataset"], n, values


def _read_counts(path: Path, obj: dict, n: int, prefix: str = "") -> dict[str, int]:
    """metrics.json's optional "counts": how many questions each mean is over (a metric undefined
    for some questions, such as fact precision of a refusal, is over fewer than n)."""
    counts = obj.get("counts")
    if counts is None:
        return {}
    if not isinstance(counts, dict):
        raise DataFormatError(path, "expected an object of metric -> count", field=prefix + "counts")
    for name, c in counts.items():
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= n:
            raise DataFormatError(path, f"expected an integer in [0, n={n}], got {c!r}", field=f"{prefix}counts.{name}")
    return counts


def _read_host(path: Path, obj: dict, field: str = "host") -> tuple[str | None, ...]:
    """metrics.json's optional "host" object: its string fields, then the whole object as JSON."""
    host = obj.get("host")
    if host is None:
        return (None,) * (len(HOST_FIELDS) + 1)
    check_host(path, host, field)
    return (*(host.get(k) for k in HOST_FIELDS), json.dumps(_nan_to_none(host), sort_keys=True, ensure_ascii=False))


def _read_decoding(path: Path, obj: dict) -> tuple[float | None, int | None]:
    """metrics.json's optional "decoding": (temperature >= 0, seed: an integer or null)."""
    dec = obj.get("decoding")
    if dec is None:
        return None, None
    if not isinstance(dec, dict):
        raise DataFormatError(path, f"expected an object {{temperature, seed}}, got {dec!r}", field="decoding")
    t, seed = dec.get("temperature"), dec.get("seed")
    if not _is_number(t) or not math.isfinite(t) or t < 0:
        raise DataFormatError(path, f"expected a finite number >= 0, got {t!r}", field="decoding.temperature")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise DataFormatError(path, f"expected an integer or null, got {seed!r}", field="decoding.seed")
    return float(t), seed


def _read_trained(path: Path, obj: dict) -> list[tuple[Any, ...]]:
    """metrics.json's optional "trained" list (`ragrl.hostinfo.lineage` rows with their model):
    (model, seq, stage, segment, from_step, HOST_FIELDS..., host JSON) per row."""
    trained = obj.get("trained")
    if trained is None:
        return []
    if not isinstance(trained, list):
        raise DataFormatError(path, f"expected a list, got {type(trained).__name__}", field="trained")
    rows = []
    for i, row in enumerate(trained):
        where = f"trained[{i}]"
        check_trained_row(path, row, where)
        rows.append((row["model"], i, row["stage"], row["segment"], row["from_step"],
                     *_read_host(path, row, f"{where}.host")))
    return rows


def _read_train_log(path: Path, run_id: str) -> tuple[list[dict[str, Any]], set[str]]:
    _require_file(path)
    records: list[dict[str, Any]] = []
    keys: set[str] = set()
    seen: dict[int, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, f"not UTF-8 text ({exc.reason})") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, f"invalid JSON: {exc.msg} (column {exc.colno})",
                                  line=lineno) from None
        if not isinstance(obj, dict):
            raise DataFormatError(path, f"expected a JSON object, got {type(obj).__name__}",
                                  line=lineno)
        step = obj.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise DataFormatError(path, f"missing or not a non-negative integer: {step!r}",
                                  line=lineno, field="step")
        if step in seen:
            raise DataFormatError(path, f"step {step} already logged on line {seen[step]}",
                                  line=lineno, field="step")
        seen[step] = lineno
        rec: dict[str, Any] = {"step": step}
        for key, value in obj.items():
            if key == "step":
                continue
            if key == "run_id":
                if value != run_id:
                    raise DataFormatError(path, f"{value!r} differs from the run directory "
                                                f"{run_id!r}", line=lineno, field="run_id")
                continue
            if value is not None and not _is_number(value):
                raise DataFormatError(path, f"expected a number or null, got {value!r}",
                                      line=lineno, field=key)
            rec[key] = None if value is None else _finite_or_none(value)
            keys.add(key)
        records.append(rec)
    return records, keys


def _check_parquet(path: Path) -> pa.Schema:
    _require_file(path, duckdb_reader=True)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataFormatError(path, f"not a readable parquet file: {exc}") from None
    missing = [c for c in PREDICTION_COLUMNS if c not in schema.names]
    if missing:
        raise DataFormatError(path, f"missing column(s) {', '.join(missing)}")
    return schema


def benchmark_rule(path: PathLike, root: PathLike | None = None) -> tuple[str, str]:
    """(rule, wildcards) of a benchmark file: ``benchmarks/align/nq/3.tsv`` -> ("align", "nq/3").

    With `root`, the path is taken relative to it; otherwise the path's last component named
    ``benchmarks`` (or its first, if the path starts with one) is the root; failing that the
    file's stem is the rule.
    """
    p = Path(path)
    if root is not None:
        try:
            parts = p.relative_to(root).parts
        except ValueError:
            raise DataFormatError(p, f"benchmark file is not under {root}") from None
    elif p.parts and p.parts[0] == "benchmarks":
        parts = p.parts[1:]
    elif "benchmarks" in p.parts[:-1]:
        idx = len(p.parts) - 1 - p.parts[:-1][::-1].index("benchmarks") - 1
        parts = p.parts[idx + 1:]
    else:
        parts = (p.name,)
    if not parts:
        raise DataFormatError(p, "cannot tell the rule from this benchmark path")
    parts = list(parts)
    if parts[-1].endswith(".tsv"):
        parts[-1] = parts[-1][: -len(".tsv")]
    return parts[0], "/".join(parts[1:])


def _check_benchmark(path: Path) -> tuple[list[str], int]:
    """Check a benchmark TSV; return its header and number of data rows."""
    _require_file(path, duckdb_reader=True)
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, f"not UTF-8 text ({exc.reason})") from None
    if not rows:
        raise DataFormatError(path, "empty benchmark file (no header)", line=1)
    header = rows[0]
    if "s" not in header:
        raise DataFormatError(path, f"header lacks the 's' column: {header}", line=1)
    if len(set(header)) != len(header):
        raise DataFormatError(path, f"duplicate column names in header: {header}", line=1)
    data = [(i, r) for i, r in enumerate(rows[1:], start=2) if any(c.strip() for c in r)]
    if not data:
        raise DataFormatError(path, "no data rows", line=2)
    for lineno, row in data:
        if len(row) != len(header):
            raise DataFormatError(path, f"{len(row)} fields, header has {len(header)}",
                                  line=lineno)
        for name, value in zip(header, row):
            if name in BENCH_NUMERIC and value.strip() != "-":
                try:
                    float(value)
                except ValueError:
                    raise DataFormatError(path, f"expected a number or '-', got {value!r}",
                                          line=lineno, field=name) from None
    return header, len(data)


# --------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------

def build_database(
    db_path: PathLike,
    *,
    runs: Sequence[PathLike],
    evals: Sequence[PathLike],
    predictions: Sequence[PathLike],
    train_logs: Sequence[PathLike],
    benchmarks: Sequence[PathLike],
    rule_gpus: Mapping[str, int],
    table_specs: Sequence[Mapping[str, Any]],
    main_metric: str = "em",
    benchmarks_root: PathLike | None = None,
    lineage: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Validate all inputs, then build the DuckDB file at `db_path` atomically. Returns its path.

    `lineage`: run -> {family, step, start_run, variant_of, ablation_of} (`ragrl.results.paired`);
    the runs it names must have manifests among `runs`."""
    db_path = Path(db_path)
    if not isinstance(main_metric, str) or not main_metric:
        raise InputError(f"main_metric must be a non-empty string, got {main_metric!r}")
    for rule, n in rule_gpus.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"rule_gpus[{rule!r}] must be a non-negative integer, got {n!r}")
    specs: list[TableSpec] = [normalize_spec(s, default_metric=main_metric) for s in table_specs]
    names = [s.name for s in specs]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise InputError(f"table spec name(s) used more than once: {', '.join(dups)}")

    # --- runs
    run_rows: list[dict[str, Any]] = []
    run_files: dict[str, Path] = {}
    for p in map(Path, runs):
        row = _read_run(p)
        if row["run_id"] in run_files:
            raise DataFormatError(p, f"run {row['run_id']!r} already defined in "
                                     f"{run_files[row['run_id']]}", field="run_id")
        run_files[row["run_id"]] = p
        run_rows.append(row)
    lineages = paired.parse_lineage(lineage or {}, {r["run_id"]: (r["recipe"], r["stage"]) for r in run_rows})

    def known_run(run_id: str, path: Path, how: str, field: str | None = None) -> None:
        if run_id not in run_files:
            raise DataFormatError(path, f"run {run_id!r} ({how}) has no run manifest "
                                        "(run.json) among the inputs", field=field)

    # --- evals
    eval_rows: list[tuple[str, str, str, float | None, int, float | None, float | None]] = []
    type_rows: list[tuple[str, str, str, str, float | None, int, float | None, float | None]] = []
    eval_files: dict[tuple[str, str], Path] = {}
    host_rows: list[tuple[str | None, ...]] = []  # run_id, dataset, HOST_FIELDS, the host as JSON
    train_host_rows: list[tuple[Any, ...]] = []  # run_id, dataset, then _read_trained's columns
    decoding_rows: list[tuple[str, str, float | None, int | None]] = []
    for p in map(Path, evals):
        obj = _read_json_object(p)
        run_id, dataset, n, metrics = _read_eval_object(p, obj)
        known_run(run_id, p, "from the file", "run_id")
        if (run_id, dataset) in eval_files:
            raise DataFormatError(p, f"run {run_id!r} x dataset {dataset!r} already evaluated "
                                     f"in {eval_files[run_id, dataset]}")
        eval_files[run_id, dataset] = p
        ci = _read_ci95(p, obj)
        host_rows.append((run_id, dataset, *_read_host(p, obj)))
        decoding_rows.append((run_id, dataset, *_read_decoding(p, obj)))
        train_host_rows += [(run_id, dataset, *row) for row in _read_trained(p, obj)]
        counts = _read_counts(p, obj, n)
        eval_rows += [(run_id, dataset, m, v, counts.get(m, n), *ci.get(m, (None, None))) for m, v in metrics.items()]
        # Per question type (metrics.json "by_type"), so that a table or a query can put 1hop /
        # bridge / comparison side by side.
        by_type = obj.get("by_type") or {}
        if not isinstance(by_type, dict):
            raise DataFormatError(p, "expected an object of type -> {n, metrics, ci95}", field="by_type")
        for kind, part in by_type.items():
            if not kind or ":" in kind:
                raise DataFormatError(p, f"question type {kind!r} must be non-empty, without ':'", field="by_type")
            sub = {"run_id": run_id, "dataset": dataset, **(part if isinstance(part, dict) else {})}
            _, _, sub_n, sub_metrics = _read_eval_object(p, sub, f"by_type.{kind}.")
            sub_ci = _read_ci95(p, sub)
            sub_counts = _read_counts(p, sub, sub_n, f"by_type.{kind}.")
            type_rows += [(run_id, dataset, kind, m, v, sub_counts.get(m, sub_n), *sub_ci.get(m, (None, None)))
                          for m, v in sub_metrics.items()]
    if eval_rows and main_metric not in {r[2] for r in eval_rows}:
        raise InputError(f"main metric {main_metric!r} appears in no metrics.json "
                         f"(metrics: {', '.join(sorted({r[2] for r in eval_rows}))})")

    # --- predictions
    pred_map: list[tuple[int, str, str, str, int]] = []
    pred_cols: set[str] = set()
    seen_pred: dict[tuple[str, str], Path] = {}
    for i, p in enumerate(map(Path, predictions)):
        schema = _check_parquet(p)
        run_id, dataset = p.parent.parent.name, p.parent.name
        known_run(run_id, p, "from the directory name")
        if (run_id, dataset) in seen_pred:
            raise DataFormatError(p, f"predictions for run {run_id!r} x dataset {dataset!r} "
                                     f"already given in {seen_pred[run_id, dataset]}")
        seen_pred[run_id, dataset] = p
        pred_cols.update(schema.names)
        pred_map.append((i, os.fspath(p), run_id, dataset, pq.read_metadata(p).num_rows))

    # --- training logs
    train_records: list[dict[str, Any]] = []
    extra_keys: set[str] = set()
    seen_log: dict[str, Path] = {}
    for p in map(Path, train_logs):
        run_id = p.parent.name
        known_run(run_id, p, "from the directory name")
        if run_id in seen_log:
            raise DataFormatError(p, f"training log for run {run_id!r} already given in "
                                     f"{seen_log[run_id]}")
        seen_log[run_id] = p
        records, keys = _read_train_log(p, run_id)
        extra_keys |= keys - set(TRAIN_KEYS)
        train_records += [{"run_id": run_id, **r} for r in records]

    # --- benchmarks
    bench: list[tuple[Path, str, str, list[str], int]] = []
    for p in map(Path, benchmarks):
        header, nrows = _check_benchmark(p)
        rule, wildcards = benchmark_rule(p, benchmarks_root)
        bench.append((p, rule, wildcards, header, nrows))

    # --- write
    db_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{db_path.name}.", suffix=".tmp", dir=db_path.parent))
    tmp_db = tmp_dir / db_path.name
    try:
        con = duckdb.connect(str(tmp_db), config={"storage_compatibility_version": STORAGE_VERSION})
        try:
            eval_tables = {"hosts": host_rows, "train_hosts": train_host_rows, "decodings": decoding_rows}
            _write_all(con, run_rows, eval_rows, type_rows, eval_tables, pred_map, pred_cols,
                       train_records, extra_keys, bench, dict(rule_gpus), specs, main_metric, lineages)
            con.execute("CHECKPOINT")
        except duckdb.Error as exc:
            raise InputError(f"{db_path}: building the results database failed: "
                             f"{one_line(exc)}") from exc
        finally:
            con.close()
        # A stale write-ahead log of an earlier database at db_path would be replayed onto ours.
        Path(f"{db_path}.wal").unlink(missing_ok=True)
        os.replace(tmp_db, db_path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return db_path


def _insert(con, table: str, rows: Sequence[Sequence[Any]], *, json_last: bool = False) -> None:
    """Insert `rows` into `table` (a name of _SCHEMA's, never input), one placeholder per column,
    the last cast to JSON where `json_last`."""
    if not rows:
        return
    marks = ["?"] * len(rows[0])
    if json_last:
        marks[-1] = "?::JSON"
    con.executemany(f"INSERT INTO {table} VALUES ({', '.join(marks)})", [list(r) for r in rows])


def _write_all(con, run_rows, eval_rows, type_rows, eval_tables, pred_map, pred_cols, train_records, extra_keys,
               bench, rule_gpus, specs, main_metric, lineages) -> None:
    con.execute(_SCHEMA)
    cols = ", ".join(("run_id", "recipe", "model", "config_hash", "git_commit", "seeds", "stage",
                      "extra") + paired.LINEAGE_FIELDS)
    if run_rows:
        con.executemany(
            f"INSERT INTO runs ({cols}) VALUES (?, ?, ?, ?, ?, ?::JSON, ?, ?::JSON, ?, ?, ?, ?, ?)",
            [[r["run_id"], r["recipe"], r["model"], r["config_hash"], r["git_commit"],
              r["seeds"], r["stage"], r["extra"],
              *(getattr(lineages[r["run_id"]], k) for k in paired.LINEAGE_FIELDS)] for r in run_rows])
    # The per-metrics.json tables; hosts' and train_hosts' last column is the host record as JSON.
    for table, rows, json_last in (("evals", eval_rows, False), ("evals_by_type", type_rows, False),
                                   ("hosts", eval_tables["hosts"], True),
                                   ("train_hosts", eval_tables["train_hosts"], True),
                                   ("decodings", eval_tables["decodings"], False)):
        _insert(con, table, rows, json_last=json_last)

    # predictions: one read_parquet over all files; run/dataset joined on the file name.
    if pred_map:
        files = pa.table({
            "ord": [m[0] for m in pred_map], "file": [m[1] for m in pred_map],
            "run_id": [m[2] for m in pred_map], "dataset": [m[3] for m in pred_map],
            "expected": [m[4] for m in pred_map],
        })
        con.register("_pred_files", files)
        exclude = ["__source_file", "file_row_number"] + [c for c in ("run_id", "dataset")
                                                           if c in pred_cols]
        con.execute(
            "CREATE TABLE predictions AS "
            "SELECT m.run_id, m.dataset, p.* EXCLUDE ("
            + ", ".join(quote_ident(c) for c in exclude) + ") "
            "FROM read_parquet(?, union_by_name = true, filename = '__source_file', "
            "file_row_number = true) p "
            "JOIN _pred_files m ON m.file = p.__source_file "
            "ORDER BY m.ord, p.file_row_number",
            [[m[1] for m in pred_map]])
        bad = con.execute(
            "SELECT f.file, f.expected, count(p.run_id) FROM _pred_files f "
            "LEFT JOIN predictions p ON p.run_id = f.run_id AND p.dataset = f.dataset "
            "GROUP BY ALL HAVING count(p.run_id) <> f.expected").fetchall()
        if bad:
            f, want, got = bad[0]
            raise DataFormatError(f, f"expected {want} prediction rows, loaded {got}")
        con.unregister("_pred_files")
    else:
        con.execute(_EMPTY_PREDICTIONS)

    # training logs
    keys = list(TRAIN_KEYS) + sorted(extra_keys)
    log = pa.table(
        {"run_id": pa.array([r["run_id"] for r in train_records], pa.string()),
         "step": pa.array([r["step"] for r in train_records], pa.int64())}
        | {k: pa.array([r.get(k) for r in train_records], pa.float64()) for k in keys})
    con.register("_train_log", log)
    con.execute("CREATE TABLE train_log AS SELECT * FROM _train_log ORDER BY run_id, step")
    con.unregister("_train_log")

    # benchmarks: one read_csv per file (headers may differ); values checked beforehand.
    targets = {"wall_s": "s", "max_rss_mb": "max_rss", "cpu_s": "cpu_time",
               "mean_load": "mean_load"}
    for path, rule, wildcards, header, nrows in bench:
        exprs = [
            f"CAST(NULLIF(trim({quote_ident(src)}), '-') AS DOUBLE) AS {col}"
            if src in header else f"CAST(NULL AS DOUBLE) AS {col}"
            for col, src in targets.items()
        ]
        gpu = int(rule_gpus.get(rule, 0))
        con.execute(
            "INSERT INTO jobs SELECT ?, ?, wall_s, max_rss_mb, cpu_s, mean_load, "
            "?, wall_s / 3600.0 * ?, ?, CAST(row_number() OVER () - 1 AS INTEGER) FROM ("
            "SELECT " + ", ".join(exprs) + " FROM read_csv(?, delim = '\t', header = true, "
            "all_varchar = true, quote = '', escape = ''))",
            [rule, wildcards, gpu, gpu, os.fspath(path), os.fspath(path)])
        (loaded,) = con.execute("SELECT count(*) FROM jobs WHERE benchmark_file = ?",
                                [os.fspath(path)]).fetchone()
        if loaded != nrows:
            raise DataFormatError(path, f"expected {nrows} data rows, DuckDB read {loaded}")

    # paired comparisons, from the predictions just loaded
    tables = [(s.metric, s.runs) for s in specs]
    pairs = paired.derive_pairs(lineages, [s.runs for s in specs])
    rows = paired.paired_rows(con, pairs, lineages, tables, main_metric)
    if rows:
        con.executemany(f"INSERT INTO paired VALUES ({', '.join('?' * len(paired.PAIRED_COLUMNS))})", rows)

    # meta + views
    bootstrap = {"resamples": paired.RESAMPLES, "seed": paired.SEED, "level": paired.LEVEL}
    con.execute("INSERT INTO meta VALUES ('main_metric', ?::JSON), ('table_specs', ?::JSON), "
                "('paired_bootstrap', ?::JSON)",
                [json.dumps(main_metric), json.dumps([dataclasses.asdict(s) for s in specs]), json.dumps(bootstrap)])
    metric = sql_literal(main_metric)
    con.execute(f"""
CREATE VIEW leaderboard AS
SELECT p.run_id, r.recipe, r.model, p.dataset, {metric} AS metric, e.value, coalesce(e.n, p.n) AS n
FROM (SELECT run_id, dataset, max(n) AS n FROM evals GROUP BY run_id, dataset) p
JOIN runs r ON r.run_id = p.run_id
LEFT JOIN evals e ON e.run_id = p.run_id AND e.dataset = p.dataset AND e.metric = {metric}
ORDER BY p.run_id, p.dataset""")
    for spec in specs:
        check_spec(con, spec)
        con.execute(f"CREATE VIEW {quote_ident(spec.view)} AS {table_sql(spec)}")
