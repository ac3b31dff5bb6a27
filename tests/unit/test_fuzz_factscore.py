"""Fuzz: KnowRL's fact scoring reads model text twice: the policy's think text (the embedded
backend's facts) and an LLM's replies (the paper backend's fact lists, grades and verdicts). Both
give a defined result for any text, never an exception."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragrl.factscore import embedded
from ragrl.factscore.paper import facts_stated, parse_atomic_facts, parse_grade, parse_verdict, verdict_stated

FUZZ = settings(max_examples=250, deadline=None, derandomize=True)

PERSON = "Kila V. Daisam"
THINK_FRAGMENTS = [f"{PERSON} was born in Port Velmar", "Daisam works for Gipusk Holdings", " and ", ", and ", "; ",
                   ", but ", ", while ", ". ", "? ", "! ", "\n\n", "Mr. ", "e.g. ", "U.S.", "[DOT]", "V.", "1,953",
                   "was born in ", "The capital of ", " is ", "<think>", "</think>", " ", "\ufffd", "\x00"]
THINK = st.lists(st.sampled_from(THINK_FRAGMENTS) | st.text(max_size=5), max_size=30).map("".join)
REPLY_FRAGMENTS = ["- ", "-", "\n", " ", "NON_FACTUAL:", "NON_FACTUAL", "<ANSWER>", "</ANSWER>", "<answer>", "A", "B",
                   "C", "CORRECT", "INCORRECT", "NOT_ATTEMPTED", "NOT ATTEMPTED", "True", "false", "TRUE", "not",
                   "cannot", "unknown", "information", ".", "Kila was born in Port Velmar", "\u0130", "\ufffd"]
REPLY = st.lists(st.sampled_from(REPLY_FRAGMENTS) | st.text(max_size=5), max_size=25).map("".join)


@FUZZ
@given(THINK | st.text(max_size=200), st.sampled_from([None, PERSON, "", " ", "x"]))
@example("x" * 5_000 + " was born in " + "y" * 5_000, PERSON)  # a run-on sentence is no fact to parse
@example(" and " * 2_000, None)
def test_the_embedded_backend_reads_any_think_text(text, topic):
    facts = embedded.atomic_facts(text)
    assert isinstance(facts, list) and all(isinstance(f, str) and f.strip() for f in facts)
    assert not any(f.endswith("?") for f in facts)  # questions are not facts
    for sentence in embedded.sentences(text):
        assert isinstance(sentence, str) and sentence == sentence.strip() and sentence
    for fact in facts:
        for head, relation, tail in embedded.parse_triples(fact, topic):
            assert isinstance(head, str) and isinstance(relation, str) and isinstance(tail, str)
    triples = embedded.document_triples(topic or "T", [text])
    assert all(isinstance(s, str) for s in triples.values())


@FUZZ
@given(REPLY | st.text(max_size=120))
@example("")
@example("- " * 3_000)
def test_llm_replies_are_read_without_raising(reply):
    facts = parse_atomic_facts(reply)
    assert all(isinstance(f, str) and len(f.split()) >= 3 and f == f.strip() for f in facts)
    assert len({f.lower() for f in facts}) == len(facts)  # one fact once
    assert isinstance(facts_stated(reply), bool)
    if facts:
        assert facts_stated(reply)  # a reply that gave facts was in the prompt's format
    assert parse_grade(reply) in ("correct", "incorrect", "not_attempted", "unparsed")
    assert isinstance(parse_verdict(reply), bool) and isinstance(verdict_stated(reply), bool)


def test_a_null_reply_is_no_fact_and_unparsed():
    assert parse_atomic_facts(None) == [] and parse_grade(None) == "unparsed" and isinstance(parse_verdict(None), bool)


FACT = (st.lists(st.text(st.characters(blacklist_categories=("Zs", "Cc", "Zl", "Zp")), min_size=1, max_size=6),
                 min_size=3, max_size=6).map(" ".join).filter(lambda f: "NON_FACTUAL:" not in f))


@FUZZ
@given(st.lists(FACT, max_size=6, unique_by=str.lower), st.sampled_from(["\n", "\n\n", "\n  "]))
def test_a_fact_list_reply_round_trips(facts, sep):
    reply = "Here are the facts:" + sep + sep.join(f"- {f}" for f in facts)
    assert parse_atomic_facts(reply) == facts


@FUZZ
@given(st.sampled_from([("A", "correct"), ("CORRECT", "correct"), ("B", "incorrect"), ("INCORRECT", "incorrect"),
                        ("C", "not_attempted"), ("NOT_ATTEMPTED", "not_attempted")]), st.text(max_size=30))
def test_a_tagged_grade_wins_over_the_text_around_it(pair, noise):
    letter, grade = pair
    noise = noise.replace("<", "")  # no second tag
    assert parse_grade(f"{noise}<ANSWER>{letter}</ANSWER>") == grade
