"""KnowRL's rewards on hand-made completions (both fact modes), bad completions, the method plug-in."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from types import SimpleNamespace

import pytest

from ragrl.methods import get_method
from ragrl.recipe import parse_recipe
from ragrl.rewards.knowrl import em_grade, format_reward, is_refusal, simpleqa_rates, think_text
from ragrl.settings import RolloutConfig
from helpers import KNOWRL_PERSON, KNOWRL_ROW, knowrl_kb

PERSON, ROW = KNOWRL_PERSON, KNOWRL_ROW


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return knowrl_kb(tmp_path_factory.mktemp("kb"))


def recipe(db, **options):
    return parse_recipe({"env": "knowrl", "options": {"kb": str(db), **options}, "sft": {"enabled": False}}, "knowrl")


def score(db, text, row=ROW, **options):
    s = get_method("knowrl").score(recipe(db, **options), SimpleNamespace(response_text=text), row)
    return s.reward, dict(s.components)


E9, E4 = math.exp(-9), math.exp(-4)  # length penalty of 1 fact and of 2 facts (gamma 10)
LONG_THINK = f"{PERSON} was born in Port Velmar. " * 300  # ~10k characters, one distinct fact
# completion, (format, correct, factuality), total additive, total wrong_only
TABLE = [
    (f"<think>{PERSON} was born in Port Velmar.</think><answer>Port Velmar</answer>", (1, 2, E9), 3 + E9, 3),
    (f"<think> {PERSON} was born in Port Velmar. </think>\n<answer> Velmar </answer>\n", (1, 2, E9), 3 + E9, 3),
    ("<think>Daisam works for Gipusk Holdings. Daisam was born in the year 1953.</think><answer>Kessa</answer>",
     (1, -1, E4), E4, E4),
    ("<think>Daisam works for Gipusk Holdings. Daisam works for Oru Mills.</think><answer>Kessa</answer>",
     (1, -1, 0.5 * E4), 0.5 * E4, 0.5 * E4),
    ("<think>I do not recall this person.</think><answer>I don't know.</answer>", (1, 1, 0.0), 2, 2),
    ("<think>Daisam works for Gipusk Holdings.</think><answer>I don't know</answer>", (1, 1, E9), 2 + E9, 2),
    # Bad shapes: a defined reward, never an exception.
    ("Port Velmar", (-1, -1, 0.0), -2, -2),  # no tags: no answer (incorrect), the whole text is the think text
    ("", (-1, -1, 0.0), -2, -2),
    (None, (-1, -1, 0.0), -2, -2),
    ("<think>a <think>b</think></think><answer>Port Velmar</answer>", (-1, 2, 0.0), 1, 1),  # nested think
    ("<think>x</think></think><answer>Port Velmar</answer>", (-1, 2, 0.0), 1, 1),  # repeated closing tag
    ("<think>x</think><answer>Kessa</answer><answer>Port Velmar</answer>", (-1, -1, 0.0), -2, -2),  # first answer counts
    ("<think>x</think><answer></answer>", (-1, -1, 0.0), -2, -2),  # empty answer
    ("<think></think><answer>Velmar</answer>", (-1, 2, 0.0), 1, 1),  # empty think
    (f"<think>{LONG_THINK}</think><answer>Port Velmar</answer>", (1, 2, E9), 3 + E9, 3),
    ("x" * 10_000, (-1, -1, 0.0), -2, -2),
    ("<think>" + "<answer>" * 2000, (-1, -1, 0.0), -2, -2),
]


@pytest.mark.parametrize("text, parts, additive, wrong_only", TABLE)
def test_reward_table(db, text, parts, additive, wrong_only):
    fmt, correct, factuality = parts
    total, comp = score(db, text)
    assert (comp["format"], comp["correct"]) == (fmt, correct)
    assert comp["factuality"] == pytest.approx(factuality)
    assert total == pytest.approx(additive) and comp["fact"] == pytest.approx(factuality)
    total, comp = score(db, text, fact_mode="wrong_only")
    assert total == pytest.approx(wrong_only)
    assert comp["fact_applied"] == float(correct == -1)


def test_every_component_is_logged(db):
    _, comp = score(db, TABLE[2][0])
    assert comp == {"format": 1.0, "correct": -1.0, "fact": pytest.approx(E4), "factuality": pytest.approx(E4),
                    "fact_applied": 1.0, "refusal": 0.0, "is_correct": 0.0, "is_incorrect": 1.0, "n_facts": 2.0,
                    "fact_precision": 1.0, "fact_missing_topic": 0.0, "fact_offformat_replies": 0.0,
                    "grade_unparsed": 0.0}


def test_weights_and_the_ablation(db):
    text = TABLE[2][0]
    total, _ = parse_and_score(db, text, {"format": 1.0, "correct": 1.0})  # KnowRL's ablation: no fact term
    assert total == 0.0
    total, _ = parse_and_score(db, text, {"format": 0.5, "correct": 2.0, "fact": 4.0})
    assert total == pytest.approx(0.5 - 2.0 + 4 * E4)


def parse_and_score(db, text, reward):
    r = parse_recipe({"env": "knowrl", "options": {"kb": str(db)}, "sft": {"enabled": False}, "reward": reward}, "k")
    s = get_method("knowrl").score(r, SimpleNamespace(response_text=text), ROW)
    return s.reward, s.components


@pytest.mark.parametrize("metadata", [json.dumps({"topic_entity": "Nobody"}), json.dumps({"type": "x"}), "not json",
                                      None, json.dumps([1])])
def test_no_topic_document_costs_only_the_fact_term(db, metadata):
    total, comp = score(db, TABLE[0][0], row={**ROW, "metadata": metadata})
    assert (total, comp["fact_missing_topic"], comp["factuality"]) == (3.0, 1.0, 0.0)


def test_a_long_completion_is_fast():
    start = time.monotonic()
    for text in ("<think>" + "a " * 5000 + "</think>" + "b" * 5000, "<think>" + " " * 10_000, "<" * 10_000):
        assert format_reward(text) == -1.0
    assert time.monotonic() - start < 1.0


def test_pieces():
    assert format_reward("<think>x</think><answer>y</answer>") == 1.0
    assert format_reward("x</think><answer>y</answer>") == -1.0
    assert format_reward("x</think><answer>y</answer>", think_prefilled=True) == 1.0  # KnowRL's template
    assert format_reward("<think>x</think><search>q</search><answer>y</answer>") == -1.0
    assert think_text("no tags at all") == "no tags at all"
    assert [is_refusal(a) for a in ("I don't know.", "i do not know the answer", "Unknown", "Known", None)] == [
        True, True, True, False, False]
    assert [em_grade(a, ["Port Velmar"]) for a in ("the port velmar", "I don't know", "Kessa", "", None)] == [
        "correct", "not_attempted", "incorrect", "incorrect", "incorrect"]


def test_a_fact_stated_again_counts_once(db):
    # The length penalty pays for more facts: the same fact again in another case, with a final
    # "!", or by the surname (the world's templates read it into the same triple) is one fact, or
    # restating one true sentence would climb from exp(-9) to near 1.
    once = score(db, f"<think>{PERSON} was born in Port Velmar.</think><answer>Port Velmar</answer>")[1]
    think = (f"{PERSON} was born in Port Velmar. {PERSON} was born in port velmar! "
             f"{PERSON.upper()} WAS BORN IN PORT VELMAR. Daisam was born in Port Velmar.")
    again = score(db, f"<think>{think}</think><answer>Port Velmar</answer>")[1]
    assert once["n_facts"] == again["n_facts"] == 1.0
    assert again["factuality"] == pytest.approx(once["factuality"]) == pytest.approx(E9)
    # Two different facts stay two.
    two = score(db, f"<think>{PERSON} was born in Port Velmar. {PERSON} works for Gipusk Holdings.</think>"
                    "<answer>Port Velmar</answer>")[1]
    assert two["n_facts"] == 2.0


def test_a_gold_that_reads_like_a_refusal_is_graded_correct():
    # The match is checked before the refusal words: the album "Unknown Pleasures" is an answer.
    assert [em_grade(a, ["Unknown Pleasures"]) for a in ("Unknown Pleasures", "unknown", "Closer")] == [
        "correct", "not_attempted", "incorrect"]
    assert em_grade("No Idea Records", ["No Idea Records"]) == "correct"


def test_with_the_think_prefilled_only_the_reasoning_is_scored(db):
    # The prompt opened the <think>: the completion starts inside it. The fact term scores the text
    # before </think>, as with the tag written out, not the answer and tags after it.
    body = f"{PERSON} was born in Port Velmar.</think><answer>Port Velmar</answer>"
    assert think_text(body, think_prefilled=True) == f"{PERSON} was born in Port Velmar."
    assert think_text("<think>x</think><answer>y</answer>", think_prefilled=True) == "x"
    assert think_text(body) == body.strip()  # not prefilled: KnowRL's fallback, the whole completion
    no_close = f"{PERSON} was born in Port Velmar. <answer>x</answer>"
    assert think_text(no_close, think_prefilled=True) == no_close.strip()  # no </think>: the fallback, no tag added
    prefilled, written = score(db, body, think_prefilled=True), score(db, "<think>" + body)
    assert prefilled[0] == pytest.approx(written[0]) == pytest.approx(3 + E9)
    assert prefilled[1]["n_facts"] == written[1]["n_facts"] == 1.0
    assert prefilled[1]["fact_precision"] == 1.0


def test_simpleqa_rates():
    rates = simpleqa_rates(["correct", "correct", "incorrect", "not_attempted", "unparsed"])
    assert rates == {"correct": 0.4, "incorrect": 0.4, "not_attempted": 0.2, "accuracy_given_attempted": 0.5,
                     "f1": pytest.approx(2 * 0.5 * 0.4 / 0.9), "n": 5.0}
    assert simpleqa_rates(["not_attempted"])["accuracy_given_attempted"] == 0.0
    assert simpleqa_rates([])["n"] == 0.0


@pytest.mark.parametrize("options, needle", [
    ({"fact_mode": "sometimes"}, "fact_mode='sometimes'"),
    ({"factscore": "paper"}, "need endpoint"),
    ({"endpoint": {"base_url": "http://x", "model": "m", "colour": 1}}, "endpoint.colour: unknown"),
    ({"gamma": 0}, "gamma=0"),
    ({"kb_path": "x"}, "unknown setting"),
])
def test_bad_options_fail_at_parse_naming_the_key(db, options, needle):
    with pytest.raises(ValueError, match="recipes.knowrl.options") as err:
        recipe(db, **options)
    assert needle in str(err.value)


def test_single_turn_environment_and_eval_hooks(db):
    method = get_method("knowrl")
    env = method.make_environment(recipe(db), {})
    assert env.spec.actions == ("answer",) and env.respond([SimpleNamespace(kind="search", error=None)])[0]
    # The single turn is the recipe's rollout from parsing on: SFT data, RL and evaluation share it.
    cfg = recipe(db).rollout
    assert (cfg.max_turns, cfg.forced_answer_prefill) == (0, False) and "I don't know" in cfg.instruction
    assert method.rollout(dataclasses.replace(RolloutConfig(), instruction="Q: {question}")).instruction == "Q: {question}"
    refusal = SimpleNamespace(response_text="<think>t</think><answer>I don't know</answer>")
    assert method.eval_metrics(recipe(db), ROW, refusal) == {
        "correct": 0.0, "incorrect": 0.0, "not_attempted": 1.0, "format_ok": 1.0, "fact_precision": None,
        "n_facts": 1.0}  # a refusal rests on no claim: no precision, though "t" counts as a fact
    guess = SimpleNamespace(response_text="<think>t</think><answer>Velmar Bay</answer>")
    assert method.eval_metrics(recipe(db), ROW, guess)["fact_precision"] == 0.0  # "t": no passage supports it
    empty = SimpleNamespace(response_text="<think>\n</think><answer>Port Velmar</answer>")
    assert method.eval_metrics(recipe(db), ROW, empty)["fact_precision"] is None  # no fact: no precision
    recalled = SimpleNamespace(response_text=f"<think>{PERSON} was born in Port Velmar. {PERSON} works for Acme."
                                             "</think><answer>Port Velmar</answer>")
    assert method.eval_metrics(recipe(db), ROW, recalled) == {
        "correct": 1.0, "incorrect": 0.0, "not_attempted": 0.0, "format_ok": 1.0, "fact_precision": 0.5,
        "n_facts": 2.0}
    assert set(method.eval_metric_columns) == {"correct", "incorrect", "not_attempted", "format_ok", "fact_precision",
                                               "n_facts"}


def test_a_corrupt_kb_fails_when_the_environment_is_made(db, tmp_path):
    """RL, evaluation and gold SFT data all make the environment before any rollout: a damaged KB
    is named there, not mid-run by sqlite."""
    from ragrl.errors import DataFormatError

    bad = tmp_path / "knowledge_base.db"
    bad.write_bytes(db.read_bytes()[:len(db.read_bytes()) // 2])
    with pytest.raises(DataFormatError, match=f"{bad}: not a readable SQLite database"):
        get_method("knowrl").make_environment(recipe(bad), {})
    with pytest.raises(FileNotFoundError, match=f"knowledge base {tmp_path / 'none.db'}: no such file"):
        get_method("knowrl").make_environment(recipe(tmp_path / "none.db"), {})


def test_the_reward_over_a_judge_endpoint_counts_off_format_replies_and_fails_on_null(db, chat_server):
    """KnowRL's reward with the paper backend and the LLM grader against a real HTTP endpoint: an
    off-format grade or fact list keeps KnowRL's reading and shows in the sample's components
    (the step's log), a reply without content raises naming the endpoint."""
    from ragrl.factscore.paper import EndpointError

    replies = {"grade": "A", "facts": f"- {PERSON} was born in Port Velmar.", "verdict": "True"}

    def reply(body):
        prompt = body["messages"][0]["content"]
        kind = "grade" if "Gold target:" in prompt else "verdict" if "STATEMENT TO VERIFY" in prompt else "facts"
        return 200, {"choices": [{"message": {"role": "assistant", "content": replies[kind]}}]}

    chat_server.reply = reply
    options = {"factscore": "paper", "grader": "llm", "verifier": "llm", "ranker_model": None,
               "endpoint": {"base_url": chat_server.url, "model": "judge", "max_retries": 0}}
    text = f"<think>{PERSON} was born in Port Velmar.</think><answer>Port Velmar</answer>"
    _, comp = score(db, text, **options)
    assert (comp["correct"], comp["n_facts"], comp["grade_unparsed"], comp["fact_offformat_replies"]) == (2, 1, 0, 0)
    replies.update(grade="Z", facts="Sure! Here they are.")
    _, comp = score(db, text.replace("Port", "Old Port"), **options)
    assert (comp["correct"], comp["n_facts"], comp["grade_unparsed"], comp["fact_offformat_replies"]) == (0, 0, 1, 1)
    replies["grade"] = None
    with pytest.raises(EndpointError, match=f"chat endpoint at {chat_server.url}/chat/completions answered with no "
                                            "content"):
        score(db, text.replace("Port", "New Port"), **options)
