"""Benchmark tables: runs x datasets grids of one metric, as Markdown, CSV and LaTeX.

A table spec (from the config) is::

    {"name": "main", "title": "Main results", "runs": ["r1", "r2"], "datasets": ["nq", "hotpotqa"],
     "metric": "em", "higher_is_better": true, "label": "run_id", "precision": 3}

Only `name` is required. `runs` defaults to every run with a value of `metric` (ordered by
run_id), `datasets` to every dataset with a value of `metric` (ordered by name), `metric` to the
database's main metric, `higher_is_better` to true (null: neither direction is better, as for a
count of searches; no cell is marked best), `label` (the column of `runs` shown as the row
label) to `run_id`, `precision` (decimal places) to 3, `title` to the name. Unknown keys, unknown
runs / datasets / label columns and a metric absent from the database are errors.

The same SQL (`table_sql`) defines the `table_<name>` views in the database and feeds
`render_tables`, so the files and the views always agree. The view has one row per
run x dataset (row_idx, label, run_id, col_idx, dataset, metric, value, best, ci_low, ci_high); `best` is true for
every cell holding the column's best value (ties are all marked), computed on the stored values,
not on the rounded ones.

Rendering conventions (all three files list rows in spec order, columns in dataset order):

* Markdown: a cell is the value and, where the run's metrics.json gave one, its 95% bootstrap
  interval as stored (``0.512 [0.420, 0.600]``); best cell in bold; missing cell ``–`` (en dash).
* CSV: first column is the label column, then one column per dataset, the value alone (the
  intervals are the database's ci_low / ci_high); the best cell carries a ``*`` suffix
  (``0.512*``); a missing cell is ``–``. Strip a trailing ``*`` to get the number.
* LaTeX: a booktabs ``table`` (needs ``\\usepackage{booktabs}``), cells as the Markdown's; best cell
  ``\\textbf{0.512 [0.420, 0.600]}``; missing cell ``--`` (LaTeX's en dash); labels, dataset names
  and the title are escaped.

`render_delta_tables` writes next to each table ``{name}_delta.md`` / ``.csv``: the `paired` rows
(ragrl.results.paired) of the table's metric whose two runs are both rows of the table, one row per
pair, one column per dataset of the table: ``+0.120 [+0.040, +0.200] (n=100)`` (run − baseline,
95% paired bootstrap interval; bold when the interval is clear of 0). The CSV is long: one line per
pair and dataset.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ragrl.errors import InputError
from ragrl.results.query import (
    connect_read_only,
    one_line,
    quote_ident,
    sql_literal,
    write_utf8,
)

SPEC_KEYS = frozenset(
    {"name", "title", "runs", "datasets", "metric", "higher_is_better", "label", "precision"})
MISSING = "–"
LATEX_MISSING = "--"
CSV_BEST_SUFFIX = "*"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class TableSpec:
    name: str
    title: str
    runs: tuple[str, ...] | None
    datasets: tuple[str, ...] | None
    metric: str
    higher_is_better: bool | None  # None: neither direction is better, no best cell
    label: str
    precision: int

    @property
    def view(self) -> str:
        return f"table_{self.name}"


def _str_list(value: Any, what: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise InputError(f"{where}: '{what}' must be a non-empty list of names")
    for item in value:
        if not isinstance(item, str) or not item:
            raise InputError(f"{where}: '{what}' must hold non-empty strings, got {item!r}")
    dups = sorted({x for x in value if list(value).count(x) > 1})
    if dups:
        raise InputError(f"{where}: '{what}' lists {', '.join(dups)} more than once")
    return tuple(value)


def normalize_spec(spec: Mapping[str, Any] | TableSpec, *, default_metric: str = "em") -> TableSpec:
    """Check a table spec from the config and fill in the defaults."""
    if isinstance(spec, TableSpec):
        return spec
    if not isinstance(spec, Mapping):
        raise InputError(f"table spec must be a mapping, got {type(spec).__name__}")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InputError(f"table spec name {name!r} must match {_NAME_RE.pattern} "
                         "(it names the view and the output files)")
    where = f"table spec '{name}'"
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(SPEC_KEYS))}")
    runs = None if spec.get("runs") is None else _str_list(spec["runs"], "runs", where)
    datasets = (None if spec.get("datasets") is None
                else _str_list(spec["datasets"], "datasets", where))
    metric = spec.get("metric", default_metric)
    if not isinstance(metric, str) or not metric:
        raise InputError(f"{where}: 'metric' must be a non-empty string")
    hib = spec.get("higher_is_better", True)
    if hib is not None and not isinstance(hib, bool):
        raise InputError(f"{where}: 'higher_is_better' must be true, false or null (neither), got {hib!r}")
    label = spec.get("label", "run_id")
    if not isinstance(label, str) or not label:
        raise InputError(f"{where}: 'label' must be a column name of the runs table")
    precision = spec.get("precision", 3)
    if isinstance(precision, bool) or not isinstance(precision, int) or not 0 <= precision <= 12:
        raise InputError(f"{where}: 'precision' must be an integer from 0 to 12, got {precision!r}")
    title = spec.get("title", name)
    if not isinstance(title, str):
        raise InputError(f"{where}: 'title' must be a string")
    return TableSpec(name, title, runs, datasets, metric, hib, label, precision)


def _values(rows: Iterable[tuple[int, str]]) -> str:
    return ", ".join(f"({i}, {sql_literal(v)})" for i, v in rows)


# What a table's cells come from: every evaluation, and its per-question-type breakdown as the
# column "<dataset>:<type>" (databases built before evals_by_type existed have none).
_CELLS = ("(SELECT run_id, dataset, metric, value, ci_low, ci_high FROM evals UNION ALL "
          "SELECT run_id, dataset || ':' || question_type, metric, value, ci_low, ci_high FROM evals_by_type)")


def table_sql(spec: TableSpec, with_ci: bool = True, with_types: bool = True) -> str:
    """The SELECT behind the `table_<name>` view (literals quoted with `sql_literal`).

    `with_ci=False` for a database built before `evals` had the ci_low / ci_high columns,
    `with_types=False` for one built before `evals_by_type`."""
    metric = sql_literal(spec.metric)
    ci = "ci_low, ci_high" if with_ci else "NULL::DOUBLE AS ci_low, NULL::DOUBLE AS ci_high"
    cells = _CELLS if with_types and with_ci else "evals"
    if spec.runs is None:
        sel_runs = (f"SELECT CAST(row_number() OVER (ORDER BY run_id) - 1 AS INTEGER) AS row_idx, "
                    f"run_id FROM (SELECT DISTINCT run_id FROM evals WHERE metric = {metric})")
    else:
        sel_runs = (f"SELECT * FROM (VALUES {_values(enumerate(spec.runs))}) "
                    "AS v(row_idx, run_id)")
    if spec.datasets is None:
        sel_ds = (f"SELECT CAST(row_number() OVER (ORDER BY dataset) - 1 AS INTEGER) AS col_idx, "
                  f"dataset FROM (SELECT DISTINCT dataset FROM evals WHERE metric = {metric})")
    else:
        sel_ds = (f"SELECT * FROM (VALUES {_values(enumerate(spec.datasets))}) "
                  "AS v(col_idx, dataset)")
    if spec.higher_is_better is None:
        best = "false"
    else:
        agg = "max" if spec.higher_is_better else "min"
        best = f"coalesce(value = {agg}(value) OVER (PARTITION BY col_idx), false)"
    return f"""
WITH sel_runs AS ({sel_runs}),
     sel_datasets AS ({sel_ds}),
     m AS (SELECT run_id, dataset, value, {ci} FROM {cells} WHERE metric = {metric}),
     grid AS (
        SELECT sr.row_idx, CAST(r.{quote_ident(spec.label)} AS VARCHAR) AS label, sr.run_id,
               sd.col_idx, sd.dataset, m.value, m.ci_low, m.ci_high
        FROM sel_runs sr
        JOIN runs r ON r.run_id = sr.run_id
        CROSS JOIN sel_datasets sd
        LEFT JOIN m ON m.run_id = sr.run_id AND m.dataset = sd.dataset)
SELECT row_idx, label, run_id, col_idx, dataset, {metric} AS metric, value,
       {best} AS best, ci_low, ci_high
FROM grid
ORDER BY row_idx, col_idx""".strip()


def check_spec(con: duckdb.DuckDBPyConnection, spec: TableSpec) -> None:
    """Fail clearly when the spec names runs, datasets, a label or a metric the DB lacks."""
    where = f"table spec '{spec.name}'"
    run_columns = [r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' "
        "ORDER BY ordinal_position").fetchall()]
    if spec.label not in run_columns:
        raise InputError(f"{where}: label {spec.label!r} is not a column of runs "
                         f"({', '.join(run_columns)})")
    metrics = {r[0] for r in con.execute("SELECT DISTINCT metric FROM evals").fetchall()}
    if spec.metric not in metrics:
        raise InputError(f"{where}: metric {spec.metric!r} not in the database "
                         f"(have: {', '.join(sorted(metrics)) or 'none'})")
    if spec.runs is not None:
        known = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
        missing = [r for r in spec.runs if r not in known]
        if missing:
            raise InputError(f"{where}: run(s) {', '.join(missing)} not in the database")
    if spec.datasets is not None:
        known = {r[0] for r in con.execute("SELECT DISTINCT dataset FROM evals").fetchall()}
        if _has_table(con, "evals_by_type"):
            known |= {r[0] for r in con.execute(
                "SELECT DISTINCT dataset || ':' || question_type FROM evals_by_type").fetchall()}
        missing = [d for d in spec.datasets if d not in known]
        if missing:
            raise InputError(f"{where}: dataset(s) {', '.join(missing)} not in the database")


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()[0])


@dataclass
class TableData:
    spec: TableSpec
    labels: list[str]
    run_ids: list[str]
    datasets: list[str]
    values: list[list[float | None]]  # [row][col]
    best: list[list[bool]]
    # the 95% bootstrap interval (low, high), where metrics.json gave one ([row][col])
    intervals: list[list[tuple[float, float] | None]] | None = None

    def cell(self, r: int, c: int, interval: bool = True) -> str:
        """The value, then its interval as stored: a percentile bootstrap is lopsided near 0 and
        1 (0.025 [0.000, 0.075]), which "± half-width" misstated (0.025 ± 0.037 reads as
        reaching below 0)."""
        v = self.values[r][c]
        if v is None:
            return MISSING
        ci = self.intervals[r][c] if self.intervals and interval else None
        p = self.spec.precision
        return f"{v:.{p}f}" if ci is None else f"{v:.{p}f} [{ci[0]:.{p}f}, {ci[1]:.{p}f}]"


def load_table(con: duckdb.DuckDBPyConnection, spec: TableSpec) -> TableData:
    check_spec(con, spec)
    with_ci = bool(con.execute("SELECT count(*) FROM information_schema.columns "
                               "WHERE table_name = 'evals' AND column_name = 'ci_low'").fetchone()[0])
    rows = con.execute(table_sql(spec, with_ci, _has_table(con, "evals_by_type"))).fetchall()
    labels: dict[int, str] = {}
    run_ids: dict[int, str] = {}
    datasets: dict[int, str] = {}
    cells: dict[tuple[int, int], tuple[float | None, bool, tuple[float, float] | None]] = {}
    for row_idx, label, run_id, col_idx, dataset, _metric, value, best, low, high in rows:
        labels[row_idx], run_ids[row_idx], datasets[col_idx] = label, run_id, dataset
        ci = (low, high) if value is not None and low is not None and high is not None else None
        cells[row_idx, col_idx] = (value, bool(best), ci)
    rs, cs = sorted(labels), sorted(datasets)
    return TableData(
        spec=spec,
        labels=[labels[r] if labels[r] is not None else "" for r in rs],
        run_ids=[run_ids[r] for r in rs],
        datasets=[datasets[c] for c in cs],
        values=[[cells[r, c][0] for c in cs] for r in rs],
        best=[[cells[r, c][1] for c in cs] for r in rs],
        intervals=[[cells[r, c][2] for c in cs] for r in rs],
    )


# --------------------------------------------------------------------------------------------
# renderers
# --------------------------------------------------------------------------------------------

def _md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "\n": " ",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters so `text` prints literally in text mode."""
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def _direction(spec: TableSpec) -> str:
    if spec.higher_is_better is None:
        return ""
    return ", higher is better" if spec.higher_is_better else ", lower is better"


def render_markdown(t: TableData) -> str:
    spec = t.spec
    head = [spec.label] + t.datasets
    lines = [
        f"**{_md_escape(spec.title)}** ({_md_escape(spec.metric)}{_direction(spec)}; "
        + ("" if spec.higher_is_better is None else "best per column in bold, ") + f"{MISSING} = missing)",
        "",
        "| " + " | ".join(_md_escape(h) for h in head) + " |",
        "|" + "|".join([":---"] + ["---:"] * len(t.datasets)) + "|",
    ]
    for r, label in enumerate(t.labels):
        cells = []
        for c in range(len(t.datasets)):
            text = t.cell(r, c)
            cells.append(f"**{text}**" if t.best[r][c] else text)
        lines.append("| " + " | ".join([_md_escape(label)] + cells) + " |")
    return "\n".join(lines) + "\n"


def render_csv(t: TableData) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([t.spec.label] + t.datasets)
    for r, label in enumerate(t.labels):
        writer.writerow([label] + [
            t.cell(r, c, interval=False) + (CSV_BEST_SUFFIX if t.best[r][c] else "")
            for c in range(len(t.datasets))
        ])
    return buf.getvalue()


def render_latex(t: TableData) -> str:
    spec = t.spec
    lines = [
        "% generated by ragrl (results tables); needs \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{latex_escape(spec.title)} ({latex_escape(spec.metric)}"
        f"{_direction(spec)})}}",
        f"\\label{{tab:{spec.name}}}",
        "\\begin{tabular}{l" + "r" * len(t.datasets) + "}",
        "\\toprule",
        " & ".join(latex_escape(h) for h in [spec.label] + t.datasets) + " \\\\",
        "\\midrule",
    ]
    for r, label in enumerate(t.labels):
        cells = []
        for c in range(len(t.datasets)):
            if t.values[r][c] is None:
                cells.append(LATEX_MISSING)
            else:
                text = t.cell(r, c)
                cells.append(f"\\textbf{{{text}}}" if t.best[r][c] else text)
        lines.append(" & ".join([latex_escape(label)] + cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def _default_metric(con: duckdb.DuckDBPyConnection) -> str:
    try:
        row = con.execute("SELECT value ->> '$' FROM meta WHERE key = 'main_metric'").fetchone()
    except duckdb.Error:
        row = None
    return row[0] if row and row[0] else "em"


def render_tables(db_path: str | os.PathLike, specs: Sequence[Mapping[str, Any]],
                  out_dir: str | os.PathLike) -> list[Path]:
    """Write `{name}.md`, `{name}.csv` and `{name}.tex` for each spec into `out_dir`.

    Returns the written paths (in spec order, md/csv/tex each). Every spec is checked and
    rendered before the first file is written, so a bad spec writes nothing.
    """
    out_dir = Path(out_dir)
    rendered = []
    for t in _load_specs(db_path, specs, load_table, "tables"):
        rendered += [
            (out_dir / f"{t.spec.name}.md", render_markdown(t)),
            (out_dir / f"{t.spec.name}.csv", render_csv(t)),
            (out_dir / f"{t.spec.name}.tex", render_latex(t)),
        ]
    return _write_all(rendered)


def _load_specs(db_path: str | os.PathLike, specs: Sequence[Mapping[str, Any]], load, what: str) -> list:
    """`load(con, spec)` for every checked spec, all before anything is written."""
    con = connect_read_only(db_path)
    try:
        default_metric = _default_metric(con)
        norm = [normalize_spec(s, default_metric=default_metric) for s in specs]
        names = [s.name for s in norm]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise InputError(f"table spec name(s) used more than once: {', '.join(dups)}")
        try:
            return [load(con, s) for s in norm]
        except duckdb.Error as exc:
            raise InputError(f"{db_path}: rendering {what} failed: {one_line(exc)}") from exc
    finally:
        con.close()


def _write_all(rendered: list[tuple[Path, str]]) -> list[Path]:
    for path, text in rendered:
        write_utf8(text, path)
    return [p for p, _ in rendered]


# --------------------------------------------------------------------------------------------
# paired differences next to each table
# --------------------------------------------------------------------------------------------

DELTA_COLUMNS = ("run_id", "baseline", "relation", "dataset", "n", "mean_run", "mean_baseline", "diff",
                 "ci_low", "ci_high")


@dataclass
class DeltaData:
    spec: TableSpec
    pairs: list[tuple[str, str, str]]  # (run, baseline, relation), in the table's row order
    datasets: list[str]
    cells: dict[tuple[str, str, str], tuple]  # (run, baseline, dataset) -> DELTA_COLUMNS row
    bootstrap: dict[str, Any]
    # whether any run of the table has the metric per question (predictions); without it no
    # pair can be compared, however the runs are related
    per_question: bool = True


def load_delta(con: duckdb.DuckDBPyConnection, spec: TableSpec) -> DeltaData:
    """The `paired` rows of a table: its metric, pairs of two of its runs, its datasets."""
    if not _has_table(con, "paired"):
        raise InputError(f"table spec '{spec.name}': the database has no paired table (built before paired "
                         "comparisons existed); rebuild it")
    rows = con.execute(f"SELECT {', '.join(DELTA_COLUMNS)} FROM paired WHERE metric = ? ORDER BY rowid",
                       [spec.metric]).fetchall()
    listed = {r: i for i, r in enumerate(spec.runs)} if spec.runs is not None else None
    rows = [r for r in rows if listed is None or (r[0] in listed and r[1] in listed)]
    datasets = list(spec.datasets) if spec.datasets is not None else sorted({r[3] for r in rows if ":" not in r[3]})
    rows = [r for r in rows if r[3] in datasets]
    pairs = list(dict.fromkeys((r[0], r[1], r[2]) for r in rows))
    if listed is not None:
        pairs.sort(key=lambda p: (listed[p[0]], listed[p[1]]))
    (bootstrap,) = con.execute("SELECT value FROM meta WHERE key = 'paired_bootstrap'").fetchone() or ("{}",)
    return DeltaData(spec, pairs, datasets, {(r[0], r[1], r[3]): r for r in rows}, json.loads(bootstrap),
                     pairs != [] or _has_per_question_values(con, spec))


def _has_per_question_values(con: duckdb.DuckDBPyConnection, spec: TableSpec) -> bool:
    """Does any run of the table have a value of its metric for some question? (graph-rank's
    recall, for one, is in metrics.json only.)"""
    if not _has_table(con, "predictions"):
        return False
    columns = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                         "WHERE table_name = 'predictions'").fetchall()}
    if spec.metric not in columns:
        return False
    runs = "" if spec.runs is None else " WHERE run_id IN (SELECT unnest(?))"
    (count,) = con.execute(f"SELECT count({quote_ident(spec.metric)}) FROM predictions{runs}",
                           [] if spec.runs is None else [list(spec.runs)]).fetchone()
    return count > 0


def _delta_cell(row: tuple | None, precision: int) -> str:
    if row is None:
        return MISSING
    n, diff, low, high = row[4], row[7], row[8], row[9]
    text = f"{diff:+.{precision}f} [{low:+.{precision}f}, {high:+.{precision}f}] (n={n})"
    return f"**{text}**" if low > 0 or high < 0 else text


def render_delta_markdown(d: DeltaData) -> str:
    spec, b = d.spec, d.bootstrap
    how = (f"95% paired bootstrap interval, {b['resamples']:,} resamples of the questions, seed {b['seed']}"
           if b else "95% paired bootstrap interval")
    lines = [
        f"**{_md_escape(spec.title)}: paired differences** ({_md_escape(spec.metric)}{_direction(spec)}; "
        f"run − baseline, mean over the n questions both answered; {how}; bold: interval clear of 0; "
        f"{MISSING} = no shared questions)",
        "",
    ]
    if not d.pairs:
        why = ("No two runs of this table are a compared pair." if d.per_question else
               f"No paired differences: no run of this table has {_md_escape(spec.metric)} per question "
               "(its evaluation wrote the mean only), so no pair could be compared.")
        return "\n".join(lines + [why, ""])
    lines += [
        "| " + " | ".join(["run", "baseline", "relation"] + [_md_escape(ds) for ds in d.datasets]) + " |",
        "|" + "|".join([":---"] * 3 + ["---:"] * len(d.datasets)) + "|",
    ]
    for run, baseline, relation in d.pairs:
        cells = [_delta_cell(d.cells.get((run, baseline, ds)), spec.precision) for ds in d.datasets]
        lines.append("| " + " | ".join([_md_escape(run), _md_escape(baseline), _md_escape(relation)] + cells) + " |")
    return "\n".join(lines) + "\n"


def render_delta_csv(d: DeltaData) -> str:
    """Long format: one line per pair and dataset with values (DELTA_COLUMNS), full precision."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(DELTA_COLUMNS)
    for run, baseline, _ in d.pairs:
        for ds in d.datasets:
            row = d.cells.get((run, baseline, ds))
            if row is not None:
                writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def render_delta_tables(db_path: str | os.PathLike, specs: Sequence[Mapping[str, Any]],
                        out_dir: str | os.PathLike) -> list[Path]:
    """Write `{name}_delta.md` and `{name}_delta.csv` for each spec: the paired differences
    (`paired` table) between two runs of the table, in its metric, per dataset column."""
    out_dir = Path(out_dir)
    rendered = []
    for d in _load_specs(db_path, specs, load_delta, "delta tables"):
        rendered += [(out_dir / f"{d.spec.name}_delta.md", render_delta_markdown(d)),
                     (out_dir / f"{d.spec.name}_delta.csv", render_delta_csv(d))]
    return _write_all(rendered)
