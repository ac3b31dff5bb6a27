"""AutoGraph-R1's benchmark stage: a corpus-level KG (built from text by a constructor, or a gold
KG) as a passage index. The HippoRAG-2 PPR retriever (`ragrl.kg.text_graph.GraphRetriever`) ranks
the corpus' passages for every question of a QA set; the stage writes

* `ranking.parquet`: id, passage_ids (best first, the top `keep`), scores; the input of the
  reader run (`ragrl.retrieval.oracle.RankingRetriever`, a search agent whose every search gets
  its question's ranked passages);
* `metrics.json` in the evaluation format (`ragrl.eval.evaluate.summarize`): recall@2 / recall@5
  of the supporting passages with 95% bootstrap intervals, per question type too, and the share of
  questions the graph ranks nothing for (no triple links them to any passage).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa

from ragrl.data.qa import read_qa_rows
from ragrl.errors import InputError
from ragrl.eval.evaluate import question_type, summarize, write_metrics
from ragrl.io import read_columns, write_parquet
from ragrl.kg.extraction import Triple

RECALL_KS = (2, 5)
COLUMNS = tuple(f"recall@{k}" for k in RECALL_KS) + ("unranked",)
RANKING_SCHEMA = pa.schema([("id", pa.string()), ("passage_ids", pa.list_(pa.string())),
                            ("scores", pa.list_(pa.float64()))])


def corpus_graph(triples_path: str | Path, passages_path: str | Path):
    """The graph of a KG whose triples name their passage (`source_id`); every passage of the
    corpus is a node, so one no triple came from counts as unreachable, not as absent."""
    from ragrl.kg.text_graph import build_graph

    by_passage: dict[str, list[Triple]] = {str(p): [] for p in read_columns(passages_path, ["id"]).column("id").to_pylist()}
    rows = read_columns(triples_path, ["head", "relation", "tail", "source_id"]).to_pylist()
    unknown = sorted({str(r["source_id"]) for r in rows} - set(by_passage))
    if unknown:
        raise InputError(f"{triples_path}: source_id(s) {unknown[:5]} are not passages of {passages_path}")
    for r in rows:
        by_passage[str(r["source_id"])].append(Triple(str(r["head"]), str(r["relation"]), str(r["tail"])))
    return build_graph(by_passage.items())


def graph_rank(triples: str | Path, passages: str | Path, qa: str | Path, out_dir: str | Path, *, run_id: str,
               dataset: str, embed, top_triples: int = 10, keep: int = 20, max_questions: int | None = None) -> dict:
    from ragrl.kg.text_graph import GraphRetriever
    from ragrl.progress import progress
    from ragrl.rewards.autograph import recall_at_k

    graph = corpus_graph(triples, passages)
    print(f"[graph-rank] {run_id}: {len(graph.entities)} entities, {len(graph.passages)} passages, "
          f"{len(graph.triples)} triples", file=sys.stderr, flush=True)
    rows = read_qa_rows(qa, max_questions or None, columns=("metadata",), required=("supporting_ids",))
    if not any(row["supporting_ids"] for row in rows):
        raise InputError(f"{qa}: no question has supporting_ids; recall cannot be measured")
    retriever = GraphRetriever(graph, embed, top_triples)
    records, ranking, reasons = [], [], {}
    for row in progress(rows, desc=f"graph-rank {run_id}/{dataset}", unit="question"):
        ranked = retriever.rank(str(row["question"]))
        if ranked.reason:
            reasons[ranked.reason] = reasons.get(ranked.reason, 0) + 1
        gold = [str(s) for s in row["supporting_ids"] or []]
        # A question without supporting passages has no recall (left out of the mean, as the
        # retrieval evaluation leaves it out), not a recall of 0.
        records.append({**{f"recall@{k}": recall_at_k(ranked.passage_ids, gold, k) if gold else None
                           for k in RECALL_KS},
                        "unranked": float(not ranked.passage_ids), "question_type": question_type(row)})
        ranking.append({"id": str(row["id"]), "passage_ids": list(ranked.passage_ids[:keep]),
                        "scores": list(ranked.scores[:keep])})
    metrics = summarize(records, run_id, dataset, COLUMNS)
    metrics["graph"] = {"entities": len(graph.entities), "passages": len(graph.passages),
                        "triples": len(graph.triples), "empty_reasons": reasons}
    out = Path(out_dir)
    write_parquet(pa.Table.from_pylist(ranking, schema=RANKING_SCHEMA), out / "ranking.parquet")
    metrics = write_metrics(metrics, out / "metrics.json")
    shown = " ".join(f"{k}={metrics['metrics'][k]:.4f}" for k in COLUMNS if metrics["metrics"][k] is not None)
    print(f"[graph-rank] {run_id}/{dataset}: n={metrics['n']} {shown}", file=sys.stderr, flush=True)
    return metrics
