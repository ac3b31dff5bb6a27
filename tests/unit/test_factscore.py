"""`ragrl factscore`: both backends on hand-made texts and KBs; the paper backend against a real
OpenAI-shaped HTTP server on 127.0.0.1 (a stand-in that answers by rule, for the plumbing)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import re
import time

import pytest
from fastapi import Request  # at module level: FastAPI resolves the handler's string annotations here

from ragrl.cli import main
from ragrl.factscore import length_penalty
from ragrl.factscore.embedded import EmbeddedFactScorer, atomic_facts
from ragrl.factscore.paper import (
    ChatEndpoint,
    EndpointError,
    EndpointUnavailable,
    LLMGrader,
    PaperFactScorer,
    fill,
    parse_atomic_facts,
    parse_grade,
    parse_verdict,
)
from ragrl.kb.build import build_kb

PERSON = "Kila V. Daisam"
CITY = "Port Velmar"
DOCS = [
    {"title": PERSON, "text": f"{PERSON} was born in {CITY}. {PERSON} works for Gipusk Holdings. "
                              f"{PERSON} was born in the year 1953."},
    {"title": CITY, "text": f"{CITY} is a city in Kessa. {CITY} has a population of 1,234,000."},
    {"title": "Ossel Bridge", "text": "Ossel Bridge spans the Tamm. It opened in 1887. Ida Marrow designed it."},
]


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    d = tmp_path_factory.mktemp("kb")
    src = d / "docs.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in DOCS))
    build_kb([src], d / "knowledge_base.db")
    return d / "knowledge_base.db"


def test_length_penalty():
    assert length_penalty(0) == 0.0
    assert length_penalty(5) == pytest.approx(math.exp(-1.0))
    assert length_penalty(10) == pytest.approx(1.0)  # exp(1 - 10/10)
    assert length_penalty(11) == 1.0
    assert length_penalty(2, gamma=4) == pytest.approx(math.exp(-1.0))


# --------------------------------------------------------------------------- embedded


def test_embedded_facts_and_verdicts(kb):
    text = (f"Daisam was born in {CITY} and works for Gipusk Holdings. {PERSON} was born in 1960. "
            "Where did Daisam work? Daisam is known for chess.")
    assert atomic_facts(text) == [f"Daisam was born in {CITY}.", "Daisam works for Gipusk Holdings.",
                                  f"{PERSON} was born in 1960.", "Daisam is known for chess."]
    fs = EmbeddedFactScorer(kb).score(PERSON, text)
    assert [v.supported for v in fs.verdicts] == [True, True, False, False]
    assert fs.verdicts[0].evidence == f"{PERSON} was born in {CITY}."
    # 2 of 4 supported, 4 facts: exp(1 - 10/4).
    assert fs.score == pytest.approx(0.5 * math.exp(-1.5))
    assert not fs.missing_topic


def test_embedded_anaphor_other_template_and_number_format(kb):
    fs = EmbeddedFactScorer(kb).score(CITY, "The city has a population of 1234000. About 1,234,000 people live in "
                                            "Port Velmar. Port Velmar lies in Kessa. Velmar lies in Norland.")
    # The first two state one fact (the population) in two templates: it counts once.
    assert [v.supported for v in fs.verdicts] == [True, True, False]
    assert [v.fact for v in fs.verdicts][1:] == ["Port Velmar lies in Kessa.", "Velmar lies in Norland."]


def test_a_name_with_and_stays_whole(kb):
    assert atomic_facts("The Lamp was written by Tom and Jerry.") == ["The Lamp was written by Tom and Jerry."]


def test_missing_topic_costs_only_its_item_and_is_logged_once(kb):
    log = io.StringIO()
    scorer = EmbeddedFactScorer(kb, log=log)
    text = f"{PERSON} was born in {CITY}."
    out = scorer.score_many([("Nobody", text), (PERSON, text), ("Nobody", text + " Ok.")])
    assert [o.missing_topic for o in out] == [True, False, True]
    assert [o.score for o in out] == [0.0, pytest.approx(math.exp(-9.0)), 0.0]
    assert log.getvalue().count("no KB document for topic 'Nobody'") == 1


def test_several_titles_and_the_verdict_cache(kb):
    scorer = EmbeddedFactScorer(kb)
    topic = f"Nobody;{CITY}"
    first = scorer.score(topic, f"{CITY} is a city in Kessa. {CITY} is a city in Norland.")
    assert [v.supported for v in first.verdicts] == [True, False]
    assert scorer.calls == {"extract": 1, "verify": 2}
    again = scorer.score_many([(topic, f"{CITY} is a city in Kessa."), (topic, f"{CITY} is a city in Kessa. Hm.")])
    assert [v.supported for v in again[1].verdicts] == [True, False]
    # Two new texts, one new fact ("Hm."): the Kessa fact is not verified again.
    assert scorer.calls == {"extract": 3, "verify": 3}


def test_cli_embedded(kb, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "topic": PERSON, "text": f"{PERSON} works for Gipusk Holdings."}) + "\n"
                   + json.dumps({"topic": "Nobody", "text": "x y z."}) + "\n")
    out = tmp_path / "scores.jsonl"
    assert main(["factscore", "--kb", str(kb), "--input", str(src), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["n_supported"], r["missing_topic"]) for r in rows] == [("a", 1, False), ("2", 0, True)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "x"}) + "\n")
    assert main(["factscore", "--kb", str(kb), "--input", str(bad), "--out", str(tmp_path / "b.jsonl")]) == 2
    assert "bad.jsonl:1: field 'topic': missing" in capsys.readouterr().err
    assert not (tmp_path / "b.jsonl").exists()


# --------------------------------------------------------------------------- replies and templates


def test_reading_replies_as_knowrl():
    assert parse_atomic_facts("Facts:\n- Ossel Bridge spans the Tamm.\n- It opened.\n- ossel bridge spans the tamm.\n"
                              "* not a fact line\n- Ida Marrow designed it.") == [
        "Ossel Bridge spans the Tamm.", "Ida Marrow designed it."]
    assert parse_atomic_facts("NON_FACTUAL: This is a question, not a factual statement.") == []
    assert parse_atomic_facts("") == []
    assert [parse_grade(r) for r in ("A", "b", "<ANSWER>C</ANSWER> because A", "NOT_ATTEMPTED", "maybe", "")] == [
        "correct", "incorrect", "not_attempted", "not_attempted", "unparsed", "unparsed"]
    assert [parse_verdict(r) for r in ("True", "false.", "True, not false", "False, not true", "It is not stated",
                                       "supported")] == [True, False, True, False, False, True]


def test_fill_inserts_once():
    assert fill("Q: {question} A: {answer} {other}", question="{answer}", answer="x") == "Q: {answer} A: x {other}"


# --------------------------------------------------------------------------- paper backend over HTTP


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def standin_app():
    """Answers KnowRL's three prompts by rule: facts = the text's sentences; a fact is True when its
    words appear in the context; a grade compares the gold and the prediction."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    app.state.fail_next, app.state.delay, app.state.requests = 0, 0.0, []
    app.state.in_flight = app.state.max_in_flight = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        prompt = body["messages"][0]["content"]
        app.state.requests.append(prompt)
        app.state.in_flight += 1
        app.state.max_in_flight = max(app.state.max_in_flight, app.state.in_flight)
        try:
            await asyncio.sleep(app.state.delay)
        finally:
            app.state.in_flight -= 1
        if app.state.fail_next > 0:
            app.state.fail_next -= 1
            return JSONResponse({"error": "overloaded"}, status_code=503)
        if "MALFORMED" in prompt:
            return {"id": "x", "object": "chat.completion"}
        if "independent atomic facts" in prompt:
            text = prompt.rsplit("Text: ", 1)[1].rsplit("Facts:", 1)[0].strip()
            sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
            reply = "\n".join(f"- {s}" for s in sents) if not text.endswith("?") else "NON_FACTUAL: This is a question."
        elif "STATEMENT TO VERIFY" in prompt:
            fact = _between(prompt, "### STATEMENT TO VERIFY:", "### ANSWER").rstrip(".")
            reply = "True" if fact in _between(prompt, "### CONTEXT:", "### STATEMENT") else "False"
        elif "Gold target:" in prompt:
            gold, pred = _between(prompt, "Gold target:", "\n"), _between(prompt, "Predicted answer:", "\n")
            reply = "C" if "know" in pred.lower() else ("A" if gold.lower() in pred.lower() else "B")
        else:
            reply = "?"
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]}

    return app


@pytest.fixture(scope="module")
def server():
    from ragrl.http_server import BackgroundServer

    app = standin_app()
    with BackgroundServer(app) as srv:
        srv.app = app
        yield srv


@pytest.fixture
def fresh(server):
    deadline = time.monotonic() + 5
    while server.app.state.in_flight and time.monotonic() < deadline:  # requests a timed-out client left
        time.sleep(0.05)
    server.app.state.fail_next, server.app.state.delay = 0, 0.0
    server.app.state.requests.clear()
    server.app.state.max_in_flight = 0
    return server


def endpoint(url: str, **kw) -> ChatEndpoint:
    kw.setdefault("backoff_s", 0.01)
    return ChatEndpoint(url + "/v1", "standin", **kw)


def test_paper_backend_llm_verifier_over_http(kb, fresh):
    scorer = PaperFactScorer(kb, endpoint(fresh.url))
    text = "Ossel Bridge spans the Tamm. It opened in 1901.\nIda Marrow designed it."
    fs = scorer.score("Ossel Bridge", text)
    assert [(v.fact, v.supported) for v in fs.verdicts] == [
        ("Ossel Bridge spans the Tamm.", True), ("It opened in 1901.", False), ("Ida Marrow designed it.", True)]
    assert fs.score == pytest.approx(2 / 3 * math.exp(1 - 10 / 3))
    # One extraction (KnowRL's prompt, the lines joined by blank lines) and one check per fact.
    assert len(fresh.app.state.requests) == 4
    assert "Text: Ossel Bridge spans the Tamm. It opened in 1901.\n\nIda Marrow designed it.\nFacts:" in \
        fresh.app.state.requests[0]
    assert "[Ossel Bridge]\nOssel Bridge spans the Tamm. It opened in 1887. Ida Marrow designed it." in \
        fresh.app.state.requests[1]
    assert scorer.score("Ossel Bridge", text) == fs and len(fresh.app.state.requests) == 4  # all cached
    assert scorer.score("Ossel Bridge", "Is it old?").n_facts == 0  # NON_FACTUAL


def test_paper_backend_nli_verifier_uses_top_k_and_the_threshold(kb, fresh):
    seen = []

    def entail(pairs):
        seen.extend(pairs)
        return [0.3 if fact.rstrip(".") in premise else 0.29 for premise, fact in pairs]

    class FirstPassages:
        def top(self, topic, fact, passages, k):
            return list(range(k))

    # A KB document of one passage: the ranker is not consulted (<= top_k passages).
    scorer = PaperFactScorer(kb, endpoint(fresh.url), entailment=entail, ranker=FirstPassages(), top_k=5)
    fs = scorer.score("Ossel Bridge", "Ossel Bridge spans the Tamm. It opened in 1901.")
    assert [v.supported for v in fs.verdicts] == [True, False]
    assert len(seen) == 2 and len(fresh.app.state.requests) == 1  # NLI: only the extraction went out


def test_grader_over_http(fresh):
    grader = LLMGrader(endpoint(fresh.url))
    items = [("Who designed Ossel Bridge?", ["Ida Marrow"], "Ida Marrow"),
             ("Who designed Ossel Bridge?", ["Ida Marrow"], "Dovan Arno"),
             ("Who designed Ossel Bridge?", ["Ida Marrow"], "I don't know"),
             ("Who designed Ossel Bridge?", ["Ida Marrow"], None),
             ("Who designed Ossel Bridge?", ["Ida Marrow"], "  ")]
    assert grader.grade_many(items) == ["correct", "incorrect", "not_attempted", "incorrect", "incorrect"]
    assert len(fresh.app.state.requests) == 3  # no request for a missing or empty answer


def test_retries_then_success(fresh):
    fresh.app.state.fail_next = 2
    assert endpoint(fresh.url, max_retries=2).complete(["anything"]) == ["?"]
    assert len(fresh.app.state.requests) == 3


def test_still_failing_fails_loudly(fresh):
    fresh.app.state.fail_next = 10
    with pytest.raises(EndpointUnavailable, match=r"unavailable after 2 attempts \(HTTP 503: overloaded\)"):
        endpoint(fresh.url, max_retries=1).complete(["anything"])


def test_timeout_is_retried_then_fails(fresh):
    fresh.app.state.delay = 1.0
    with pytest.raises(EndpointUnavailable, match="ReadTimeout"):
        endpoint(fresh.url, max_retries=1, timeout_s=0.2).complete(["anything"])


def test_endpoint_down():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(EndpointUnavailable, match=f"127.0.0.1:{port}/v1/chat/completions unavailable"):
            endpoint(f"http://127.0.0.1:{port}", max_retries=1).complete(["anything"])


def test_not_a_chat_completion(fresh):
    with pytest.raises(EndpointError, match="not a chat completion"):
        endpoint(fresh.url).complete(["MALFORMED"])


def test_batched_requests_run_concurrently_in_order(fresh):
    fresh.app.state.delay = 0.2
    prompts = [f"Gold target: g{i}\nPredicted answer: g{i if i % 2 else 'x'}\n" for i in range(8)]
    start = time.monotonic()
    replies = endpoint(fresh.url, max_workers=4).complete(prompts)
    elapsed = time.monotonic() - start
    assert replies == ["B", "A"] * 4
    assert fresh.app.state.max_in_flight == 4
    assert elapsed < 8 * 0.2


def test_embedded_on_the_world(tmp_path):
    """Every fact the world's factual questions list is supported by the KB built from the world's
    documents; the same sentence with another entity's name as its tail is not."""
    from ragrl.toy.world import generate_world

    world = generate_world(3, "tiny")
    docs = tmp_path / "documents.jsonl"
    docs.write_text("".join(json.dumps({"title": d["title"], "text": d["text"]}) + "\n" for d in world.kb_documents))
    build_kb([docs], tmp_path / "kb.db")
    scorer = EmbeddedFactScorer(tmp_path / "kb.db")
    rows = world.factual["train"][:20]
    other = world.kb_documents[-1]["title"]
    for row in rows:
        meta = json.loads(row["metadata"])
        facts, topic = meta["facts"], meta["topic_entity"]
        fs = scorer.score(topic, " ".join(facts))
        assert (fs.n_facts, fs.n_supported) == (len(facts), len(facts)), (topic, fs.verdicts)
        tail = meta["hops"][0][2]
        wrong = [f.replace(tail, other) for f in facts if f.endswith(f"{tail}.")]
        assert wrong and scorer.score(topic, " ".join(wrong)).n_supported == 0


# --------------------------------------------------------------------------- files checked when a job opens them


def _truncated(kb, path):
    data = kb.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return path


def test_cli_names_a_truncated_kb_before_scoring(kb, tmp_path, capsys):
    bad = _truncated(kb, tmp_path / "knowledge_base.db")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"topic": PERSON, "text": f"{PERSON} works for Gipusk Holdings."}) + "\n")
    out = tmp_path / "scores.jsonl"
    assert main(["factscore", "--kb", str(bad), "--input", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not a readable SQLite database (database disk image is malformed)" in err
    assert not out.exists()
    assert main(["factscore", "--kb", str(tmp_path / "none.db"), "--input", str(src), "--out", str(out)]) == 2
    assert f"knowledge base {tmp_path / 'none.db'}: no such file" in capsys.readouterr().err


def test_a_kb_damaged_after_opening_is_named_with_the_document(kb, tmp_path):
    from ragrl.errors import DataFormatError

    copy = tmp_path / "knowledge_base.db"
    copy.write_bytes(kb.read_bytes())
    scorer = EmbeddedFactScorer(copy)
    _truncated(kb, copy)
    with pytest.raises(DataFormatError, match=f"{re.escape(str(copy))}: reading document 'Port Velmar'"):
        scorer.score(CITY, f"{CITY} is a city in Kessa.")


def _model_dir(path, files):
    path.mkdir()
    for name in files:
        (path / name).write_text("{}")
    return path


@pytest.mark.parametrize("files, needle", [
    (["model.safetensors"], "no config.json"),
    (["config.json"], "no weights"),
    (["config.json", "model.safetensors.index.json"], "not a shard index"),
    (["config.json", "model.safetensors.index.json", "model-1.safetensors"], "missing shard"),
])
def test_paper_backend_models_are_checked_when_it_is_built(kb, tmp_path, files, needle):
    from ragrl.factscore.paper import DenseRanker, NLIModel

    bad = _model_dir(tmp_path / "model", files)
    if "model-1.safetensors" in files:
        (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors",
                                                                                    "b": "model-2.safetensors"}}))
    with pytest.raises(ValueError, match=f"factscore nli_model.*{re.escape(str(bad))}.*{needle}"):
        NLIModel(str(bad))
    with pytest.raises(ValueError, match=f"factscore ranker.*{re.escape(str(bad))}.*{needle}"):
        DenseRanker(str(bad))
    with pytest.raises(ValueError, match="model path '/nowhere/model' does not exist"):
        NLIModel("/nowhere/model")


def test_a_complete_model_dir_passes(tmp_path):
    from ragrl.factscore.paper import DenseRanker, NLIModel

    good = _model_dir(tmp_path / "model", ["config.json", "model.safetensors"])
    assert NLIModel(str(good)).path == str(good)
    sharded = _model_dir(tmp_path / "sharded", ["config.json", "model-1.safetensors"])
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    assert NLIModel(str(sharded)).path == str(sharded)
    st = _model_dir(tmp_path / "st", ["modules.json"])
    (st / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "0_Transformer",
                                                  "type": "sentence_transformers.models.Transformer"}]))
    _model_dir(st / "0_Transformer", ["config.json", "pytorch_model.bin"])
    assert DenseRanker(str(st)).path == str(st)


# --------------------------------------------------------------------------- replies without text or in the wrong format


def _completion(content):
    return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                              "finish_reason": "length" if content is None else "stop"}]}


def _paper_cli(kb, chat_server, tmp_path, texts, *extra):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"topic": "Ossel Bridge", "text": t}) + "\n" for t in texts))
    out = tmp_path / "scores.jsonl"
    argv = ["factscore", "--backend", "paper", "--kb", str(kb), "--input", str(src), "--out", str(out),
            "--base-url", chat_server.url, "--model", "judge", "--verifier", "llm", "--ranker", "", *extra]
    return argv, out


def test_cli_a_reply_without_content_is_an_error_naming_the_endpoint(kb, chat_server, tmp_path, capsys):
    chat_server.reply = lambda body: _completion(None)
    argv, out = _paper_cli(kb, chat_server, tmp_path, ["Ossel Bridge spans the Tamm."], "--max-retries", "1")
    assert main(argv) == 2  # one line naming the endpoint, no traceback
    assert capsys.readouterr().err.startswith(
        f"ragrl factscore: error: chat endpoint at {chat_server.url}/chat/completions answered with no content 2 "
        "time(s) (model 'judge', finish_reason 'length')")
    assert len(chat_server.seen) == 2 and not out.exists()  # asked again once, then nothing written


def _facts_of_the_spans_text(other: str):
    """A judge that verifies every fact, states one for the text that says "spans" and answers
    `other` for any other text."""

    def reply(body):
        prompt = body["messages"][0]["content"]
        if "STATEMENT TO VERIFY" in prompt:
            return _completion("True")
        return _completion("- Ossel Bridge spans the Tamm." if "spans" in prompt.rsplit("Text:", 1)[1] else other)

    return reply


def test_a_blank_reply_cut_by_the_token_cap_fails_at_once_and_a_stray_blank_one_is_counted(kb, chat_server, tmp_path,
                                                                                              capsys):
    chat_server.reply = lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": "\n\n"},
                                                         "finish_reason": "length"}]})
    argv, out = _paper_cli(kb, chat_server, tmp_path, ["Ossel Bridge spans the Tamm."], "--max-retries", "3")
    assert main(argv) == 2
    assert "no text before its token cap" in capsys.readouterr().err
    assert len(chat_server.seen) == 1 and not out.exists()  # asked again at temperature 0 it would be cut again

    # A blank reply that ended by itself, among usable ones, is an off-format reply: counted, not fatal.
    chat_server.reply = _facts_of_the_spans_text(other=" ")
    argv, out = _paper_cli(kb, chat_server, tmp_path, ["Ossel Bridge spans the Tamm.", "It opened in 1887."])
    assert main(argv) == 0 and out.exists()
    assert "1 of 2 replies off-format, read as no facts" in capsys.readouterr().err


def test_cli_replies_all_off_format_are_an_error_and_some_are_counted(kb, chat_server, tmp_path, capsys):
    chat_server.reply = lambda body: _completion("I like turtles.")
    argv, out = _paper_cli(kb, chat_server, tmp_path, ["Ossel Bridge spans the Tamm.", "It opened in 1887.", "\n \n"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"ragrl factscore: error: fact extraction at {chat_server.url}/chat/completions: all 2 replies were " \
           "off-format" in err, err[-2000:]
    assert len(chat_server.seen) == 2 and not out.exists()  # the blank text is not sent
    assert "2 of 2 replies off-format, read as no facts (2 of 2 so far)" in err

    chat_server.reply = _facts_of_the_spans_text(other="Hmm.")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "fact extraction at" in captured.err and "1 of 2 replies off-format, read as no facts" in captured.err
    assert "'offformat_replies': {'extract': 1, 'verify': 0}" in captured.out
    assert [json.loads(line)["n_supported"] for line in out.read_text().splitlines()] == [1, 0, 0]


def test_a_run_of_off_format_grades_is_an_error(chat_server, capsys):
    from ragrl.replies import DEAD_RUN

    chat_server.reply = lambda body: _completion("Z")
    grader = LLMGrader(ChatEndpoint(chat_server.url, "judge"))
    item = ("Who designed Ossel Bridge?", ["Ida Marrow"], "Ida Marrow")
    for _ in range(DEAD_RUN - 1):
        assert grader.grade_many([item]) == ["unparsed"]  # a stray reply: KnowRL's reading, counted
    assert grader.replies.offformat == DEAD_RUN - 1
    assert "grader at" in capsys.readouterr().err
    with pytest.raises(EndpointError, match=f"grader at {chat_server.url}/chat/completions: the last {DEAD_RUN} "
                                            "replies were all off-format"):
        grader.grade_many([item])
    chat_server.reply = lambda body: _completion("A")
    assert grader.grade_many([item]) == ["correct"] and grader.replies.run == 0  # a good reply ends the run
