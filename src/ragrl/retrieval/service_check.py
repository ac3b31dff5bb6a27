"""End-to-end check of the retrieval service as users run it.

Starts `ragrl serve-retriever` as its own process on loopback, queries it exactly the way
Search-R1's client does (POST /retrieve, read result[i][j]["document"]["contents"]), compares the
answers with the in-process searcher on the same index, and stops the server by its pid.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ragrl.io import read_columns, write_json


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"retrieval server exited with code {proc.returncode} before becoming healthy")
        try:
            response = httpx.get(f"{url}/health", timeout=2.0)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"retrieval server at {url} not healthy after {timeout_s:.0f}s")


def search_r1_retrieve(url: str, queries: list[str], topk: int) -> list[list[str]]:
    """Search-R1's `_batch_search` + `_passages2string`, reduced to what a policy sees."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    result = httpx.post(f"{url}/retrieve", json=payload, timeout=60.0).json()["result"]
    return [[doc["document"]["contents"] for doc in per_query] for per_query in result]


def check_service(index_args: list[str], searcher, qa_path: str | Path, out: str | Path, topk: int = 3,
                  max_questions: int = 64, startup_timeout_s: float = 180.0, min_agreement: float = 0.95) -> dict:
    """Raise if the service disagrees with in-process search, rejects nothing, or dies on a bad request.

    Agreement may fall short of 1.0 only through near-ties: the server encodes queries in other
    batch compositions, which moves embeddings by float rounding.
    """
    questions = read_columns(qa_path, ["question"]).column("question").to_pylist()[:max_questions]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "ragrl", "serve-retriever", *index_args, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    try:
        health = wait_healthy(url, proc, startup_timeout_s)
        start = time.monotonic()
        over_http = search_r1_retrieve(url, questions, topk)
        http_s = time.monotonic() - start
        # Search-R1's trainer searches every turn, also with no active query: it needs {"result": []}.
        empty = httpx.post(f"{url}/retrieve", json={"queries": [], "topk": topk}, timeout=10.0)
        bad = httpx.post(f"{url}/retrieve", json={"queries": "not a list", "topk": topk}, timeout=10.0)
        still_up = httpx.get(f"{url}/health", timeout=10.0).status_code == 200
    finally:
        proc.terminate()  # by pid: we own exactly this process
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    local = [[h.contents for h in hits] for hits in searcher.search(questions, topk)]
    agree = sum(a == b for a, b in zip(over_http, local)) / len(questions)
    report = {
        "url": url,
        "questions": len(questions),
        "topk": topk,
        "agreement_with_in_process": agree,
        "http_seconds": round(http_s, 3),
        "empty_query_list_status": empty.status_code,
        "bad_request_status": bad.status_code,
        "healthy_after_bad_request": still_up,
        "health": health,
    }
    empty_ok = empty.status_code == 200 and empty.json() == {"result": []}
    if agree < min_agreement or not empty_ok or not 400 <= bad.status_code < 500 or not still_up:
        raise RuntimeError(f"retrieval service check failed: {report}")
    write_json(report, out)
    return report
