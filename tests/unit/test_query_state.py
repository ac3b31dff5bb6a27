"""HARR's retrieval state strings, checked against the exact text the authors' code builds."""

from __future__ import annotations

import pytest

from ragrl.retrieval.query_state import (
    INSTRUCT_TEMPLATE,
    Hop,
    default_instruction,
    encoder_input,
    history_state,
    query_only_state,
    retrieval_state,
)


def test_history_state_with_react_hops():
    hops = [Hop("Who founded Velmora Works?", "Daifan H. Jaitheam", "FOUND"),
            {"sub_query": "Où est né Daifan?", "status": "NOT_FOUND", "answer": "The context mentions Orlu"}]
    got = history_state("Where was the founder of Velmora Works born?", hops, "Daifan H. Jaitheam birthplace")
    assert got == (
        "Original Question: Where was the founder of Velmora Works born?\n"
        'History: [{"sub_query": "Who founded Velmora Works?", "status": "FOUND", "answer": "Daifan H. Jaitheam"}, '
        '{"sub_query": "Où est né Daifan?", "status": "NOT_FOUND", "answer": "The context mentions Orlu"}]\n'
        "Query: Daifan H. Jaitheam birthplace"
    )


def test_first_hop_and_search_r1_hops():
    assert history_state("Q?", [], "q") == "Original Question: Q?\nHistory: []\nQuery: q"
    # Search-R1's loop records no status, and null when the agent wrote no <think>.
    got = history_state("Q?", [Hop("a", None), Hop("b", 'said "x"')], "c")
    assert got == ('Original Question: Q?\nHistory: [{"sub_query": "a", "answer": null}, '
                   '{"sub_query": "b", "answer": "said \\"x\\""}]\nQuery: c')


def test_query_only_ablation():
    assert query_only_state("Daifan H. Jaitheam birthplace") == "Query: Daifan H. Jaitheam birthplace"
    assert retrieval_state("Q?", [Hop("a", "b")], "c", use_history=False) == "Query: c"
    assert retrieval_state("Q?", [], "c", use_history=True) == "Original Question: Q?\nHistory: []\nQuery: c"


def test_encoder_input_with_the_authors_instructions():
    state = history_state("Q?", [], "q")
    assert encoder_input(state, default_instruction(True)) == (
        "Instruct: Given an Original Question that requires multi-hop retrieval and the History (i.e., the "
        "completed hops), retrieve relevant passages for the Query (i.e., the current hop) that help answer the "
        "Original Question.\nOriginal Question: Q?\nHistory: []\nQuery: q"
    )
    assert encoder_input("Query: {x}", default_instruction(False), INSTRUCT_TEMPLATE) == (
        "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: {x}")
    # A model trained without instructions sees the state alone.
    assert encoder_input("Query: q", "ignored", "{state}") == "Query: q"
    with pytest.raises(ValueError, match="no {state} placeholder"):
        encoder_input("Query: q", "i", "Instruct: {instruction}")
