"""AutoGraph-R1's constructor episodes: documents one per turn, triples back, then the graph rewards.

An episode is one question and its documents (the supporting passages for R_C; supporting passages
plus hard negatives for R_I). The policy sees a system prompt and "Extracts for {title}: {text}"
as a user turn and answers with a JSON array of triples; each valid answer brings the next
document as a new user turn (AutoGraph-R1's iterative mode); an invalid answer ends the episode
with reward 0. After the last document the triples become a graph and a frozen retriever scores
it. Loss: only the constructor's turns (their tokens and closing eos); the system prompt, the
documents and the chat headers are context (mask 0).

The chat frame is read from the policy's own chat template (`ChatFrame`), so the same code
serves the tiny ChatML policy and Qwen2.5-Instruct; SFT transcripts (`gold_transcript`) and
rollouts (`ConstructorRollout`) are tokenised by the same frame, so SFT trains on exactly the
sequences RL samples.

`ConstructorRollout` is a batched episode loop of its own (one generate call per turn for every
live episode) on the generic `Generator` protocol; docs/AUTOGRAPH_R1.md says why the generic
`RolloutEngine` cannot run this episode shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from ragrl.errors import InputError
from ragrl.kg.extraction import ParsedTurn, Triple, parse_triples, repetition_share, triples_json
from ragrl.kg.text_graph import (
    SUBGRAPH_HOPS,
    TOP_TRIPLES,
    Embedder,
    PassageRanking,
    build_graph,
    rank_passages,
    rank_passages_autograph,
    seed_entities,
    subgraph_triples,
)
from ragrl.kg.graph_scoring import REPETITION_LIMIT, RECALL_K, Judge, JudgeItem, penalised, recall_at_k

REWARD_MODES = ("index", "carrier")  # R_I (PPR recall) or R_C (judge on the subgraph)
# R_I's walk: HippoRAG 2's (text_graph.GraphRetriever) or AutoGraph-R1's code's (rank_passages_autograph)
PPR_MODES = ("hipporag", "autograph")
_A, _U = "\u2063ASSISTANT\u2063", "\u2063USER\u2063"  # placeholders no template or document writes


def constructor_system_prompt() -> str:
    return resources.files("ragrl.kg").joinpath("prompts", "autograph_constructor_system.txt").read_text(
        encoding="utf-8").strip()


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Episode:
    id: str
    question: str
    golden_answers: tuple[str, ...]
    supporting_ids: tuple[str, ...]
    documents: tuple[Document, ...]


def document_message(doc: Document, k: int) -> str:
    """AutoGraph-R1's user turn: "Extracts for {title}: {text}", or "Document k" without a title."""
    name = doc.title.strip() or f"Document {k + 1}"
    return f"Extracts for {name}: {doc.text}"


class ChatFrame:
    """The token frame of a constructor episode in one tokenizer's chat template."""

    def __init__(self, tokenizer, system: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.system = constructor_system_prompt() if system is None else system
        self.eos_id = tokenizer.eos_token_id
        rendered = tokenizer.apply_chat_template(
            [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
             {"role": "assistant", "content": _A}, {"role": "user", "content": _U}],
            tokenize=False, add_generation_prompt=True)
        after = rendered.split(_A, 1)[1]
        self._before_user, self._after_user = after.split(_U, 1)
        eos = tokenizer.eos_token or ""
        # The policy's own eos closes its turn (it is generated, mask 1); the template's copy of it
        # must then not be appended a second time.
        self._closed_before_user = self._before_user[len(eos):] if eos and self._before_user.startswith(eos) \
            else self._before_user

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, first_message: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "system", "content": self.system}, {"role": "user", "content": first_message}],
            tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def next_ids(self, message: str, closed: bool) -> list[int]:
        """Context after an assistant turn up to the next generation: the turn's end (unless the
        policy closed it with eos), the next user message, the assistant header."""
        return self.encode((self._closed_before_user if closed else self._before_user) + message + self._after_user)

    def answer_ids(self, text: str) -> list[int]:
        """A written (gold) assistant turn as the policy would generate it: content then eos."""
        return self.encode(text) + ([self.eos_id] if self.eos_id is not None else [])


@dataclass
class ConstructorTrajectory:
    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    turns: list[ParsedTurn] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    stop_reason: str = ""  # done | invalid | response_limit
    latency_s: float = 0.0
    episode: Episode | None = None  # set by the engine that ran it: what the reward reads
    num_searches: int = 0  # the RL log's searches per trajectory: a constructor never searches

    @property
    def complete(self) -> bool:
        """Every document answered with a valid turn."""
        return self.stop_reason == "done"

    def triples(self) -> list[Triple]:
        return [t for turn in self.turns for t in turn.triples]


class ConstructorRollout:
    def __init__(self, generator, tokenizer, *, system: str | None = None, max_turn_tokens: int = 256,
                 max_response_tokens: int = 4096, temperature: float = 1.0, top_p: float = 1.0,
                 allow_empty: bool = False) -> None:
        self.generator = generator
        self.frame = ChatFrame(tokenizer, system)
        self.tokenizer = tokenizer
        self.max_turn_tokens = max_turn_tokens
        self.max_response_tokens = max_response_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.allow_empty = allow_empty

    def run(self, episodes: Sequence[Episode], n: int = 1, seed: int | None = None) -> list[ConstructorTrajectory]:
        """`n` episodes per question (question-major order)."""
        from ragrl.agent.generation import cut_at_stop, keep_prefixes

        start = time.monotonic()
        empty = [e.id for e in episodes if not e.documents]
        if empty:
            raise ValueError(f"episode(s) without documents: {empty[:5]}")
        trajs = [ConstructorTrajectory(p, s, self.frame.prompt_ids(document_message(e.documents[0], 0)), episode=e)
                 for p, e in enumerate(episodes) for s in range(n)]
        active = list(trajs)
        stops = [self.frame.eos_id] if self.frame.eos_id is not None else []
        turn = 0
        with keep_prefixes(self.generator):  # each turn's contexts extend the last turn's sequences
            while active:
                limits = [min(self.max_turn_tokens, self.max_response_tokens - len(t.response_ids)) for t in active]
                outputs = self.generator.generate([t.prompt_ids + t.response_ids for t in active], limits,
                                                  self.temperature, self.top_p,
                                                  None if seed is None else seed * 1_000_003 + turn, stop_token_ids=stops)
                still = []
                for t, out, limit in zip(active, outputs, limits):
                    ids = cut_at_stop(list(out), stops, limit)
                    _append(t, ids, 1, turn)
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                    parsed = parse_triples(text, allow_empty=self.allow_empty)
                    t.texts.append(text)
                    t.turns.append(parsed)
                    docs = episodes[t.prompt_index].documents
                    if not parsed.valid:
                        t.stop_reason = "invalid"
                    elif turn + 1 == len(docs):
                        t.stop_reason = "done"
                    else:
                        nxt = self.frame.next_ids(document_message(docs[turn + 1], turn + 1), bool(ids) and ids[-1] in stops)
                        # The next document plus at least one generated token must fit.
                        if len(t.response_ids) + len(nxt) + 1 > self.max_response_tokens:
                            t.stop_reason = "response_limit"
                        else:
                            _append(t, nxt, 0, turn)
                            still.append(t)
                            continue
                    t.latency_s = time.monotonic() - start
                active = still
                turn += 1
        return trajs


def _append(t: ConstructorTrajectory, ids: list[int], mask: int, turn: int) -> None:
    t.response_ids.extend(ids)
    t.loss_mask.extend([mask] * len(ids))
    t.turn_index.extend([turn] * len(ids))


# --------------------------------------------------------------------------- rewards of an episode


@dataclass(frozen=True)
class GraphScore:
    reward: float
    components: dict[str, float]
    reason: str | None = None  # why the task reward is 0 without the policy being wrong, when known


def graph_docs(episode: Episode, turns: Sequence[ParsedTurn]) -> list[tuple[str, list[Triple]]]:
    return [(doc.id, list(turn.triples)) for doc, turn in zip(episode.documents, turns)]


def _finish(task: float, triples: list[Triple], complete: bool, limit: float, reason: str | None,
            penalty: float = 1.0) -> GraphScore:
    rep = repetition_share(triples)
    reward = penalised(task, rep, limit, penalty) if complete else 0.0
    return GraphScore(reward, {"task": task if complete else 0.0, "repetition": rep, "valid": float(complete),
                               "triples": float(len(triples))}, reason if complete else "invalid or unfinished episode")


def episode_ranking(episode: Episode, turns: Sequence[ParsedTurn], embed: Embedder,
                    top_triples: int = TOP_TRIPLES, ppr: str = "hipporag") -> PassageRanking:
    """The PPR retriever's ranking of the episode's documents over the graph of its triples (`ppr`:
    one of PPR_MODES)."""
    if ppr == "autograph":
        return rank_passages_autograph(graph_docs(episode, turns), episode.question, embed, top_triples)
    return rank_passages(build_graph(graph_docs(episode, turns)), episode.question, embed, top_triples)


def index_score(episode: Episode, turns: Sequence[ParsedTurn], complete: bool, embed: Embedder, *,
                k: int = RECALL_K, top_triples: int = TOP_TRIPLES, limit: float = REPETITION_LIMIT,
                ranking: PassageRanking | None = None, penalty: float = 1.0, ppr: str = "hipporag") -> GraphScore:
    """R_I: recall of the supporting passages in the PPR retriever's top k, minus `penalty` x the
    repetition share. `ranking`: the episode's `episode_ranking`, when the caller has it already."""
    triples = [t for turn in turns for t in turn.triples]
    if not complete:
        return _finish(0.0, triples, False, limit, None, penalty)
    if ranking is None:
        ranking = episode_ranking(episode, turns, embed, top_triples, ppr)
    return _finish(recall_at_k(ranking.passage_ids, episode.supporting_ids, k), triples, True, limit, ranking.reason,
                   penalty)


def carrier_items(episode: Episode, turns: Sequence[ParsedTurn], embed: Embedder | None = None,
                  hops: int = SUBGRAPH_HOPS) -> JudgeItem:
    """What the judge sees for R_C: the triples the subgraph retriever returns for the question."""
    graph = build_graph(graph_docs(episode, turns))
    picked = subgraph_triples(graph, seed_entities(graph, episode.question, embed), hops)
    return JudgeItem(episode.question, episode.golden_answers, tuple(graph.triples[i] for i in picked))


def carrier_scores(episodes: Sequence[Episode], trajectories: Sequence[tuple[int, Sequence[ParsedTurn], bool]],
                   judge: Judge, embed: Embedder | None = None, *, hops: int = SUBGRAPH_HOPS,
                   limit: float = REPETITION_LIMIT, penalty: float = 1.0) -> list[GraphScore]:
    """R_C for a batch: (episode index, turns, complete) per trajectory; one judge call for all
    complete ones."""
    pending = [(i, carrier_items(episodes[e], turns, embed, hops)) for i, (e, turns, ok) in enumerate(trajectories)
               if ok]
    verdicts = dict(zip((i for i, _ in pending), judge.judge([item for _, item in pending]))) if pending else {}
    out = []
    for i, (_, turns, ok) in enumerate(trajectories):
        triples = [t for turn in turns for t in turn.triples]
        out.append(_finish(float(verdicts.get(i, False)), triples, ok, limit, None, penalty))
    return out


# --------------------------------------------------------------------------- episodes and gold data


NEGATIVES_FROM = ("question", "supporting")


def episodes_from_world(qa_rows: Sequence[dict], passages: Sequence[dict], *, negatives: int = 0,
                        search: Callable[[list[str], int], list[list[dict]]] | None = None,
                        shuffle_seed: int | None = 0, in_all: bool = False,
                        negatives_from: str = "question") -> list[Episode]:
    """One episode per QA row: its supporting passages, plus up to `negatives` hard negatives that
    do not support it; with `in_all`, hard negatives up to `negatives` documents in all, the
    supporting ones included (AutoGraph-R1's DOC_SIZE). `negatives_from` "question": the
    retriever's best passages for the question; "supporting": each supporting passage's own
    nearest passages (its text as the query), the count split evenly over them and the remainder
    given one each from a random one on (AutoGraph-R1's data_preparation.py). Document order is
    shuffled per question (seeded), so a retriever that ranks documents in input order earns nothing."""
    import random

    if negatives_from not in NEGATIVES_FROM:
        raise InputError(f"negatives_from must be one of {NEGATIVES_FROM}, got {negatives_from!r}")
    by_id = {str(p["id"]): Document(str(p["id"]), str(p.get("title") or ""), str(p["text"])) for p in passages}
    rows = []
    for row in qa_rows:
        support = [str(s) for s in row["supporting_ids"] or []]
        if not support:
            # Its reward (recall of the supporting passages) would be 0 whatever the graph, and its
            # evaluation a 0 in the recall mean.
            raise InputError(f"question {row['id']}: no supporting_ids; an episode needs its supporting passages")
        missing = [s for s in support if s not in by_id]
        if missing:
            raise InputError(f"question {row['id']}: supporting passage(s) {missing} are not in the passages")
        rows.append((row, support))
    if negatives and search is None:
        raise InputError("hard negatives need a retriever (search)")
    per_support = bool(negatives) and negatives_from == "supporting"
    # the retriever's best for each question, or for each supporting passage (its text the query)
    queries = ([str(row["question"]) for row, _ in rows] if not per_support
               else list(dict.fromkeys(s for _, support in rows for s in support)))
    found = search([q if not per_support else _passage_text(by_id[q]) for q in queries], negatives + 8) \
        if negatives and queries else [[] for _ in queries]
    nearest = [[str(h["id"]) for h in hits] for hits in found]
    by_support = dict(zip(queries, nearest)) if per_support else {}
    episodes = []
    for r, (row, support) in enumerate(rows):
        wanted = max(negatives - len(support), 0) if in_all else negatives
        if per_support:
            ids = support + _negatives_per_support(support, by_support, wanted, by_id,
                                                   random.Random(f"{shuffle_seed}:{row['id']}:negatives"))
        else:
            extra = [h for h in nearest[r] if h not in support and h in by_id]
            ids = support + list(dict.fromkeys(extra))[:wanted]
        if shuffle_seed is not None:
            random.Random(f"{shuffle_seed}:{row['id']}").shuffle(ids)
        episodes.append(Episode(str(row["id"]), str(row["question"]), tuple(str(a) for a in row["golden_answers"]),
                                tuple(support), tuple(by_id[i] for i in ids)))
    return episodes


def _passage_text(doc: Document) -> str:
    return f"{doc.title}: {doc.text}" if doc.title else doc.text


def _negatives_per_support(support: list[str], nearest: Mapping[str, list[str]], wanted: int,
                           known: Mapping[str, Document], rng) -> list[str]:
    """`wanted` negatives split over the supporting passages: each its (wanted // n) nearest
    passages not already taken, the remainder one more each from a random supporting passage on,
    in turn (AutoGraph-R1's data_preparation.py, which raises where we take fewer)."""
    share = dict.fromkeys(support, wanted // len(support))
    start = rng.randrange(len(support))
    for i in range(wanted - sum(share.values())):
        share[support[(start + i) % len(support)]] += 1
    taken: list[str] = []
    for s in support:
        fresh = [p for p in nearest.get(s, []) if p in known and p not in support and p not in taken]
        taken += fresh[: share[s]]
    return taken


def gold_transcript(episode: Episode, gold: dict[str, list[Triple]], frame: ChatFrame) -> dict:
    """One SFT row: the episode with every turn answered by the passage's true triples (an empty
    array for a passage with none). Loss on the answers and their eos only."""
    ids = frame.prompt_ids(document_message(episode.documents[0], 0))
    mask = [0] * len(ids)
    for k, doc in enumerate(episode.documents):
        answer = frame.answer_ids(triples_json(gold.get(doc.id, [])))
        ids += answer
        mask += [1] * len(answer)
        if k + 1 < len(episode.documents):
            nxt = frame.next_ids(document_message(episode.documents[k + 1], k + 1), closed=True)
            ids += nxt
            mask += [0] * len(nxt)
    return {"id": episode.id, "input_ids": ids, "assistant_masks": mask, "num_turns": len(episode.documents),
            "text": frame.tokenizer.decode(ids, skip_special_tokens=False)}


def gold_triples_by_passage(rows: Sequence[dict]) -> dict[str, list[Triple]]:
    """A world KG's triples (`head, relation, tail, source_id`) grouped by the passage stating them."""
    out: dict[str, list[Triple]] = {}
    for r in rows:
        out.setdefault(str(r["source_id"]), []).append(Triple(str(r["head"]), str(r["relation"]), str(r["tail"])))
    return out


__all__ = ["ChatFrame", "ConstructorRollout", "ConstructorTrajectory", "Document", "Episode", "GraphScore",
           "NEGATIVES_FROM", "PPR_MODES", "REWARD_MODES", "carrier_items", "carrier_scores", "constructor_system_prompt", "document_message",
           "episode_ranking",
           "episodes_from_world", "gold_transcript", "gold_triples_by_passage", "graph_docs", "index_score"]
