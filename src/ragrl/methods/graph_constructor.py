"""AutoGraph-R1: the policy is a KG constructor; a frozen graph retriever over its triples is the reward.

Episodes (`ragrl.kg.constructor`): a question's documents, one per turn ("Extracts for {title}:
{text}"), each answered with a JSON array of triples (`ragrl.kg.extraction`: json_repair, the
validity rules, `allow_empty`); an invalid turn ends the episode with reward 0; loss only on the
constructor's turns. Rewards (`options.reward`):
- "index" (R_I, the default): recall of the supporting passages in the HippoRAG-2 PPR retriever's
  top `recall_k`, over the supporting passages plus `negatives` hard negatives from the retriever;
- "carrier" (R_C): the judge (`options.judge`: "connectivity", deterministic, or "openai", an
  OpenAI-compatible endpoint) says whether the gold answer follows from the subgraph retriever's
  triples; documents are the supporting passages only.
Both minus the share of repeated triples, 0 above `repetition_limit`.
Cold-start SFT ("gold"): each passage's true triples from a world KG (`options.gold_triples`, a
`head, relation, tail, source_id` parquet).

Not yet runnable through the generic RL and evaluation stages: they drive `RolloutEngine`, whose
episodes are tag actions with `<information>` observations; this method's environment must feed
the next document as a new user turn and end the episode itself. `ConstructorRollout` does that on
the same `Generator` protocol; docs/AUTOGRAPH_R1.md lists what the generic stages lack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ragrl.methods import Method, Score
from ragrl.methods.search import world_gold_reason

REWARD_KEYS = ("task",)
JUDGES = ("connectivity", "openai")


@dataclass(frozen=True)
class GraphConstructorOptions:
    reward: str = "index"  # index (R_I) | carrier (R_C)
    allow_empty: bool = False  # accept [] for a document with nothing to extract
    negatives: int = 15  # R_I: hard negatives per question (AutoGraph-R1: 15)
    recall_k: int = 5
    top_triples: int = 10
    hops: int = 3
    repetition_limit: float = 0.9
    judge: str = "connectivity"
    judge_url: str = ""
    judge_model: str = ""
    embedding_model: str = "sentence-transformers/all-MiniLM-L6-v2"
    gold_triples: str = ""  # a triples parquet with source_id: the gold SFT targets

    def __post_init__(self) -> None:
        from ragrl.kg.constructor import REWARD_MODES

        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {self.reward!r}")
        if self.judge not in JUDGES:
            raise ValueError(f"judge must be one of {JUDGES}, got {self.judge!r}")
        if self.judge == "openai" and not (self.judge_url and self.judge_model):
            raise ValueError("judge openai needs judge_url and judge_model")
        for name in ("negatives", "recall_k", "top_triples", "hops"):
            if getattr(self, name) < (0 if name == "negatives" else 1):
                raise ValueError(f"{name}={getattr(self, name)} is out of range")
        if not 0.0 <= self.repetition_limit <= 1.0:
            raise ValueError(f"repetition_limit={self.repetition_limit} must be in [0, 1]")


class ConstructorEnvironment:
    """The episode settings a constructor run needs: documents, the embedder, the judge."""

    name = "graph_constructor"

    def __init__(self, options: GraphConstructorOptions, retriever=None) -> None:
        from ragrl.agent.protocol import ActionSpec

        self.options = options
        self.retriever = retriever
        self.spec = ActionSpec(actions=("answer",))
        self.last_search_s = 0.0

    def parse(self, text: str):
        raise NotImplementedError(_NOT_GENERIC)

    def respond(self, actions, reserved=(), sample_ids=None):
        raise NotImplementedError(_NOT_GENERIC)

    def episodes(self, qa_rows: list[dict]):
        from ragrl.kg.constructor import episodes_from_world

        if self.retriever is None:
            raise ValueError("constructor episodes need the passages: a retriever (--index/--bm25 with --passages)")
        passages = self.retriever.passages.table.to_pylist()
        negatives = self.options.negatives if self.options.reward == "index" else 0
        search = (lambda qs, k: [[h.to_dict() if hasattr(h, "to_dict") else dict(h) for h in hits]
                                 for hits in self.retriever.search(qs, k)])
        return episodes_from_world(qa_rows, passages, negatives=negatives, search=search if negatives else None)

    def score(self, episode, trajectory) -> Score:
        from ragrl.kg.constructor import carrier_scores, index_score

        o = self.options
        if o.reward == "index":
            s = index_score(episode, trajectory.turns, trajectory.complete, _embedder(o.embedding_model),
                            k=o.recall_k, top_triples=o.top_triples, limit=o.repetition_limit)
        else:
            s = carrier_scores([episode], [(0, trajectory.turns, trajectory.complete)], _judge(o), None, hops=o.hops,
                               limit=o.repetition_limit)[0]
        return Score(s.reward, None, s.components)


_NOT_GENERIC = ("graph_constructor episodes run on ragrl.kg.constructor.ConstructorRollout: the generic "
                "RolloutEngine cannot feed the next document as a user turn (docs/AUTOGRAPH_R1.md)")


@lru_cache(maxsize=2)
def _embedder(model: str):
    from ragrl.retrieval.encoder import Encoder

    return Encoder(model).encode_queries


def _judge(options: GraphConstructorOptions):
    from ragrl.rewards.autograph import ConnectivityJudge, OpenAIJudge

    if options.judge == "openai":
        return OpenAIJudge(options.judge_url, options.judge_model)
    return ConnectivityJudge()


def make_environment(recipe, backends: Mapping[str, Any]) -> ConstructorEnvironment:
    return ConstructorEnvironment(recipe.options, backends.get("retriever"))


def score(recipe, trajectory, row: Mapping[str, Any]) -> Score:
    """`row["episode"]`: the trajectory's `Episode` (its documents); see `ConstructorEnvironment.score`."""
    return ConstructorEnvironment(recipe.options).score(row["episode"], trajectory)


def gold_sft(recipe, qa, policy, env, backends, out, limit=None) -> dict:
    import pyarrow.parquet as pq
    import transformers

    from ragrl.kg.constructor import ChatFrame, gold_transcript, gold_triples_by_passage
    from ragrl.train.sft_data import SFTDataStats, read_qa_rows, write_sft_data

    options: GraphConstructorOptions = recipe.options
    if not options.gold_triples:
        raise ValueError(f"recipe {recipe.name!r}: gold constructor SFT needs options.gold_triples "
                         "(a triples parquet with source_id, e.g. the world's kg/B/triples.parquet)")
    gold = gold_triples_by_passage(pq.read_table(options.gold_triples).to_pylist())
    frame = ChatFrame(transformers.AutoTokenizer.from_pretrained(policy))
    stats = SFTDataStats("gold")
    rows = []
    for episode in env.episodes(read_qa_rows(qa, limit)):
        stats.total += 1
        row = gold_transcript(episode, gold, frame)
        empty = any(not gold.get(d.id) for d in episode.documents)
        if empty and not options.allow_empty:
            stats.dropped["passage_without_triples"] += 1  # its gold answer `[]` would be an invalid turn
        elif len(row["input_ids"]) > recipe.rollout.max_context_tokens:
            stats.dropped["too_long"] += 1
        else:
            rows.append(row)
            stats.kept += 1
    write_sft_data(rows, stats, out)
    return stats.to_dict()


METHOD = Method(
    name="graph_constructor",
    summary="AutoGraph-R1: a KG constructor rewarded by PPR passage recall (R_I) or a judge on its subgraph (R_C)",
    make_environment=make_environment,
    score=score,
    inputs=("retriever",),
    reward_keys=REWARD_KEYS,
    default_reward={"task": 1.0},
    options=GraphConstructorOptions,
    gold_sft=gold_sft,
    # Gold triples are keyed by the world's passage ids: only its QA splits name them.
    gold_sft_reason=world_gold_reason,
)
