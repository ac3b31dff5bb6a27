"""Oracle retrieval: the upper bound of a search agent's table row.

Every query of a question gets that question's supporting passages (the QA contract's
`supporting_ids`), so the row shows what a policy does with perfect evidence; the gap to its
real-retriever row is what retrieval costs it. The passages are ranked by word overlap with the
query, title words counting double (the hop a query asks about comes first), then cut to top-k like any retriever's hits.

With a `fill` retriever (the run's own), a query whose question has fewer supporting passages
than top-k gets the rest from it, gold first and no passage twice: a policy trained on top-k
passages per search is then shown top-k, as always. Without it a 1-hop question's searches came
back with one passage instead of two, and the toy's RAG-R1 policy scored below its own
real-retriever row (0.23 against 0.27 EM, 1-hop 0.50); with it, 0.30 (1-hop 0.675).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ragrl.errors import InputError
from ragrl.io import read_columns
from ragrl.retrieval import Hit

_WORD = re.compile(r"\w+")


class OracleRetriever:
    """`search_for(queries, topk, sample_ids)`: the supporting passages of each query's question."""

    def __init__(self, passages: str | Path, qa: str | Path, fill=None) -> None:
        self.supporting = _ids_by_question(qa, "supporting_ids")
        self.passages = _passages_named(passages, self.supporting, f"{qa}: supporting passage")
        self.fill = fill  # anything with search(queries, topk) -> hits, or None

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        raise ValueError("oracle retrieval answers a query from its question's supporting passages, so it "
                         "needs the question of each query (search_for with sample ids)")

    def search_for(self, queries: Sequence[str], topk: int, sample_ids: Sequence[str | None]) -> list[list[Hit]]:
        gold = [self._hits(q, sid, topk) for q, sid in zip(queries, sample_ids, strict=True)]
        short = [i for i, hits in enumerate(gold) if len(hits) < topk]
        if self.fill is None or not short:
            return gold
        # Enough candidates that top-k remain after the gold ones are dropped from them.
        found = self.fill.search([queries[i] for i in short], 2 * topk)
        for i, candidates in zip(short, found, strict=True):
            seen = {h.id for h in gold[i]}
            extra = [h for h in candidates if str(h.id) not in seen]
            gold[i] = gold[i] + extra[: topk - len(gold[i])]
        return gold

    def _hits(self, query: str, sample_id: str | None, topk: int) -> list[Hit]:
        ids = self.supporting.get(str(sample_id), []) if sample_id is not None else []
        words = set(_WORD.findall(query.lower()))
        # Title words count twice: a query names the entity whose page it wants.
        scored = [(2 * len(words & set(_WORD.findall(p["title"].lower())))
                   + len(words & set(_WORD.findall(p["text"].lower()))), -k, p)
                  for k, p in enumerate(self.passages[i] for i in ids)]
        scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
        return [Hit(str(p["id"]), str(p["title"]), str(p["text"]), float(score)) for score, _, p in scored[:topk]]


class RankingRetriever:
    """`search_for(queries, topk, sample_ids)`: each question's passages as a ranking file orders
    them (`ranking.parquet`: id, passage_ids best first), whatever the query: a reader given a
    fixed retriever's top passages (AutoGraph-R1's graph-RAG benchmark: the PPR ranking over a
    constructed KG, `ragrl.stages.graph_rag`)."""

    def __init__(self, passages: str | Path, ranking: str | Path) -> None:
        self.ranked = _ids_by_question(ranking, "passage_ids")
        self.passages = _passages_named(passages, self.ranked, f"{ranking}: passage")

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        raise ValueError("a ranking retriever answers a query from its question's ranking, so it needs the "
                         "question of each query (search_for with sample ids)")

    def search_for(self, queries: Sequence[str], topk: int, sample_ids: Sequence[str | None]) -> list[list[Hit]]:
        out = []
        for _, sid in zip(queries, sample_ids, strict=True):
            ids = self.ranked.get(str(sid), []) if sid is not None else []
            out.append([Hit(i, str(self.passages[i]["title"]), str(self.passages[i]["text"]), float(-k))
                        for k, i in enumerate(ids[:topk])])
        return out


def _ids_by_question(path: str | Path, column: str) -> dict[str, list[str]]:
    """question id -> the passage ids a file's `column` lists for it, in order."""
    return {str(r["id"]): [str(i) for i in (r[column] or [])] for r in read_columns(path, ["id", column]).to_pylist()}


def _passages_named(passages: str | Path, ids_by_question: dict[str, list[str]], what: str) -> dict[str, dict]:
    """The passages (id, title, text) the lists name; an id not in `passages` is an error."""
    wanted = {i for ids in ids_by_question.values() for i in ids}
    table = read_columns(passages, ["id", "title", "text"]).to_pylist()
    found = {str(p["id"]): p for p in table if str(p["id"]) in wanted}
    missing = sorted(wanted - set(found))
    if missing:
        raise InputError(f"{what} id(s) {', '.join(missing[:5])} not in {passages}")
    return found
