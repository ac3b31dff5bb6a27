"""AutoGraph-R1: the policy is a KG constructor; a frozen graph retriever over its triples is the reward.

Episodes (`ragrl.kg.constructor`): a question's documents, one per turn ("Extracts for {title}:
{text}"), each answered with a JSON array of triples (`ragrl.kg.extraction`: json_repair, the
validity rules, `allow_empty`); an invalid turn ends the episode with reward 0; loss only on the
constructor's turns. Rewards (`options.reward`):
- "index" (R_I, the default): recall of the supporting passages in the HippoRAG-2 PPR retriever's
  top `recall_k`, over the supporting passages plus `negatives` hard negatives from the retriever
  (`documents_in_all`: up to `negatives` documents in all);
- "carrier" (R_C): the judge (`options.judge`: "connectivity", deterministic, or "openai", an
  OpenAI-compatible endpoint) says whether the gold answer follows from the subgraph retriever's
  triples; documents are the supporting passages only.
Both minus `repetition_penalty` x the share of repeated triples, 0 above `repetition_limit`.
Cold-start SFT ("gold"): each passage's true triples from a world KG (`options.gold_triples`, a
`head, relation, tail, source_id` parquet).

Episodes run on the method's own engine (`ConstructorEngine`, the `engine` hook): the generic
tag-action `RolloutEngine` frames observations inside the assistant turn, while this method feeds
the next document as a new user turn and ends the episode itself. The RL and evaluation stages
drive either through the same `run_rows` protocol. Evaluation (`eval_metrics`) reports the PPR
retriever's recall@2/@5 of the supporting passages over the episode's graph, the reward the
training optimises, the share of valid episodes, and the number and repetition of triples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ragrl.errors import InputError
from ragrl.methods import Method, Score
from ragrl.methods.search import world_gold_reason

REWARD_KEYS = ("task",)
JUDGES = ("connectivity", "openai")


@dataclass(frozen=True)
class GraphConstructorOptions:
    reward: str = "index"  # index (R_I) | carrier (R_C)
    allow_empty: bool = False  # accept [] for a document with nothing to extract
    negatives: int = 15  # R_I: hard negatives per question
    # R_I: `negatives` counts the documents in all, the supporting ones included (AutoGraph-R1's
    # DOC_SIZE=15) instead of the hard negatives added to them.
    documents_in_all: bool = False
    # R_I: hard negatives for the question ("question") or split over its supporting passages, each
    # its own nearest passages ("supporting": AutoGraph-R1's data_preparation.py)
    negatives_from: str = "question"
    recall_k: int = 5
    top_triples: int = 10
    # R_I's walk: "hipporag" (HippoRAG 2's: undirected, weighted, raw cosine seeds, reached passages
    # only) or "autograph" (AutoGraph-R1's code: directed, min-max seeds, every passage ranked).
    ppr: str = "hipporag"
    hops: int = 3
    repetition_limit: float = 0.9
    # The weight of the repetition share subtracted from the task reward; 0: no penalty
    # (AutoGraph-R1's main scripts: triple_repetition_penalty=0.0).
    repetition_penalty: float = 1.0
    judge: str = "connectivity"
    # The constructor's system message; None: ragrl's (ragrl/kg/prompts/autograph_constructor_system.txt).
    system_prompt: str | None = None
    # judge "openai": {model, base_url?, serve?, api_key_env?} (ragrl.serving): an external
    # endpoint, or a vLLM server the RL and evaluation jobs start for it (AutoGraph-R1's judge).
    judge_endpoint: dict = field(default_factory=dict)
    embedding_model: str = "sentence-transformers/all-MiniLM-L6-v2"
    # The reward's embedder behind an endpoint instead of in process (the same entry shape; vLLM
    # serves embedding models with `--runner pooling`); embedding_model is then unused.
    embedding_endpoint: dict = field(default_factory=dict)
    gold_triples: str = ""  # a triples parquet with source_id: the gold SFT targets
    # Gold SFT rows: whole episodes (every document of a training question, one per turn), or each
    # distinct document of those episodes as a one-turn transcript (shorter rows, more of them: the
    # cheaper way to teach a small policy the triple format; construct-kg runs one-document episodes).
    sft_unit: str = "episode"
    # With sft_unit "document": each row chains this many distinct documents, one per turn, in the
    # order the training episodes give them (each document still once). One-document rows never
    # show the model a second user turn after its own answer, and a policy trained on them alone
    # wrote valid first turns but broke on later ones (docs/AUTOGRAPH_R1.md).
    sft_turns: int = 1

    def __post_init__(self) -> None:
        from ragrl.kg.constructor import NEGATIVES_FROM, PPR_MODES, REWARD_MODES

        if self.reward not in REWARD_MODES:
            raise InputError(f"reward must be one of {REWARD_MODES}, got {self.reward!r}")
        if self.negatives_from not in NEGATIVES_FROM:
            raise InputError(f"negatives_from must be one of {NEGATIVES_FROM}, got {self.negatives_from!r}")
        if self.ppr not in PPR_MODES:
            raise InputError(f"ppr must be one of {PPR_MODES}, got {self.ppr!r}")
        if self.judge not in JUDGES:
            raise InputError(f"judge must be one of {JUDGES}, got {self.judge!r}")
        from ragrl.serving import check_endpoint

        if self.judge == "openai" and not self.judge_endpoint:
            raise InputError("judge openai needs judge_endpoint: {model, base_url or serve}")
        for name in ("judge_endpoint", "embedding_endpoint"):
            if getattr(self, name):
                check_endpoint(getattr(self, name), name)
        for name in ("negatives", "recall_k", "top_triples", "hops", "sft_turns"):
            if getattr(self, name) < (0 if name == "negatives" else 1):
                raise InputError(f"{name}={getattr(self, name)} is out of range")
        if self.sft_unit not in ("episode", "document"):
            raise InputError(f"sft_unit must be 'episode' or 'document', got {self.sft_unit!r}")
        if not 0.0 <= self.repetition_limit <= 1.0:
            raise InputError(f"repetition_limit={self.repetition_limit} must be in [0, 1]")
        if isinstance(self.repetition_penalty, bool) or not isinstance(self.repetition_penalty, (int, float)) \
                or not 0.0 <= self.repetition_penalty < float("inf"):
            raise InputError(f"repetition_penalty={self.repetition_penalty!r} must be a finite number >= 0")


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

    def episodes(self, qa_rows: Sequence[dict]):
        from ragrl.kg.constructor import episodes_from_world

        if self.retriever is None:
            raise InputError("constructor episodes need the passages: a retriever (--index/--bm25 with --passages)")
        passages = self.retriever.passages.table.to_pylist()
        negatives = self.options.negatives if self.options.reward == "index" else 0
        search = (lambda qs, k: [[h.to_dict() if hasattr(h, "to_dict") else dict(h) for h in hits]
                                 for hits in self.retriever.search(qs, k)])
        return episodes_from_world(qa_rows, passages, negatives=negatives, search=search if negatives else None,
                                   negatives_from=self.options.negatives_from,
                                   in_all=self.options.documents_in_all)

    def score(self, episode, trajectory, ranking=None) -> Score:
        """`ranking`: the episode's PPR ranking (R_I), when the caller computed it already."""
        from ragrl.kg.constructor import carrier_scores, index_score

        if episode is None:
            raise ValueError("a constructor trajectory without its episode (run it with ConstructorEngine)")
        o = self.options
        if o.reward == "index":
            s = index_score(episode, trajectory.turns, trajectory.complete, embedder(o),
                            k=o.recall_k, top_triples=o.top_triples, limit=o.repetition_limit, ranking=ranking,
                            penalty=o.repetition_penalty, ppr=o.ppr)
        else:
            judge = _judge(o)
            tally = getattr(judge, "replies", None)  # an LLM judge's: its off-format replies go into the log
            before = tally.offformat if tally is not None else 0
            s = carrier_scores([episode], [(0, trajectory.turns, trajectory.complete)], judge, None, hops=o.hops,
                               limit=o.repetition_limit, penalty=o.repetition_penalty)[0]
            if tally is not None:
                return Score(s.reward, None, {**s.components, "judge_offformat": float(tally.offformat - before)})
        return Score(s.reward, None, s.components)


_NOT_GENERIC = ("graph_constructor episodes run on ragrl.kg.constructor.ConstructorRollout: the generic "
                "RolloutEngine cannot feed the next document as a user turn (docs/AUTOGRAPH_R1.md)")


def embedder(options: GraphConstructorOptions):
    """The reward's query embedder: the endpoint's (served by this job or external), else in process."""
    from ragrl.serving import api_key, endpoint_url

    if options.embedding_endpoint:
        return _endpoint_embedder(*endpoint_url(options.embedding_endpoint), api_key(options.embedding_endpoint))
    return _local_embedder(options.embedding_model)


# Cached: the reward embeds every rollout's triples, and a model load or HTTP client per call costs seconds.
@lru_cache(maxsize=2)
def _local_embedder(model: str):
    from ragrl.retrieval.encoder import Encoder

    return Encoder(model).encode_queries


@lru_cache(maxsize=2)
def _endpoint_embedder(base_url: str, model: str, api_key: str | None):
    from ragrl.retrieval.endpoint_encoder import EndpointEncoder

    return EndpointEncoder(base_url, model, api_key=api_key).encode_queries


def _judge(options: GraphConstructorOptions):
    from ragrl.rewards.autograph import ConnectivityJudge
    from ragrl.serving import api_key, endpoint_url

    if options.judge == "openai":
        return _openai_judge(*endpoint_url(options.judge_endpoint), api_key(options.judge_endpoint))
    return ConnectivityJudge()


# Cached: its count of off-format replies must outlive one trajectory's score to tell a dead
# judge (a run of them) from a stray reply, and an HTTP client per score call costs a connection.
@lru_cache(maxsize=2)
def _openai_judge(base_url: str, model: str, api_key: str | None):
    from ragrl.rewards.autograph import OpenAIJudge

    return OpenAIJudge(base_url, model, api_key=api_key)


def make_environment(recipe, backends: Mapping[str, Any]) -> ConstructorEnvironment:
    return ConstructorEnvironment(recipe.options, backends.get("retriever"))


def score(recipe, trajectory, row: Mapping[str, Any]) -> Score:
    """The trajectory carries its `Episode` (its documents); see `ConstructorEnvironment.score`."""
    return ConstructorEnvironment(recipe.options).score(trajectory.episode, trajectory)


class ConstructorEngine:
    """The `engine` hook: QA rows -> episodes (`ConstructorEnvironment.episodes`) -> batched
    per-document rollouts (`ConstructorRollout`), each trajectory carrying its episode."""

    def __init__(self, generator, tokenizer, env: ConstructorEnvironment, cfg) -> None:
        from ragrl.kg.constructor import ConstructorRollout

        self.env = env
        self.seed = cfg.seed
        self.rollout = ConstructorRollout(generator, tokenizer, max_turn_tokens=cfg.max_turn_tokens,
                                          max_response_tokens=cfg.max_response_tokens, temperature=cfg.temperature,
                                          top_p=cfg.top_p, allow_empty=env.options.allow_empty,
                                          system=env.options.system_prompt)

    def run_rows(self, rows: Sequence[dict], n: int | None = None, seed: int | None = None):
        return self.rollout.run(self.env.episodes(rows), n=n or 1, seed=self.seed if seed is None else seed)

    def record(self, row: Mapping[str, Any], t) -> dict:
        """The prediction row: the episode's triples as the prediction; answer metrics do not apply
        (null), `format` is 1 for an episode whose every turn is valid."""
        from ragrl.eval.evaluate import question_type
        from ragrl.kg.extraction import triples_json

        observed = sum(1 for m in t.loss_mask if m == 0)
        return {"id": str(row["id"]), "question": row["question"],
                "golden_answers": [str(g) for g in row["golden_answers"]],
                "prediction": triples_json(t.triples()), "turns": len(t.turns), "searches": 0, "queries": [],
                "generated_tokens": len(t.loss_mask) - observed, "observation_tokens": observed,
                "latency_s": float(t.latency_s), "em": None, "f1": None, "cover_em": None,
                "format": float(t.complete), "stop_reason": t.stop_reason,
                "response": "\n".join(t.texts), "question_type": question_type(dict(row))}


EVAL_COLUMNS = ("recall@2", "recall@5", "carried", "reward", "valid", "triples", "repetition")


def eval_metrics(recipe, row: Mapping[str, Any], trajectory) -> dict:
    """Per episode: the PPR retriever's recall@2/@5 of the supporting passages over the graph the
    constructor built from the episode's documents (0 for an invalid episode, as in training);
    `carried`, R_C's task term under the deterministic judge (its subgraph joins the question to
    the answer), whichever reward the recipe trains with, so every constructor is measured by
    both reward kinds; the training reward, validity, triple count and repetition share."""
    from ragrl.kg.constructor import carrier_items, episode_ranking
    from ragrl.rewards.autograph import connected_answer, recall_at_k

    o: GraphConstructorOptions = recipe.options
    episode, ranking = trajectory.episode, None
    recall = {"recall@2": 0.0, "recall@5": 0.0}
    carried = 0.0
    if trajectory.complete:
        ranking = episode_ranking(episode, trajectory.turns, embedder(o), o.top_triples, o.ppr)
        recall = {f"recall@{k}": recall_at_k(ranking.passage_ids, episode.supporting_ids, k) for k in (2, 5)}
        # ConnectivityJudge's verdict; no embedder, as R_C's training score
        carried = float(connected_answer(carrier_items(episode, trajectory.turns, None, o.hops)))
    s = ConstructorEnvironment(o).score(episode, trajectory, ranking)
    return {**recall, "carried": carried, "reward": s.reward, "valid": float(trajectory.complete),
            "triples": float(len(trajectory.triples())), "repetition": s.components.get("repetition", 0.0)}


def files(recipe) -> dict[str, str]:
    # The gold SFT targets are read by the sft_data job: a workflow input, so a rebuilt world re-runs it.
    return {"gold_triples": recipe.options.gold_triples} if recipe.options.gold_triples else {}


def gold_sft(recipe, qa, policy, env, backends, out, limit=None) -> dict:
    import pyarrow.parquet as pq
    import transformers

    from ragrl.kg.constructor import ChatFrame, Episode, gold_transcript, gold_triples_by_passage
    from ragrl.train.sft_data import SFTDataStats, read_qa_rows, write_sft_data

    options: GraphConstructorOptions = recipe.options
    if not options.gold_triples:
        raise InputError(f"recipe {recipe.name!r}: gold constructor SFT needs options.gold_triples "
                         "(a triples parquet with source_id, e.g. the world's kg/B/triples.parquet)")
    gold = gold_triples_by_passage(pq.read_table(options.gold_triples).to_pylist())
    frame = ChatFrame(transformers.AutoTokenizer.from_pretrained(policy), options.system_prompt)
    stats = SFTDataStats("gold")
    rows = []
    episodes = env.episodes(read_qa_rows(qa, limit))
    if options.sft_unit == "document":
        distinct = list({d.id: d for e in episodes for d in e.documents}.values())
        if not options.allow_empty:  # dropped one by one, so a chain is not lost for one document
            without = sum(1 for d in distinct if not gold.get(d.id))
            stats.total += without
            stats.dropped["passage_without_triples"] += without
            distinct = [d for d in distinct if gold.get(d.id)]
        n = options.sft_turns
        episodes = [Episode("+".join(d.id for d in distinct[i:i + n]), "", (), (), tuple(distinct[i:i + n]))
                    for i in range(0, len(distinct), n)]
    for episode in episodes:
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
    engine=ConstructorEngine,
    row_columns=("supporting_ids",),
    eval_metrics=eval_metrics,
    eval_metric_columns=EVAL_COLUMNS,
    files=files,
    # Its task (triples from documents) is not the QA baselines': the untrained policy gets its own row.
    own_baseline=True,
    oracle_row=False,
    endpoints=("judge_endpoint", "embedding_endpoint"),
)
