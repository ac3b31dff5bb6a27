"""Fuzz: AutoGraph-R1's constructor turns (`ragrl.kg.extraction.parse_triples`) and the judge's replies
(`ragrl.rewards.autograph`) give a defined result for any text a model writes, never an exception."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragrl.kg.extraction import (
    MAX_NAME_CHARS,
    MAX_TRIPLES_PER_TURN,
    MAX_TURN_CHARS,
    ParsedTurn,
    Triple,
    clean_name,
    parse_triples,
    repetition_share,
    triples_json,
    unique_triples,
)
from ragrl.kg.graph_scoring import JudgeItem
from ragrl.rewards.autograph import judge_prompt, read_verdict, verdict_stated

FUZZ = settings(max_examples=250, deadline=None, derandomize=True)

# What a constructor's JSON is made of, and what goes wrong in it: escapes (a lone surrogate escape
# is half an emoji), fences, prose, single quotes, comments, non-finite numbers, protocol tags.
FRAGMENTS = ["[", "]", "{", "}", '"', "'", ":", ",", "\\", '\\"', "\\n", "\\u", "\\ud83d", "\\ude00", "\\u0000",
             '"subject"', '"relation"', '"object"', '"subject": ', '"relation": "', '"object": "', "subject",
             '{"subject": "a", "relation": "r", "object": "b"}', "```json\n", "```", "\n", " ", "\t", "null", "true",
             "1e999", "-0", "NaN", "Infinity", "//", "/*", "*/", "Ada Lovelace", "born in", "<think>", "</think>",
             "<answer>", "|", "\ud800", "\udfff", "\x00", "\u2028", "\ufb01", "\u0130", "Here are the triples:"]
TAG_SOUP = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=40).map("".join)
KEYS = st.sampled_from(["subject", "relation", "object", "x"]) | st.text(max_size=4)
NESTED_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                           max_leaves=20).map(json.dumps)
NAME = st.text(min_size=1, max_size=30).filter(lambda s: clean_name(s) is not None)


def check_turn(turn: object, allow_empty: bool = False) -> None:
    """What every caller of `parse_triples` relies on."""
    assert isinstance(turn, ParsedTurn)
    if not turn.valid:
        assert isinstance(turn.error, str) and turn.error and turn.triples == ()
        return
    assert turn.error is None
    assert len(turn.triples) <= MAX_TRIPLES_PER_TURN
    assert turn.triples or allow_empty
    for t in turn.triples:
        for name in (t.subject, t.relation, t.object):
            # A usable node name: trimmed, single-spaced, bounded, and storable (the KG is a parquet
            # table, the triples are embedded and written as JSON lines: all need valid UTF-8).
            assert isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS
            assert " ".join(name.split()) == name
            name.encode("utf-8")
    pa.Table.from_pylist([{"head": t.subject, "relation": t.relation, "tail": t.object} for t in turn.triples])
    assert 0.0 <= repetition_share(turn.triples) < 1.0 or not turn.triples
    assert len({t.key() for t in unique_triples(turn.triples)}) == len(unique_triples(turn.triples))


@FUZZ
@given(st.text(max_size=300))
@example("x" * (MAX_TURN_CHARS + 1))
@example("[" * 5_000)
@example('{"a":' * 2_000)
@example('[{"subject": "\\ud83d", "relation": "likes", "object": "cats"}]')  # a lone surrogate escape
def test_any_text_gives_a_parsed_turn(text):
    for allow_empty in (False, True):
        check_turn(parse_triples(text, allow_empty=allow_empty), allow_empty)


@pytest.mark.parametrize("text, valid", [
    ('[{"subject": "cat \\ud83d\\ude00", "relation": "r", "object": "b"}]', True),  # a pair, whole JSON
    ('[{"subject": "cat \\ud83d\\ude00", "relation": "r", "object": "b"}', True),  # json_repair's path splits it
    ('[{"subject": "cat \\ud83d", "relation": "r", "object": "b"}', False),  # half an emoji
    ('[{"subject": "cat \\ude00\\ud83d", "relation": "r", "object": "b"}]', False),  # a pair the wrong way round
])
def test_an_escaped_emoji_is_a_name_and_half_of_one_is_not(text, valid):
    turn = parse_triples(text)
    assert turn.valid is valid
    if valid:
        assert turn.triples[0].subject == "cat \U0001F600"


@FUZZ
@given(TAG_SOUP | NESTED_JSON, st.booleans())
def test_json_soup_gives_a_parsed_turn(text, allow_empty):
    check_turn(parse_triples(text, allow_empty=allow_empty), allow_empty)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.none() | st.integers() | st.binary(max_size=20) | st.lists(st.text(max_size=5), max_size=3))
def test_a_turn_that_is_not_text_is_invalid(value):
    turn = parse_triples(value)
    assert not turn.valid and "not text" in turn.error


@FUZZ
@given(st.lists(st.tuples(NAME, NAME, NAME), min_size=1, max_size=6), st.sampled_from(["plain", "fenced", "cut"]))
def test_a_well_formed_turn_round_trips(names, wrapping):
    triples = [Triple(*(clean_name(n) for n in t)) for t in names]
    text = triples_json(triples)
    if wrapping == "fenced":  # models wrap the array in prose and a code fence
        text = f"Here are the triples:\n```json\n{text}\n```\n"
    elif wrapping == "cut":  # ... or stop before the closing bracket
        text = text[:-1]
    turn = parse_triples(text)
    assert turn.valid and len(turn.triples) == len(triples)
    # json_repair's repair path (not the plain one) decodes some escapes its own way: a backslash
    # followed by "\b" comes back as a backslash and "b". The triples survive; such names may not.
    escaped = any(c < " " or c == "\\" for t in triples for c in t.text())
    if wrapping == "plain" or not escaped:
        assert list(turn.triples) == triples
    assert parse_triples(triples_json(turn.triples)) == turn  # the canonical text reads back as itself


@FUZZ
@given(st.text(max_size=60) | st.none() | st.integers())
def test_judge_replies_are_read_without_raising(reply):
    yes = read_verdict(reply)
    assert isinstance(yes, bool)
    if isinstance(reply, str):
        stated = verdict_stated(reply)
        assert isinstance(stated, bool) and (stated or not yes)  # a yes is always a stated verdict


@FUZZ
@given(st.lists(st.tuples(NAME, NAME, NAME), max_size=4), st.text(max_size=40), st.text(max_size=20))
@example([("Ann", "born in", "{answer}"), ("{question}", "{triples}", "x")], "Where was Ann born?", "Lund")
def test_judge_prompt_quotes_the_triples_verbatim(names, question, answer):
    # The triples are the policy's text: one that spells "{answer}" must reach the judge as written.
    item = JudgeItem(question, (answer,), tuple(Triple(*t) for t in names))
    messages = judge_prompt(item, system="s", user="T:{triples}\nQ:{question}\nA:{answer}")
    facts = ". ".join(f"({s}-{r}->{o})" for s, r, o in names) or "No relevant triples found."
    assert messages[1]["content"] == f"T:{facts}\nQ:{question}\nA:{answer}".strip()
