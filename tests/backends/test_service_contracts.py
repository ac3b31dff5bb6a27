"""Contract tests: the methods' own client code, unchanged, against our running services.

The clients (tests/method_clients.py) reproduce those projects' request and response handling
line for line, so a change on our side that would break their unmodified trainers fails here:
Search-R1's and RAG-R1's search clients, KG-R1's KG client, and KG-R1's response shape for a
stand-in KG-R1 server that our own KG client must understand.

Servers run as real uvicorn on 127.0.0.1 (BackgroundServer), and `serve-kg` once through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from method_clients import KGR1Client, RagR1Client, SearchR1Client, kg_retrieval_completion_response

from ragrl.agent.environments import MultiQuerySearchEnvironment
from ragrl.agent.protocol import parse_action
from ragrl.agent.retriever_adapter import AgentRetriever
from ragrl.corpus import write_passages
from ragrl.http_server import BackgroundServer
from ragrl.kg.client import KGClient
from ragrl.kg.environment import KGBackendError, KGEnvironment
from ragrl.kg.ops import Status, status_of_message
from ragrl.kg.server import KGService, create_app as create_kg_app
from ragrl.kg.store import load_kg
from ragrl.retrieval.client import RetrievalClient
from ragrl.retrieval.searcher import load_searcher
from ragrl.retrieval.service import create_app as create_retrieval_app
from ragrl.retrieval.sparse import build_bm25

REPO = Path(__file__).resolve().parents[2]
KG_FIXTURE = REPO / "resources" / "fixtures" / "kgqa" / "simple"
BIRTH = "people.person.place_of_birth"

# A FlashRAG / wiki-18 style corpus: titles in quotes, as Search-R1's index serves them.
CORPUS = [
    ("0", '"Kessa Bay"', "Kessa Bay is a shallow bay where the Tamm River meets the sea."),
    ("1", '"Tamm River"', "The Tamm River flows under Ossel bridge into Kessa Bay."),
    ("2", '"Verrow Lantern"', "The Verrow Lantern is a brass lamp lit on the night of the first frost."),
    ("3", '"Ida Marrow"', "Ida Marrow was a cartographer who mapped Verrow Lake."),
]


@pytest.fixture(scope="module")
def retrieval_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    jsonl = root / "wiki.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "contents": f"{t}\n{x}"}) + "\n" for i, t, x in CORPUS))
    write_passages("flashrag", [jsonl], root / "passages.parquet")
    build_bm25(root / "passages.parquet", root / "bm25")
    searcher = load_searcher(root / "bm25")
    with BackgroundServer(create_retrieval_app(searcher, max_batch=16, max_topk=10)) as srv:
        srv.searcher = searcher
        yield srv


def test_search_r1_sees_corpus_titles_as_the_corpus_has_them(retrieval_server):
    assert retrieval_server.searcher.passages.table["title"].to_pylist()[0] == '"Kessa Bay"'
    [obs] = SearchR1Client(f"{retrieval_server.url}/retrieve").batch_search(["Ossel bridge"])
    assert obs.startswith('Doc 1(Title: "Tamm River") The Tamm River flows under Ossel bridge')


def test_search_r1_turn_without_searches_gets_an_empty_result(retrieval_server):
    # Its trainer calls batch_search every turn; with no active searcher the list is empty and it
    # indexes ['result'] unconditionally (KeyError on our old 400).
    assert SearchR1Client(f"{retrieval_server.url}/retrieve").batch_search([]) == []


def test_search_r1_blank_query_does_not_fail_the_batch(retrieval_server):
    client = SearchR1Client(f"{retrieval_server.url}/retrieve", topk=2)
    good, blank, spaces, other = client.batch_search(["Kessa Bay", "", "   ", "Verrow Lantern frost"])
    assert good.startswith('Doc 1(Title: "Kessa Bay")')
    assert blank == spaces == ""  # BM25 without terms: no hits, as Search-R1's pyserini server
    assert other.startswith('Doc 1(Title: "Verrow Lantern")')


def test_search_r1_sends_a_whole_rollout_batch_at_once(retrieval_server):
    queries = [f"{['Kessa Bay', 'Tamm River', 'Ida Marrow'][i % 3]} {i}" for i in range(1024)]
    results = SearchR1Client(f"{retrieval_server.url}/retrieve").batch_search(queries)
    assert len(results) == 1024 and all(r.startswith("Doc 1(Title: ") for r in results)


@pytest.mark.parametrize(("topk", "docs"), [("2", 2), (0, 3), (None, 3)])
def test_search_r1_topk_variants(retrieval_server, topk, docs):
    client = SearchR1Client(f"{retrieval_server.url}/retrieve", topk=topk)
    [obs] = client.batch_search(["Kessa Bay Tamm River Verrow Lantern Ida Marrow"])
    assert obs.count("Doc ") == docs


def test_rag_r1_multi_query_turns(retrieval_server):
    client = RagR1Client(f"{retrieval_server.url}/retrieve", topk=2)
    two, none = client.batch_search(["Kessa Bay, Ida Marrow", ","])
    parsed = json.loads(two)
    assert parsed["query"] == ["Kessa Bay", "Ida Marrow"]
    assert parsed["documents"][0].startswith('Doc 1: "Kessa Bay"\nKessa Bay is a shallow bay')
    assert parsed["documents"][1].startswith('Doc 1: "Ida Marrow"\nIda Marrow was a cartographer')
    # `<search>,</search>` sends an empty query list; the server answers {"result": []}.
    assert json.loads(none) == {"query": [], "documents": []}


def test_our_rag_r1_preset_writes_rag_r1s_observation(retrieval_server):
    with RetrievalClient(retrieval_server.url) as backend:
        env = MultiQuerySearchEnvironment(AgentRetriever(backend), topk=2, max_queries=3, query_format="rag_r1")
        action = env.parse("<think>two things</think><search> Kessa Bay, Ida Marrow </search>")
        assert action.queries == ("Kessa Bay", "Ida Marrow")
        [obs] = env.respond([action])
    want = RagR1Client(f"{retrieval_server.url}/retrieve", topk=2).batch_search(["Kessa Bay, Ida Marrow"])[0]
    assert obs == want
    assert "separated by commas" in env.instruction


def test_multi_query_default_format_is_unchanged():
    env = MultiQuerySearchEnvironment(None, topk=1, max_queries=2)
    assert env.separators == ("|", "\n") and env.instruction is None
    assert parse_action("<search>a | b, c</search>", env.spec).queries == ("a", "b, c")
    custom = MultiQuerySearchEnvironment(None, max_queries=3, separators=[";"], query_format="rag_r1")
    assert parse_action("<search>a; b, c</search>", custom.spec).queries == ("a", "b, c")
    assert custom.format.observation == "json"
    with pytest.raises(ValueError, match="unknown multi-query format"):
        MultiQuerySearchEnvironment(None, query_format="rag-r2")


# --------------------------------------------------------------------------- KG-R1's client


@pytest.fixture(scope="module")
def kg_server():
    # One KG, served under its directory's name ("simple"): KG-R1 sends "webqsp" and must get it.
    with BackgroundServer(create_kg_app(load_kg(KG_FIXTURE, "whole"))) as srv:
        yield srv


def test_kg_r1_client_sees_typed_results_and_full_lists(kg_server):
    client = KGR1Client(f"{kg_server.url}/retrieve")
    meta = [{"sample_id": "WebQTest-1", "dataset_name": "webqsp"}] * 5
    raw, texts = client.batch_search([
        ("get_relations_out", "John F. Kennedy", None),
        ("get_entities_out", " John F. Kennedy ", BIRTH),
        ("get_entities_out", "Nobody At All", BIRTH),
        ("get_relations_out", "John F. Kennedy", BIRTH),  # a relation given to a relations listing
        ("get_tail_entities", "John F. Kennedy", "no such relation"),
    ], meta)
    assert [r["kg_metadata"]["error_type"] for r in raw] == [
        "KG_SUCCESS", "KG_SUCCESS", "KG_ENTITY_NOT_FOUND", "KG_FORMAT_ERROR", "KG_RELATION_NOT_FOUND"]
    assert [r["success"] for r in raw] == [True, True, False, False, False]
    assert all(r["object"] == "kg_retrieval" and r["choices"][0]["finish_reason"] in ("stop", "error") for r in raw)
    # Every relation is in the text the model reads, not only the first result.
    relations = KGService(load_kg(KG_FIXTURE, "whole")).retrieve([{"action_type": "get_relations_out",
                                                                    "entity_id": "John F. Kennedy"}])[0]["results"]
    assert len(relations) > 1 and all(rel in texts[0] for rel in relations)
    assert "Brookline" in texts[1]
    assert texts[2].startswith("Entity not found: ") and texts[3].startswith("Format error: ")
    assert "accepts only one entity argument" in texts[3]


def test_kg_r1_client_empty_batch_and_actions(kg_server):
    assert httpx.post(f"{kg_server.url}/retrieve", json=[]).json() == []
    actions = KGR1Client(f"{kg_server.url}/retrieve").available_actions()
    assert actions == ["get_relations_out", "get_relations_in", "get_entities_out", "get_entities_in"]
    listing = httpx.get(f"{kg_server.url}/actions").json()
    assert listing["supported_kgs"] == ["simple"] and set(listing["action_details"]) == set(actions)


def test_kg_r1_bad_item_is_answered_alone_among_concurrent_batches(kg_server):
    good = {"action_type": "get_relations_out", "dataset_name": "webqsp", "sample_id": "x", "entity_id": "Brookline"}
    bad = b'[{"action_type": "get_relations_out", "dataset_name": "webqsp", "entity_id": "abc \\ud800"}, ' + \
        json.dumps(good).encode() + b"]"

    def send(i: int) -> httpx.Response:
        if i % 10 == 0:
            return httpx.post(f"{kg_server.url}/retrieve", content=bad, timeout=30)
        return httpx.post(f"{kg_server.url}/retrieve", json=[good] * 3, timeout=30)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(pool.map(send, range(40)))
    assert all(r.status_code == 200 for r in responses)
    for i, r in enumerate(responses):
        errors = [item["kg_metadata"]["error_type"] for item in r.json()]
        assert errors == (["KG_FORMAT_ERROR", "KG_SUCCESS"] if i % 10 == 0 else ["KG_SUCCESS"] * 3)


def test_serve_kg_cli_dataset_names(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "ragrl", "serve-kg", "--kg", str(KG_FIXTURE), "--dataset-name", "webqsp",
           "--kg", str(KG_FIXTURE), "--dataset-name", "CWQ", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "serve-kg did not start"
            time.sleep(0.2)
        client = KGR1Client(f"{url}/retrieve")
        raw, _ = client.batch_search([("get_relations_in", "Brookline", None)] * 3,
                                     [{"sample_id": "s", "dataset_name": n} for n in ("webqsp", "cwq", "grailqa")])
        assert [r["kg_metadata"]["error_type"] for r in raw] == ["KG_SUCCESS", "KG_SUCCESS", "KG_SERVER_ERROR"]
        assert sorted(httpx.get(f"{url}/actions").json()["supported_kgs"]) == ["CWQ", "webqsp"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --------------------------------------------------------------------------- our client vs KG-R1's server


def kg_r1_stand_in() -> FastAPI:
    """A KG-R1-shaped server over three facts, answering as its action handlers do."""
    out = defaultdict(list, {"Ada": ["place of birth", "occupation"]})
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(items: list[dict]):
        answers = []
        for item in items:
            action, entity = item["action_type"], item.get("entity_id", "")
            if item.get("sample_id") == "missing":
                answers.append(kg_retrieval_completion_response(f'Sample "missing" not found in KG', action, True,
                                                                "KG_SAMPLE_NOT_FOUND"))
            elif entity not in out:
                answers.append(kg_retrieval_completion_response(f'Entity "{entity}" not found in KG', action, True,
                                                                "KG_ENTITY_NOT_FOUND"))
            elif action == "get_relations_out":
                answers.append(kg_retrieval_completion_response(
                    f'Outgoing relations for entity "{entity}":\n' + "\n".join(out[entity]), action))
            else:
                answers.append(kg_retrieval_completion_response(f'No entities found for "{entity}"', action, True,
                                                                "KG_NO_RESULTS"))
        return answers

    return app


def test_our_client_and_environment_against_kg_r1s_response_shape():
    with BackgroundServer(kg_r1_stand_in()) as srv, KGClient(srv.url, retries=0) as client:
        env = KGEnvironment(client, dataset_name="webqsp", sample_id="q1")
        actions = [env.parse(f"<think>t</think><kg-query>{q}</kg-query>") for q in (
            'get_relations_out("Ada")', 'get_relations_out("Bob")', 'get_entities_in("Ada", "occupation")')]
        obs = env.respond(actions)
        assert [status_of_message(o) for o in obs] == [Status.SUCCESS, Status.ENTITY_NOT_FOUND, Status.NO_RESULTS]
        assert "place of birth" in obs[0] and "occupation" in obs[0]  # KG-R1's full listing reaches the model
        assert obs[1] == 'Entity not found: Entity "Bob" not found in KG'
        with pytest.raises(KGBackendError, match="Sample"):
            env.respond([actions[0]], sample_ids=["missing"])
