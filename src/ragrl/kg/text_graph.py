"""A graph built from extracted triples, and AutoGraph-R1's two frozen retrievers over it.

Nodes: one per entity (subjects and objects, identified by `extraction.fold` of the name, shown by
the first spelling seen) and one per passage. Edges: each unique (subject, relation, object)
triple links two entity nodes; each entity has a "source" edge to every passage a triple naming
it was extracted from (HippoRAG 2's passage nodes; the entity → passage direction is the
bookkeeping, the walk treats every edge as undirected, as HippoRAG 2's igraph graph does).

- Subgraph retriever (R_C, "graph as knowledge carrier"): seed entities are the nodes whose name
  occurs in the question (AutoGraph-R1 asks an LLM for the question's entities, then matches them
  by name or, failing that, by embedding; `seed_entities` matches names directly and falls back
  to the embedding when no name matches), then an undirected BFS up to `hops` (3) collects the
  triples around them.
- PPR passage retriever (R_I, "graph as knowledge index", HippoRAG 2): embed every triple, take
  the question's top-10 triples, personalise their head and tail nodes by the mean score of the
  top triples naming them, run personalised PageRank (damping 0.85) on a scipy sparse matrix and
  rank passages by their PageRank mass. `rank_passages_autograph` is the same idea as AutoGraph-R1's
  code runs it (a directed graph, min-max-normalised seeds, networkx): its paper config's.

Embedders are plain callables `texts -> array [n, d]` with L2-normalised rows
(`ragrl.retrieval.encoder.Encoder.encode_queries` is one), so tests pass hand-made vectors.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ragrl.kg.extraction import Triple, fold, unique_triples

log = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], np.ndarray]

PPR_DAMPING = 0.85  # HippoRAG 2 and AutoGraph-R1
TOP_TRIPLES = 10  # AutoGraph-R1's HippoRAG-2 retriever: top-10 triples seed the walk
SUBGRAPH_HOPS = 3  # AutoGraph-R1's subgraph retriever, num_hop
_WORD_RE = re.compile(r"\w+")
_MAX_NAME_WORDS = 12  # longer "names" are sentences; they are nodes but never seeds by name


def name_key(name: str) -> str:
    """Names compared word by word: "Daifan H. Jaitheam" and "daifan h jaitheam" are one key."""
    return " ".join(_WORD_RE.findall(fold(name)))


@dataclass(frozen=True, eq=False)
class TextGraph:
    entities: tuple[str, ...]  # display name per entity node id
    passages: tuple[str, ...]  # passage ids; passage p is node len(entities) + p
    triples: tuple[Triple, ...]  # unique relation triples
    heads: np.ndarray  # int64 entity id of each triple's subject
    tails: np.ndarray  # int64 entity id of each triple's object
    source_entity: np.ndarray  # int64, one per unique (entity, passage) source edge
    source_passage: np.ndarray  # int64 passage index
    _ids: Mapping[str, int] = field(repr=False)

    @property
    def n_nodes(self) -> int:
        return len(self.entities) + len(self.passages)

    def entity_id(self, name: str) -> int | None:
        return self._ids.get(fold(name))

    @cached_property
    def _by_words(self) -> dict[str, list[int]]:
        index: dict[str, list[int]] = {}
        for i, name in enumerate(self.entities):
            key = name_key(name)
            if key and len(key.split()) <= _MAX_NAME_WORDS:
                index.setdefault(key, []).append(i)
        return index

    @cached_property
    def _neighbours(self) -> list[list[tuple[int, int]]]:
        """Undirected entity adjacency: (neighbour, triple index) per entity."""
        adj: list[list[tuple[int, int]]] = [[] for _ in self.entities]
        for t, (h, o) in enumerate(zip(self.heads.tolist(), self.tails.tolist())):
            adj[h].append((o, t))
            if o != h:
                adj[o].append((h, t))
        return adj


def build_graph(docs: Iterable[tuple[str, Sequence[Triple]]]) -> TextGraph:
    """The graph of (passage id, triples extracted from it) pairs; repeated triples count once,
    a passage listed twice is one node."""
    ids: dict[str, int] = {}
    names: list[str] = []
    passages: list[str] = []
    passage_ids: dict[str, int] = {}
    sources: set[tuple[int, int]] = set()
    per_doc: list[tuple[int, list[Triple]]] = []
    for pid, triples in docs:
        if pid not in passage_ids:
            passage_ids[pid] = len(passages)
            passages.append(pid)
        per_doc.append((passage_ids[pid], list(triples)))

    def node(name: str) -> int:
        key = fold(name)
        if key not in ids:
            ids[key] = len(names)
            names.append(name)
        return ids[key]

    for p, triples in per_doc:
        for t in triples:
            sources.add((node(t.subject), p))
            sources.add((node(t.object), p))
    unique = unique_triples(t for _, ts in per_doc for t in ts)
    heads = np.array([ids[fold(t.subject)] for t in unique], dtype=np.int64)
    tails = np.array([ids[fold(t.object)] for t in unique], dtype=np.int64)
    src = sorted(sources)
    return TextGraph(tuple(names), tuple(passages), tuple(unique), heads, tails,
                     np.array([e for e, _ in src], dtype=np.int64), np.array([p for _, p in src], dtype=np.int64),
                     ids)


# --------------------------------------------------------------------------- subgraph retriever


def name_matches(graph: TextGraph, text: str) -> list[int]:
    """Entity nodes whose name occurs in `text` as a whole run of words, in order of first occurrence."""
    words = _WORD_RE.findall(fold(text))
    found: list[int] = []
    index = graph._by_words
    for start in range(len(words)):
        for n in range(1, min(_MAX_NAME_WORDS, len(words) - start) + 1):
            for e in index.get(" ".join(words[start:start + n]), ()):
                if e not in found:
                    found.append(e)
    return found


def seed_entities(graph: TextGraph, question: str, embed: Embedder | None = None, fallback_k: int = 3) -> list[int]:
    """The question's entities in the graph: by name; when none matches and an embedder is given,
    the `fallback_k` entity names nearest to the question (AutoGraph-R1 takes num_hop = 3 nodes
    when its NER finds nothing)."""
    seeds = name_matches(graph, question)
    if seeds or embed is None or not graph.entities:
        return seeds
    q = np.asarray(embed([question]), dtype=np.float64)[0]
    names = np.asarray(embed(list(graph.entities)), dtype=np.float64)
    return top_indices(names @ q, fallback_k)


def top_indices(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k highest scores, ties broken by the lower index (deterministic)."""
    order = np.lexsort((np.arange(scores.size), -scores))
    return [int(i) for i in order[:k]]


def subgraph_triples(graph: TextGraph, seeds: Iterable[int], hops: int = SUBGRAPH_HOPS) -> list[int]:
    """Indices of the triples an undirected BFS of depth `hops` from `seeds` walks over (every edge
    of every node reached in fewer than `hops` steps, as AutoGraph-R1's construct_subgraph), sorted."""
    seen = {int(s) for s in seeds if 0 <= int(s) < len(graph.entities)}
    frontier = sorted(seen)
    picked: set[int] = set()
    for _ in range(hops):
        nxt = []
        for e in frontier:
            for nbr, t in graph._neighbours[e]:
                picked.add(t)
                if nbr not in seen:
                    seen.add(nbr)
                    nxt.append(nbr)
        frontier = nxt
    return sorted(picked)


# --------------------------------------------------------------------------- PPR passage retriever


def ppr_matrix(graph: TextGraph):
    """Symmetric scipy CSR adjacency over all nodes: weight = number of unique triples between two
    entities, 1 per source edge."""
    from scipy.sparse import coo_matrix

    e = len(graph.entities)
    rows = np.concatenate([graph.heads, graph.tails, graph.source_entity, graph.source_passage + e])
    cols = np.concatenate([graph.tails, graph.heads, graph.source_passage + e, graph.source_entity])
    loops = np.concatenate([graph.heads == graph.tails, graph.heads == graph.tails,
                            np.zeros(2 * graph.source_entity.size, dtype=bool)])
    # A self-loop triple is one edge, not two.
    weights = np.where(loops, 0.5, 1.0)
    return coo_matrix((weights, (rows, cols)), shape=(graph.n_nodes, graph.n_nodes)).tocsr()


def personalized_pagerank(adj, personalization: np.ndarray, alpha: float = PPR_DAMPING, tol: float = 1e-10,
                          max_iter: int = 1000) -> np.ndarray:
    """Power iteration with networkx.pagerank's conventions: row-stochastic walk on `adj` weights,
    teleport and dangling mass both follow `personalization` (normalised here), L1 stop at n*tol.
    Nodes unreachable from the personalised ones get exactly 0."""
    n = adj.shape[0]
    p = np.asarray(personalization, dtype=np.float64)
    if n == 0 or p.shape != (n,) or not np.isfinite(p).all() or (p < 0).any() or p.sum() <= 0:
        raise ValueError(f"personalization must be {n} finite non-negative weights with a positive sum")
    p = p / p.sum()
    out = np.asarray(adj.sum(axis=1)).ravel()
    dangling = out == 0
    inv = np.divide(1.0, out, out=np.zeros(n), where=~dangling)
    walk = adj.multiply(inv[:, None]).tocsr()  # row-stochastic (dangling rows stay zero)
    walk_t = walk.T.tocsr()
    # Starting from the reset vector (networkx starts uniform; the fixed point is the same) keeps
    # nodes the walk cannot reach at exactly 0, so they are not ranked at all.
    x = p.copy()
    for _ in range(max_iter):
        last = x
        x = alpha * (walk_t @ last + last[dangling].sum() * p) + (1 - alpha) * p
        if np.abs(x - last).sum() < n * tol:
            return x
    raise RuntimeError(f"personalized PageRank did not converge in {max_iter} iterations")


@dataclass(frozen=True)
class PassageRanking:
    passage_ids: tuple[str, ...]  # best first; passages the walk never reached are left out
    scores: tuple[float, ...]
    reason: str | None = None  # why the ranking is empty, when it is


def rank_passages(graph: TextGraph, question: str, embed: Embedder, top_triples: int = TOP_TRIPLES,
                  alpha: float = PPR_DAMPING) -> PassageRanking:
    """HippoRAG 2's passage ranking over `graph` for one question (module docstring)."""
    return GraphRetriever(graph, embed, top_triples, alpha).rank(question)


class GraphRetriever:
    """The PPR passage retriever over one graph, for many questions: the triples are embedded and
    the walk matrix built once (a corpus-level graph), each question costs one query embedding
    and one walk."""

    def __init__(self, graph: TextGraph, embed: Embedder, top_triples: int = TOP_TRIPLES,
                 alpha: float = PPR_DAMPING) -> None:
        self.graph, self.embed, self.top_triples, self.alpha = graph, embed, top_triples, alpha
        self._vectors: np.ndarray | None = None
        self._adj = None

    def rank(self, question: str) -> PassageRanking:
        graph = self.graph
        if not graph.triples:
            return _empty("the graph has no triples, so nothing links the question to a passage")
        if self._vectors is None:
            vectors = np.asarray(self.embed([question, *(t.text() for t in graph.triples)]), dtype=np.float64)
            self._vectors, query = vectors[1:], vectors[0]
            self._adj = ppr_matrix(graph)
        else:
            query = np.asarray(self.embed([question]), dtype=np.float64)[0]
        scores = self._vectors @ query
        reset = reset_vector(graph, scores, top_indices(scores, self.top_triples))
        return passage_ranking(graph, personalized_pagerank(self._adj, reset, self.alpha))


def reset_vector(graph: TextGraph, scores: np.ndarray, top: Sequence[int]) -> np.ndarray:
    """HippoRAG 2's personalisation: each head/tail node of the top triples gets the mean score
    (negative as 0) of the top triples naming it; uniform over those nodes if all scored <= 0."""
    weights = np.zeros(graph.n_nodes)
    counts = np.zeros(graph.n_nodes)
    for t in top:
        for node in {int(graph.heads[t]), int(graph.tails[t])}:
            weights[node] += max(float(scores[t]), 0.0)
            counts[node] += 1
    reset = np.divide(weights, counts, out=np.zeros_like(weights), where=counts > 0)
    if reset.sum() <= 0:  # every top triple scored <= 0: still walk from its nodes, uniformly
        reset = (counts > 0).astype(np.float64)
    return reset


def passage_ranking(graph: TextGraph, rank: np.ndarray) -> PassageRanking:
    """Passages by PageRank mass, best first (ties by node order); unreached passages left out."""
    mass = rank[len(graph.entities):]
    order = [int(i) for i in np.lexsort((np.arange(mass.size), -mass)) if mass[i] > 0]
    return PassageRanking(tuple(graph.passages[i] for i in order), tuple(float(mass[i]) for i in order))


# AutoGraph-R1's query to the triple embedder (autograph/rag_server/hipporag2.py, query2edge);
# the triples are embedded as they are.
AUTOGRAPH_TRIPLE_QUERY = ("Instruct: Given a question, retrieve the most relevant knowledge graph triple that can "
                          "help answer the question.\nQuery: {question}")


def rank_passages_autograph(docs: Iterable[tuple[str, Sequence[Triple]]], question: str, embed: Embedder,
                            top_triples: int = TOP_TRIPLES, alpha: float = PPR_DAMPING) -> PassageRanking:
    """R_I's ranking as AutoGraph-R1's code computes it (HippoRAG2Retriever.retrieve over the graph
    parse_triples_with_texts builds), where `GraphRetriever` is HippoRAG 2's own walk:
    - a directed, unweighted networkx graph: a node per exact entity string, subject -> object per
      ordered pair (the last relation written wins), subject and object -> their passage;
    - the question, with their instruction, against every entity-to-entity edge "s r o"; scores
      min-max normalised over all edges (all equal: 1), the top `top_triples` by np.argsort;
    - each head and tail seeded by the mean normalised score of the top edges naming it;
    - networkx.pagerank with its defaults, dangling passages returning mass along the seeds;
    - every passage node ranked by its mass, the ones the walk never reached included (mass 0, or
      the trace networkx's iteration leaves on a cycle), ties in the graph's node order (so a top 5
      over few reached passages is filled with the others).
    An embedder that returns NaN leaves the walk unconverged: an empty ranking with its reason."""
    import networkx as nx

    kg = nx.DiGraph()
    for pid, triples in docs:
        text = ("passage", pid)  # a tuple: no entity string can be this node
        for t in triples:
            subject, relation, obj = str(t.subject), str(t.relation), str(t.object)
            kg.add_node(subject, node_type="entity")
            kg.add_node(obj, node_type="entity")
            kg.add_edge(subject, obj, relation=relation)
            kg.add_node(text, node_type="text")
            kg.add_edge(subject, text, relation="source")
            kg.add_edge(obj, text, relation="source")
    entities = [n for n, kind in kg.nodes(data="node_type") if kind != "text"]
    edges = list(kg.subgraph(entities).edges(data="relation"))
    if not edges:
        return _empty("the graph has no triples, so nothing links the question to a passage")
    vectors = np.asarray(embed([AUTOGRAPH_TRIPLE_QUERY.format(question=question),
                                *(f"{s} {r} {o}" for s, o, r in edges)]), dtype=np.float64)
    raw = vectors[1:] @ vectors[0]
    spread = raw.max() - raw.min()
    scores = (raw - raw.min()) / spread if spread != 0 else np.ones_like(raw)
    seeds: dict[str, list[float]] = {}
    for i in np.argsort(scores)[-top_triples:][::-1]:
        head, tail, _ = edges[i]
        seeds.setdefault(head, []).append(float(scores[i]))
        seeds.setdefault(tail, []).append(float(scores[i]))
    try:
        mass = nx.pagerank(kg, alpha=alpha, personalization={n: sum(v) / len(v) for n, v in seeds.items()})
    except (nx.PowerIterationFailedConvergence, ZeroDivisionError) as exc:
        return _empty(f"PageRank did not converge ({type(exc).__name__}): the triple scores are not finite")
    ranked = sorted(((n[1], m) for n, m in mass.items() if kg.nodes[n]["node_type"] == "text"),
                    key=lambda item: item[1], reverse=True)
    return PassageRanking(tuple(p for p, _ in ranked), tuple(float(m) for _, m in ranked))


def _empty(reason: str) -> PassageRanking:
    log.info("PPR passage retriever: %s", reason)
    return PassageRanking((), (), reason)


__all__ = ["Embedder", "GraphRetriever", "PPR_DAMPING", "PassageRanking", "SUBGRAPH_HOPS", "TOP_TRIPLES", "TextGraph", "build_graph",
           "name_key", "name_matches", "passage_ranking", "personalized_pagerank", "ppr_matrix", "rank_passages",
           "AUTOGRAPH_TRIPLE_QUERY", "rank_passages_autograph", "reset_vector", "seed_entities",
           "subgraph_triples", "top_indices"]
