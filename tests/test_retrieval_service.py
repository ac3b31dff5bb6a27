"""The HTTP retrieval service (Search-R1 wire format, micro-batching, bad input) and its client."""

from __future__ import annotations

import json
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragrl.retrieval import Hit
from ragrl.retrieval.client import RetrievalClient, RetrievalError, RetrievalUnavailable
from ragrl.retrieval.dense import build_faiss_index, embed_shard
from ragrl.retrieval.searcher import Searcher, load_searcher
from ragrl.retrieval.service import BackgroundServer, create_app

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MAX_BATCH = 16
MAX_TOPK = 10

PASSAGES = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France, completed in 1889."),
    ("Photosynthesis", "Photosynthesis is the process by which green plants turn sunlight, water and carbon dioxide into sugar."),
    ("Python (programming language)", "Python is a programming language created by Guido van Rossum, first released in 1991."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas between Nepal and China."),
    ("Great Barrier Reef", "The Great Barrier Reef off Queensland, Australia is the world's largest coral reef system."),
    ("Penicillin", "Penicillin was discovered by Alexander Fleming in 1928 and was the first widely used antibiotic."),
    ("Jazz", "Jazz is a music genre that originated in African-American communities of New Orleans."),
    ("Apollo 11", "Apollo 11 was the spaceflight that first landed humans on the Moon, in July 1969."),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
    ("Coffee", "Coffee is a drink brewed from roasted coffee beans, the seeds of Coffea berries."),
]
# query -> title of the passage that must come first
EXPECTED = {
    "Who discovered penicillin?": "Penicillin",
    "What is the tallest mountain on Earth?": "Mount Everest",
    "In which city is the Eiffel Tower?": "Eiffel Tower",
    "When did people first walk on the moon?": "Apollo 11",
    "How do plants make sugar from sunlight?": "Photosynthesis",
    "Who created the Python programming language?": "Python (programming language)",
    "Where did jazz music come from?": "Jazz",
    "largest coral reef in the world": "Great Barrier Reef",
}
QUERIES = list(EXPECTED)


@pytest.fixture(scope="module")
def searcher(tmp_path_factory) -> Searcher:
    root = tmp_path_factory.mktemp("service")
    table = pa.table(
        {
            "id": [f"doc-{i}" for i in range(len(PASSAGES))],
            "title": [t for t, _ in PASSAGES],
            "text": [x for _, x in PASSAGES],
            "source": ["test"] * len(PASSAGES),
        }
    )
    pq.write_table(table, root / "passages.parquet")
    embed_shard(root / "passages.parquet", MODEL, 0, 1, root / "emb.npy", batch_size=8)
    build_faiss_index([root / "emb.npy"], "Flat", root / "index")
    return load_searcher(root / "index")


@pytest.fixture(scope="module")
def server(searcher):
    app = create_app(searcher, max_batch=MAX_BATCH, max_topk=MAX_TOPK, batch_window_ms=30)
    with BackgroundServer(app) as srv:
        yield srv


def batching(url: str) -> dict:
    return httpx.get(f"{url}/health").json()["batching"]


# --- written the way Search-R1's generation.py talks to its retrieval server -------------------


def search_r1_batch_search(url: str, queries: list[str], topk: int) -> list:
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    return httpx.post(url, json=payload, timeout=30).json()["result"]


def search_r1_passages2string(retrieval_result: list) -> str:
    format_reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return format_reference


def test_search_r1_client_gets_the_right_passages(server):
    assert server.host == "127.0.0.1" and server.port > 0
    result = search_r1_batch_search(f"{server.url}/retrieve", QUERIES, 3)
    assert len(result) == len(QUERIES)
    for query, docs in zip(QUERIES, result):
        assert len(docs) == 3
        text = dict(PASSAGES)[EXPECTED[query]]
        assert search_r1_passages2string(docs).startswith(f"Doc 1(Title: {EXPECTED[query]}) {text}\n"), query
        scores = [d["score"] for d in docs]
        assert scores == sorted(scores, reverse=True) and all(isinstance(s, float) for s in scores)
        assert docs[0]["document"]["id"] == f"doc-{[t for t, _ in PASSAGES].index(EXPECTED[query])}"

    plain = httpx.post(f"{server.url}/retrieve", json={"queries": QUERIES[:2], "topk": 2, "return_scores": False}).json()
    assert set(plain) == {"result"}
    first = plain["result"][0][0]
    assert set(first) == {"id", "contents"}
    assert first["contents"] == f"Penicillin\n{dict(PASSAGES)['Penicillin']}"


def test_health_reports_index(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["mode"] == "dense"
    assert health["num_passages"] == len(PASSAGES)
    assert health["dense"]["model"] == MODEL and health["dense"]["factory"] == "Flat"
    assert health["limits"]["max_topk"] == MAX_TOPK
    assert {"batches", "requests", "queries"} <= set(health["batching"])


BAD_REQUESTS = [
    (b"this is not json", 400, "not valid JSON"),
    (b"\xff\xfe\x00", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"topk": 3}).encode(), 400, "'queries'"),
    (json.dumps({"queries": "one string"}).encode(), 400, "list of strings"),
    (json.dumps({"queries": [1, 2]}).encode(), 400, "list of strings"),
    (json.dumps({"queries": []}).encode(), 400, "empty"),
    (json.dumps({"queries": ["ok", "   "]}).encode(), 400, "queries[1] is empty"),
    (json.dumps({"queries": ["ok"], "topk": 0}).encode(), 400, "[1, 10]"),
    (json.dumps({"queries": ["ok"], "topk": MAX_TOPK + 1}).encode(), 400, "[1, 10]"),
    (json.dumps({"queries": ["ok"], "topk": "3"}).encode(), 400, "integer"),
    (json.dumps({"queries": ["ok"], "topk": True}).encode(), 400, "integer"),
    (json.dumps({"queries": ["ok"], "topk": 2.5}).encode(), 400, "integer"),
    (json.dumps({"queries": ["ok"], "return_scores": "yes"}).encode(), 400, "return_scores"),
    (json.dumps({"queries": ["x" * 5000]}).encode(), 413, "characters"),
    (json.dumps({"queries": ["q"] * (MAX_BATCH + 1)}).encode(), 413, "too many queries"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_4xx_and_server_keeps_serving(server, body, status, message):
    response = httpx.post(f"{server.url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    ok = httpx.post(f"{server.url}/retrieve", json={"queries": [QUERIES[0]], "topk": 1, "return_scores": True})
    assert ok.json()["result"][0][0]["document"]["contents"].startswith("Penicillin\n")


def test_wrong_method_is_4xx(server):
    assert httpx.get(f"{server.url}/retrieve").status_code == 405


def test_concurrent_clients_are_micro_batched(server, searcher):
    before = batching(server.url)
    n_clients = 32
    barrier = threading.Barrier(n_clients)

    def one_client(i: int):
        queries = [QUERIES[i % len(QUERIES)], QUERIES[(i * 3 + 1) % len(QUERIES)]][: 1 + i % 2]
        topk = 1 + i % 4
        barrier.wait(timeout=30)  # all requests in flight together
        body = {"queries": queries, "topk": topk, "return_scores": True}
        result = httpx.post(f"{server.url}/retrieve", json=body, timeout=60).json()["result"]
        return queries, topk, result

    with ThreadPoolExecutor(max_workers=n_clients) as pool:
        answers = list(pool.map(one_client, range(n_clients)))

    expected = {q: hits for q, hits in zip(QUERIES, searcher.search(QUERIES, 4))}
    for queries, topk, result in answers:
        assert len(result) == len(queries)
        for q, docs in zip(queries, result):
            assert [d["document"]["id"] for d in docs] == [h.id for h in expected[q][:topk]]
            assert docs[0]["score"] == pytest.approx(expected[q][0].score, abs=1e-4)
    after = batching(server.url)
    requests = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    assert requests == n_clients
    assert after["queries"] - before["queries"] == sum(len(q) for q, _, _ in answers)
    assert batches < requests, f"{requests} requests ran as {batches} batches: nothing was merged"
    assert after["largest_batch_queries"] <= MAX_BATCH


class FakeSearch:
    """A search function that records its calls; hit ids say which query and rank they answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.calls.append((len(queries), topk))
        if "boom" in queries:
            raise RuntimeError("index exploded")
        return [[Hit(f"{q}#{r}", q, "text", float(-r)) for r in range(topk)] for q in queries]


def test_batcher_splits_results_back_and_respects_max_batch():
    fake = FakeSearch()
    with BackgroundServer(create_app(fake, max_batch=4, max_topk=10, batch_window_ms=50)) as srv:
        barrier = threading.Barrier(12)

        def one_client(i: int):
            queries = [f"c{i}q{j}" for j in range(1 + i % 3)]
            barrier.wait(timeout=30)
            body = {"queries": queries, "topk": 1 + i % 5, "return_scores": False}
            return queries, 1 + i % 5, httpx.post(f"{srv.url}/retrieve", json=body, timeout=30).json()["result"]

        with ThreadPoolExecutor(max_workers=12) as pool:
            answers = list(pool.map(one_client, range(12)))
        for queries, topk, result in answers:
            assert result == [[{"id": f"{q}#{r}", "contents": f"{q}\ntext"} for r in range(topk)] for q in queries]
        assert all(n <= 4 for n, _ in fake.calls)
        assert sum(n for n, _ in fake.calls) == sum(len(q) for q, _, _ in answers)
        assert len(fake.calls) < 12

        failed = httpx.post(f"{srv.url}/retrieve", json={"queries": ["boom"], "topk": 1})
        assert failed.status_code == 500 and "index exploded" in failed.json()["error"]
        again = httpx.post(f"{srv.url}/retrieve", json={"queries": ["fine"], "topk": 1}).json()
        assert again["result"] == [[{"id": "fine#0", "contents": "fine\ntext"}]]


def test_client_matches_in_process_search(server, searcher):
    before = batching(server.url)
    with RetrievalClient(server.url, batch_size=3) as client:
        hits = client.search(QUERIES, 3)
    assert batching(server.url)["requests"] - before["requests"] == 3  # 8 queries in chunks of 3
    want = searcher.search(QUERIES, 3)
    assert [[h.id for h in q] for q in hits] == [[h.id for h in q] for q in want]
    assert [[h.title for h in q] for q in hits] == [[h.title for h in q] for q in want]
    assert [[h.text for h in q] for q in hits] == [[h.text for h in q] for q in want]
    assert [q[0].title for q in hits] == [EXPECTED[q] for q in QUERIES]


def test_client_does_not_retry_a_rejected_request(server):
    with RetrievalClient(server.url, retries=3, backoff=5.0) as client:
        with pytest.raises(RetrievalError, match=r"HTTP 400.*topk") as err:
            client.search(["anything"], topk=MAX_TOPK + 5)
    assert not isinstance(err.value, RetrievalUnavailable)


def test_client_retries_then_fails_on_dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed on exit: nothing listens there now
    url = f"http://127.0.0.1:{port}"
    with RetrievalClient(url, timeout=2.0, retries=2, backoff=0.01) as client:
        with pytest.raises(RetrievalUnavailable, match=rf"{url}/retrieve unavailable after 3 attempts.*ConnectError"):
            client.search(["anything"], topk=3)


def test_client_retries_transient_failures():
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        if len(attempts) == 1:
            raise httpx.ConnectTimeout("slow", request=request)
        if len(attempts) == 2:
            return httpx.Response(503, json={"error": "warming up"})
        doc = {"document": {"id": "d1", "contents": "Title\nline one\nline two"}, "score": 0.5}
        return httpx.Response(200, json={"result": [[doc]]})

    client = RetrievalClient("http://retriever.invalid", retries=2, backoff=0.0, transport=httpx.MockTransport(handler))
    assert client.search(["q"], 1) == [[Hit("d1", "Title", "line one\nline two", 0.5)]]
    assert len(attempts) == 3
    assert json.loads(attempts[-1].content) == {"queries": ["q"], "topk": 1, "return_scores": True}
