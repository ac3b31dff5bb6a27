"""Cold-start SFT data: token sequences in exactly the format the rollout engine produces.

Two routes, one output format.

Gold trajectories (the embedded default): for each QA row of the synthetic world, the trajectory
of a perfect agent, planned by a `GoldPlanner` (`ragrl.agent.gold_plan`; the world's: `ragrl.toy.gold`). One assistant turn per hop, `<think>…</think>\\n<search>query</search>`, whose
query is the 1-hop question template of the hop's relation filled with the hop's head ("Where was
X born?"); bridge hops are sequential (the second head is the first hop's answer); the two sides
of a comparison are one turn each, or ONE turn `<search>q1 | q2</search>` in the multi-query
environment (RAG-R1). After each search comes the observation the real retriever returns,
formatted by the environment itself (`env.parse` + `env.respond`, the engine's reserved tokens),
then the final `<think>…</think>\\n<answer>gold</answer>` and eos.

Token layout: the prompt is the engine's `prompt_ids(question)`; every assistant segment and every
observation is encoded on its own and concatenated, as the engine does, so the ids (not just the
text) equal what the engine would produce for a policy that emitted those segments. The mask is
the engine's loss mask: 1 on generated tokens, 0 on prompt and observations.

One deliberate difference: the rollout engine stops a turn at `</answer>` (a stop tag), so its
trajectories end there; the SFT sequences append the tokenizer's eos (`<|im_end|>` for ChatML,
mask 1), as a chat-formatted assistant message ends. A fine-tuned model then also stops cleanly
under plain chat generation; under the engine nothing changes (it stops at `</answer>` first).

Which gold trajectories are kept (`require_support=True`, the default): only those where every
hop's supporting passage is among that query's top-k. A trajectory whose observations lack the
evidence would teach the model to state the answer without support, i.e. to ignore retrieval;
dropping it costs data, not honesty, and the kept share is reported. Rows are also dropped when
they would not fit the rollout budgets unchanged (the engine would cut or force them): more
search turns than `max_turns - 1`, a turn longer than `max_turn_tokens`, an observation longer
than `max_obs_tokens`, or a sequence over `max_response_tokens` / `max_context_tokens` (the
latter only where the engine ends a trajectory there: `context_overflow: end`).

Teacher trajectories (paper scale): rollouts of a stronger model behind an OpenAI-compatible
endpoint (`OpenAICompletionsGenerator`), kept only when the extracted answer is an exact match
with a gold answer (and, by default, the response is well formed). The engine's tokenizer must be
the student's: the generator exchanges token ids, so the teacher must share the vocabulary (same
model family), which is how R1-style cold starts are usually distilled.

Output parquet (`write_sft_parquet`): id string, input_ids list<int32>, assistant_masks list<int8>,
num_turns int32, text string (the decoded sequence, special tokens kept, for inspection).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import pyarrow as pa

from ragrl.agent.gold_plan import GoldPlan, GoldPlanner, Hop  # noqa: F401  (re-exported)
from ragrl.agent.protocol import observation, recorded_turns
from ragrl.agent.rollout import RolloutEngine
from ragrl.data.qa import read_qa_rows  # plug-ins' gold SFT imports it from here too
from ragrl.errors import InputError
from ragrl.io import write_json, write_parquet
from ragrl.rewards.qa import exact_match, turns_format_reward

SFT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("assistant_masks", pa.list_(pa.int8())),
    ("num_turns", pa.int32()),
    ("text", pa.string()),
])


@dataclass
class SFTDataStats:
    """What went in and what came out; `dropped` counts rows per reason."""

    source: str
    total: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    @property
    def kept_share(self) -> float:
        return self.kept / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        return {"source": self.source, "total": self.total, "kept": self.kept,
                "kept_share": round(self.kept_share, 6), "dropped": dict(sorted(self.dropped.items()))}


# --------------------------------------------------------------------------- gold trajectories


@dataclass
class Draft:
    """One gold trajectory being assembled turn by turn (`dropped`: why it will not be kept)."""

    plan: GoldPlan  # or any plan with a row_id (the KG agent's KGPlan)
    ids: list[int]
    mask: list[int]
    dropped: str | None = None
    segments: int = 0


def gold_trajectories(qa_rows: Iterable[dict], engine: RolloutEngine, planner: GoldPlanner, *,
                      require_support: bool = True, append_eos: bool = True) -> tuple[list[dict], SFTDataStats]:
    """Gold SFT rows for `qa_rows` under `engine`'s prompt, environment, tokenizer and budgets.

    All rows advance turn by turn, so each turn is one batched retriever call (as in a rollout).
    The engine's generator is never called.
    """
    spec = engine.env.spec
    # A copy of the environment, so the engine's keeps its own record of the latest turn. Gold search
    # plans need a search environment (its `last_shown`), which the Environment protocol lacks.
    env: Any = copy.copy(engine.env)
    stats = SFTDataStats("gold")
    drafts = []
    for row in qa_rows:
        stats.total += 1
        plan = planner.plan(row, spec.multi_query, spec.max_queries)
        if not plan.answer:
            stats.dropped["no_gold_answer"] += 1
            continue
        if len(plan.turns) >= engine.config.max_turns:
            stats.dropped["too_many_turns"] += 1  # the engine would force an answer turn instead
            continue
        prompt = engine.prompt_ids(plan.question)
        drafts.append(Draft(plan, list(prompt), [0] * len(prompt)))

    for turn in range(max((len(d.plan.turns) for d in drafts), default=0)):
        active = [d for d in drafts if d.dropped is None and turn < len(d.plan.turns)]
        if active:
            _search_turn(active, turn, env, engine, planner, require_support)
    return finish_drafts(drafts, planner.answer_text, engine, stats, append_eos), stats


def finish_drafts(drafts, answer_of, engine: RolloutEngine, stats: SFTDataStats, append_eos: bool) -> list[dict]:
    """Append each surviving draft's answer turn (`answer_of(plan)`), check the totals, and turn
    the drafts into SFT rows; dropped drafts are counted by reason in `stats`."""
    rows = []
    for d in drafts:
        if d.dropped is None:
            append_segment(d, encode_segment(engine, answer_of(d.plan)), engine, eos=append_eos)
            _check_totals(d, engine)
        if d.dropped is not None:
            stats.dropped[d.dropped] += 1
            continue
        rows.append(sft_row(d.plan.row_id, d.ids, d.mask, d.segments, engine.tokenizer))
    stats.kept = len(rows)
    return rows


def _search_turn(active: list[Draft], turn: int, env, engine: RolloutEngine, planner: GoldPlanner,
                 require_support: bool) -> None:
    actions = []
    for d in active:
        text = planner.search_text(d.plan, turn)
        actions.append(env.parse(text))
        append_segment(d, encode_segment(engine, text), engine)
    infos = env.respond(actions, engine.reserved)
    # What each observation showed, per query: a passage the environment cut off (RAG-R1's
    # per-query cut) does not support a gold hop however high the retriever ranked it.
    for d, action, info, per_query in zip(active, actions, infos, env.last_shown, strict=True):
        hop_ids = d.plan.turns[turn]
        if d.dropped is not None:
            continue
        if action.kind != "search" or len(action.queries) != len(hop_ids):
            d.dropped = "unparsed_query"  # e.g. a name containing the query separator
            continue
        shown = [found[: env.topk] for found in per_query]
        if require_support and not all(_supported(d.plan.hops[h], hits) for h, hits in zip(hop_ids, shown)):
            d.dropped = "support_not_retrieved"
            continue
        obs = encode_segment(engine, observation(info or ""))
        if len(obs) > engine.config.max_obs_tokens:
            d.dropped = "observation_too_long"  # the engine would truncate it
            continue
        d.ids += obs
        d.mask += [0] * len(obs)


def _supported(hop: Hop, hits: Sequence[dict]) -> bool:
    return hop.passage is not None and any(str(h.get("id")) == hop.passage for h in hits)


def append_segment(d: Draft, ids: list[int], engine: RolloutEngine, eos: bool = False) -> None:
    if d.dropped is not None:
        return
    if len(ids) > engine.config.max_turn_tokens:
        d.dropped = "turn_too_long"
        return
    if eos and engine.tokenizer.eos_token_id is not None:
        ids = ids + [int(engine.tokenizer.eos_token_id)]
    d.ids += ids
    d.mask += [1] * len(ids)
    d.segments += 1


def _check_totals(d: Draft, engine: RolloutEngine) -> None:
    if d.dropped is not None:
        return
    cfg = engine.config
    prompt_len = d.mask.index(1) if 1 in d.mask else len(d.mask)
    over_context = cfg.context_limit is not None and len(d.ids) > cfg.context_limit
    if len(d.ids) - prompt_len > cfg.max_response_tokens or over_context:
        d.dropped = "sequence_too_long"


def encode_segment(engine: RolloutEngine, text: str) -> list[int]:
    # The engine's own encoding: no special tokens added (the chat template wrote them already).
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


def sft_row(row_id: str, ids: list[int], mask: list[int], turns: int, tokenizer) -> dict:
    return {"id": row_id, "input_ids": [int(i) for i in ids], "assistant_masks": [int(m) for m in mask],
            "num_turns": int(turns), "text": tokenizer.decode(ids, skip_special_tokens=False)}


# --------------------------------------------------------------------------- teacher trajectories


def teacher_trajectories(qa_rows: Sequence[dict], engine: RolloutEngine, *, n: int = 1, seed: int | None = 0,
                         batch_size: int = 64, max_per_question: int = 1, require_format: bool = True,
                         append_eos: bool = True) -> tuple[list[dict], SFTDataStats]:
    """Roll out `engine` (a teacher behind its generator) and keep the correct trajectories.

    Kept: the trajectory answered, its answer is an exact match with a gold answer and, with
    `require_format`, the whole response is well formed (`format_reward` = 1). At most
    `max_per_question` samples per question (ids get `#k` when several are kept).
    """
    from ragrl.progress import progress

    stats = SFTDataStats("teacher")
    rows: list[dict] = []
    batches = [list(qa_rows[i : i + batch_size]) for i in range(0, len(qa_rows), batch_size)]
    for b, batch in enumerate(progress(batches, desc="teacher rollouts", unit="batch")):
        trajs = engine.run_questions([r["question"] for r in batch], n=n,
                                     seed=None if seed is None else seed + b)
        kept_per_prompt: Counter = Counter()
        for t in trajs:
            stats.total += 1
            row = batch[t.prompt_index]
            reason = _teacher_reject(t, row, engine, require_format)
            if reason is None and kept_per_prompt[t.prompt_index] >= max_per_question:
                reason = "over_max_per_question"
            if reason is not None:
                stats.dropped[reason] += 1
                continue
            k = kept_per_prompt[t.prompt_index]
            kept_per_prompt[t.prompt_index] += 1
            ids, mask = list(t.prompt_ids) + list(t.response_ids), [0] * len(t.prompt_ids) + list(t.loss_mask)
            eos = engine.tokenizer.eos_token_id
            if append_eos and eos is not None and ids[-1] != eos:
                ids, mask = ids + [int(eos)], mask + [1]
            rows.append(sft_row(row["id"] if k == 0 else f"{row['id']}#{k}", ids, mask, len(t.actions),
                                 engine.tokenizer))
    stats.kept = len(rows)
    return rows, stats


def _teacher_reject(t, row: dict, engine: RolloutEngine, require_format: bool) -> str | None:
    if not t.finished or t.answer is None:
        return "no_answer"
    if exact_match(t.answer, row["golden_answers"]) < 1.0:
        return "wrong_answer"
    if require_format and turns_format_reward(recorded_turns(t), engine.env.spec.tools) < 1.0:
        return "bad_format"
    return None


# --------------------------------------------------------------------------- files


def write_sft_parquet(rows: Sequence[dict], path: str | Path) -> None:
    write_parquet(pa.Table.from_pylist(list(rows), schema=SFT_SCHEMA), path)


def write_sft_data(rows: Sequence[dict], stats: SFTDataStats, path: str | Path) -> Path:
    """The parquet at `path`, and its stats (kept share, drop reasons) next to it as `<name>.stats.json`."""
    path = Path(path)
    if not rows:
        raise InputError(f"no SFT trajectories to write to {path} ({stats.to_dict()})")
    write_sft_parquet(rows, path)
    stats_path = path.with_name(path.name.removesuffix(".parquet") + ".stats.json")
    write_json(stats.to_dict(), stats_path)
    return stats_path


# --------------------------------------------------------------------------- stages (what the CLI calls)


def data_engine(model_dir: str | Path, env, generator, rollout_cfg) -> RolloutEngine:
    import transformers

    from ragrl.agent.rollout import RolloutConfig

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return RolloutEngine(generator, tokenizer, env, rollout_cfg or RolloutConfig())


def gold_sft_stage(qa_parquet: str | Path, model_dir: str | Path, env, planner: GoldPlanner, out: str | Path, *,
                   rollout_cfg=None, limit: int | None = None, require_support: bool = True) -> dict:
    """Gold trajectories for the rows of `qa_parquet`, tokenized with the policy's tokenizer (`model_dir`).

    `env`: the environment RL and evaluation use (its retriever answers the gold queries), with
    the same budgets, or the format drifts.
    """
    engine = data_engine(model_dir, env, None, rollout_cfg)
    rows, stats = gold_trajectories(read_qa_rows(qa_parquet, limit), engine, planner, require_support=require_support)
    write_sft_data(rows, stats, out)
    report_stats(stats, out)
    return stats.to_dict()


def teacher_sft_stage(qa_parquet: str | Path, model_dir: str | Path, env, out: str | Path, *, base_url: str,
                      teacher_model: str, api_key: str | None = None, rollout_cfg=None, limit: int | None = None,
                      n: int = 1, max_per_question: int = 1, batch_size: int = 64, seed: int | None = 0) -> dict:
    """Teacher trajectories from an OpenAI-compatible server (vLLM) serving `teacher_model`, kept when right."""
    from ragrl.agent.generation import OpenAICompletionsGenerator

    teacher = OpenAICompletionsGenerator(base_url, teacher_model, api_key=api_key)
    try:
        engine = data_engine(model_dir, env, teacher, rollout_cfg)
        rows, stats = teacher_trajectories(read_qa_rows(qa_parquet, limit), engine, n=n, seed=seed,
                                           batch_size=batch_size, max_per_question=max_per_question)
    finally:
        teacher.close()
    write_sft_data(rows, stats, out)
    report_stats(stats, out)
    return stats.to_dict()


def report_stats(stats: SFTDataStats, out) -> None:
    import sys

    print(f"[sft-data] {stats.source}: kept {stats.kept}/{stats.total} ({100 * stats.kept_share:.1f}%), "
          f"dropped {dict(stats.dropped)} -> {out}", file=sys.stderr, flush=True)
