"""Invariants of the synthetic world, checked on the files it writes (what every later stage reads)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragrl.paths import world_files
from ragrl.toy.relations import RELATION_BY_KEY
from ragrl.toy.world import Entity, fact_stated, generate_world, size_to_people, write_world


def _rows(world_dir: Path, name: str) -> list[dict]:
    return pq.read_table(world_dir / name).to_pylist()


def _written(tmp_path_factory, seed: int, size) -> Path:
    out = tmp_path_factory.mktemp(f"world{seed}")
    write_world(generate_world(seed, size), out)
    return out


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory) -> Path:
    return _written(tmp_path_factory, 13, "tiny")


def test_writes_every_declared_file(tiny_world):
    for f in world_files():
        assert (tiny_world / f).is_file(), f
    manifest = json.loads((tiny_world / "manifest.json").read_text())
    assert 200 <= manifest["passages"] <= 1000  # CI-sized: hundreds of passages
    assert len(manifest["entity_types"]) >= 6
    assert manifest["relations"] >= 10


def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_world(generate_world(5, 40), a)
    write_world(generate_world(5, 40), b)
    write_world(generate_world(6, 40), c)
    for f in world_files():
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (a / "passages.parquet").read_bytes() != (c / "passages.parquet").read_bytes()


def _kg_index(world_dir: Path, kg: str) -> dict[tuple[str, str], list[str]]:
    index: dict[tuple[str, str], list[str]] = {}
    for t in _rows(world_dir, f"kg/{kg}/triples.parquet"):
        index.setdefault((t["head"], t["relation"]), []).append(t["tail"])
    return index


def _check_world(world_dir: Path) -> None:
    passages = {p["id"]: p for p in _rows(world_dir, "passages.parquet")}
    entities = {e["name"]: Entity(e["id"], e["type"], e["name"], e["aliases"], e["split"])
                for e in _rows(world_dir, "entities.parquet")}
    relations = {r["key"]: r for r in _rows(world_dir, "relations.parquet")}
    kgs = {kg: _kg_index(world_dir, kg) for kg in ("A", "B")}
    assert len({e.type for e in entities.values()}) >= 6
    entity_relations = {k for k, r in relations.items() if r["tail_type"] not in ("year", "number")}
    assert len(entity_relations) >= 10

    used_facts: dict[str, set[tuple[str, str]]] = {}
    questions: dict[str, set[str]] = {}
    for split in ("train", "dev", "test"):
        rows = _rows(world_dir, f"qa/{split}.parquet")
        assert rows, f"empty {split} split"
        questions[split] = {r["question"] for r in rows}
        assert len(questions[split]) == len(rows), "duplicate question text"
        for row in rows:
            meta = json.loads(row["metadata"])
            hops = meta["hops"]
            support = [passages[i] for i in row["supporting_ids"]]
            # Every hop is stated, in one of its templates, by a supporting passage about its head.
            for head, rel, tail in hops:
                assert any(p["title"] == head and fact_stated(p["text"], entities[head], rel, tail) for p in support), (
                    row["id"], head, rel, tail)
                # And, without the generator's own matcher: the tail's text is in such a passage.
                assert any(p["title"] == head and tail in p["text"] for p in support), (row["id"], head, rel, tail)
                used_facts.setdefault(split, set()).add((head, rel))
                assert entities[head].split == split
            if meta["type"] in ("1hop", "bridge"):
                for (_, _, t1), (h2, _, _) in zip(hops, hops[1:]):
                    assert t1 == h2, "bridge hops must chain"
                assert hops[-1][2] == row["golden_answers"][0]
                assert not re.search(rf"\b{re.escape(row['golden_answers'][0])}\b", row["question"])
                assert meta["topic_entity"] in row["question"]
                # The same chain walked on both KGs, each in its own vocabulary, reaches the answer.
                for kg, col in (("A", "kg_a"), ("B", "kg_b")):
                    node = meta["topic_entity"]
                    for _, rel, _ in hops:
                        tails = kgs[kg][(node, relations[rel][col])]
                        assert len(tails) == 1, "1-hop relations asked about are functional"
                        node = tails[0]
                    assert node == row["golden_answers"][0]
            else:
                (a, rel, va), (b, _, vb) = hops
                va, vb = float(va.replace(",", "")), float(vb.replace(",", ""))
                assert va != vb
                assert a in row["question"] and b in row["question"]
                assert row["golden_answers"][0] in (a, b)
    # No fact a test or dev question needs is needed by any train question.
    assert not used_facts["test"] & used_facts["train"]
    assert not used_facts.get("dev", set()) & used_facts["train"]
    assert not questions["test"] & questions["train"]

    # Distractors mention entities but state none of their facts.
    facts = [(t["head"], k, t["tail"]) for k in relations
             for t in _rows(world_dir, "kg/A/triples.parquet") if t["relation"] == relations[k]["kg_a"]]
    for p in passages.values():
        if p["source"] == "distractor":
            for head, rel, tail in facts:
                if head in p["text"]:
                    assert not fact_stated(p["text"], entities[head], rel, tail)


# derandomize: CI must be reproducible; the seeds still vary across examples.
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), people=st.integers(20, 60))
def test_answers_derivable_from_passages_and_kg(tmp_path_factory, seed, people):
    _check_world(_written(tmp_path_factory, seed, people))


def test_tiny_world_invariants(tiny_world):
    _check_world(tiny_world)


def test_kgqa_and_factual_rows(tiny_world):
    entities = {e["name"]: e for e in _rows(tiny_world, "entities.parquet")}
    for kg, col in (("A", "kb_id_a"), ("B", "kb_id_b")):
        rows = _rows(tiny_world, f"kgqa/{kg}/test.parquet")
        assert rows
        for r in rows:
            assert r["kg"] == kg
            for ans in r["answers"]:
                assert entities[ans["text"]][col] == ans["kb_id"]
            assert all(t in entities for t in r["topic_entities"])
    docs = {d["id"]: d for d in _rows(tiny_world, "kb/documents.parquet")}
    for r in _rows(tiny_world, "factual/test.parquet"):
        meta = json.loads(r["metadata"])
        doc = docs[r["supporting_ids"][0]]
        assert r["golden_answers"][0] in doc["text"]
        assert all(f in doc["text"] for f in meta["facts"])


def test_kgqa_splits_are_topped_up_to_the_text_splits_sizes(tiny_world):
    # #12: at least 100 test questions per dataset. Only ~60% of the text questions have an
    # entity answer, so the KGQA splits draw more of their split's entity-answer questions.
    manifest = json.loads((tiny_world / "manifest.json").read_text())
    assert manifest["kgqa"]["A"]["test"] == manifest["kgqa"]["B"]["test"] >= 100
    assert manifest["kgqa"]["A"]["train"] >= manifest["questions"]["train"]
    entities = {e["name"]: e for e in _rows(tiny_world, "entities.parquet")}
    by_split = {}
    for split in ("train", "dev", "test"):
        rows = _rows(tiny_world, f"kgqa/A/{split}.parquet")
        questions = [r["question"] for r in rows]
        assert len(set(questions)) == len(questions), split
        assert len({r["id"] for r in rows}) == len(rows), split
        # a question belongs to its topic entity's split, so no test question is trained on
        assert {entities[r["topic_entities"][0]]["split"] for r in rows} == {split}
        assert [r["question"] for r in _rows(tiny_world, f"kgqa/B/{split}.parquet")] == questions
        by_split[split] = set(questions)
    assert not by_split["train"] & (by_split["dev"] | by_split["test"])
    # the text questions with entity answers come first, under their own ids
    text_ids = {r["id"] for r in _rows(tiny_world, "qa/test.parquet")}
    test_ids = [r["id"] for r in _rows(tiny_world, "kgqa/A/test.parquet")]
    n_text = sum(i in text_ids for i in test_ids)
    assert 0 < n_text < len(test_ids) and all(i in text_ids for i in test_ids[:n_text])


def test_question_mix_has_every_type(tiny_world):
    types = {json.loads(r["metadata"])["type"] for r in _rows(tiny_world, "qa/train.parquet")}
    assert types == {"1hop", "bridge", "comparison"}


def test_templates_vary(tiny_world):
    # Passages must not all use one sentence per relation, or retrieval becomes string matching.
    texts = " ".join(p["text"] for p in _rows(tiny_world, "passages.parquet"))
    born = RELATION_BY_KEY["born_in"].sentences
    used = sum(1 for tpl in born if tpl.split("{t}")[0].replace("{h}", "").strip() in texts)
    assert used >= 2


@pytest.mark.parametrize("size,people", [("tiny", 100), ("bench", 40000), (250, 250), ("75", 75)])
def test_size_presets(size, people):
    assert size_to_people(size) == people


@pytest.mark.parametrize("size", ["huge", 3, "-5"])
def test_bad_size_is_named(size):
    with pytest.raises(ValueError, match="world size"):
        size_to_people(size)
