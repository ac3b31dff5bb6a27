"""The rollout engine on real tokenizer ids: a tiny Qwen2 policy built from a tiny synthetic world.

A random policy rarely writes a well-formed action, so most paths are driven by a scripted
"generator" that returns predetermined text (encoded with the real tokenizer, overshooting the
stop tags the way a backend may); the random model itself is run too, for the invariants that
must hold whatever it writes.
"""

from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import http.server
import json
import re
import socket
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
import transformers

from ragrl.agent.environments import MultiQuerySearchEnvironment, RetrievalResultError, SearchEnvironment
from ragrl.agent.generation import GenerationBackendError, HFGenerator, OpenAICompletionsGenerator
from ragrl.agent.protocol import OBS_PREFIX, OBS_SUFFIX, TURN_LIMIT_NOTICE, forced_answer_prompt, recorded_turns
from ragrl.agent.rollout import RolloutConfig, RolloutEngine
from ragrl.errors import InputError
from ragrl.rewards import composite_reward, exact_match, extract_answer, format_reward, turns_format_reward
from ragrl.toy.tiny_model import CHAT_TEMPLATE

from helpers import (
    FakeRetriever,
    RecordingGenerator,
    check_bounds,
    check_mask_against_info_spans,
    check_turns,
    encode_text,
    world_and_model,
)


# --------------------------------------------------------------------------- fixtures and fakes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    world, model_dir = world_and_model(root)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    rows = [r for r in world.qa["train"] if r["golden_answers"]]
    # One intra-op thread: the model is tiny, and on a shared 2-core machine a second thread mostly
    # waits for the other workers (10x slower, erratically).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SimpleNamespace(world=world, tok=tok, model_dir=model_dir, rows=rows,
                           by_question={r["question"]: r for r in rows},
                           hf=HFGenerator.from_pretrained(model_dir, dtype="float32"))
    torch.set_num_threads(threads)


class RetrievalUnavailable(RuntimeError):
    """What a real retriever client raises when its server is down."""


class ScriptedGenerator:
    """Returns `script(context_text)` encoded with the real tokenizer, honouring only the token budget
    (not the stop tags: the engine must cut overshoot itself)."""

    def __init__(self, tok, script: Callable[[str], str]):
        self.tok = tok
        self.script = script
        self.calls: list[list[int]] = []  # per call: the per-row limits

    def generate(self, batch, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *, stop_token_ids=(), stop_strings=()):
        limits = [max_new_tokens] * len(batch) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        self.calls.append(limits)
        return [self.tok.encode(self.script(self.tok.decode(ids)), add_special_tokens=False)[:lim]
                for ids, lim in zip(batch, limits)]


def _question(context: str) -> str:
    return re.search(r"Question: (.*?)\n", context).group(1)


def _response(context: str) -> str:
    """The assistant part of a context (the instruction itself mentions </information>)."""
    return context.rsplit("<|im_start|>assistant\n", 1)[-1]


def _hops(row) -> list[list[str]]:
    return json.loads(row["metadata"])["hops"]


def gold_script(tiny) -> Callable[[str], str]:
    """One search per hop, then the gold answer; overshoots after each action."""

    def script(context: str) -> str:
        row = tiny.by_question[_question(context)]
        done = _response(context).count("</information>")
        hops = _hops(row)
        if done < len(hops):
            head, rel, _ = hops[done]
            return f"<think>I need the {rel} of {head}.</think><search>{head} {rel.replace('_', ' ')}</search> spill"
        return f"<think>Found it.</think><answer>{row['golden_answers'][0]}</answer><|im_end|> more"

    return script


def _engine(tiny, generator, env=None, **cfg) -> RolloutEngine:
    env = env or SearchEnvironment(FakeRetriever(tiny.world.passages), topk=3)
    return RolloutEngine(generator, tiny.tok, env, RolloutConfig(**cfg))


# --------------------------------------------------------------------------- invariants



# --------------------------------------------------------------------------- scripted rollouts


def test_prompt_is_chat_templated(tiny):
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, lambda c: ""))
    q = tiny.rows[0]["question"]
    text = tiny.tok.decode(engine.prompt_ids(q))
    assert text.startswith("<|im_start|>user\nAnswer the given question.")
    assert f"Question: {q}\n<|im_end|>\n<|im_start|>assistant\n" in text
    custom = tiny.tok.decode(engine.prompt_ids(q, instruction="Q={question}"))
    assert f"Q={q}<|im_end|>" in custom
    configured = _engine(tiny, ScriptedGenerator(tiny.tok, lambda c: ""), instruction="Ask: {question}")
    assert f"Ask: {q}<|im_end|>" in tiny.tok.decode(configured.prompt_ids(q))
    # KnowRL's shape: the instruction as a system message, the question alone as the user's.
    system = _engine(tiny, ScriptedGenerator(tiny.tok, lambda c: ""), instruction="{question}",
                     system_prompt="Use <think> tags.\nThen <answer>.")
    assert tiny.tok.decode(system.prompt_ids(q)) == (
        f"<|im_start|>system\nUse <think> tags.\nThen <answer>.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
        "<|im_start|>assistant\n")
    # Search-R1's data processing: strip, then "?" where the question has none.
    marked = _engine(tiny, ScriptedGenerator(tiny.tok, lambda c: ""), instruction="Q={question}.", question_mark=True)
    assert "Q=Who wrote it?.<|im_end|>" in tiny.tok.decode(marked.prompt_ids(" Who wrote it \n"))
    assert "Q=Who wrote it?.<|im_end|>" in tiny.tok.decode(marked.prompt_ids("Who wrote it?"))
    assert "Ask: Who wrote it<|im_end|>" in tiny.tok.decode(configured.prompt_ids("Who wrote it"))  # off: as given
    # KnowRL's main.py: continue_final_message=True over [system, user]: the prompt stops after the
    # question, with neither the user turn's end nor an assistant header.
    user_end = _engine(tiny, ScriptedGenerator(tiny.tok, lambda c: ""), instruction="{question}",
                       system_prompt="Be brief.", continue_user_turn=True)
    assert tiny.tok.decode(user_end.prompt_ids(q)) == f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{q}"


def test_gold_trajectories(tiny):
    rows = tiny.rows[:4]
    gen = ScriptedGenerator(tiny.tok, gold_script(tiny))
    retriever = FakeRetriever(tiny.world.passages)
    cfg = dict(max_turns=4, n=2, max_turn_tokens=96, max_obs_tokens=400)
    engine = _engine(tiny, gen, SearchEnvironment(retriever, topk=3), **cfg)
    trajs = engine.run_questions([r["question"] for r in rows])
    assert [(t.prompt_index, t.sample_index) for t in trajs] == [(p, s) for p in range(4) for s in range(2)]
    for t in trajs:
        row = rows[t.prompt_index]
        check_mask_against_info_spans(t, tiny.tok)
        check_turns(t)
        check_bounds(t, engine.config)
        assert t.finished and t.stop_reason == "answer"
        assert t.answer == row["golden_answers"][0] == extract_answer(t.response_text)
        assert t.num_searches == len(_hops(row)) == len(t.actions) - 1
        assert [a["type"] for a in t.actions] == ["search"] * t.num_searches + ["answer"]
        assert "spill" not in t.response_text and " more" not in t.response_text  # overshoot cut
        assert t.response_text.endswith("</answer>")
        assert t.generated_tokens > 0 and t.observation_tokens > 0 and t.latency_s >= t.env_time_s >= 0
        assert turns_format_reward(recorded_turns(t), "search") == 1.0 == format_reward(t.response_text, "search")
        assert exact_match(t.answer, row["golden_answers"]) == 1.0
        assert composite_reward(t, row["golden_answers"], {"em": 1.0, "format": 0.1}) == pytest.approx(1.1)
        assert "Doc 1(Title: " in t.response_text
    # One generate call per turn for all active rows; one retriever call per turn with every query.
    max_hops = max(len(_hops(r)) for r in rows)
    assert len(gen.calls) == max_hops + 1
    assert len(gen.calls[0]) == 8
    assert len(retriever.calls) == max_hops
    assert len(retriever.calls[0]) == 8
    assert [len(c) for c in retriever.calls] == [2 * sum(len(_hops(r)) > k for r in rows) for k in range(max_hops)]


def test_forced_answer_after_max_turns(tiny):
    def script(context):
        if context.endswith("<answer>"):  # the prefilled forced turn
            return "Velmar</answer> trailing"
        return "<think>search more</think><search>Velmar founded</search>"

    retriever = FakeRetriever(tiny.world.passages)
    gen = ScriptedGenerator(tiny.tok, script)
    engine = _engine(tiny, gen, SearchEnvironment(retriever), max_turns=2, n=2)
    trajs = engine.run_questions([tiny.rows[0]["question"], tiny.rows[1]["question"]])
    for t in trajs:
        check_mask_against_info_spans(t, tiny.tok)
        check_turns(t)
        assert [(a["type"], a["forced"]) for a in t.actions] == [("search", False), ("search", False), ("answer", True)]
        assert t.answer == "Velmar" and t.finished and t.num_searches == 2
        assert t.response_text.count(TURN_LIMIT_NOTICE) == 1
        assert t.response_text.endswith(TURN_LIMIT_NOTICE + "</information>\n\n<answer>Velmar</answer>")
        # The notice and the prefilled <answer> are environment tokens of the last tool turn.
        turn1_env = [i for i, m, k in zip(t.response_ids, t.loss_mask, t.turn_index) if k == 1 and m == 0]
        forced = encode_text(tiny.tok, forced_answer_prompt())
        assert turn1_env[-len(forced):] == forced and len(turn1_env) == t.actions[1]["observation_tokens"]
        assert set(t.turn_index) == {0, 1, 2}
        assert turns_format_reward(recorded_turns(t)) == 1.0 == format_reward(t.response_text)
    assert len(retriever.calls) == 2 and len(gen.calls) == 3


def test_forced_turn_without_prefill_does_not_search(tiny):
    retriever = FakeRetriever(tiny.world.passages)
    gen = ScriptedGenerator(tiny.tok, lambda c: "<think>again</think><search>more</search>")
    engine = _engine(tiny, gen, SearchEnvironment(retriever), max_turns=1, forced_answer_prefill=False)
    (t,) = engine.run_questions([tiny.rows[0]["question"]])
    check_mask_against_info_spans(t, tiny.tok)
    check_turns(t)
    assert len(retriever.calls) == 1
    assert t.answer is None and not t.finished and t.stop_reason == "no_answer"
    assert t.actions[-1]["forced"] and not t.actions[-1]["valid"] and "turn limit" in t.actions[-1]["error"]
    assert t.response_text.endswith("</information>\n\n<think>again</think><search>more</search>")


def test_the_authors_last_turn_has_no_notice_and_no_prefill(tiny):
    # Search-R1's and KG-R1's loops generate the last turn as any other: nothing inserted after the
    # last observation; an answer there is scored, a search is not executed.
    contexts = []

    def script(context):
        contexts.append(context)
        return ("<think>found</think><answer>Velmar</answer>" if len(contexts) == 2
                else "<think>look</think><search>Velmar founded</search>")

    retriever = FakeRetriever(tiny.world.passages)
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), SearchEnvironment(retriever), max_turns=1,
                     forced_answer_prefill=False, turn_limit_notice=False)
    (t,) = engine.run_questions([tiny.rows[0]["question"]])
    check_mask_against_info_spans(t, tiny.tok)
    check_turns(t)
    assert contexts[1].endswith("</information>\n\n") and TURN_LIMIT_NOTICE not in t.response_text
    assert t.answer == "Velmar" and t.actions[-1]["forced"] and not t.actions[-1]["after_notice"]
    assert turns_format_reward(recorded_turns(t)) == 1.0  # the last turn needs its <think>, as any other
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, lambda c: "<think>again</think><search>more</search>"),
                     SearchEnvironment(retriever), max_turns=1, forced_answer_prefill=False, turn_limit_notice=False)
    (t,) = engine.run_questions([tiny.rows[0]["question"]])
    assert t.stop_reason == "no_answer" and not t.actions[-1]["valid"] and len(retriever.calls) == 2


@pytest.mark.parametrize("query_format, empty, sep", [("rag_r1", " , ", ", "), ("ragrl", " | ", " | ")])
def test_a_search_the_environment_refused_earns_no_format_reward(tiny, query_format, empty, sep):
    # "<search> , </search>" reads as a search in the text, but its queries split to nothing and
    # the environment refused it: the format term reads the turn record, not the text. And the
    # refusal names the format's own separator.
    from ragrl.agent.protocol import recorded_turns as turns_of

    def run(search):
        calls = iter([f"<think>a</think><search>{search}</search>", "<think>b</think><answer>Paris</answer>"])
        env = MultiQuerySearchEnvironment(FakeRetriever(tiny.world.passages), topk=1, max_queries=2,
                                          query_format=query_format)
        (t,) = _engine(tiny, ScriptedGenerator(tiny.tok, lambda _c: next(calls)), env,
                       max_turns=2).run_questions([tiny.rows[0]["question"]])
        return t

    refused, ok = run(empty), run("Velmar founded")
    assert not refused.actions[0]["valid"] and ok.actions[0]["valid"]
    assert turns_format_reward(turns_of(refused)) == 0.0 and turns_format_reward(turns_of(ok)) == 1.0
    assert f"<search>q1{sep}q2</search>" in refused.actions[0]["observation"]


def test_distinct_queries_per_search_as_the_evaluation_records_it(tiny):
    # RAG-R1's parallel-query figure (issue #35): distinct queries of the executed searches per search.
    from ragrl.methods import get_method

    def run(turns):
        calls = iter(turns + ["<think>b</think><answer>Paris</answer>"])
        env = MultiQuerySearchEnvironment(FakeRetriever(tiny.world.passages), topk=1, max_queries=3)
        (t,) = _engine(tiny, ScriptedGenerator(tiny.tok, lambda _c: next(calls)), env,
                       max_turns=3).run_questions([tiny.rows[0]["question"]])
        return get_method("multi_query_search").eval_metrics(None, tiny.rows[0], t)["distinct_per_search"]

    assert run(["<think>a</think><search>A? | B?</search>"]) == 2.0
    assert run(["<think>a</think><search>A? | B?</search>", "<think>a</think><search>A?</search>"]) == 1.0
    assert run(["<think>a</think><search> | </search>", "<think>a</think><search>A?</search>"]) == 1.0  # refused: not counted
    assert run([]) is None


def test_zero_tool_turns_is_a_plain_answer_turn(tiny):
    gen = ScriptedGenerator(tiny.tok, lambda c: "<think>no tools</think><answer>x</answer>")
    (t,) = _engine(tiny, gen, max_turns=0).run_questions([tiny.rows[0]["question"]])
    assert t.answer == "x" and t.observation_tokens == 0 and t.actions[0]["forced"]


MALFORMED = [
    "I will just ramble without any tags",
    "<think>hmm</think><search>unclosed query",
    "<think>hmm</think><search>   </search>",
    "<think>hmm</think><answer>x<think>nested</think></answer>",
    "\x00\x01\ufffd\x7f binary junk \udcff".encode("utf-8", "replace").decode("latin-1"),
    "<think>hmm</think><query>unknown tag</query>",
    "<information>I write my own docs</information><answer>x</answer>",
    "<think>hmm</think><kg-query>wrong env</kg-query>",
    "<|im_end|>",
]


def test_malformed_outputs_become_invalid_action_observations(tiny):
    rows = tiny.rows[: len(MALFORMED)]
    index = {r["question"]: i for i, r in enumerate(rows)}

    def script(context):
        if "</information>" in _response(context):
            return "<think>ok</think><answer>fine</answer>"
        return MALFORMED[index[_question(context)]]

    retriever = FakeRetriever(tiny.world.passages)
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), SearchEnvironment(retriever), max_turns=3)
    trajs = engine.run_questions([r["question"] for r in rows])
    assert retriever.calls == []  # no valid query, no retrieval
    for t in trajs:
        check_turns(t)
        first = t.actions[0]
        assert first["type"] == "invalid" and not first["valid"] and first["error"], first
        obs = tiny.tok.decode([i for i, m, k in zip(t.response_ids, t.loss_mask, t.turn_index) if m == 0 and k == 0])
        assert obs.startswith("\n\n<information>Invalid action: ") and obs.endswith("</information>\n\n")
        assert t.answer == "fine" and t.finished
        if "<information>" not in MALFORMED[t.prompt_index]:
            check_mask_against_info_spans(t, tiny.tok)


def test_multi_query_search_batches_all_queries_in_one_call(tiny):
    rows = tiny.rows[:3]

    def script(context):
        if "</information>" in _response(context):
            return "<think>ok</think><answer>done</answer>"
        head = _hops(tiny.by_question[_question(context)])[0][0]
        return f"<think>split</think><search>{head} born | {head} employer\n{head} educated | extra</search>"

    retriever = FakeRetriever(tiny.world.passages)
    env = MultiQuerySearchEnvironment(retriever, topk=2, max_queries=2)
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), env, max_turns=3)
    trajs = engine.run_questions([r["question"] for r in rows])
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 6
    for t in trajs:
        check_mask_against_info_spans(t, tiny.tok)
        check_turns(t)
        assert t.num_searches == 1 and t.num_queries == 2
        assert t.actions[0]["dropped"] == [f"{_hops(rows[t.prompt_index])[0][0]} educated", "extra"]
        assert "Query 1: " in t.response_text and "Query 2: " in t.response_text
        assert "Note: at most 2 queries per turn; not searched: " in t.response_text
        assert turns_format_reward(recorded_turns(t), "search") == 1.0 == format_reward(t.response_text, "search")
    assert "up to 2 queries" in tiny.tok.decode(engine.prompt_ids("q?"))


def test_rag_r1_cuts_each_querys_documents_not_the_whole_observation(tiny):
    # RAG-R1 (generation_mq.py `_process_documents`) cuts each query's documents string to
    # max_obs_length tokens and leaves the JSON whole: three queries whose documents each overflow
    # the budget all keep their first passage, where one cut of the whole would lose the later ones.
    rows = tiny.rows[:3]
    queries = [f"{_hops(r)[0][0]} born" for r in rows]

    def script(context):
        if "</information>" in _response(context):
            return "<think>ok</think><answer>done</answer>"
        return "<think>split</think><search>" + ", ".join(queries) + "</search>"

    def run(query_obs_tokens, max_obs_tokens):
        env = MultiQuerySearchEnvironment(FakeRetriever(tiny.world.passages), topk=3, max_queries=3,
                                          query_format="rag_r1", query_obs_tokens=query_obs_tokens)
        engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), env, max_turns=3, max_obs_tokens=max_obs_tokens)
        (t,) = engine.run_questions([rows[0]["question"]])
        check_mask_against_info_spans(t, tiny.tok)
        return env, t

    env, whole = run(None, 4000)
    full = json.loads(whole.actions[0]["observation"])["documents"]
    first_doc = [d.split("\nDoc 2: ")[0] for d in full]
    budget = max(len(tiny.tok.encode(d, add_special_tokens=False)) for d in first_doc) + 2
    assert all(len(tiny.tok.encode(d, add_special_tokens=False)) > budget for d in full)  # each query overflows
    assert len(whole.actions[0]["retrieved"]) == 9

    env, per_query = run(budget, 4000)
    docs = json.loads(per_query.actions[0]["observation"])["documents"]
    assert len(docs) == 3
    for kept, doc, one in zip(docs, full, first_doc):
        assert len(tiny.tok.encode(kept, add_special_tokens=False)) <= budget
        assert kept.startswith(one) and kept != doc  # each keeps its first passage, and is cut
    # The turn record credits the passages whose title line was shown: the first of each query, and
    # a second only where its header fit the budget.
    shown = per_query.actions[0]["retrieved"]
    hits = FakeRetriever(tiny.world.passages).search(queries, 3)
    assert {h[0]["id"] for h in hits} <= set(shown) and not {h[2]["id"] for h in hits} & set(shown)
    # Exactly the passages whose "Doc i: {title}" line is whole in what was kept, for any budget.
    for b in range(8, 400, 7):
        _, t = run(b, 4000)
        kept = json.loads(t.actions[0]["observation"])["documents"]
        want = [h["id"] for per_q, doc in zip(hits, kept) for i, h in enumerate(per_q, 1)
                if f"Doc {i}: {h['title']}\n" in doc + "\n"]
        assert t.actions[0]["retrieved"] == list(dict.fromkeys(want)), b
    # A whole-observation cut of the same size loses the later queries' passages altogether.
    _, cut_whole = run(None, budget + 40)
    assert len(cut_whole.actions[0]["retrieved"]) < 3

    with pytest.raises(InputError, match="tokenizer"):
        MultiQuerySearchEnvironment(FakeRetriever(tiny.world.passages), query_format="rag_r1",
                                    query_obs_tokens=10).respond([env.parse("<search>a, b</search>")])
    with pytest.raises(InputError, match="json"):
        MultiQuerySearchEnvironment(FakeRetriever(tiny.world.passages), query_obs_tokens=10)


def test_retrieval_failure_stops_the_rollout(tiny):
    gen = ScriptedGenerator(tiny.tok, gold_script(tiny))
    retriever = FakeRetriever(tiny.world.passages, fail=RetrievalUnavailable("http://retriever:8000 refused"))
    engine = _engine(tiny, gen, SearchEnvironment(retriever))
    with pytest.raises(RetrievalUnavailable) as info:
        engine.run_questions([tiny.rows[0]["question"], tiny.rows[1]["question"]])
    assert any("rollout stops" in note for note in info.value.__notes__)
    assert len(retriever.calls) == 1


@pytest.mark.parametrize(
    "mangle",
    [lambda out: out[:-1], lambda out: [[{"id": "x", "title": "t"}] for _ in out], lambda out: "nope"],
    ids=["too-few-lists", "hit-without-text", "not-a-list"],
)
def test_malformed_retrieval_results_are_errors(tiny, mangle):
    env = SearchEnvironment(FakeRetriever(tiny.world.passages, mangle=mangle))
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, gold_script(tiny)), env)
    with pytest.raises(RetrievalResultError):
        engine.run_questions([tiny.rows[0]["question"]])


def test_observation_truncated_to_budget_keeps_closing_tag(tiny):
    gen = ScriptedGenerator(tiny.tok, gold_script(tiny))
    engine = _engine(tiny, gen, max_obs_tokens=24)
    (t,) = engine.run_questions([tiny.rows[0]["question"]])
    check_mask_against_info_spans(t, tiny.tok)
    check_turns(t)
    tail = encode_text(tiny.tok, OBS_SUFFIX)
    for a in t.actions[:-1]:
        assert a["observation_tokens"] <= 24
    obs = [i for i, m, k in zip(t.response_ids, t.loss_mask, t.turn_index) if m == 0 and k == 0]
    assert len(obs) == 24 and obs[-len(tail):] == tail
    assert t.finished


@pytest.mark.parametrize("overflow", ["end", "roll"])
def test_context_overflow_ends_or_rolls(tiny, overflow):
    # Search-R1's loop (_update_rolling_state) keeps generating from the context's last
    # max_prompt_length tokens; `end` stops the trajectory where the context is full.
    contexts = []

    def script(context):
        contexts.append(tiny.tok.encode(context, add_special_tokens=False))
        return "<think>again</think><search>Velmora founder</search>"

    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), max_turns=6, max_turn_tokens=40, max_obs_tokens=120,
                     max_context_tokens=300, max_response_tokens=1500, context_overflow=overflow)
    (t,) = engine.run_questions([tiny.rows[0]["question"]])
    check_mask_against_info_spans(t, tiny.tok)
    full = len(t.prompt_ids) + len(t.response_ids)
    if overflow == "end":
        assert t.stop_reason == "context_limit" and full <= 300
    else:
        assert t.stop_reason != "context_limit" and full > 300 and t.num_searches == 6
        sequence = t.prompt_ids + t.response_ids
        assert all(len(c) <= 300 for c in contexts) and max(len(c) for c in contexts) == 300
        # each window is the tail of the trajectory as it stood
        assert all(any(sequence[i - len(c):i] == c for i in range(len(c), len(sequence) + 1)) for c in contexts)


def test_response_and_context_bounds(tiny):
    script = lambda c: "<think>" + "la " * 12 + "</think><search>Velmar founded</search>"  # noqa: E731
    q = tiny.rows[0]["question"]
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), max_turns=10, max_response_tokens=120, max_turn_tokens=60)
    (t,) = engine.run_questions([q])
    check_turns(t)
    check_bounds(t, engine.config)
    assert t.stop_reason == "response_limit" and t.answer is None and not t.finished
    assert len(t.response_ids) == 120  # the observation was cut to the room left

    # Room for the search but not for any observation: the search is not executed.
    turn_len = len(encode_text(tiny.tok, script("")))
    retriever = FakeRetriever(tiny.world.passages)
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), SearchEnvironment(retriever),
                     max_response_tokens=turn_len + 4)
    (t,) = engine.run_questions([q])
    check_turns(t)
    assert t.stop_reason == "response_limit" and retriever.calls == [] and t.num_searches == 0
    assert t.actions[-1]["error"] == "length limit reached; action not executed"

    prompt_len = len(engine.prompt_ids(q))
    engine = _engine(tiny, ScriptedGenerator(tiny.tok, script), max_turns=10, max_context_tokens=prompt_len + 90)
    (t,) = engine.run_questions([q])
    check_turns(t)
    check_bounds(t, engine.config)
    assert t.stop_reason == "context_limit" and t.answer is None

    with pytest.raises(ValueError, match="max_obs_tokens"):
        _engine(tiny, ScriptedGenerator(tiny.tok, script), max_obs_tokens=3)


def test_multi_token_tags_are_cut_by_text(tiny):
    # A real tokenizer (Qwen2.5) has no single-token tags: the engine must fall back to stop strings.
    from ragrl.toy.tiny_model import _train_bpe

    backend = _train_bpe(world_text_cache(tiny), 400)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                               chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
    assert len(tok.encode("</search>", add_special_tokens=False)) > 1
    script = gold_script(tiny)
    engine = RolloutEngine(ScriptedGenerator(tok, script), tok, SearchEnvironment(FakeRetriever(tiny.world.passages)),
                           RolloutConfig(max_turns=4))
    assert set(engine.stop_strings) == {"</search>", "</answer>", "</kg-query>"}
    (t,) = engine.run_questions([tiny.rows[0]["question"]])
    check_turns(t)
    assert t.answer == tiny.rows[0]["golden_answers"][0]
    assert "spill" not in t.response_text and t.response_text.endswith("</answer>")
    assert turns_format_reward(recorded_turns(t)) == 1.0 == format_reward(t.response_text)


def world_text_cache(tiny):
    return [p["title"] + "\n" + p["text"] for p in tiny.world.passages]


# --------------------------------------------------------------------------- the random policy


def test_random_policy_rollouts(tiny):
    rec = RecordingGenerator(tiny.hf)
    retriever = FakeRetriever(tiny.world.passages)
    cfg = dict(max_turns=2, n=2, max_turn_tokens=24, max_response_tokens=220, temperature=1.0, seed=7)
    engine = _engine(tiny, rec, SearchEnvironment(retriever), **cfg)
    questions = [r["question"] for r in tiny.rows[:3]]
    trajs = engine.run_questions(questions)
    tok = tiny.tok
    stops = set(engine.stop_token_ids)
    head, tail = encode_text(tok, OBS_PREFIX), encode_text(tok, OBS_SUFFIX)
    answer_open = tok.convert_tokens_to_ids("<answer>")
    for t in trajs:
        check_turns(t)
        check_bounds(t, engine.config)
        # Walk the response: each turn's mask-1 run is exactly what the backend returned for that
        # context (cut at the first stop id), each mask-0 run a whole observation.
        pos = 0
        for k, action in enumerate(t.actions):
            candidates = rec.outputs[tuple(t.prompt_ids + t.response_ids[:pos])]
            cuts = [new[: next((i + 1 for i, x in enumerate(new) if x in stops), len(new))] for new in candidates]
            gen_len = sum(1 for m, ti in zip(t.loss_mask, t.turn_index) if ti == k and m == 1)
            assert t.response_ids[pos : pos + gen_len] in cuts
            pos += gen_len
            obs = t.response_ids[pos : pos + action["observation_tokens"]]
            pos += len(obs)
            if obs:
                assert obs[: len(head)] == head
                assert obs[-len(tail):] == tail or (obs[-1] == answer_open and action["turn"] == cfg["max_turns"] - 1)
        assert pos == len(t.response_ids)
    assert rec.calls <= cfg["max_turns"] + 1
    assert len(retriever.calls) <= cfg["max_turns"]
    # Same seed, same trajectories; the samples of a group differ.
    again = _engine(tiny, tiny.hf, SearchEnvironment(FakeRetriever(tiny.world.passages)), **cfg).run_questions(questions)
    assert [t.response_ids for t in again] == [t.response_ids for t in trajs]
    assert trajs[0].response_ids != trajs[1].response_ids


# --------------------------------------------------------------------------- HF backend


def test_hf_backend_unseeded_calls_draw_from_the_global_stream(tiny):
    """A seeded call leaves torch's stream as it was; unseeded calls advance it, so the second
    draws differently from the first and the pair replays from torch.manual_seed."""
    import torch

    tok, hf = tiny.tok, tiny.hf
    prompts = [encode_text(tok, "Where was Ada born?")] * 4
    torch.manual_seed(123)
    state = torch.get_rng_state()
    hf.generate(prompts, 12, temperature=1.0, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    first, second = hf.generate(prompts, 12, temperature=1.0), hf.generate(prompts, 12, temperature=1.0)
    assert first != second
    torch.manual_seed(123)
    assert [hf.generate(prompts, 12, temperature=1.0) for _ in range(2)] == [first, second]


def test_hf_backend_stops_at_token_ids_per_row(tiny):
    tok, hf = tiny.tok, tiny.hf
    prompts = [encode_text(tok, "Where was Ada born?"), encode_text(tok, "hi")]
    free = hf.generate(prompts, 12, temperature=1.0, seed=3)
    assert free == hf.generate(prompts, 12, temperature=1.0, seed=3)  # seeded: reproducible
    assert all(len(x) <= 12 for x in free)
    row = free[0] if len(free[0]) >= 6 else free[1]
    k = next(i for i in range(2, len(row)) if row[i] not in row[:i])
    stopped = hf.generate(prompts, 12, temperature=1.0, seed=3, stop_token_ids=[row[k]])
    r = 0 if row is free[0] else 1
    assert stopped[r] == row[: k + 1]  # stops right after the stop id, which is kept
    per_row = hf.generate(prompts, [5, 2], temperature=1.0, seed=3)
    assert len(per_row[0]) <= 5 and len(per_row[1]) <= 2 and per_row[0] == free[0][: len(per_row[0])]
    assert hf.generate(prompts, [0, 3], temperature=0)[0] == []


def test_hf_backend_stop_strings(tiny, monkeypatch):
    # Multi-token tags (a real tokenizer) stop through transformers' string matcher, i.e. through
    # `model.generate`, whose sampler draws differently from ragrl's loop: both rows come from it.
    monkeypatch.setattr(tiny.hf, "own_loop", False)
    tok, hf = tiny.tok, tiny.hf
    prompts = [encode_text(tok, "Where was Ada born?")]
    (row,) = hf.generate(prompts, 16, temperature=1.0, seed=11)
    k = next(i for i in range(1, len(row))
             if len(tok.decode([row[i]]).strip()) >= 2 and tok.decode([row[i]]) not in tok.decode(row[:i]))
    (stopped,) = hf.generate(prompts, 16, temperature=1.0, seed=11, stop_strings=[tok.decode([row[k]])])
    assert stopped == row[: k + 1]


def test_hf_backend_samples_from_the_plain_policy(tiny):
    # Checkpoint sampling defaults (top_k, repetition_penalty) must not leak into RL rollouts.
    hf, prompts = tiny.hf, [encode_text(tiny.tok, "Velmar"), encode_text(tiny.tok, "Velmar")]
    plain = hf.generate(prompts, 10, temperature=1.0, seed=5)
    saved = hf.model.generation_config
    hf.model.generation_config = transformers.GenerationConfig(**saved.to_dict())
    hf.model.generation_config.top_k, hf.model.generation_config.repetition_penalty = 1, 5.0
    try:
        assert hf.generate(prompts, 10, temperature=1.0, seed=5) == plain
    finally:
        hf.model.generation_config = saved
    assert plain[0] != plain[1]  # rows of one call are independent samples


def test_hf_backend_left_padding_matches_unbatched_greedy(tiny):
    tok, hf = tiny.tok, tiny.hf
    prompts = [encode_text(tok, "In what year was the company founded?"), encode_text(tok, "Velmar")]
    batched = hf.generate(prompts, 8, temperature=0)
    single = [hf.generate([p], 8, temperature=0)[0] for p in prompts]
    assert batched == single


def test_greedy_decodes_a_repeated_prompt_once(tiny):
    # HARR's G rollouts of a question share their first turn: the copies must not each be decoded,
    # and each must get what decoding it alone gives, under its own budget.
    tok, hf = tiny.tok, tiny.hf
    a, b = encode_text(tok, "In what year was the company founded?"), encode_text(tok, "Velmar")
    prompts, limits = [a, b, a, a, b, a], [8, 8, 8, 3, 8, 8]
    rows: list[int] = []
    hook = hf.model.register_forward_pre_hook(lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                              with_kwargs=True)
    try:
        out = hf.generate(prompts, limits, temperature=0)
    finally:
        hook.remove()
    assert rows[0] == 3  # (a, 8), (b, 8) and (a, 3)
    assert out == [hf.generate([p], lim, temperature=0)[0] for p, lim in zip(prompts, limits)]
    assert len(out[3]) <= 3 and out[0] is not out[2]  # copies, not one shared list


@pytest.mark.slow
def test_hf_backend_growing_cache_generates_what_transformers_cache_does(tiny, monkeypatch):
    # The in-place KV cache must not change a single token: greedy and seeded sampling, rows of
    # different lengths (left padding), and enough new tokens for its buffer to grow twice.
    import ragrl.agent.generation as generation

    tok, hf = tiny.tok, tiny.hf
    monkeypatch.setattr(hf, "own_loop", False)  # the cache as transformers' generate uses it
    prompts = [encode_text(tok, "Where was Ada born?"), encode_text(tok, "Velmar"), encode_text(tok, "In what year was it founded? " * 3)]
    ours = [hf.generate(prompts, 150, temperature=t, seed=7) for t in (0, 1.0)]
    assert max(len(r) for r in ours[1]) > 64  # past the first buffer of max(2 * prompt, 64)
    monkeypatch.setattr(generation, "growing_cache", lambda config: transformers.DynamicCache(config=config))
    assert [hf.generate(prompts, 150, temperature=t, seed=7) for t in (0, 1.0)] == ours


def _varied_prompts(tok) -> list[list[int]]:
    texts = ["Where was Ada born?", "Velmar", "In what year was it founded? " * 4, "Who wrote Letters from Vohend?",
             "Which is older, Kelmo or Vara? " * 2, "hi"]
    return [encode_text(tok, t) for t in texts]


def test_own_loop_decodes_greedily_what_transformers_generate_does(tiny, monkeypatch):
    # Rows of different lengths, budgets and stops: rows leave the batch at different steps and the
    # padding shrinks, which must change no token.
    tok, hf = tiny.tok, tiny.hf
    prompts = _varied_prompts(tok)
    limits = [40, 3, 40, 25, 40, 1]
    free = hf.generate(prompts, 40, temperature=0)
    stops = [row[len(row) // 2] for row in free if len(row) > 4][:2]  # two rows stop early
    ours = hf.generate(prompts, limits, temperature=0, stop_token_ids=stops)
    assert sorted(map(len, ours)) != sorted(limits)  # some row stopped before its budget
    monkeypatch.setattr(hf, "own_loop", False)
    assert ours == hf.generate(prompts, limits, temperature=0, stop_token_ids=stops)
    assert free == hf.generate(prompts, 40, temperature=0)


def test_kept_prefixes_give_what_a_fresh_call_gives_and_skip_the_prefix(tiny):
    # Turn 2 of a rollout extends turn 1's sequences; inside keep_prefixes() only the new tokens run,
    # greedy and sampled, with rows stopping at different steps (so the batch is compacted).
    tok, hf = tiny.tok, tiny.hf
    prompts = _varied_prompts(tok)
    observation = encode_text(tok, " <information>Velmar is in Oskar.</information>")
    fed: list[int] = []
    handle = hf.model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].numel()), with_kwargs=True)
    try:
        for temperature in (0, 1.0):
            with hf.keep_prefixes():
                first = hf.generate(prompts, [30, 5, 30, 30, 30, 2], temperature=temperature, seed=4)
                extended = [p + out + observation for p, out in zip(prompts, first)]
                stops = [first[0][2], first[2][3]]  # two rows stop early
                fed.clear()
                kept = hf.generate(extended, [20, 3, 20, 20, 20, 9], temperature=temperature, seed=5, stop_token_ids=stops)
                prefill_kept = fed[0]
            fed.clear()
            fresh = hf.generate(extended, [20, 3, 20, 20, 20, 9], temperature=temperature, seed=5, stop_token_ids=stops)
            assert kept == fresh, temperature
            assert prefill_kept == len(extended) * (len(observation) + 1)  # the observation and the last generated token
            assert fed[0] == len(extended) * max(map(len, extended))  # outside the block: everything again
    finally:
        handle.remove()
    # a prompt that shares only part of a kept sequence reuses that part
    forked = prompts[2][:-2] + encode_text(tok, "Velmar")
    with hf.keep_prefixes():
        hf.generate(prompts, 30, temperature=0)
        assert hf._kept.current  # the call kept its rows
        reused = hf.generate([forked], 10, temperature=0)
        assert not hf._kept.previous  # freed when the call ended
    assert reused == hf.generate([forked], 10, temperature=0)


def test_repeated_greedy_rows_across_kept_turns_get_what_a_fresh_call_gives(tiny):
    # HARR's greedy G copies of a question inside one rollout: turn 1 decodes each distinct prompt
    # once and keeps only those rows; turn 2's copies (two still equal, one given another
    # observation) must all find their prefix among them and decode as a fresh call would.
    tok, hf = tiny.tok, tiny.hf
    a, b = encode_text(tok, "In what year was the company founded?"), encode_text(tok, "Velmar")
    obs = [encode_text(tok, " <information>Velmar is in Oskar.</information>"),
           encode_text(tok, " <information>Oskar is a city.</information>")]
    prompts = [a, b, a, a]
    fed: list[tuple[int, int]] = []
    handle = hf.model.register_forward_pre_hook(lambda m, args, kw: fed.append(tuple(kw["input_ids"].shape)),
                                                with_kwargs=True)
    try:
        with hf.keep_prefixes():
            first = hf.generate(prompts, 12, temperature=0)
            assert len(hf._kept.current) == 2  # (a, 12) and (b, 12): the copies were not kept twice
            extended = [p + out + o for p, out, o in zip(prompts, first, [obs[0], obs[0], obs[1], obs[0]])]
            fed.clear()
            kept = hf.generate(extended, 10, temperature=0)
            prefill = fed[0]
    finally:
        handle.remove()
    assert prefill[0] == 3  # rows 0 and 3 are one row now
    assert prefill[1] <= max(map(len, obs)) + 1  # each row ran its observation, not its whole context
    assert kept == hf.generate(extended, 10, temperature=0)
    assert kept[0] == kept[3]


def test_decode_choice_by_environment_and_model(tiny, monkeypatch):
    from ragrl.agent.generation import _own_loop_fits

    monkeypatch.setenv("RAGRL_HF_DECODE", "transformer")
    with pytest.raises(ValueError, match="RAGRL_HF_DECODE='transformer'"):
        HFGenerator(tiny.hf.model, 0)
    monkeypatch.setenv("RAGRL_HF_DECODE", "transformers")
    assert not HFGenerator(tiny.hf.model, 0).own_loop
    assert _own_loop_fits(tiny.hf.model)

    class NoLogitsToKeep(torch.nn.Module):  # a forward without `logits_to_keep`: generate drives it
        config = tiny.hf.model.config

        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None):
            raise AssertionError("not called")

    assert not _own_loop_fits(NoLogitsToKeep())


def test_sample_tokens_applies_temperature_and_top_p_then_divides_by_the_noise():
    from ragrl.agent.generation import sample_tokens

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    draw = lambda noise, **kw: sample_tokens(logits, torch.tensor(noise), **kw).tolist()  # noqa: E731
    flat = [[1.0, 1.0, 1.0]] * 2
    assert draw(flat, temperature=0, top_p=1.0) == [0, 2]  # greedy ignores the noise
    assert draw(flat, temperature=1.0, top_p=1.0) == [0, 2]
    # argmax(p / noise): 0.5 / 2 < 0.3 / 1, then 0.2 / 0.3 wins
    assert draw([[2.0, 1.0, 1.0], [1.0, 1.0, 1.0]], temperature=1.0, top_p=1.0) == [1, 2]
    assert draw([[2.0, 1.0, 0.3], [1.0, 1.0, 3.0]], temperature=1.0, top_p=1.0) == [2, 1]
    # top_p 0.6 keeps 0.5 and 0.3 (the token that crosses 0.6 is kept); 0.2 can no longer win
    assert draw([[2.0, 1.0, 0.01], [1.0, 1.0, 1.0]], temperature=1.0, top_p=0.6) == [1, 2]
    assert draw([[9.0, 9.0, 0.01], [0.01, 9.0, 9.0]], temperature=1.0, top_p=0.4) == [0, 2]  # one token left
    # temperature 0.5 squares the odds (25 : 9 : 4 over 38): 0.658 / 2.7 beats 0.237; at T 1, 0.5 / 2.7 loses to 0.3
    assert draw([[2.7, 1.0, 1.0], [1.0, 1.0, 1.0]], temperature=0.5, top_p=1.0) == [0, 2]
    assert draw([[2.7, 1.0, 1.0], [1.0, 1.0, 1.0]], temperature=1.0, top_p=1.0) == [1, 2]
    masked = torch.tensor([[float("-inf"), 0.0, float("-inf")]])  # a zero-probability token never wins
    assert sample_tokens(masked, torch.tensor([[1e-9, 50.0, 1e-9]]), 1.0, 1.0).tolist() == [1]


def test_own_loop_samples_what_transformers_generate_samples(tiny, monkeypatch):
    # Same seed, same tokens, top-p too, with rows stopping at different steps: RL rollouts drawn
    # before the loop existed are drawn again.
    tok, hf = tiny.tok, tiny.hf
    prompts = _varied_prompts(tok)
    limits = [40, 3, 40, 25, 40, 1]
    free = hf.generate(prompts, 40, temperature=1.0, seed=3)
    stops = [row[len(row) // 2] for row in free if len(row) > 4][:2]
    ours = [hf.generate(prompts, limits, temperature=1.0, top_p=p, seed=3, stop_token_ids=stops) for p in (1.0, 0.7)]
    monkeypatch.setattr(hf, "own_loop", False)
    assert ours == [hf.generate(prompts, limits, temperature=1.0, top_p=p, seed=3, stop_token_ids=stops)
                    for p in (1.0, 0.7)]


def test_own_loop_samples_the_softmax_policy(tiny):
    # One step, many rows of one prompt: the token frequencies follow the model's softmax at T 0.8.
    hf, prompt = tiny.hf, encode_text(tiny.tok, "Where was Ada born?")
    n = 4000
    drawn = torch.tensor([row[0] for row in hf.generate([prompt] * n, 1, temperature=0.8, seed=0)])
    with torch.no_grad():
        probs = torch.softmax(hf.model(torch.tensor([prompt])).logits[0, -1].float() / 0.8, -1)
    top = probs.argsort(descending=True)[:5]
    observed = torch.stack([(drawn == t).sum() for t in top]).double()
    expected = probs[top].double() * n
    assert ((observed - expected).abs() <= 4 * (expected * (1 - probs[top].double())).sqrt() + 1).all(), (observed, expected)


def test_growing_kv_layer_keeps_content_through_growth_and_crop():
    from ragrl.agent.generation import _GrowingKVLayer

    layer, plain = _GrowingKVLayer(), transformers.cache_utils.DynamicLayer()
    torch.manual_seed(0)
    for step, width in enumerate([40, 1, 1, 50, 1]):  # prefill (buffer 80), decode, a chunk past 80
        k, v = torch.randn(2, 2, width, 4), torch.randn(2, 2, width, 4)
        got, want = layer.update(k, v), plain.update(k, v)
        for a, b in zip(got, want):
            assert torch.equal(a, b), step
        if step == 2:
            layer.crop(-5), plain.crop(-5)
    assert layer.get_seq_length() == plain.get_seq_length() == 88
    assert layer._key_buf.shape[-2] > 80  # it grew


# --------------------------------------------------------------------------- OpenAI-compatible backend


class _FakeVLLM(http.server.BaseHTTPRequestHandler):
    requests: list[dict] = []
    script: list[tuple[int, object]] = []  # queued (status, payload); default: echo-style token ids

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        status, payload = type(self).script.pop(0) if type(self).script else (200, None)
        if payload is None:
            # Overshoots the stop id (5) and the budget, like a backend that ignores both.
            payload = {"choices": [{"index": i, "text": "x", "token_ids": [p[-1], 5, 6, 7, 8, 9, 10, 11],
                                    "finish_reason": "length"} for i, p in reversed(list(enumerate(body["prompt"])))]}
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm():
    _FakeVLLM.requests, _FakeVLLM.script = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}", handler=_FakeVLLM)
    server.shutdown()
    server.server_close()


def test_openai_request_and_response(vllm):
    gen = OpenAICompletionsGenerator(vllm.url, "policy", api_key="k", backoff_s=0)
    out = gen.generate([[1, 2], [3], [4]], [4, 2, 4], temperature=0.7, top_p=0.9, stop_token_ids=[5, 99])
    assert out == [[2, 5], [3, 5], [4, 5]]  # cut after the stop id, in prompt order
    reqs = vllm.handler.requests
    assert len(reqs) == 2  # one request per distinct budget (sent concurrently, in any order)
    first = next(r for r in reqs if r["body"]["max_tokens"] == 4)
    assert first["path"] == "/v1/completions" and first["auth"] == "Bearer k"
    body = first["body"]
    assert body["prompt"] == [[1, 2], [4]] and body["max_tokens"] == 4 and body["model"] == "policy"
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["stop_token_ids"] == [5, 99]
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["logprobs"] == 0
    assert "seed" not in body
    assert gen.generate([[1]], 1, stop_token_ids=[]) == [[1]]  # budget cut


def test_openai_seeded_rows_get_their_own_seed(vllm):
    gen = OpenAICompletionsGenerator(vllm.url + "/v1", "policy", backoff_s=0)
    gen.generate([[1], [1], [1]], 3, seed=10, stop_token_ids=[5])
    seeds = sorted(r["body"]["seed"] for r in vllm.handler.requests)
    assert seeds == [10, 11, 12] and all(len(r["body"]["prompt"]) == 1 for r in vllm.handler.requests)


def test_openai_greedy_rows_share_one_request_whatever_the_seed(vllm):
    # Evaluation decodes greedily and still passes its config's seed: per-row requests would cap the
    # server's batch at the client's concurrency for nothing, since a greedy row ignores its seed.
    gen = OpenAICompletionsGenerator(vllm.url, "policy", backoff_s=0)
    out = gen.generate([[1], [2], [3], [4]], [3, 3, 3, 2], temperature=0.0, seed=10, stop_token_ids=[5])
    assert out == [[1, 5], [2, 5], [3, 5], [4, 5]]
    bodies = sorted((r["body"] for r in vllm.handler.requests), key=lambda b: -b["max_tokens"])
    assert [b["prompt"] for b in bodies] == [[[1], [2], [3]], [[4]]]
    assert all("seed" not in b and b["temperature"] == 0.0 for b in bodies)
    assert gen.generate([[1], [2]], 0, temperature=1.0, seed=3) == [[], []]  # no budget, no request
    assert len(vllm.handler.requests) == 2


def test_openai_logprob_token_ids_and_retries(vllm):
    vllm.handler.script = [
        (503, {"error": "warming up"}),
        (429, {"error": "busy"}),
        (200, {"choices": [{"index": 1, "text": "b", "logprobs": {"tokens": ["token_id:7", "token_id:8"]}},
                           {"index": 0, "text": "a", "logprobs": {"tokens": ["token_id:9"]}}]}),
    ]
    gen = OpenAICompletionsGenerator(vllm.url, "policy", backoff_s=0, max_retries=2)
    assert gen.generate([[1], [2]], 4) == [[9], [7, 8]]
    assert len(vllm.handler.requests) == 3


def test_openai_errors_are_clear(vllm):
    gen = OpenAICompletionsGenerator(vllm.url, "policy", backoff_s=0, max_retries=1)
    vllm.handler.script = [(400, {"error": "max_tokens too large"})]
    with pytest.raises(GenerationBackendError, match="HTTP 400.*max_tokens too large"):
        gen.generate([[1]], 4)
    vllm.handler.script = [(500, "boom"), (500, "boom")]
    with pytest.raises(GenerationBackendError, match="after 2 attempts.*HTTP 500"):
        gen.generate([[1]], 4)
    vllm.handler.script = [(200, {"choices": [{"index": 0, "text": "abc"}]})]
    with pytest.raises(GenerationBackendError, match="no token ids"):
        gen.generate([[1]], 4)
    vllm.handler.script = [(200, {"choices": []})]
    with pytest.raises(GenerationBackendError, match="0 choices for 1 prompts"):
        gen.generate([[1]], 4)
    vllm.handler.script = [(200, "not json")]
    with pytest.raises(GenerationBackendError, match="not JSON"):
        gen.generate([[1]], 4)


def test_openai_retokenize_fallback_and_unreachable_server(vllm, tiny):
    vllm.handler.script = [(200, {"choices": [{"index": 0, "text": "<search>q</search>"}]})]
    gen = OpenAICompletionsGenerator(vllm.url, "policy", backoff_s=0, retokenize_with=tiny.tok)
    assert gen.generate([[1]], 8) == [encode_text(tiny.tok, "<search>q</search>")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = OpenAICompletionsGenerator(f"http://127.0.0.1:{port}", "policy", backoff_s=0, max_retries=1, timeout_s=2)
    with pytest.raises(GenerationBackendError, match="after 2 attempts.*Connect"):
        dead.generate([[1]], 4)


@pytest.mark.parametrize("layout", ["search_r1", "multi", "rag_r1_json"])
def test_a_cut_observation_credits_the_passages_whose_header_came_before_the_cut(layout):
    # The first passage's text names the second's title: a cut inside the first passage (or after
    # it, before the second's header) shows only the first, whatever the text mentions.
    from ragrl.agent.protocol import format_docs, format_multi_docs, format_rag_r1_json
    from ragrl.agent.rollout import shown_passages

    hits = [{"id": "p1", "title": "Alpha", "text": "Alpha was founded by Beta Works in 1901."},
            {"id": "p2", "title": "Beta Works", "text": "Beta Works is a mill."}]
    full = {"search_r1": lambda: format_docs(hits), "multi": lambda: format_multi_docs(["q1", "q2"], [hits[:1], hits[1:]]),
            "rag_r1_json": lambda: format_rag_r1_json(["q1", "q2"], [hits[:1], hits[1:]])}[layout]().strip()
    ranks = [1, 2] if layout == "search_r1" else [1, 1]
    shown_hits = [(h["id"], h["title"], r) for h, r in zip(hits, ranks)]
    second = full.rindex("Doc ")
    assert "Beta Works" in full[:second]  # the first passage does mention the second's title
    assert shown_passages(shown_hits, full, full) == ["p1", "p2"]
    assert shown_passages(shown_hits, full, full[:second + 4]) == ["p1"]  # cut inside the header "Doc "
    assert shown_passages(shown_hits, full, full[:second]) == ["p1"]
    assert shown_passages(shown_hits, full, full[:len(full) - 3]) == ["p1", "p2"]  # the second's text cut
    assert shown_passages(shown_hits, full, full[:full.index("Doc ") + 6]) == []  # "Alpha" cut
    assert shown_passages(shown_hits, full, "") == []
    title_at = full.index("Beta Works", second)
    assert shown_passages(shown_hits, full, full[:title_at + 4]) == ["p1"]  # the second's title cut short
    assert shown_passages(shown_hits, full, full[:title_at + len("Beta Works")]) == ["p1", "p2"]


def test_doc_in_the_policys_own_query_is_no_passage_header():
    from ragrl.agent.protocol import format_multi_docs, format_rag_r1_json
    from ragrl.agent.rollout import shown_passages

    hits = [{"id": f"p{i}", "title": f"T{i}", "text": "x " * 20} for i in (1, 2, 3)]
    for render in (format_multi_docs, format_rag_r1_json):
        full = render(["Doc 1: T1 Doc 2: T2 Doc 3: T3"], [hits]).strip()
        first = full.index("T1", full.index("Doc 1", full.index("T3") + 2))  # the first passage's own title
        ranks = [(h["id"], h["title"], r) for r, h in enumerate(hits, 1)]
        assert shown_passages(ranks, full, full[:first + 10]) == ["p1"], render.__name__
        assert shown_passages(ranks, full, full[:first - 8]) == [], render.__name__  # cut before the first block


def test_gold_sft_keeps_only_plans_whose_support_the_observation_showed(tiny):
    # Under RAG-R1's per-query cut a retrieved supporting passage can be cut out of the
    # observation: the gold plan's hop then has no support in what the policy would read.
    from ragrl.toy.gold import WorldPlanner
    from ragrl.train.sft_data import gold_trajectories

    passages = {p["id"]: p for p in tiny.world.passages}
    rows = tiny.rows[:30]

    def gold(query_obs_tokens):
        env = MultiQuerySearchEnvironment(FakeRetriever(tiny.world.passages), topk=3, max_queries=3,
                                          query_format="rag_r1", query_obs_tokens=query_obs_tokens)
        engine = _engine(tiny, None, env, max_turns=4, max_turn_tokens=200, max_obs_tokens=4000)
        return gold_trajectories(rows, engine, WorldPlanner(0, ", "))

    full_rows, full_stats = gold(None)
    cut_rows, cut_stats = gold(20)
    assert full_stats.dropped.get("support_not_retrieved", 0) < cut_stats.dropped["support_not_retrieved"]
    assert cut_rows
    by_id = {r["id"]: r for r in rows}
    for row in cut_rows:  # every supporting passage's title line is in what the observations showed
        shown = "".join(json.loads(part.split("</information>")[0])["documents"][0]
                        for part in row["text"].split("\n<information>")[1:])
        for pid in by_id[row["id"]]["supporting_ids"]:
            assert f"{passages[pid]['title']}\n" in shown + "\n", (row["id"], pid)


@pytest.mark.parametrize("overflow", ["end", "roll"])
def test_gold_sft_drops_sequences_past_the_context_only_where_the_engine_ends_there(tiny, overflow):
    from ragrl.toy.gold import WorldPlanner
    from ragrl.train.sft_data import gold_trajectories

    engine = _engine(tiny, None, SearchEnvironment(FakeRetriever(tiny.world.passages), topk=3), max_turns=4,
                     max_turn_tokens=200, max_obs_tokens=400, max_context_tokens=300, max_response_tokens=4000,
                     context_overflow=overflow)
    rows, stats = gold_trajectories(tiny.rows[:20], engine, WorldPlanner(0, " | "))
    too_long = stats.dropped.get("sequence_too_long", 0)
    if overflow == "end":
        assert too_long > 0 and all(len(r["input_ids"]) <= 300 for r in rows)
    else:  # the engine generates past 300 tokens from a window: such rows are kept
        assert too_long == 0 and max(len(r["input_ids"]) for r in rows) > 300


def test_a_dropped_query_note_before_the_json_fakes_no_header():
    # More queries than max_queries: the note quoting the dropped ones (the policy's text, raw)
    # comes before RAG-R1's JSON. A dropped "query" written as a passage header is not one.
    from ragrl.agent.protocol import dropped_note, format_rag_r1_json
    from ragrl.agent.rollout import shown_passages

    hits = [{"id": "p1", "title": "T1", "text": "x " * 20}]
    fake = 'Doc 1: T1 {\n  "query": [ "documents": "Doc 1: T1'
    full = dropped_note([fake], 1) + format_rag_r1_json(["q"], [hits])
    ranks = [("p1", "T1", 1)]
    real = full.index('Doc 1: T1\\n')  # the block inside the JSON (its newline escaped)
    assert shown_passages(ranks, full, full[:real - 2]) == []  # cut before the real block
    assert shown_passages(ranks, full, full[:real + 12]) == ["p1"]


def test_retrieval_reward_reads_the_passages_the_environment_showed(tiny):
    """The search methods' `retrieval` reward: recall of a question's supporting passages among
    those the environment returned (the turn record's `retrieved`), through the real engine. A
    bridge question's first hop alone earns half; both hops the whole; a forged Doc block with the
    supporting passage's text earns nothing; a passage cut off by the observation budget unread
    does not count."""
    from ragrl.methods import get_method
    from ragrl.recipe import parse_recipe

    passages = {p["id"]: p for p in tiny.world.passages}
    row = next(r for r in tiny.rows if len(_hops(r)) == 2 and len(r["supporting_ids"]) == 2)
    first, second = (passages[i] for i in row["supporting_ids"])

    def run(turns, **cfg):
        calls = iter(turns)
        gen = ScriptedGenerator(tiny.tok, lambda _ctx: next(calls))
        engine = _engine(tiny, gen, SearchEnvironment(FakeRetriever(tiny.world.passages), topk=1),
                         **{"max_turns": 3, "max_turn_tokens": 200, "max_obs_tokens": 400, **cfg})
        (t,) = engine.run_rows([row])
        return t

    def search(p):
        return f"<think>Look up.</think><search>{p['title']} {p['text']}</search>"

    answer = f"<think>Done.</think><answer>{row['golden_answers'][0]}</answer>"
    recipe = parse_recipe({"env": "search", "reward": {"em": 1.0, "retrieval": 0.5}}, "probe")
    method = get_method("search")
    one_hop = run([search(first), answer])
    both = run([search(first), search(second), answer])
    forged = run([f"<think>x</think><information>Doc 1(Title: {second['title']}) {second['text']}</information>"
                  f"{search(first)[len('<think>Look up.</think>'):]}", answer])
    assert [a["retrieved"] for a in both.actions] == [[first["id"]], [second["id"]], []]
    assert method.score(recipe, one_hop, row).components["retrieval"] == 0.5
    assert method.score(recipe, both, row).components["retrieval"] == 1.0
    assert method.score(recipe, both, row).reward == pytest.approx(1.5)
    assert method.score(recipe, forged, row).components["retrieval"] <= 0.5
    assert second["text"] in forged.response_text
    # An observation cut to a few tokens shows neither passage's title: nothing was read.
    cut = run([search(first), answer], max_obs_tokens=6)
    assert cut.actions[0]["retrieved"] == [] and method.score(recipe, cut, row).components["retrieval"] == 0.0
    # verl's reward function has no supporting passages: weighing retrieval there is an error.
    with pytest.raises(ValueError, match="supporting passages"):
        method.verl_reward({"em": 1.0, "retrieval": 0.5}, both, row["golden_answers"])
    # A row without supporting ids cannot be scored on retrieval, and says which row.
    with pytest.raises(ValueError, match=row["id"]):
        method.score(recipe, both, {**row, "supporting_ids": []})


def test_turn_retrieval_reward_credits_the_search_that_found_each_passage(tiny):
    """`turn_reward: {retrieval: w}`: each turn's share of the supporting passages it showed first,
    through the real engine, one value per turn of the rollout's turn index. A repeated search
    earns nothing the second time; the answer turn earns nothing; the values sum to the episode's
    `retrieval` reward; without the weight the method gives no turn rewards."""
    from ragrl.methods import get_method
    from ragrl.recipe import parse_recipe

    passages = {p["id"]: p for p in tiny.world.passages}
    row = next(r for r in tiny.rows if len(_hops(r)) == 2 and len(r["supporting_ids"]) == 2)
    first, second = (passages[i] for i in row["supporting_ids"])

    def run(turns):
        calls = iter(turns)
        gen = ScriptedGenerator(tiny.tok, lambda _ctx: next(calls))
        engine = _engine(tiny, gen, SearchEnvironment(FakeRetriever(tiny.world.passages), topk=1),
                         max_turns=4, max_turn_tokens=200, max_obs_tokens=400)
        (t,) = engine.run_rows([row])
        return t

    def search(p):
        return f"<think>Look up.</think><search>{p['title']} {p['text']}</search>"

    answer = f"<think>Done.</think><answer>{row['golden_answers'][0]}</answer>"
    method = get_method("search")
    recipe = parse_recipe({"env": "search", "reward": {"em": 1.0, "retrieval": 1.0}, "turn_reward": {"retrieval": 2.0},
                           "rl": {"turn_advantage_weight": 0.5}}, "probe")
    both = method.score(recipe, run([search(first), search(second), answer]), row)
    assert both.turn_rewards == [1.0, 1.0, 0.0]  # 2.0 x (1/2, 1/2, 0)
    again = method.score(recipe, run([search(first), search(first), search(second), answer]), row)
    assert again.turn_rewards == [1.0, 0.0, 1.0, 0.0]
    assert sum(again.turn_rewards) == 2.0 * again.components["retrieval"]
    plain = parse_recipe({"env": "search", "reward": {"em": 1.0}}, "probe")
    assert method.score(plain, run([search(first), answer]), row).turn_rewards is None
    assert get_method("multi_query_search").turn_reward_keys == ("retrieval",)
    with pytest.raises(ValueError, match="turn_reward"):
        parse_recipe({"env": "search", "turn_reward": {"format": 1.0}}, "probe")


def test_verls_parquet_carries_the_system_message_as_the_engine_does(tiny, tmp_path):
    # verl trains on the prompts of its parquet; the launcher checks them against the engine's.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragrl.recipe import parse_recipe
    from ragrl.verl.data import check_prompts_match_engine, write_verl_parquet

    qa = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("id", "question", "golden_answers")} for r in tiny.rows[:4]]),
                   qa)
    recipe = parse_recipe({"env": "search", "rollout": {"system_prompt": "Think, then answer.",
                                                        "instruction": "{question}"}}, "probe")
    out = tmp_path / "train.parquet"
    write_verl_parquet(qa, out, recipe, tiny.tok)
    check_prompts_match_engine(out, recipe, tiny.tok)
    prompt = pq.read_table(out).to_pylist()[0]["prompt"]
    assert prompt == [{"role": "system", "content": "Think, then answer."},
                      {"role": "user", "content": tiny.rows[0]["question"]}]
    # Search-R1's "?" is in verl's prompts as in the engine's.
    pq.write_table(pa.Table.from_pylist([{"id": "q", "question": "Who wrote it", "golden_answers": ["x"]}]), qa)
    marked = parse_recipe({"env": "search", "rollout": {"instruction": "{question}", "question_mark": True}}, "probe")
    write_verl_parquet(qa, out, marked, tiny.tok)
    check_prompts_match_engine(out, marked, tiny.tok)
    assert pq.read_table(out).to_pylist()[0]["prompt"] == [{"role": "user", "content": "Who wrote it?"}]
    # a prompt that stops after the user's text: the launcher's check and verl's ids agree with the engine
    from ragrl.verl.data import prompt_ids

    open_user = parse_recipe({"env": "search", "rollout": {"instruction": "{question}", "continue_user_turn": True}},
                             "probe")
    write_verl_parquet(qa, out, open_user, tiny.tok)
    check_prompts_match_engine(out, open_user, tiny.tok)
    row = pq.read_table(out).to_pylist()[0]
    assert tiny.tok.decode(prompt_ids(tiny.tok, row["prompt"], True)).endswith("user\nWho wrote it")
    assert prompt_ids(tiny.tok, row["prompt"], True) == RolloutEngine(
        None, tiny.tok, open_user.method.make_environment(open_user, {}), open_user.rollout).prompt_ids("Who wrote it")
