"""Our QA parquet -> verl's RL parquet (the "RL data" contract of DESIGN §3).

One row per question: `data_source`, `prompt` (the chat messages: one user turn holding the
recipe's instruction with the question filled in, exactly the text the local rollout engine
templates), `ability`, `reward_model: {style: rule, ground_truth: [answers]}` and
`extra_info: {split, index, id, question}`. verl's RLHFDataset reads it as is; our agent loop
applies the chat template to `prompt` the way RolloutEngine.prompt_ids does, and the launcher
checks on the first rows that both give the same token ids.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ragrl.errors import InputError
from ragrl.io import atomic_path, read_columns

SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.list_(pa.string()))])),
    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("id", pa.string()),
                              ("question", pa.string())])),
])


def instruction_template(recipe) -> tuple[str, int]:
    """(template, max_queries) the rollout engine would use for this recipe (RolloutEngine.prompt_ids)."""
    from ragrl.agent.protocol import DEFAULT_INSTRUCTION, DEFAULT_MULTI_QUERY_INSTRUCTION

    env = recipe.method.make_environment(recipe, {})
    spec = env.spec
    template = (recipe.rollout.instruction or getattr(env, "instruction", None)
                or (DEFAULT_MULTI_QUERY_INSTRUCTION if spec.multi_query else DEFAULT_INSTRUCTION))
    return template, spec.max_queries


def prompt_ids(tokenizer, messages: list[dict], continue_user_turn: bool = False) -> list[int]:
    """Token ids of `messages` + the assistant header (or cut after the user's text, with
    `continue_user_turn`), as RolloutEngine.prompt_ids builds them.

    Shared by the launcher (to measure prompts) and the agent loop (to start a rollout): template
    as text, then encode without special tokens (the template already wrote any BOS).
    """
    from ragrl.agent.rollout import chat_prompt_text

    text = chat_prompt_text(tokenizer, messages, continue_user_turn)
    return list(tokenizer.encode(text, add_special_tokens=False))


def write_verl_parquet(qa: Path, out: Path, recipe, tokenizer, *, split: str = "train",
                       limit: int | None = None) -> dict:
    """Write verl's parquet for the questions of `qa`; returns {rows, max_prompt_length}."""
    from ragrl.agent.protocol import prompt_messages

    rows = read_columns(qa, ["id", "question", "golden_answers"]).to_pylist()
    rows = rows[:limit] if limit else rows
    if not rows:
        raise InputError(f"{qa}: no questions to train on")
    template, max_queries = instruction_template(recipe)
    reserved = tuple(getattr(tokenizer, "all_special_tokens", ()) or ())
    records, longest = [], 0
    for index, row in enumerate(rows):
        messages = prompt_messages(row["question"], template, max_queries, reserved, recipe.rollout.system_prompt,
                                   recipe.rollout.question_mark)
        longest = max(longest, len(prompt_ids(tokenizer, messages, recipe.rollout.continue_user_turn)))
        records.append({
            "data_source": f"ragrl/{recipe.name}",
            "prompt": messages,
            "ability": "qa",
            "reward_model": {"style": "rule", "ground_truth": [str(a) for a in row["golden_answers"]]},
            "extra_info": {"split": split, "index": index, "id": str(row["id"]), "question": row["question"]},
        })
    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(records, schema=SCHEMA), tmp)
    return {"rows": len(records), "max_prompt_length": longest}


def check_prompts_match_engine(out: Path, recipe, tokenizer, k: int = 32) -> None:
    """The first `k` prompts tokenize as the local rollout engine's prompts do (same instruction,
    same template, same ids): a drift here would train verl on prompts evaluation never shows."""
    from ragrl.agent.rollout import RolloutEngine

    engine = RolloutEngine(None, tokenizer, recipe.method.make_environment(recipe, {}), recipe.rollout)
    for row in pq.read_table(out, columns=["prompt", "extra_info"]).slice(0, k).to_pylist():
        ours = prompt_ids(tokenizer, row["prompt"], recipe.rollout.continue_user_turn)
        if ours != engine.prompt_ids(row["extra_info"]["question"]):
            raise RuntimeError(f"{out}: prompt of row {row['extra_info']['index']} differs from the rollout "
                               "engine's; the verl data writer and RolloutEngine.prompt_ids disagree")
