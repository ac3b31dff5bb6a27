"""A method written outside ragrl, as a researcher would add one (tests/workflow/test_methods.py).

Closed-book answering with its own environment (only <answer>), its own reward (exact match plus
a `brevity` component no built-in method has) and its own cold-start SFT data (the gold answer,
stated at once). Nothing under src/ or rules/ knows it: a recipe names it with
`env: direct_answer` and `plugin: <path to this file>`.
"""

from __future__ import annotations

import dataclasses

from ragrl.agent.protocol import ActionSpec, invalid_message, parse_action
from ragrl.methods import Method, Score


class DirectAnswerEnvironment:
    name = "direct_answer"

    def __init__(self) -> None:
        self.spec = ActionSpec(actions=("answer",))
        self.last_search_s = 0.0

    def parse(self, text):
        return parse_action(text, self.spec)

    def respond(self, actions, reserved=(), sample_ids=None):
        return [None if a.kind == "answer" else invalid_message(a.error or "answer directly", self.spec)
                for a in actions]


def make_environment(recipe, backends):
    return DirectAnswerEnvironment()


def score(recipe, trajectory, row):
    from ragrl.rewards.qa import exact_match

    answer = trajectory.answer
    parts = {"em": exact_match(answer, row["golden_answers"]),
             "brevity": float(answer is not None and 0 < len(answer.split()) <= 4)}
    return Score(sum(w * parts[k] for k, w in recipe.reward.items()), None, parts)


def gold_sft(recipe, qa, policy, env, backends, out, limit=None):
    import transformers

    from ragrl.agent.rollout import RolloutEngine
    from ragrl.train.sft_data import SFTDataStats, sft_row, read_qa_rows, write_sft_data

    tokenizer = transformers.AutoTokenizer.from_pretrained(policy)
    engine = RolloutEngine(None, tokenizer, env, recipe.rollout)
    stats, rows = SFTDataStats("direct_answer"), []
    for row in read_qa_rows(qa, limit):
        stats.total += 1
        prompt = engine.prompt_ids(row["question"])
        reply = tokenizer.encode(f"<think>I know this.</think>\n<answer>{row['golden_answers'][0]}</answer>",
                                 add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append(sft_row(row["id"], prompt + reply, [0] * len(prompt) + [1] * len(reply), 1, tokenizer))
    stats.kept = len(rows)
    write_sft_data(rows, stats, out)
    return stats.to_dict()


def eval_rollout(cfg):
    return dataclasses.replace(cfg, max_turns=0)


METHOD = Method(
    name="direct_answer",
    summary="closed-book answers with a brevity bonus (a test plug-in)",
    make_environment=make_environment,
    score=score,
    reward_keys=("em", "brevity"),
    default_reward={"em": 1.0},
    gold_sft=gold_sft,
    eval_rollout=eval_rollout,
)
