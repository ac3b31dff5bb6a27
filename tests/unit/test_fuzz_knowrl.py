"""Fuzz: KnowRL's completion rewards (`ragrl.rewards.knowrl`, the method's `score`) for any text a
policy writes: a reward in its documented range, never an exception, in linear time."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragrl.methods import get_method
from ragrl.methods.knowrl import completion
from ragrl.recipe import parse_recipe
from ragrl.rewards.knowrl import (
    CORRECTNESS,
    answer_text,
    em_grade,
    format_reward,
    is_refusal,
    knowrl_reward,
    think_text,
)
from helpers import KNOWRL_PERSON, KNOWRL_ROW, knowrl_kb

FUZZ = settings(max_examples=250, deadline=None, derandomize=True)

TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<search>", "</search>", "<information>", "</information>",
        "<kg-query>", "</kg-query>")
_TAG = re.compile("|".join(map(re.escape, TAGS)))
FRAGMENTS = [*TAGS, "<", ">", "/", "think", "answer", " ", "\n", "\t", "\u00a0", "\u2028", "I don't know", "Unknown",
             "not sure", "Port Velmar", "Kila V. Daisam was born in Port Velmar.", ".", "?", "\ufffd", "\x00"]
TAG_SOUP = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join)
# Text that may hold '<', '>' and tag names but no whole protocol tag, with something non-blank in it.
PLAIN = (st.lists(st.sampled_from(FRAGMENTS[len(TAGS):]) | st.text(max_size=6), min_size=1, max_size=8).map("".join)
         .filter(lambda s: s.strip() and not _TAG.search(s)))
WS = st.sampled_from(["", " ", "\n", "\n\n", " \t\n"])

PERSON, ROW = KNOWRL_PERSON, KNOWRL_ROW


def check_format(text, think_prefilled: bool) -> float:
    fmt = format_reward(text, think_prefilled)
    assert fmt in (1.0, -1.0)
    if fmt == 1.0:
        # The documented shape: exactly <think>…</think><answer>…</answer>, both parts non-blank,
        # no protocol tag inside either (a repeated or stray tag is a format error).
        whole = text.strip()
        whole = whole if not think_prefilled or whole.startswith("<think>") else "<think>" + whole
        tags = list(_TAG.finditer(whole))
        assert [m.group() for m in tags] == ["<think>", "</think>", "<answer>", "</answer>"]
        assert tags[0].start() == 0 and tags[3].end() == len(whole)
        assert whole[tags[0].end():tags[1].start()].strip() and whole[tags[2].end():tags[3].start()].strip()
        assert not whole[tags[1].end():tags[2].start()].strip()
    return fmt


@FUZZ
@given(st.text(max_size=200) | TAG_SOUP, st.booleans())
@example("<think></think></think><answer>x</answer>", False)  # an empty think closed twice
@example("</think></think><answer>x</answer>", True)  # the same with KnowRL's prefilled <think>
@example("<think>x</think><answer><answer>y</answer>", False)  # an opening tag at the start of a part
@example("<think><search>q</think><answer>y</answer>", False)
def test_any_completion_gets_a_defined_reward(text, think_prefilled):
    fmt = check_format(text, think_prefilled)
    think, answer = think_text(text), answer_text(text)
    assert isinstance(think, str) and think == think.strip()
    assert answer is None or (isinstance(answer, str) and answer == answer.strip() and "</answer>" not in answer)
    assert isinstance(is_refusal(answer), bool)
    grade = em_grade(answer, ROW["golden_answers"])
    assert grade in ("correct", "not_attempted", "incorrect")
    if is_refusal(answer):
        assert grade == "not_attempted"
    for fact_mode in ("additive", "wrong_only"):
        for factuality in (0.0, 1.0):
            total, parts = knowrl_reward(fmt, grade, factuality, fact_mode=fact_mode)
            assert parts["correct"] == CORRECTNESS[grade] and -2.0 <= total <= 4.0
            assert total == pytest.approx(parts["format"] + parts["correct"] + parts["fact"])


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.none() | st.integers() | st.binary(max_size=10) | st.lists(st.text(max_size=3), max_size=2))
def test_a_completion_that_is_not_text_is_a_format_error(value):
    assert format_reward(value) == -1.0 and format_reward(value, True) == -1.0
    assert answer_text(value) is None and think_text(value) == ""


@FUZZ
@given(PLAIN, PLAIN, WS, WS, WS)
def test_a_well_formed_completion_round_trips(think, answer, before, between, after):
    text = f"{before}<think>{think}</think>{between}<answer>{answer}</answer>{after}"
    assert check_format(text, False) == 1.0 and check_format(text, True) == 1.0
    assert think_text(text) == think.strip() and answer_text(text) == answer.strip()
    # KnowRL's chat template prefills <think>: the policy writes the rest.
    assert check_format(text.strip()[len("<think>"):], True) == 1.0
    assert format_reward(completion(think, answer)) == 1.0  # the gold SFT completions are well formed


@pytest.mark.parametrize("make", [
    lambda n: "<think>a" + " " * n + "</think><answer>a" + " " * n + "b",  # long whitespace runs, no </answer>
    lambda n: "<think>a" + "\n" * n + "</think>" + " " * n + "<answer>" + "\n" * n,
    lambda n: "<think>" + "a " * n + "</think><answer>" + " b" * n,
    lambda n: "<think>x</think><answer>" + "<" * n,
], ids=["whitespace_runs", "newline_runs", "words", "brackets"])
def test_format_reward_is_linear_in_the_completion(make):
    for n in (1_000, 50_000):
        start = time.monotonic()
        assert format_reward(make(n)) == -1.0
        # The old regex took 90 s at n = 4,000; this one ~30 ms at 50,000 on the 2-core machine.
        assert time.monotonic() - start < 3.0, n


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    kb = knowrl_kb(tmp_path_factory.mktemp("kb"))
    recipe = parse_recipe({"env": "knowrl", "options": {"kb": str(kb)}, "sft": {"enabled": False}},
                          "knowrl")
    return lambda text: get_method("knowrl").score(recipe, SimpleNamespace(response_text=text), ROW)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(TAG_SOUP | st.builds(lambda t, a: f"<think>{t}</think><answer>{a}</answer>", TAG_SOUP, TAG_SOUP))
@example("<think>" + f"{PERSON} was born in Port Velmar. " * 200 + "</think><answer>Velmar</answer>")
def test_the_method_scores_any_completion(scored, text):
    s = scored(text)
    c = s.components
    assert c["format"] in (1.0, -1.0) and c["correct"] in (2.0, 1.0, -1.0)
    assert 0.0 <= c["factuality"] <= 1.0 and 0.0 <= c["fact_precision"] <= 1.0 and c["n_facts"] >= 0
    assert s.reward == pytest.approx(c["format"] + c["correct"] + c["fact"])
