"""ragrl.config.drop_null_entries: how an overlay removes a default's entry (rules/common.smk and
tests/workflow/test_paper_configs.py both call it)."""

from __future__ import annotations

from ragrl.config import drop_null_entries


def test_null_entries_of_the_named_collections_are_dropped_and_nothing_else():
    config = {
        "harr": None, "world": {"seed": None},
        "recipes": {"search_r1": {"env": "search"}, "rag_r1": None},
        "retrieval": {"indexes": {"flat": "Flat", "hnsw": None}, "bm25": None},
        "resources": {"rules": {"sft": None}, "default": None},
    }
    assert drop_null_entries(config) is config
    assert config == {
        "world": {"seed": None},  # not a named collection: a null value stays for validation to judge
        "recipes": {"search_r1": {"env": "search"}},
        "retrieval": {"indexes": {"flat": "Flat"}, "bm25": None},
        "resources": {"rules": {}, "default": None},
    }


def test_a_missing_or_non_mapping_collection_is_left_alone():
    config = {"recipes": ["not", "a", "mapping"], "retrieval": None}
    # retrieval: None is a top-level null entry, so it goes; the list is not a collection to clean.
    assert drop_null_entries(config) == {"recipes": ["not", "a", "mapping"]}
