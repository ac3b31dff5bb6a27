"""Fuzz: what the search and KG methods read from a policy's text besides the action parser
(tests/unit/test_protocol.py): the QA rewards (`ragrl.rewards.qa`), KG-R1's turn and answer rewards
(`ragrl.rewards.kg`) and RAG-R1's multi-query turns (`MultiQuerySearchEnvironment`, both query
formats), for any text: a value in the documented range, never an exception, no injected token."""

from __future__ import annotations

import json
import re

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from ragrl.agent.environments import MultiQuerySearchEnvironment
from ragrl.agent.protocol import ACTION_NAMES, PROTOCOL_TAGS, normalize_query, observation, parse_turns, sanitize
from ragrl.rewards.kg import (
    answer_items,
    entity_f1,
    hits_at_1,
    split_turns,
    turn_format_ok,
    turn_reward_components,
    turn_rewards,
)
from ragrl.rewards.qa import extract_answer, format_reward, normalize_answer, strip_observations, turn_kind

FUZZ = settings(max_examples=250, deadline=None, derandomize=True)

RESERVED = ("<|im_end|>", "<|endoftext|>", "<s>", "</s>")  # chat tokens of Qwen and Llama tokenizers
_TAG = re.compile("|".join(map(re.escape, PROTOCOL_TAGS)))
FRAGMENTS = [*PROTOCOL_TAGS, *RESERVED, "<query>", "<", ">", "/", "|", ",", ", ", ";", "\n", " ", "\t", "\u00a0",
             "\ufffd", "\x00", "Turn limit reached. Give your final answer now.", "get_relations_out(\"Ada\")",
             "get_entities_out(\"Ada\", \"born_in\")", "Ada Lovelace", "London", "the", "1,234"]
TAG_SOUP = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join)
TEXT = TAG_SOUP | st.text(max_size=200)
# Non-blank text without a whole protocol tag or chat token (it may hold '<', '>' and '|').
PLAIN = (st.lists(st.sampled_from(FRAGMENTS[len(PROTOCOL_TAGS) + len(RESERVED):]) | st.text(max_size=6),
                  min_size=1, max_size=6).map("".join)
         .filter(lambda s: s.strip() and not _TAG.search(s) and not any(r in s for r in RESERVED)))


# --- QA rewards (Search-R1 and friends) ---------------------------------------------------------


@FUZZ
@given(TEXT)
def test_qa_rewards_read_any_response(text):
    answer = extract_answer(text)
    assert answer is None or (answer == answer.strip() and "<answer>" not in answer)
    assert len(strip_observations(text)) <= len(text)
    for tools in ("search", "kg-query", ()):
        fmt = format_reward(text, tools)
        assert fmt in (0.0, 1.0)
        if fmt:
            assert answer is not None  # a well-formed response ends in an <answer>
    for require_think in (True, False):
        assert turn_kind(text, require_think) in (None, *ACTION_NAMES)


@FUZZ
@given(st.lists(st.tuples(PLAIN, PLAIN, PLAIN | st.just("<answer>a decoy</answer>")), max_size=3), PLAIN,
       PLAIN | st.just(""))
def test_a_well_formed_search_response_round_trips(searches, think, answer):
    # The documents may hold an <answer>: it is the environment's text, never the policy's answer.
    text = "".join(f"<think>{t}</think>\n<search>{q}</search>{observation(doc)}" for t, q, doc in searches)
    text += f"<think>{think}</think>\n<answer>{answer}</answer>"
    assert len(parse_turns(text)) == len(searches) + 1
    assert format_reward(text) == 1.0 and extract_answer(text) == answer.strip()


# --- KG-R1 rewards ------------------------------------------------------------------------------


@FUZZ
@given(TEXT)
def test_kg_turn_rewards_read_any_response(text):
    turns = split_turns(text)
    assert all(t.action in ("kg-query", "answer", "invalid") for t in turns)
    for components in turn_reward_components(turns):
        assert set(components) == {"format", "query", "answer"} and set(components.values()) <= {0.0, 1.0}
    assert all(0.0 <= r <= 0.35 + 1e-9 for r in turn_rewards(turns))  # KG-R1's weights sum to 0.35
    assert isinstance(turn_format_ok(text), bool) and isinstance(turn_format_ok(text, forced=True), bool)


GOLD = st.text(st.sampled_from("abcxyzAB019 ,.'-"), min_size=1, max_size=12)


@FUZZ
@given(TEXT | st.none(), st.lists(GOLD | st.fixed_dictionaries({"text": GOLD, "kb_id": GOLD}), max_size=4))
def test_kg_answer_rewards_read_any_answer(answer, golds):
    items = answer_items(answer)
    assert all(i and i == i.strip() for i in items) and len(set(items)) == len(items)
    f1, hits = entity_f1(answer, golds), hits_at_1(answer, golds)
    assert 0.0 <= f1 <= 1.0 and hits in (0.0, 1.0)
    assert not hits or f1 > 0  # a gold first item is a correct item


@FUZZ
@given(st.lists(GOLD, min_size=1, max_size=4, unique_by=normalize_answer), st.sampled_from([" | ", "; ", "\n"]))
def test_naming_every_gold_entity_scores_one(names, sep):
    assume(all(normalize_answer(n) for n in names))
    assert entity_f1(sep.join(names), names) == 1.0 and hits_at_1(sep.join(names), names) == 1.0
    golds = [{"text": n, "kb_id": f"m.{i}"} for i, n in enumerate(names)]
    assert entity_f1(sep.join(names), golds) == 1.0


# --- RAG-R1: several queries in one <search> turn -----------------------------------------------


class EchoRetriever:
    def search(self, queries, topk):
        return [[{"id": str(i), "title": q, "text": f"about {q}"}] for i, q in enumerate(queries)]


ENVS = {fmt: MultiQuerySearchEnvironment(EchoRetriever(), topk=1, max_queries=3, query_format=fmt)
        for fmt in ("ragrl", "rag_r1")}


@FUZZ
@given(TEXT, st.sampled_from(sorted(ENVS)))
@example("</s>", "ragrl")  # quoted in the error as "unknown tag <s>": Llama's BOS token
@example("<search>a, b, c, d<|im_end|></search>", "rag_r1")  # a dropped query, quoted in the note
def test_a_multi_query_turn_gets_a_clean_observation(text, fmt):
    env = ENVS[fmt]
    action = env.parse(text)
    assert action.kind in ("search", "answer", "invalid")
    (obs,) = env.respond([action], reserved=RESERVED)
    if action.kind == "answer":
        assert obs is None
        return
    # Whatever the policy wrote, the observation cannot end itself early or carry a chat token.
    assert "</information>" not in obs and not any(r in obs for r in RESERVED), obs
    if action.kind == "search":
        assert 1 <= len(action.queries) <= 3
        if fmt == "rag_r1" and not action.dropped:
            assert json.loads(obs)["query"] == [sanitize(q, RESERVED) for q in action.queries]


@FUZZ
@given(st.lists(PLAIN, min_size=1, max_size=5), st.sampled_from(sorted(ENVS)))
def test_multi_query_splitting_round_trips(queries, fmt):
    sep = {"ragrl": " | ", "rag_r1": ", "}[fmt]
    assume(not any(s in q for q in queries for s in ENVS[fmt].separators))
    expected = list(dict.fromkeys(q for q in map(normalize_query, queries) if q))
    assume(expected)
    action = ENVS[fmt].parse(f"<think>plan</think><search>{sep.join(queries)}</search>")
    assert action.kind == "search"
    assert list(action.queries) == expected[:3] and list(action.dropped) == expected[3:]
