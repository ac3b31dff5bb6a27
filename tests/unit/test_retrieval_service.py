"""The HTTP retrieval service (Search-R1 wire format, micro-batching, bad input) and its client."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
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
from method_clients import SearchR1Client

from ragrl.http_server import HttpLimits
from ragrl.retrieval.service import DEFAULT_MAX_QUERIES, BackgroundServer, create_app

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
    return SearchR1Client(url, topk)._batch_search(queries)["result"]


def search_r1_passages2string(retrieval_result: list) -> str:
    return SearchR1Client("")._passages2string(retrieval_result)


@pytest.mark.slow
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


@pytest.mark.slow
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
    (json.dumps({"queries": ["ok"], "topk": -1}).encode(), 400, "[1, 10]"),
    (json.dumps({"queries": ["ok"], "topk": MAX_TOPK + 1}).encode(), 400, "[1, 10]"),
    (json.dumps({"queries": ["ok"], "topk": "three"}).encode(), 400, "integer"),
    (json.dumps({"queries": ["ok"], "topk": True}).encode(), 400, "integer"),
    (json.dumps({"queries": ["ok"], "topk": 2.5}).encode(), 400, "integer"),
    (json.dumps({"queries": ["ok"], "return_scores": "yes"}).encode(), 400, "return_scores"),
    (json.dumps({"queries": ["x" * 5000]}).encode(), 413, "characters"),
    (json.dumps({"queries": ["q"] * (DEFAULT_MAX_QUERIES + 1)}).encode(), 413, "too many queries"),
    # F5: valid JSON, but no UTF-8 string: the request gets its own 400, never a 500.
    (b'{"queries": ["good", "abc \\ud800"]}', 400, "queries[1] is not valid Unicode"),
    # F6: nesting and integers that made json.loads raise past the 400 handler.
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    (b'{"a": ' * 10_000 + b"1" + b"}" * 10_000, 400, "nested too deeply"),
    (b'{"queries": ["q"], "topk": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_4xx_and_server_keeps_serving(server, body, status, message):
    response = httpx.post(f"{server.url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    ok = httpx.post(f"{server.url}/retrieve", json={"queries": [QUERIES[0]], "topk": 1, "return_scores": True})
    assert ok.json()["result"][0][0]["document"]["contents"].startswith("Penicillin\n")


@pytest.mark.slow
def test_wrong_method_is_4xx(server):
    assert httpx.get(f"{server.url}/retrieve").status_code == 405


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- what Search-R1's and RAG-R1's unmodified trainers send (issue 16) --------------------------


@pytest.mark.slow
def test_empty_query_list_is_an_empty_result(server):
    # Search-R1 searches every turn, also when no trajectory searched; RAG-R1's `<search>,</search>`
    # splits into no queries at all. Its server answers {"result": []}.
    response = httpx.post(f"{server.url}/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
    assert response.status_code == 200 and response.json() == {"result": []}


@pytest.mark.slow
def test_blank_queries_are_searched_and_do_not_fail_the_others(server, searcher):
    queries = [QUERIES[0], "", "   ", QUERIES[1]]
    result = search_r1_batch_search(f"{server.url}/retrieve", queries, 2)
    assert len(result) == 4
    assert [d["document"]["id"] for d in result[0]] == [h.id for h in searcher.search([QUERIES[0]], 2)[0]]
    assert [d["document"]["id"] for d in result[3]] == [h.id for h in searcher.search([QUERIES[1]], 2)[0]]
    # Dense retrieval embeds the blank query like Search-R1's encoder does: it gets documents.
    assert [d["document"]["id"] for d in result[1]] == [h.id for h in searcher.search([""], 2)[0]]
    assert len(result[2]) == 2


@pytest.mark.slow
@pytest.mark.parametrize(("topk", "expected"), [(0, 3), (None, 3), ("2", 2), (" 4 ", 4), (2.0, 2)])
def test_topk_is_read_as_search_r1_reads_it(server, topk, expected):
    body = {"queries": [QUERIES[0]], "return_scores": True, **({} if topk is None else {"topk": topk})}
    response = httpx.post(f"{server.url}/retrieve", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["result"][0]) == expected


def test_a_thousand_queries_in_one_request_are_split_into_batches():
    fake = FakeSearch()
    with BackgroundServer(create_app(fake, max_batch=64, max_topk=10)) as srv:
        queries = [f"q{i}" for i in range(1024)]
        response = httpx.post(f"{srv.url}/retrieve", json={"queries": queries, "topk": 1}, timeout=60)
        assert response.status_code == 200, response.text[:200]
        assert [r[0]["id"] for r in response.json()["result"]] == [f"q{i}#0" for i in range(1024)]
        assert max(n for n, _ in fake.calls) == 64 and sum(n for n, _ in fake.calls) == 1024


# --- F5: one bad request never fails the others merged with it --------------------------------------


class PickySearch(FakeSearch):
    """Fails any batch containing a query it cannot handle, as a tokenizer would."""

    def __call__(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if any("poison" in q for q in queries):
            self.calls.append((len(queries), topk))
            raise UnicodeEncodeError("utf-8", "poison", 0, 1, "surrogates not allowed")
        return super().__call__(queries, topk)


def test_bad_request_fails_alone_among_concurrent_good_ones():
    picky = PickySearch()
    n_good = 39
    with BackgroundServer(create_app(picky, max_batch=64, max_topk=10, batch_window_ms=50)) as srv:
        barrier = threading.Barrier(n_good + 2)

        def send(body: dict) -> httpx.Response:
            barrier.wait(timeout=30)
            return httpx.post(f"{srv.url}/retrieve", json=body, timeout=60)

        bodies = [{"queries": [f"good {i}"], "topk": 2} for i in range(n_good)]
        bodies.append({"queries": ["poison pill"], "topk": 2})  # fails inside the search
        with ThreadPoolExecutor(max_workers=n_good + 2) as pool:
            futures = [pool.submit(send, b) for b in bodies]
            # A lone surrogate, sent raw: rejected before it reaches the shared batch.
            raw = pool.submit(lambda: (barrier.wait(timeout=30), httpx.post(
                f"{srv.url}/retrieve", content=b'{"queries": ["abc \\ud800"]}', timeout=60))[1])
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses[:n_good]] == [200] * n_good
        for i, r in enumerate(responses[:n_good]):
            assert r.json()["result"][0][0]["id"] == f"good {i}#0"
        assert responses[-1].status_code == 500 and "UnicodeEncodeError" in responses[-1].json()["error"]
        assert raw.result().status_code == 400 and "not valid Unicode" in raw.result().json()["error"]
        assert any(n > 1 for n, _ in picky.calls), "the requests were never merged, so isolation was not tested"


# --- F7: body limits while reading, read timeouts ----------------------------------------------------


def _raw_exchange(url: str, data: bytes, wait_s: float = 10.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def test_declared_oversized_body_is_refused_before_reading():
    limits = HttpLimits(max_body_bytes=1000, header_timeout_s=5, body_timeout_s=5)
    with BackgroundServer(create_app(FakeSearch(), http_limits=limits)) as srv:
        # Headers promise 200 MB; only a few bytes follow. The answer must not wait for the rest.
        head = (b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 200000000\r\n\r\n{\"queries\": [")
        start = time.monotonic()
        answer = _raw_exchange(srv.url, head)
        assert answer.startswith(b"HTTP/1.1 413") and b"limit 1000" in answer
        assert time.monotonic() - start < 4
        ok = httpx.post(f"{srv.url}/retrieve", json={"queries": ["fine"], "topk": 1})
        assert ok.status_code == 200


def test_chunked_body_is_cut_off_at_the_limit():
    limits = HttpLimits(max_body_bytes=10_000)
    with BackgroundServer(create_app(FakeSearch(), http_limits=limits)) as srv:
        def chunks():
            yield b'{"queries": ["'
            for _ in range(1000):  # 1 MB, far past the limit, in a stream without content-length
                yield b"x" * 1000
            yield b'"]}'

        response = httpx.post(f"{srv.url}/retrieve", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413 and "limit of 10000 bytes" in response.json()["error"]


def test_slow_headers_and_slow_bodies_time_out():
    limits = HttpLimits(max_body_bytes=10_000, header_timeout_s=0.5, body_timeout_s=0.5)
    with BackgroundServer(create_app(FakeSearch(), http_limits=limits)) as srv:
        start = time.monotonic()
        answer = _raw_exchange(srv.url, b"POST /retrieve HTTP/1.1\r\nhost: x\r\n")  # headers never finish
        assert answer.startswith(b"HTTP/1.1 408") and b"headers" in answer
        assert time.monotonic() - start < 5
        answer = _raw_exchange(srv.url, b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        assert answer.startswith(b"HTTP/1.1 408") and b"body" in answer
        assert httpx.post(f"{srv.url}/retrieve", json={"queries": ["fine"], "topk": 1}).status_code == 200
        health = httpx.get(f"{srv.url}/health").json()["limits"]
        assert health["max_body_bytes"] == 10_000 and health["header_timeout_s"] == 0.5
