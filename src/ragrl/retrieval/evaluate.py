"""Retrieval quality on QA sets: how often the supporting passages are in the top k.

Multi-hop questions need every supporting passage, so besides recall@k (the share of supporting
passages found) we report hit@k (at least one) and all@k (every one): an agent that searches once
is bounded by all@k, an agent that searches per hop by hit@k per hop.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ragrl.errors import InputError
from ragrl.io import read_columns, write_json, write_text
from ragrl.progress import progress


def support_scores(retrieved: Sequence[str], supporting: Sequence[str], k: int) -> dict[str, float]:
    """recall, hit and all at k for one question (pure; `supporting` must be non-empty)."""
    top = set(retrieved[:k])
    found = sum(1 for s in set(supporting) if s in top)
    total = len(set(supporting))
    return {"recall": found / total, "hit": float(found > 0), "all": float(found == total)}


def evaluate_retrieval(searcher, qa_path: str | Path, ks: Sequence[int], batch_size: int = 64) -> list[dict]:
    """Mean recall/hit/all at each k over the questions of `qa_path` that have supporting ids."""
    table = read_columns(qa_path, ["question", "supporting_ids"]).to_pydict()
    items = [(q, s) for q, s in zip(table["question"], table["supporting_ids"]) if s]
    if not items:
        raise InputError(f"{qa_path}: no question has supporting_ids; recall cannot be measured")
    kmax = max(ks)
    sums = {k: {"recall": 0.0, "hit": 0.0, "all": 0.0} for k in ks}
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    for batch in progress(batches, desc=f"retrieval eval {Path(qa_path).name}", unit="batch"):
        hits = searcher.search([q for q, _ in batch], kmax)
        for (_, supporting), ranked in zip(batch, hits):
            ids = [h.id for h in ranked]
            for k in ks:
                for name, value in support_scores(ids, supporting, k).items():
                    sums[k][name] += value
    n = len(items)
    return [{"k": k, "n": n, **{name: total / n for name, total in sums[k].items()}} for k in ks]


def write_recall_report(rows: list[dict], out_json: str | Path) -> None:
    write_json({"rows": rows}, out_json)


def recall_table(reports: Sequence[str | Path], out_md: str | Path, out_csv: str | Path) -> pl.DataFrame:
    """Collect per-retriever reports into one table: rows retriever × dataset, columns metric@k."""
    import json

    rows = []
    for path in reports:
        rows += json.loads(Path(path).read_text())["rows"]
    df = pl.DataFrame(rows)
    wide = (
        df.unpivot(index=["retriever", "dataset", "k"], on=["recall", "hit", "all"], variable_name="metric")
        .with_columns(pl.format("{}@{}", pl.col("metric"), pl.col("k")).alias("column"))
        .pivot(on="column", index=["retriever", "dataset"], values="value", sort_columns=False)
        .sort(["dataset", "retriever"])
    )
    write_text(wide.write_csv(), out_csv)
    header = "| " + " | ".join(wide.columns) + " |"
    rule = "|" + "|".join("---" for _ in wide.columns) + "|"
    lines = [header, rule]
    for rec in wide.iter_rows():
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in rec) + " |")
    write_text("\n".join(lines) + "\n", out_md)
    return wide
