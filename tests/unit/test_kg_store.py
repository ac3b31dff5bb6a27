"""KG store (CSR adjacency, lookups, loaders, subgraphs) and the four one-hop operations."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.errors import DataFormatError
from ragrl.kg.ops import (
    OPERATIONS,
    OpLimits,
    Status,
    execute,
    get_entities_in,
    get_entities_out,
    get_head_entities,
    get_head_relations,
    get_relations_in,
    get_relations_out,
    get_tail_entities,
    get_tail_relations,
    status_of_message,
)
from ragrl.kg.store import KGStore, SimpleKGQA, load_kg, load_triples_parquet
from ragrl.toy.world import generate_world, write_world

FIXTURE = Path(__file__).resolve().parents[2] / "resources" / "fixtures" / "kgqa" / "simple"

TRIPLES = [
    ("Ada Lovelace", "place of birth", "London"),
    ("Ada Lovelace", "father", "Lord Byron"),
    ("Ada Lovelace", "field", "Mathematics"),
    ("Ada Lovelace", "field", "Computing"),
    ("Lord Byron", "place of birth", "London"),
    ("London", "country", "United Kingdom"),
    ("Charles Babbage", "place of birth", "London"),
    ("Charles Babbage", "field", "Mathematics"),
    ("ADA", "field", "Programming languages"),  # differs from a name only by case: exact wins
    ("Ada Lovelace", "field", "Mathematics"),  # a repeated triple
]


@pytest.fixture(scope="module")
def store() -> KGStore:
    h, r, t = zip(*TRIPLES)
    return KGStore.from_triples(list(h), list(r), list(t))


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kgworld")
    write_world(generate_world(7, "tiny"), root)
    return root


# --------------------------------------------------------------------------- store structure


def test_build_dedupes_and_encodes(store):
    assert store.num_triples == len(set(TRIPLES))
    assert store.num_relations == 4
    assert store.relation_names == sorted(store.relation_names)  # listings come out sorted
    assert {store.entity_keys[i] for i in np.concatenate([store.heads, store.tails])} == {
        x for h, _, t in TRIPLES for x in (h, t)}


def test_csr_slices_are_sorted_by_relation(store):
    for adj in (store.out, store.inc):
        assert adj.indptr[0] == 0 and adj.indptr[-1] == store.num_triples
        for e in range(store.num_entities):
            rels = adj.rel[adj.indptr[e] : adj.indptr[e + 1]]
            assert list(rels) == sorted(rels)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3), st.integers(0, 7)), max_size=60))
def test_adjacency_matches_brute_force(triples):
    h, r, t = (np.array([x[i] for x in triples], dtype=np.int64) for i in range(3))
    s = KGStore(h, r, t, [f"e{i}" for i in range(8)], [f"r{i}" for i in range(4)])
    facts = set(triples)
    for e in range(8):
        assert list(s.relations_out(e)) == sorted({rr for hh, rr, _ in facts if hh == e})
        assert list(s.relations_in(e)) == sorted({rr for _, rr, tt in facts if tt == e})
        for rel in range(4):
            assert sorted(s.entities_out(e, rel)) == sorted({tt for hh, rr, tt in facts if hh == e and rr == rel})
            assert sorted(s.entities_in(e, rel)) == sorted({hh for hh, rr, tt in facts if tt == e and rr == rel})
    assert s.num_triples == len(facts)


def test_million_triples_build_in_seconds():
    rng = np.random.default_rng(0)
    m, n = 1_000_000, 200_000

    def names(ids, prefix):  # Arrow-built strings: the test measures the store, not Python string making
        return pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(pa.array(ids), pa.string()), "")

    h, t, r = rng.integers(0, n, m), rng.integers(0, n, m), rng.integers(0, 300, m)
    start = time.perf_counter()
    s = KGStore.from_triples(names(h, "Entity "), names(r, "rel."), names(t, "Entity ")).warm()
    elapsed = time.perf_counter() - start
    assert s.num_triples > 990_000
    assert elapsed < 30, f"1M-triple build + lookup indexes took {elapsed:.1f}s"
    e = s.lookup("entity 42")
    assert e is not None and s.entity_keys[e] == "Entity 42"
    expected = sorted(set(r[(h == 42)].tolist()))
    assert [int(s.relation_names[x][4:]) for x in s.relations_out(e)] == sorted(expected, key=lambda v: f"rel.{v}")


# --------------------------------------------------------------------------- lookups


def test_name_lookup_exact_then_case_insensitive(store):
    ada = store.resolve("Ada Lovelace")
    assert ada.how == "exact" and store.entity_keys[ada.ids[0]] == "Ada Lovelace"
    assert store.resolve("ada lovelace").how == "casefold"
    assert store.resolve("  Ada   Lovelace ").how == "exact"  # whitespace is not identity
    assert store.entity_keys[store.resolve("ADA").ids[0]] == "ADA"  # exact beats case-insensitive
    assert store.resolve("Ada").how == "casefold" and store.entity_keys[store.resolve("Ada").ids[0]] == "ADA"
    assert store.resolve("Grace Hopper").ids == ()
    assert store.relation_id("PLACE OF BIRTH") == store.relation_id("place of birth") is not None
    assert store.relation_id("born in") is None


def test_aliases_and_kb_ids_from_an_entities_table(store):
    table = pa.table({"name": ["Ada Lovelace", "Nobody"], "aliases": [["Augusta Ada King"], ["x"]],
                      "kb_id": ["Q7259", "Q0"]})
    s = store.with_entity_table(table.column("name").to_pylist(), table.column("aliases").to_pylist(),
                                table.column("kb_id").to_pylist())
    assert s.resolve("Augusta Ada King").how == "alias"
    assert s.resolve("augusta ada king").how == "alias_casefold"
    assert s.resolve("Q7259").how == "exact"
    assert s.entity_names[s.lookup("Q7259")] == "Ada Lovelace"
    assert s.resolve("x").ids == ()  # aliases of entities not in the KG are ignored
    assert store.resolve("Augusta Ada King").ids == ()  # the original is unchanged


def test_suggestions_by_case_insensitive_prefix(store):
    assert store.suggest("ada lovelac") == ["Ada Lovelace"]
    assert store.suggest("Charles Darwin")[0] == "Charles Babbage"  # longest shared prefix: "charles "
    assert store.suggest("zzz") == []
    # Shorter than min_prefix (3): nothing, so names cannot be listed letter by letter.
    assert store.suggest("Ad") == [] and store.suggest("A") == [] and "Ada Lovelace" in store.suggest("Ada")


# --------------------------------------------------------------------------- ops and every status


def test_relations_out_and_in(store):
    out = get_relations_out(store, "Ada Lovelace")
    assert out.status is Status.SUCCESS and out.results == ("father", "field", "place of birth")
    assert out.message.startswith('get_relations_out("Ada Lovelace") found 3 relations:\n')
    inc = get_relations_in(store, "London")
    assert inc.ok and inc.results == ("place of birth",)
    assert get_tail_relations(store, "Ada Lovelace").results == out.results
    assert get_head_relations(store, "London").results == inc.results
    assert get_tail_relations(store, "Ada Lovelace").message.startswith("get_tail_relations(")


def test_entities_out_and_in(store):
    r = get_entities_out(store, "ada lovelace", "Field")
    assert r.ok and r.results == ("Computing", "Mathematics") and r.total == 2
    assert r.message.startswith('get_entities_out("Ada Lovelace", "field") found 2 entities:')  # canonical names echoed
    born = get_entities_in(store, "London", "place of birth")
    assert born.results == ("Ada Lovelace", "Charles Babbage", "Lord Byron")
    assert get_tail_entities(store, "Ada Lovelace", "field").results == r.results
    assert get_head_entities(store, "London", "place of birth").results == born.results


def test_entity_not_found_suggests_names(store):
    r = get_relations_out(store, "Ada Lovelac")
    assert r.status is Status.ENTITY_NOT_FOUND and r.results == ()
    assert '"Ada Lovelace"' in r.message and r.message.startswith("Entity not found: ")


def test_relation_not_found_lists_available_relations(store):
    r = get_entities_out(store, "Ada Lovelace", "born in")
    assert r.status is Status.RELATION_NOT_FOUND
    assert "not a relation in the knowledge graph" in r.message
    assert "father, field, place of birth" in r.message
    # A real relation in the wrong direction: the message points at the other operation.
    wrong_way = get_entities_out(store, "London", "place of birth")
    assert wrong_way.status is Status.RELATION_NOT_FOUND
    assert 'get_entities_in("London", "place of birth")' in wrong_way.message


def test_relation_listing_is_capped(store):
    r = get_entities_out(store, "Ada Lovelace", "nope", OpLimits(max_listed_relations=1))
    assert "(+2 more)" in r.message


def test_no_results(store):
    r = get_relations_out(store, "United Kingdom")
    assert r.status is Status.NO_RESULTS and 'get_relations_in("United Kingdom")' in r.message
    r = get_entities_out(store, "Mathematics", "field")
    assert r.status is Status.NO_RESULTS


def test_format_errors(store):
    assert execute(store, "get_relations_out", []).status is Status.FORMAT_ERROR
    assert execute(store, "get_entities_out", ["Ada Lovelace"]).status is Status.FORMAT_ERROR
    assert execute(store, "get_entities_out", ["Ada Lovelace", "  "]).status is Status.FORMAT_ERROR
    assert execute(store, "get_entities_out", ["Ada Lovelace", None]).status is Status.FORMAT_ERROR
    long = execute(store, "get_relations_out", ["x" * 10_000])
    assert long.status is Status.FORMAT_ERROR and len(long.message) < 300
    unknown = execute(store, "drop_table", ["Ada"])
    assert unknown.status is Status.FORMAT_ERROR and "get_relations_out" in unknown.message


def test_results_are_capped_with_a_note():
    s = KGStore.from_triples(["hub"] * 120, ["links"] * 120, [f"n{i:03d}" for i in range(120)])
    r = get_entities_out(s, "hub", "links", OpLimits(max_results=10))
    assert r.ok and len(r.results) == 10 and r.total == 120 and r.truncated == 110
    assert "found 120 entities, showing the first 10" in r.message


def test_every_status_is_recoverable_from_its_message(store):
    cases = {
        Status.SUCCESS: get_relations_out(store, "Ada Lovelace"),
        Status.ENTITY_NOT_FOUND: get_relations_out(store, "Nobody At All"),
        Status.RELATION_NOT_FOUND: get_entities_out(store, "Ada Lovelace", "nope"),
        Status.NO_RESULTS: get_relations_out(store, "United Kingdom"),
        Status.FORMAT_ERROR: execute(store, "get_entities_out", ["x"]),
    }
    for status, result in cases.items():
        assert result.status is status
        assert status_of_message(result.message) is status
    assert status_of_message("Invalid action: no action found.") is None
    assert set(OPERATIONS) == {"get_relations_out", "get_relations_in", "get_entities_out", "get_entities_in"}


def test_model_text_is_only_a_lookup_key(store):
    for hostile in ["'; DROP TABLE triples; --", "$(rm -rf /)", "__import__('os')", "{0.__class__}", "\x00"]:
        r = get_relations_out(store, hostile)
        assert r.status in (Status.ENTITY_NOT_FOUND, Status.FORMAT_ERROR)


# --------------------------------------------------------------------------- subgraphs


def test_subgraph_view_and_neighbourhood(store):
    london = store.lookup("London")
    hood = store.neighbourhood([london], 1)
    names = {store.entity_keys[i] for i in hood}
    assert names == {"London", "United Kingdom", "Ada Lovelace", "Lord Byron", "Charles Babbage"}
    sub = store.subgraph(hood)
    assert sub.num_entities == 5
    assert get_relations_out(sub, "Ada Lovelace").results == ("father", "place of birth")  # field edges leave it
    assert get_relations_out(sub, "Mathematics").status is Status.ENTITY_NOT_FOUND


# --------------------------------------------------------------------------- the "simple" KGQA format


def test_simple_fixture_whole_mode():
    source = load_kg(FIXTURE, "whole")
    s = source.store
    assert source.mode == "whole" and source.num_samples == 4
    assert s.num_entities == 13 and s.num_relations == 8
    assert get_entities_out(s, "John F. Kennedy", "people.person.place_of_birth").results == ("Brookline",)
    # A nameless (CVT) node is shown and found by its KB id; a name with a comma works.
    assert get_entities_out(s, "John F. Kennedy", "people.person.spouse_s").results == ("m.0j6d8k",)
    spouses = get_entities_out(s, "m.0j6d8k", "people.marriage.spouse").results
    assert spouses == ("Jacqueline Kennedy Onassis", "John F. Kennedy")
    assert get_entities_in(s, "Washington, D.C.", "location.country.capital").results == ("United States of America",)
    assert s.resolve("m.0d3k14").how == "exact"  # KB ids are keys
    two = get_entities_out(s, "Paris", "location.location.containedby")
    assert two.results == ("France", "Texas") and "2 entities are named" in two.message
    # The whole KG spans all question files.
    assert get_entities_out(s, "Jacqueline Kennedy Onassis", "people.person.children").results == ("Caroline Kennedy",)


def test_simple_fixture_subgraph_mode():
    source = load_kg(FIXTURE, "subgraph")
    assert source.mode == "subgraph" and source.store is None
    q2 = source.store_for("WebQTest-2")  # its topic entity was given as a KB id, not an index
    assert q2.num_entities == 3
    assert get_entities_out(q2, "United States of America", "location.country.capital").results == ("Washington, D.C.",)
    assert get_relations_out(q2, "Brookline").status is Status.ENTITY_NOT_FOUND  # outside this subgraph
    q3 = source.store_for("WebQTest-3")
    assert get_entities_out(q3, "Paris", "location.location.containedby").results == ("France", "Texas")
    assert source.store_for("WebQTest-2") is q2  # cached
    assert source.store_for("no-such-question") is None and source.store_for(None) is None


def test_simple_questions_are_read():
    data = SimpleKGQA(FIXTURE)
    q = data.questions[data.by_id["WebQTest-2"]]
    assert q.answers == ({"kb_id": "m.0rh6k", "text": "Washington, D.C."},)
    assert [data.entity_names[i] for i in q.topic_entities] == ["United States of America"]


def _copy_fixture(tmp_path: Path) -> Path:
    dst = tmp_path / "simple"
    shutil.copytree(FIXTURE, dst)
    return dst


@pytest.mark.parametrize(
    ("file", "edit", "line", "words"),
    [
        ("entities.txt", lambda t: t.replace("m.01qh7\n", "\n"), 2, "empty line"),
        ("entities.txt", lambda t: t.replace("m.01qh7\n", "m.0d3k14\n"), 2, "duplicate"),
        ("entities_text.txt", lambda t: t.replace("Texas\n", ""), 13, "aligned"),
        ("test_simple.json", lambda t: t.replace('"subgraph"', '"subgraph" oops', 1), 1, "invalid JSON"),
        ("test_simple.json", lambda t: t.replace("[0, 0, 1]", "[0, 99, 1]", 1), 1, "relation index 99"),
        ("test_simple.json", lambda t: t.replace("[0, 0, 1]", "[0, 0]", 1), 1, "subgraph.tuples[0]"),
        ("test_simple.json", lambda t: t.replace('["m.09c7w0"]', '["m.nope"]'), 2, "unknown entity id"),
        ("train_simple.json", lambda t: t.replace('"question": "who', '"question": 5, "x": "who'), 1, "question"),
    ],
)
def test_bad_simple_files_name_file_and_line(tmp_path, file, edit, line, words):
    root = _copy_fixture(tmp_path)
    path = root / file
    path.write_text(edit(path.read_text()))
    with pytest.raises(DataFormatError) as info:
        load_kg(root, "subgraph")
    err = info.value
    assert Path(err.path).name == file and err.line == line
    assert words in str(err)


def test_missing_vocabulary_is_reported(tmp_path):
    root = _copy_fixture(tmp_path)
    (root / "relations.txt").unlink()
    with pytest.raises(DataFormatError, match="no KG here"):
        load_kg(root)


# --------------------------------------------------------------------------- our parquet KGs


def test_world_kgs_whole_and_subgraph(world_dir):
    a = load_kg(world_dir / "kg" / "A")
    b = load_kg(world_dir / "kg" / "B", "subgraph")
    assert a.name == "A" and b.mode == "subgraph"
    row = pq.read_table(world_dir / "kgqa" / "B" / "test.parquet").slice(0, 1).to_pylist()[0]
    topic, answer = row["topic_entities"][0], row["answers"][0]["text"]
    sub = b.store_for(row["id"])
    assert sub is not None and sub.num_entities < b.store.num_entities
    assert sub.resolve(answer).ids, "a 2-hop question's answer lies in its 2-hop subgraph"
    assert get_relations_out(sub, topic).ok
    # KG A speaks Freebase-like relation names, KG B Wikidata-like labels, over the same entities.
    assert all("." in r for r in get_relations_out(a.store, topic).results)
    assert not any("." in r for r in get_relations_out(b.store, topic).results)
    # The entities table adds KB ids and aliases as lookup keys.
    ents = pq.read_table(world_dir / "entities.parquet").to_pylist()
    person = next(e for e in ents if e["type"] == "person" and a.store.resolve(e["name"]).ids)
    assert a.store.lookup(person["kb_id_a"]) == a.store.lookup(person["name"])
    assert a.store.resolve(person["aliases"][0]).how.startswith("alias")


def test_bad_parquet_is_reported(tmp_path):
    bad = tmp_path / "triples.parquet"
    pq.write_table(pa.table({"head": ["a"], "rel": ["r"], "tail": ["b"]}), bad)
    with pytest.raises(DataFormatError, match="missing column"):
        load_triples_parquet(bad)
    pq.write_table(pa.table({"head": ["a", None], "relation": ["r", "r"], "tail": ["b", "c"]}), bad)
    with pytest.raises(DataFormatError) as info:
        load_triples_parquet(bad)
    assert info.value.record == 1 and info.value.field == "head"
    bad.write_text("not parquet")
    with pytest.raises(DataFormatError, match="cannot read"):
        load_triples_parquet(bad)


def test_subgraph_mode_needs_questions(tmp_path):
    path = tmp_path / "kg" / "triples.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"head": ["a"], "relation": ["r"], "tail": ["b"]}), path)
    with pytest.raises(DataFormatError, match="question files"):
        load_kg(path.parent, "subgraph")
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q1"], "topic_entities": [["a"]], "subgraph_id": [None]},
                            schema=pa.schema([("id", pa.string()), ("topic_entities", pa.list_(pa.string())),
                                              ("subgraph_id", pa.string())])), questions)
    source = load_kg(path.parent, "subgraph", questions=[questions], hops=1)
    assert get_entities_out(source.store_for("q1"), "a", "r").results == ("b",)
    json.dumps(source.info())  # health output must be JSON
