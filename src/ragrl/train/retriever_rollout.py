"""HARR's environment: a frozen generator's search agent whose every `<search>` goes through the
retriever policy, with the history-aware state and a recorded Plackett–Luce draw per search.

The generator and its protocol are the Search-R1 agent this workflow already runs
(`ragrl.agent.rollout.RolloutEngine` with any generation backend); only the retriever behind
`<search>` changes. Each trajectory gets its own sample id ("{question id}#{k}", k its place in
the batch), so that the environment can keep the per-trajectory history the state string needs,
and the G rollouts of a question stay apart, as do two copies of a question in one batch (a step
that crosses an epoch boundary can draw a question twice).

History entries follow the authors' Search-R1 loop ({"sub_query", "answer"}): "answer" is the
generator's <think> text in the turn that issued the hop's search (`Action.think`, null when the
turn had none), or always null with `hop_answer="none"`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ragrl.agent.environments import SearchEnvironment
from ragrl.agent.protocol import Action
from ragrl.errors import InputError
from ragrl.retrieval.query_state import INSTRUCT_TEMPLATE, Hop, default_instruction, encoder_input, retrieval_state
from ragrl.settings import HOP_ANSWERS
from ragrl.train.retriever_grpo import Trajectory
from ragrl.train.retriever_policy import RetrievalStep, retrieve


class HistoryAwareSearchEnvironment(SearchEnvironment):
    """Search-R1's `<search>` environment over a retriever policy (HARR)."""

    def __init__(self, policy: Any, index: Any, passages: Any, *, topk: int = 3, pool_size: int = 30,
                 alpha: float = 0.05, use_history: bool = True, instruction: str | None = None,
                 template: str = INSTRUCT_TEMPLATE, stochastic: bool = True, seed: int = 0,
                 hop_answer: str = "think", forced_retrieval: bool = False) -> None:
        super().__init__(retriever=self, topk=topk)  # self.search is never called: _search is overridden
        if pool_size < topk:
            raise InputError(f"pool_size={pool_size} must be >= topk={topk}: the draw takes topk from the pool")
        self.policy, self.index, self.passages = policy, index, passages
        self.pool_size, self.alpha, self.use_history = pool_size, alpha, use_history
        # Not `self.instruction`: the rollout engine reads an environment's `instruction` as the
        # generator's prompt, and this is the query encoder's.
        self.query_instruction = default_instruction(use_history) if instruction is None else instruction
        if hop_answer not in HOP_ANSWERS:
            raise InputError(f"hop_answer must be one of {HOP_ANSWERS}, got {hop_answer!r}")
        self.template, self.stochastic, self.hop_answer = template, stochastic, hop_answer
        self.forced_retrieval = forced_retrieval
        self.generator = torch.Generator().manual_seed(seed)
        self.questions: dict[str, str] = {}
        self.history: dict[str, list[Hop]] = {}
        self.steps: dict[str, list[RetrievalStep]] = {}
        self._query_sample_ids: list[str] = []
        self._query_thinks: list[str | None] = []

    def begin(self, questions: Mapping[str, str]) -> None:
        """Start a batch: the original question of each sample id; histories start empty."""
        self.questions = dict(questions)
        self.history = {sid: [] for sid in questions}
        self.steps = {sid: [] for sid in questions}

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        raise TypeError("the history-aware environment needs each query's trajectory; use respond()")

    def respond(self, actions: Sequence[Action], reserved=(), sample_ids: Sequence[str | None] | None = None):
        if sample_ids is None or len(sample_ids) != len(actions):
            raise ValueError("the history-aware environment needs one sample id per action")
        unknown = sorted({str(s) for a, s in zip(actions, sample_ids) if a.kind == "search" and s not in self.questions})
        if unknown:
            raise ValueError(f"sample ids {unknown[:5]} were not started with begin()")
        searches = [(a, str(s)) for a, s in zip(actions, sample_ids) if a.kind == "search" for _ in a.queries]
        self._query_sample_ids = [s for _, s in searches]
        self._query_thinks = [a.think if self.hop_answer == "think" else None for a, _ in searches]
        return super().respond(actions, reserved, sample_ids)

    def _search(self, queries: list[str], sample_ids: list[str | None] | None = None) -> list[list[dict]]:
        # The base environment hands over each query's sample id; respond() has checked them.
        sids = [str(s) for s in sample_ids] if sample_ids is not None else self._query_sample_ids
        states = [encoder_input(retrieval_state(self.questions[sid], self.history[sid], q, use_history=self.use_history),
                                self.query_instruction, self.template) for sid, q in zip(sids, queries)]
        steps = retrieve(self.policy, self.index, states, pool_size=self.pool_size, k=self.topk, alpha=self.alpha,
                         stochastic=self.stochastic, generator=self.generator)
        out = []
        # respond() set them for exactly these queries; taken once, so a later direct call gets none.
        thinks = self._query_thinks if len(self._query_thinks) == len(queries) else [None] * len(queries)
        self._query_thinks = []
        for sid, query, step, think in zip(sids, queries, steps, thinks):
            self.steps[sid].append(step)
            # Appended after this hop's retrieval: a hop's own think shows from the next hop on.
            self.history[sid].append(Hop(query, think))
            rows = self.passages.rows(step.doc_ids)
            out.append([{"id": pid, "title": title, "text": text, "score": step.scores[j]}
                        for (pid, title, text), j in zip(rows, step.order)])
        return out

    def force_retrieval(self, sample_ids: Sequence[str]) -> None:
        """HARR's generator (`search_r1_generate`): a trajectory that never searched gets one
        retrieval step, its question as the query with an empty history, the pool's top k (not
        drawn); it trains the encoder under the trajectory's advantage like any other step."""
        missing = [sid for sid in sample_ids if not self.steps[sid]]
        states = [encoder_input(retrieval_state(self.questions[sid], [], self.questions[sid], use_history=self.use_history),
                                self.query_instruction, self.template) for sid in missing]
        for sid, step in zip(missing, retrieve(self.policy, self.index, states, pool_size=self.pool_size, k=self.topk,
                                               alpha=self.alpha, stochastic=False)):
            self.steps[sid].append(step)


def sample_id(question_id: str, k: int) -> str:
    return f"{question_id}#{k}"


def rollout_groups(engine: Any, env: HistoryAwareSearchEnvironment, rows: Sequence[Mapping[str, Any]],
                   group_size: int, seed: int | None = None) -> list[Trajectory]:
    """G rollouts of each QA row (id, question, golden_answers) scored by answer F1 (max over golds)."""
    from ragrl.rewards.qa import f1

    # Keyed by the trajectory's place in the batch, not its place in the group: with a question
    # twice in `rows`, "{id}#{g}" made two trajectories share one history and one list of draws
    # (each draw then trained under both advantages).
    sids = [sample_id(str(r["id"]), i * group_size + g) for i, r in enumerate(rows) for g in range(group_size)]
    env.begin({sid: str(r["question"]) for sid, r in zip(sids, (r for r in rows for _ in range(group_size)))})
    prompts = [engine.prompt_ids(str(r["question"])) for r in rows for _ in range(group_size)]
    runs = engine.run(prompts, n=1, seed=seed, sample_ids=sids)
    if env.forced_retrieval:
        env.force_retrieval(sids)
    out = []
    for i, (sid, run) in enumerate(zip(sids, runs)):
        row = rows[i // group_size]
        out.append(Trajectory(str(row["id"]), i // group_size, f1(run.answer, list(row["golden_answers"])),
                              env.steps[sid], run.answer or ""))
    return out
