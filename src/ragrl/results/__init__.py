"""The results database and what is made from it: benchmark tables, plots, ad-hoc queries.

* `build_database` (database.py) collects run manifests, metrics, predictions, training logs and
  Snakemake benchmark files into one DuckDB file, atomically.
* `render_tables` (tables.py) writes Markdown / CSV / LaTeX benchmark tables from table specs,
  `render_delta_tables` each table's paired differences.
* `paired` (paired.py): which runs a reader compares (from their lineage) and the paired bootstrap
  of their per-question differences (the database's `paired` table).
* `plot_training`, `plot_reward_curves`, `plot_metrics`, `plot_paired`, `plot_families` (plots.py)
  draw PNG figures (matplotlib is imported lazily).
* `query` (query.py) runs read-only SQL and prints or writes the result.
"""

from __future__ import annotations

from ragrl.results.database import build_database
from ragrl.results.plots import plot_families, plot_metrics, plot_paired, plot_reward_curves, plot_training
from ragrl.results.query import query, quote_ident, sql_literal
from ragrl.results.tables import render_delta_tables, render_tables

__all__ = [
    "build_database",
    "plot_families",
    "plot_metrics",
    "plot_paired",
    "plot_reward_curves",
    "plot_training",
    "query",
    "quote_ident",
    "render_delta_tables",
    "render_tables",
    "sql_literal",
]
