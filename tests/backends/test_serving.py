"""Model servers the job starts itself (ragrl.serving): config checks, and a REAL vLLM server.

The vLLM tests serve the tiny model from .venv-vllm (RAGRL_VLLM_VENV; scripts/vllm_venv.sh), as a
job on the cluster would serve a teacher or judge: started on a free loopback port, healthy,
used, and stopped by pid when the body returns, raises, or the job is sent SIGTERM. "Stopped"
means no process is left of the server's session (it is started as a session leader, so every
process it spawned, vLLM's engine core included, carries its pid as session id).
"""

from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ragrl.recipe import parse_recipe
from ragrl.serving import ServerSpec, ServerStartError, model_server, resolve_endpoint

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("RAGRL_VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM virtualenv at {VLLM_VENV} "
                                "(scripts/vllm_venv.sh)")
# As tests/backends/test_vllm_backend.py: float32, no compile warm-up (half the start-up on 2 cores).
VLLM_ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--disable-uvicorn-access-log"]


def _teacher_recipe(teacher: dict) -> dict:
    return {"env": "search", "sft": {"source": "teacher", "teacher": teacher}}


# --------------------------------------------------------------------------- config (no server)


@pytest.mark.parametrize("teacher, server", [
    # no base_url: the job serves it, under its own name, with the default start-up limit
    ({"model": "Qwen/Qwen2.5-7B-Instruct"}, ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", None, (), 900.0)),
    ({"model": "m", "serve": True}, ("m", "m", None, (), 900.0)),
    ({"model": "m", "serve": {"python": "/x/bin/python", "args": ["--tensor-parallel-size", "2"],
                              "startup_timeout_s": 1200, "served_name": "teacher"}},
     ("m", "teacher", "/x/bin/python", ("--tensor-parallel-size", "2"), 1200.0)),
    ({"model": "m", "base_url": "http://host:8000"}, None),  # external: nothing to start
    ({"model": "m", "base_url": "http://host:8000", "serve": False}, None),
])
def test_teacher_routes_accepted(teacher, server, tmp_path):
    from ragrl.stages.agent import served_model

    recipe = parse_recipe(_teacher_recipe(teacher), "r")
    spec = served_model(recipe.sft["teacher"], tmp_path / "teacher.log")
    got = None if spec is None else (spec.model, spec.served_name, spec.python, spec.args, spec.startup_timeout_s)
    assert got == server


@pytest.mark.parametrize("teacher,needle", [
    ({"base_url": "http://host:8000"}, r"recipes\.r\.sft\.teacher'.*\['model'\]"),
    ({"model": "m", "base_url": "http://h", "serve": True}, r"recipes\.r\.sft\.teacher'.*exclude each other"),
    ({"model": "m", "serve": False}, r"recipes\.r\.sft\.teacher\.serve'.*base_url"),
    ({"model": "m", "serve": {"pyhton": "x"}}, r"recipes\.r\.sft\.teacher\.serve\.pyhton'.*unknown"),
    ({"model": "m", "serve": {"args": ["--tp", 2]}}, r"recipes\.r\.sft\.teacher\.serve\.args'"),
    ({"model": "m", "serve": "yes"}, r"recipes\.r\.sft\.teacher\.serve'.*mapping"),
])
def test_teacher_route_errors_name_the_key(teacher, needle):
    with pytest.raises(ValueError, match=needle):
        parse_recipe(_teacher_recipe(teacher), "r")


def test_external_url_starts_nothing(tmp_path):
    spec = ServerSpec(model="m", served_name="m", log=tmp_path / "never.log", python="/nonexistent/python")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with resolve_endpoint("http://10.0.0.1:8000", spec) as url:
        assert url == "http://10.0.0.1:8000"
        assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    assert not spec.log.exists()


def test_server_that_dies_at_start_is_an_error_with_its_log(tmp_path):
    # This venv has no vLLM: the module is missing, the server exits at once, the error shows why.
    log = tmp_path / "logs" / "serve.log"
    spec = ServerSpec(model="m", served_name="m", log=log, python=sys.executable, startup_timeout_s=60)
    with pytest.raises(ServerStartError, match=r"(?s)exited with code \d+.*vllm"):
        with model_server(spec):
            pytest.fail("body ran without a server")
    assert log.read_text().startswith(f"{sys.executable} -m vllm.entrypoints.openai.api_server --model m ")


# --------------------------------------------------------------------------- a real vLLM server


def _session_left(pid: int) -> list[int]:
    """Processes still in the server's session (its pid as session id), the server included."""
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == pid:
                left.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return left


def _server_pid(text: str) -> int:
    m = re.search(r"\[serve\] \S+ \(.*?\) at http://127\.0\.0\.1:\d+, pid (\d+)", text)
    assert m, f"no start line in:\n{text[-2000:]}"
    return int(m.group(1))


def _assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 30  # reaped children can linger a moment as zombies of init
    while _session_left(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _session_left(pid), f"server session {pid} left processes {_session_left(pid)}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ragrl.retrieval.sparse import build_bm25
    from ragrl.toy.tiny_model import TinyModelSpec, build_tiny
    from ragrl.toy.world import generate_world, world_text, write_world

    root = tmp_path_factory.mktemp("serving")
    write_world(generate_world(3, 30), root / "world")
    spec = TinyModelSpec(vocab_size=600, hidden_size=128, num_heads=2, num_kv_heads=1, num_layers=2,
                         intermediate_size=256)
    model = build_tiny(world_text(root / "world"), root / "model", spec)
    build_bm25(root / "world" / "passages.parquet", root / "bm25")
    return root, model


@pytest.fixture
def vllm_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default share of RAM is far too much here
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


@pytest.mark.slow
@needs_vllm
def test_teacher_served_by_the_sft_data_job_and_stopped_when_it_fails(tiny, tmp_path, vllm_env, capfd):
    """The teacher SFT route with no base_url: sft_data starts vLLM on the tiny model and rolls 4
    questions out through it. A random tiny teacher answers none right, so the job then fails
    ("no SFT trajectories", with total 4: every rollout went through the server), inside the
    server's context: the failure path, and the server is gone afterwards. Its log is where the
    rule puts it."""
    from ragrl.retrieval.searcher import load_searcher
    from ragrl.stages import agent

    root, model = tiny
    teacher = {"model": str(model), "serve": {"python": str(VLLM_PYTHON), "args": VLLM_ARGS,
                                              "served_name": "teacher", "startup_timeout_s": 600}}
    recipe = parse_recipe({**_teacher_recipe(teacher), "rollout": {"max_turns": 1, "max_turn_tokens": 16,
                                                                    "max_response_tokens": 64}}, "t")
    log = tmp_path / "logs" / "sft_data" / "t.server.log"
    with pytest.raises(ValueError, match=r"no SFT trajectories .*'total': 4"):
        agent.sft_data(recipe, root / "world" / "qa" / "train.parquet", model,
                       {"retriever": load_searcher(bm25_dir=root / "bm25")}, tmp_path / "sft.parquet", limit=4,
                       server_log=log)
    pid = _server_pid(capfd.readouterr().err)
    _assert_gone(pid)
    text = log.read_text()
    assert text.startswith(f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server --model {model} ")
    assert "--served-model-name teacher" in text.splitlines()[0]


@pytest.mark.slow
@needs_vllm
def test_server_started_healthy_used_and_stopped(tiny, tmp_path, vllm_env, capfd):
    from ragrl.agent.generation import OpenAICompletionsGenerator

    _, model = tiny
    spec = ServerSpec(model=str(model), served_name="judge", log=tmp_path / "logs" / "judge.log",
                      python=str(VLLM_PYTHON), args=tuple(VLLM_ARGS), startup_timeout_s=600)
    with model_server(spec) as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        models = httpx.get(f"{url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["judge"]
        gen = OpenAICompletionsGenerator(url, "judge", timeout_s=300)
        try:
            assert len(gen.generate([[5, 6, 7]], 3, temperature=0)[0]) >= 1
        finally:
            gen.close()
        pid = _server_pid(capfd.readouterr().err)
        assert pid in _session_left(pid)  # the server (and its engine process) is up
    _assert_gone(pid)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


_JOB = """
import sys, time
from pathlib import Path
from ragrl.serving import ServerSpec, model_server
spec = ServerSpec(model=sys.argv[1], served_name="m", log=Path(sys.argv[2]), python=sys.argv[3],
                  args=tuple(sys.argv[5:]), startup_timeout_s=600)
with model_server(spec) as url:
    Path(sys.argv[4]).write_text(url)
    time.sleep(3600)
"""


@pytest.mark.slow
@needs_vllm
def test_server_stopped_when_the_job_gets_sigterm(tiny, tmp_path, vllm_env):
    # What Snakemake (Ctrl-C) and scancel do to a running job: SIGTERM to its process.
    _, model = tiny
    log, ready, err = tmp_path / "logs" / "m.log", tmp_path / "url", tmp_path / "job.err"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with open(err, "wb") as stderr:
        job = subprocess.Popen([sys.executable, "-c", _JOB, str(model), str(log), str(VLLM_PYTHON), str(ready),
                                *VLLM_ARGS], env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + 600
        while not ready.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert ready.exists(), err.read_text()[-3000:]
        pid = _server_pid(err.read_text())
        assert httpx.get(f"{ready.read_text()}/health", timeout=5).status_code == 200
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    _assert_gone(pid)
    assert "[serve] stopped m" in err.read_text()
