"""Benchmark tables rendered from a hand-made results database, parsed back and checked."""

from __future__ import annotations

import csv
import io
import re
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.results.tables import latex_escape, render_tables

SPECIAL = "a_b%c&d#e"
RUN_META = {SPECIAL: "search_r1", "plain": "r1_searcher", "third": "base"}
# (run, dataset, metric) -> value; third x triviaqa is missing.
VALUES = {
    (SPECIAL, "nq", "em"): 0.41234, (SPECIAL, "hotpotqa", "em"): 0.3005,
    (SPECIAL, "triviaqa", "em"): 0.6,
    ("plain", "nq", "em"): 0.45678, ("plain", "hotpotqa", "em"): 0.2999,
    ("plain", "triviaqa", "em"): 0.55,
    ("third", "nq", "em"): 0.1, ("third", "hotpotqa", "em"): 0.3005,
    (SPECIAL, "nq", "latency"): 2.5, ("plain", "nq", "latency"): 1.25,
    ("third", "nq", "latency"): 3.0,
}


def make_db(path: Path, runs: dict[str, str], values: dict[tuple[str, str, str], float | None]
            ) -> Path:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs (run_id VARCHAR, recipe VARCHAR, model VARCHAR, "
                "stage VARCHAR)")
    con.execute("CREATE TABLE evals (run_id VARCHAR, dataset VARCHAR, metric VARCHAR, "
                "value DOUBLE, n BIGINT)")
    con.executemany("INSERT INTO runs VALUES (?, ?, 'tiny', 'rl')",
                    [[r, m] for r, m in runs.items()])
    con.executemany("INSERT INTO evals VALUES (?, ?, ?, ?, 10)",
                    [[r, d, m, v] for (r, d, m), v in values.items()])
    con.close()
    return path


@pytest.fixture
def db(tmp_path) -> Path:
    return make_db(tmp_path / "hand.duckdb", RUN_META, VALUES)


# ---- parsers for the three formats ---------------------------------------------------------

def parse_markdown(text: str) -> tuple[list[str], list[list[str]]]:
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    split = [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in rows]
    header, body = split[0], split[2:]
    assert all(re.fullmatch(r":?-+:?", c) for c in split[1])
    return header, body


def parse_csv(text: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(text)))
    return rows[0], rows[1:]


def parse_latex(text: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines()
    top, mid, bottom = lines.index("\\toprule"), lines.index("\\midrule"), lines.index(
        "\\bottomrule")
    assert mid == top + 2

    def cells(line: str) -> list[str]:
        assert line.endswith(" \\\\")
        return line[: -len(" \\\\")].split(" & ")

    return cells(lines[top + 1]), [cells(ln) for ln in lines[mid + 1: bottom]]


def cell_value(fmt: str, cell: str) -> tuple[float | None, bool]:
    """(number, marked best) from a rendered cell; None for a missing cell."""
    if fmt == "md":
        best = cell.startswith("**") and cell.endswith("**")
        cell = cell.strip("*") if best else cell
        missing = "–"
    elif fmt == "csv":
        best = cell.endswith("*")
        cell = cell[:-1] if best else cell
        missing = "–"
    else:
        m = re.fullmatch(r"\\textbf\{(.*)\}", cell)
        best = m is not None
        cell = m.group(1) if m else cell
        missing = "--"
    if cell == missing:
        assert not best
        return None, False
    return float(cell), best


def check_rendered(out_dir: Path, name: str, con, metric: str, runs: list[str],
                   datasets: list[str], precision: int, higher: bool,
                   labels: list[str] | None = None) -> None:
    db_values = {(r, d): v for r, d, v in con.execute(
        "SELECT run_id, dataset, value FROM evals WHERE metric = ?", [metric]).fetchall()}
    parsers = {"md": parse_markdown, "csv": parse_csv, "tex": parse_latex}
    for fmt, parse in parsers.items():
        header, body = parse((out_dir / f"{name}.{fmt}").read_text(encoding="utf-8"))
        assert header[1:] == [latex_escape(d) if fmt == "tex" else d for d in datasets]
        want_labels = labels or runs
        got_labels = [r[0] for r in body]
        assert got_labels == [latex_escape(x) if fmt == "tex" else x for x in want_labels]
        for c, ds in enumerate(datasets):
            present = [db_values[r, ds] for r in runs if db_values.get((r, ds)) is not None]
            best_value = (max if higher else min)(present) if present else None
            for r, run in enumerate(runs):
                number, best = cell_value(fmt, body[r][c + 1])
                stored = db_values.get((run, ds))
                if stored is None:
                    assert number is None, (fmt, run, ds)
                    continue
                assert body[r][c + 1].strip("*").replace("\\textbf{", "").rstrip("}") == \
                    f"{stored:.{precision}f}", (fmt, run, ds)
                assert number == pytest.approx(stored, abs=0.5 * 10 ** -precision + 1e-12)
                assert best == (stored == best_value), (fmt, run, ds)


# ---- tests ------------------------------------------------------------------------------------

def test_table_numbers_and_best_cells_match_db(db, tmp_path):
    runs, datasets = ["plain", SPECIAL, "third"], ["nq", "hotpotqa", "triviaqa"]
    paths = render_tables(db, [{"name": "main", "title": "Main & more", "runs": runs,
                                "datasets": datasets, "metric": "em", "precision": 3}],
                          tmp_path / "tables")
    assert [p.name for p in paths] == ["main.md", "main.csv", "main.tex"]
    con = duckdb.connect(str(db), read_only=True)
    check_rendered(tmp_path / "tables", "main", con, "em", runs, datasets, 3, True)
    # hotpotqa has a tie at the top (0.3005 twice): both are bold.
    md = (tmp_path / "tables" / "main.md").read_text(encoding="utf-8")
    assert md.count("**0.300**") == 1 + 1  # the 0.3005 tie; 0.2999 (also 0.300) is not marked
    assert "| plain | **0.457** | 0.300 | 0.550 |" in md
    assert "| third | 0.100 | **0.300** | – |" in md
    con.close()


def test_a_cell_shows_its_interval_as_stored_not_a_half_width(tmp_path):
    # A percentile bootstrap near 0 is lopsided: 0.025 [0.000, 0.075] must not read 0.025 ± 0.037
    # (down to -0.012). The CSV keeps the number alone, as its contract says.
    path = tmp_path / "ci.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs (run_id VARCHAR, recipe VARCHAR, model VARCHAR, stage VARCHAR)")
    con.execute("CREATE TABLE evals (run_id VARCHAR, dataset VARCHAR, metric VARCHAR, value DOUBLE, n BIGINT, "
                "ci_low DOUBLE, ci_high DOUBLE)")
    con.executemany("INSERT INTO runs VALUES (?, ?, 'tiny', 'rl')", [["a", "search_r1"], ["b", "rag_r1"]])
    con.executemany("INSERT INTO evals VALUES (?, 'bridge', 'em', ?, 40, ?, ?)",
                    [["a", 0.025, 0.0, 0.075], ["b", 0.2, None, None]])
    con.close()
    render_tables(path, [{"name": "t", "runs": ["a", "b"], "precision": 3}], tmp_path / "out")
    md = (tmp_path / "out/t.md").read_text(encoding="utf-8")
    assert "| a | 0.025 [0.000, 0.075] |" in md and "| b | **0.200** |" in md
    assert parse_csv((tmp_path / "out/t.csv").read_text(encoding="utf-8"))[1] == [["a", "0.025"], ["b", "0.200*"]]
    assert "a & 0.025 [0.000, 0.075] \\\\" in (tmp_path / "out/t.tex").read_text(encoding="utf-8")


def test_lower_is_better_marks_minimum(db, tmp_path):
    render_tables(db, [{"name": "lat", "metric": "latency", "higher_is_better": False,
                        "precision": 2}], tmp_path)
    con = duckdb.connect(str(db), read_only=True)
    check_rendered(tmp_path, "lat", con, "latency", sorted(RUN_META), ["nq"], 2, False)
    rows = parse_csv((tmp_path / "lat.csv").read_text(encoding="utf-8"))[1]
    assert [r[1] for r in rows] == ["2.50", "1.25*", "3.00"]
    con.close()


def test_defaults_and_label_column(db, tmp_path):
    # default runs / datasets: every run and dataset with the metric, sorted; label from runs.
    render_tables(db, [{"name": "by_recipe", "label": "recipe", "precision": 1}], tmp_path)
    header, body = parse_csv((tmp_path / "by_recipe.csv").read_text(encoding="utf-8"))
    assert header == ["recipe", "hotpotqa", "nq", "triviaqa"]
    assert [r[0] for r in body] == ["search_r1", "r1_searcher", "base"]  # a_b%..., plain, third
    con = duckdb.connect(str(db), read_only=True)
    check_rendered(tmp_path, "by_recipe", con, "em", sorted(RUN_META),
                   ["hotpotqa", "nq", "triviaqa"], 1, True,
                   labels=[RUN_META[r] for r in sorted(RUN_META)])
    con.close()


def test_latex_escaping(db, tmp_path):
    render_tables(db, [{"name": "t", "title": "50% of R&D #1_x", "runs": [SPECIAL]}], tmp_path)
    tex = (tmp_path / "t.tex").read_text(encoding="utf-8")
    assert r"a\_b\%c\&d\#e &" in tex
    assert r"\caption{50\% of R\&D \#1\_x" in tex
    assert SPECIAL not in tex
    assert latex_escape(r"\ {x} ~ ^ $") == (
        r"\textbackslash{} \{x\} \textasciitilde{} \textasciicircum{} \$")


@pytest.mark.parametrize("spec, pattern", [
    ({"name": "x", "runs": ["nobody"]}, r"run\(s\) nobody not in the database"),
    ({"name": "x", "datasets": ["squad"]}, r"dataset\(s\) squad not in the database"),
    ({"name": "x", "metric": "bleu"}, r"metric 'bleu' not in the database"),
    ({"name": "x", "label": "colour"}, r"label 'colour' is not a column of runs"),
    ({"name": "x", "higher_is_beter": False}, r"unknown key\(s\) higher_is_beter"),
    ({"name": "../x"}, r"must match"),
    ({"name": "x", "runs": ["plain", "plain"]}, r"lists plain more than once"),
])
def test_bad_specs_write_nothing(db, tmp_path, spec, pattern):
    with pytest.raises(ValueError, match=pattern):
        render_tables(db, [{"name": "ok"}, spec], tmp_path / "out")
    assert not (tmp_path / "out").exists()


@settings(max_examples=25, deadline=None)
@given(
    grid=st.lists(st.lists(st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)),
                           min_size=2, max_size=2), min_size=1, max_size=3),
    precision=st.integers(0, 4),
    higher=st.booleans(),
)
def test_random_grids_round_trip(grid, precision, higher):
    runs = [f"run_{i}" for i in range(len(grid))]
    values = {(runs[i], ds, "em"): v for i, row in enumerate(grid)
              for ds, v in zip(["d0", "d1"], row) if v is not None}
    values[("run_0", "d0", "em")] = values.get(("run_0", "d0", "em"), 0.0)  # metric must exist
    values.setdefault(("run_0", "d1", "em"), 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        db = make_db(Path(tmp) / "g.duckdb", {r: "x" for r in runs}, values)
        render_tables(db, [{"name": "g", "runs": runs, "datasets": ["d0", "d1"],
                            "precision": precision, "higher_is_better": higher}], tmp)
        con = duckdb.connect(str(db), read_only=True)
        check_rendered(Path(tmp), "g", con, "em", runs, ["d0", "d1"], precision, higher)
        con.close()


def test_neither_direction_marks_no_best_and_claims_none(db, tmp_path):
    # Issue 18 F12: a count of searches is neither better high nor low.
    render_tables(db, [{"name": "n", "metric": "latency", "higher_is_better": None}], tmp_path)
    md = (tmp_path / "n.md").read_text(encoding="utf-8")
    assert "better" not in md and "**" not in md.split("\n", 1)[1]
    assert "better" not in (tmp_path / "n.tex").read_text(encoding="utf-8")
    rows = parse_csv((tmp_path / "n.csv").read_text(encoding="utf-8"))[1]
    assert not any(cell.endswith("*") for row in rows for cell in row[1:])


def test_default_config_does_not_call_more_searches_better():
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "config/config.yaml").read_text())
    searches = [t for t in config["results"]["tables"] if t.get("metric") == "searches"]
    assert searches and all("higher_is_better" in t and t["higher_is_better"] is None for t in searches)
