from __future__ import annotations

import re
import string
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ragrl.agent.protocol import TURN_LIMIT_NOTICE, forced_answer_prompt, observation
from ragrl.rewards import (
    composite_reward,
    cover_exact_match,
    exact_match,
    extract_answer,
    f1,
    format_reward,
    normalize_answer,
)
from ragrl.agent.protocol import TurnRecord, parse_action, parse_turns
from ragrl.factscore.paper import parse_grade
from ragrl.rewards import knowrl
from ragrl.rewards.qa import split_observations, strip_observations, turns_format_reward


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Cat", "cat"),
        ("  A   quick, brown fox!  ", "quick brown fox"),
        ("an apple; the END.", "apple end"),
        ("theatre", "theatre"),  # articles only as whole words
        ("1,234,000", "1234000"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match():
    assert exact_match("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("1974", ["1,974", "1974"]) == 1.0
    assert exact_match("x", "x") == 1.0  # a single gold string
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("x", []) == 0.0


def test_a_gold_that_normalises_to_nothing_is_not_matched_by_every_empty_answer():
    # TriviaQA's "The The" is a band. Under plain SQuAD normalisation both it and "the", "a." or ""
    # normalise to "", so any article-only answer scored 1: a reward a policy learns to collect.
    for answer in ("", "the", "a.", "An"):
        assert exact_match(answer, ["The The"]) == 0.0
        assert cover_exact_match(answer, ["The The"]) == 0.0
    assert f1("a.", ["The The"]) == f1("", ["The The"]) == 0.0
    assert f1("the", ["The The"]) == pytest.approx(2 / 3)  # one of its two tokens, not 1
    assert exact_match("the the", ["The The"]) == 1.0
    assert exact_match("The The!", ["The The"]) == 1.0
    assert f1("The The band", ["The The"]) == pytest.approx(0.8)  # [the, the, band] vs [the, the]
    assert exact_match("", ["?"]) == 0.0  # a gold that is nothing either way matches nothing
    assert exact_match("the", ["The The", "the"]) == 1.0  # the second gold is "the" itself


def test_f1_hand_computed():
    # "the cat sat" -> [cat, sat]; "a cat sat down" -> [cat, sat, down]; 2 common tokens.
    # precision 2/2, recall 2/3, F1 = 2 * 1 * (2/3) / (1 + 2/3) = 0.8
    assert f1("the cat sat", ["a cat sat down"]) == pytest.approx(0.8)
    # [cat, cat] vs [cat]: common 1 (multiset), p = 1/2, r = 1 -> 2/3
    assert f1("cat cat", "cat") == pytest.approx(2 / 3)
    # best gold counts: vs "dog" 0, vs "cat sat" 1
    assert f1("cat sat", ["dog", "cat sat"]) == 1.0
    assert f1("dog", ["cat"]) == 0.0
    assert f1("the", ["a"]) == 0.0  # both normalise to nothing: compared with their articles kept
    assert f1("", ["cat"]) == 0.0
    assert f1(None, ["cat"]) == 0.0


def test_cover_exact_match():
    assert cover_exact_match("It was Paris, France.", ["paris"]) == 1.0
    assert cover_exact_match("in 1974", ["1974"]) == 1.0
    assert cover_exact_match("19745", ["1974"]) == 1.0  # character level, as in Search-R1
    assert cover_exact_match("Lyon", ["Paris"]) == 0.0
    assert cover_exact_match("anything", ["the"]) == 0.0
    assert cover_exact_match("it is The The", ["The The"]) == 1.0  # compared with its articles kept...
    for pred, gold in (("Paris", "A"), ("other", "The"), ("the theatre", "The The"), ("an ant", "A")):
        assert cover_exact_match(pred, [gold]) == 0.0, (pred, gold)  # ...as whole words
    assert cover_exact_match("a", ["A"]) == 1.0
    assert cover_exact_match("anything", ["?!"]) == 0.0  # nothing either way: covers nothing
    assert cover_exact_match(None, ["x"]) == 0.0


def test_extract_answer():
    assert extract_answer("<think>a</think><answer> Paris </answer>") == "Paris"
    assert extract_answer("<answer>a</answer> later <answer>b</answer>") == "b"
    assert extract_answer("<answer>a<answer>b</answer>") == "b"
    assert extract_answer("no answer here") is None
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer("</answer>") is None
    assert extract_answer("<answer></answer>") == ""
    # An observation quoting the syntax is not the model's answer.
    text = "<search>q</search>" + observation("Invalid action: x. Use <answer>answer</answer>.")
    assert extract_answer(text) is None


GOOD = (
    "<think>find Ada</think><search>Ada birthplace</search>"
    + observation("Doc 1(Title: Ada) Ada was born in Velmar.\n")
    + "<think>so Velmar</think>\n<answer>Velmar</answer>"
)


@pytest.mark.parametrize(
    ("text", "tools", "score"),
    [
        (GOOD, "search", 1.0),
        ("<think>easy</think><answer>x</answer>", "search", 1.0),
        ("<answer>x</answer>", "search", 0.0),  # no think
        ("<think>\n</think><answer>x</answer>", "search", 0.0),  # a blank think: the degenerate way to format
        ("<think></think><answer></answer>", "search", 0.0),
        ("<think>a</think><search>q</search>" + observation("docs"), "search", 0.0),  # no answer
        ("<think>a</think><search>q</search>" + observation("docs") + "<answer>x</answer>", "search", 0.0),
        ("<think>a</think>chatter<answer>x</answer>", "search", 0.0),  # text between think and action
        ("<think>a</think><answer>x</answer> trailing", "search", 0.0),
        ("<think>a</think><search> </search>" + observation("Invalid") + "<think>b</think><answer>x</answer>",
         "search", 0.0),
        ("<think>a <search>q</search></think><answer>x</answer>", "search", 0.0),
        ("<think>a</think><search>q1 | q2</search>" + observation("docs") + "<think>b</think><answer>x</answer>",
         "search", 1.0),
        ("<think>a</think><kg-query>q</kg-query>" + observation("triples") + "<think>b</think><answer>x</answer>",
         "search", 0.0),
        ("<think>a</think><kg-query>q</kg-query>" + observation("triples") + "<think>b</think><answer>x</answer>",
         "kg-query", 1.0),
        # forced final turn: the environment prefilled <answer>, so no <think> is required there
        ("<think>a</think><search>q</search>" + observation("docs") + forced_answer_prompt() + "Velmar</answer>",
         "search", 1.0),
        ("", "search", 0.0),
        # two observations in a row without the notice: an empty assistant turn
        ("<think>a</think><search>q</search>" + observation("d") + observation("e") + "<think>b</think><answer>x</answer>",
         "search", 0.0),
    ],
)
def test_format_reward(text, tools, score):
    assert format_reward(text, tools) == score


def test_forced_exemption_needs_the_exact_notice():
    text = "<think>a</think><search>q</search>" + observation("docs") + "<answer>x</answer>"
    assert format_reward(text) == 0.0
    assert TURN_LIMIT_NOTICE in forced_answer_prompt()


def test_format_reward_unknown_env():
    with pytest.raises(ValueError):
        format_reward("x", "browser")


def _actions(text):
    return [{"text": t.text, "observation": t.observation, "after_notice": t.after_notice} for t in parse_turns(text)]


def test_format_reward_reads_the_record_not_a_typed_notice():
    """A policy that types the turn-limit notice itself would, read from text, excuse its next
    turn from <think>; the record knows which turn really followed the environment's notice."""
    typed = ("<think>a</think><search>q</search>" + observation("docs")
             + "<information>" + TURN_LIMIT_NOTICE + "</information><answer>x</answer>")
    assert format_reward(typed) == 1.0  # the text route is fooled
    record = [TurnRecord("<think>a</think><search>q</search>", "docs"),
              TurnRecord("<information>" + TURN_LIMIT_NOTICE + "</information><answer>x</answer>")]
    assert turns_format_reward(record) == 0.0


def test_composite_reward():
    golds = ["Velmar", "Port Velmar"]
    good = {"response_text": GOOD, "answer": "Velmar", "actions": _actions(GOOD)}
    assert composite_reward(good, golds, {"em": 1.0, "format": 0.1}) == pytest.approx(1.1)
    assert composite_reward({**good, "answer": "Lyon"}, golds, {"em": 1.0, "format": 0.1}) == pytest.approx(0.1)
    traj = {"response_text": GOOD, "answer": "Port Velmar", "actions": _actions(GOOD)}
    assert composite_reward(traj, golds, {"em": 1.0, "f1": 0.5, "cover_em": 0.25, "format": 1.0}) == pytest.approx(2.75)
    junk = {"response_text": "junk", "answer": None, "actions": [{"text": "junk", "observation": None}]}
    assert composite_reward(junk, golds, {"em": 1.0, "format": 1.0}) == 0.0
    # A trajectory is scored by its turn record; one without a record is refused, not re-parsed.
    with pytest.raises(RuntimeError, match="no turn record"):
        composite_reward({"response_text": GOOD, "answer": "Velmar"}, golds, {"format": 1.0})
    with pytest.raises(ValueError, match="unknown reward weight"):
        composite_reward(good, golds, {"accuracy": 1.0})


# --- properties ----------------------------------------------------------------------------------

_NO_PUNCT = str.maketrans("", "", string.punctuation)
_answers = st.text(alphabet=st.sampled_from(list("abc the,.!A ")), max_size=20) | st.text(max_size=20)


@settings(max_examples=300, deadline=None)
@given(_answers, st.lists(_answers, min_size=1, max_size=3))
def test_metric_properties(pred, golds):
    em, f, cover = exact_match(pred, golds), f1(pred, golds), cover_exact_match(pred, golds)
    assert em in (0.0, 1.0) and cover in (0.0, 1.0) and 0.0 <= f <= 1.0
    assert em <= f  # an exact match has F1 1
    if all(normalize_answer(g) for g in golds):
        assert em <= cover  # a (non-empty) exact match is also covered
    assert exact_match(pred, golds) == max(exact_match(pred, [g]) for g in golds)
    assert f == max(f1(pred, [g]) for g in golds)


@settings(max_examples=300, deadline=None)
@given(_answers, _answers)
def test_single_gold_symmetry_and_self_match(a, b):
    assert exact_match(a, [b]) == exact_match(b, [a])
    if normalize_answer(a) and normalize_answer(b):  # else one side is compared with its articles
        assert f1(a, [b]) == pytest.approx(f1(b, [a]))
    # self-match, unless the answer is nothing but punctuation and space (it matches nothing)
    assert exact_match(a, [a]) == f1(a, [a]) == float(bool(a.translate(_NO_PUNCT).split()))
    assume(normalize_answer(a))
    assert cover_exact_match(a, [a]) == 1.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="ascii")))
def test_normalize_is_idempotent_on_ascii(s):
    n = normalize_answer(s)
    assert normalize_answer(n) == n
    assert n == n.strip() and "  " not in n


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30).filter(lambda s: "<" not in s and ">" not in s))
def test_extract_answer_roundtrip(content):
    text = f"<think>t</think><answer>{content}</answer>"
    assert extract_answer(text) == content.strip()


# --------------------------------------------------------------------------- linear-time parsing

_INFO_RE = re.compile(r"<information>(.*?)</information>", re.S)  # the pairing the scanner must keep


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<information>", "</information>", "<answer>", "</answer>", "x", "\n", " "]),
                max_size=16))
def test_split_observations_pairs_tags_like_the_regex(parts):
    text = "".join(parts)
    assert split_observations(text) == _INFO_RE.split(text)
    assert strip_observations(text) == _INFO_RE.sub("", text)


def _best_time(fn, text: str, repeats: int = 5, calls: int = 10) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(text)
            if time.perf_counter() - start > 2.0:  # far beyond linear (~1 ms): measured enough
                return (time.perf_counter() - start) / (_ + 1) * calls
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("fn", [strip_observations, extract_answer, format_reward], ids=lambda f: f.__name__)
def test_parsers_are_linear_in_unclosed_information_tags(fn):
    # 4x the input: linear costs ~4x, the old regex ~16x (3.4 s at 5,000 tags, 52 s at 20,000).
    # Sizes are small enough that a quadratic regression fails in seconds instead of hanging, and
    # the best of several repeats keeps a busy machine's noise out of the ratio.
    small, large = ("<information> x " * n + "<answer>a</answer>" for n in (2_000, 8_000))
    ratio = _best_time(fn, large) / max(_best_time(fn, small), 1e-9)
    assert ratio < 8, f"{fn.__name__}: 4x the tags took {ratio:.1f}x the time"


def _last_think(text: str) -> str | None:
    return parse_action(text + "<search>q</search>").think


@pytest.mark.parametrize("fn, tag", [(_last_think, "<think>"), (knowrl.think_text, "<think>"),
                                     (knowrl.answer_text, "<answer>"), (parse_grade, "<ANSWER>")],
                         ids=["parse_action", "knowrl.think_text", "knowrl.answer_text", "factscore.parse_grade"])
def test_parsers_are_linear_in_unclosed_tags_of_their_own(fn, tag):
    # parse_action's last <think>, KnowRL's first <think>/<answer> and the judge's <ANSWER> were
    # lazy regexes: 13 s for a turn of 20,000 unclosed <think> (measured before the fix).
    small, large = (tag * n + "x" for n in (2_000, 8_000))
    ratio = _best_time(fn, large) / max(_best_time(fn, small), 1e-9)
    assert ratio < 8, f"4x the tags took {ratio:.1f}x the time"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "x", "y", " "]), max_size=16))
def test_the_linear_parsers_pick_the_blocks_the_regexes_picked(parts):
    text = "".join(parts)
    think = re.compile(r"<think>(.*?)</think>", re.S)
    assert _last_think(text) == (think.findall(text)[-1] if think.findall(text) else None)
    first = think.search(text)
    assert knowrl.think_text(text) == (first.group(1) if first else text).strip()
    answer = re.search(r"<answer>(.*?)</answer>", swapped := text.replace("think>", "answer>"), re.S)
    assert knowrl.answer_text(swapped) == (answer.group(1).strip() if answer else None)
