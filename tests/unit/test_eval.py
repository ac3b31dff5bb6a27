"""evaluate(): one prediction row per question, hand-checked metrics, metrics.json = column means."""

from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import math
import re
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers

from ragrl.agent.rollout import RolloutConfig
from ragrl.agent.environments import MultiQuerySearchEnvironment, SearchEnvironment
from ragrl.agent.retriever_adapter import AgentRetriever
from ragrl.eval.evaluate import METRIC_COLUMNS, PREDICTION_SCHEMA, evaluate
from ragrl.methods import get_method
from ragrl.methods.closed_book import NO_SEARCH_INSTRUCTION
from ragrl.recipe import parse_recipe
from ragrl.settings import RolloutConfig as _Cfg
from ragrl.stages.agent import environment
from ragrl.retrieval.searcher import load_searcher
from ragrl.retrieval.sparse import build_bm25

from helpers import world_and_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    world, model_dir = world_and_model(root)
    build_bm25(root / "world" / "passages.parquet", root / "bm25")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SimpleNamespace(root=root, world=world, model_dir=model_dir,
                          tok=transformers.AutoTokenizer.from_pretrained(model_dir),
                          searcher=load_searcher(bm25_dir=root / "bm25"))  # returns Hit objects, not dicts
    torch.set_num_threads(threads)


class ScriptedPolicy:
    """Answers by script: `script(question, response_so_far) -> text`, encoded with the real tokenizer."""

    def __init__(self, tok, script):
        self.tok = tok
        self.script = script
        self.prompts: list[str] = []

    def generate(self, batch, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                 stop_token_ids=(), stop_strings=()):
        assert temperature == 0.0  # evaluation decodes greedily by default
        out = []
        for ids in batch:
            context = self.tok.decode(ids)
            prompt, response = context.rsplit("<|im_start|>assistant\n", 1)
            self.prompts.append(prompt)
            question = re.search(r"Question: (.*?)\n", prompt).group(1)
            out.append(self.tok.encode(self.script(question, response), add_special_tokens=False))
        return out


def _qa(tiny, golds: list[list[str]]):
    """A QA parquet with the world's first questions and hand-chosen gold answers."""
    rows = tiny.world.qa["test"][: len(golds)]
    path = tiny.root / f"qa_{len(golds)}.parquet"
    table = pa.table({"id": [r["id"] for r in rows], "question": [r["question"] for r in rows],
                      "golden_answers": golds, "metadata": [r["metadata"] for r in rows]})
    pq.write_table(table, path)
    return path, [r["question"] for r in rows]


def _read(out_dir):
    return pq.read_table(out_dir / "predictions.parquet"), json.loads((out_dir / "metrics.json").read_text())


def test_metrics_by_hand(tiny, tmp_path):
    path, questions = _qa(tiny, [["Port Velmar"], ["Ada Lovelace", "Ada"], ["1974"], ["The Beatles"]])
    q0, q1, q2, q3 = questions

    def script(question, response):
        if question == q0:  # search once, then answer in other case/punctuation
            if "</information>" not in response:
                return "<think>look it up</think>\n<search>capital of Velmar</search>"
            return "<think>found</think>\n<answer>port velmar.</answer>"
        if question == q1:
            return "<think>sure</think>\n<answer>Ada Byron Lovelace</answer>"
        if question == q2:
            return "I do not know"  # no action, every turn; the forced turn cannot be closed either
        return "<think>sure</think><answer>Beatles</answer>"

    policy = ScriptedPolicy(tiny.tok, script)
    cfg = RolloutConfig(max_turns=2, max_turn_tokens=64)  # temperature 1.0: evaluate() makes it greedy
    env = SearchEnvironment(AgentRetriever(tiny.searcher), topk=3)
    metrics = evaluate(None, path, env, tmp_path / "out", run_id="r1", dataset="toy",
                       rollout_cfg=cfg, batch_size=3, generator=policy, tokenizer=tiny.tok)
    table, written = _read(tmp_path / "out")
    assert written == metrics and written["run_id"] == "r1" and written["dataset"] == "toy" and written["n"] == 4
    assert table.schema.equals(PREDICTION_SCHEMA)
    p = {r["question"]: r for r in table.to_pylist()}
    assert [r["id"] for r in table.to_pylist()] == [r["id"] for r in tiny.world.qa["test"][:4]]

    # q0: normalised exact match after one search.
    assert (p[q0]["em"], p[q0]["f1"], p[q0]["cover_em"], p[q0]["format"]) == (1.0, 1.0, 1.0, 1.0)
    assert p[q0]["prediction"] == "port velmar." and p[q0]["turns"] == 2 and p[q0]["searches"] == 1
    assert p[q0]["queries"] == ["capital of Velmar"] and p[q0]["observation_tokens"] > 0
    # q1: "ada byron lovelace" vs "ada lovelace": P = 2/3, R = 1, F1 = 0.8 (vs "ada": 0.5; the best counts);
    # not an exact match, but the gold "ada" occurs in it.
    assert (p[q1]["em"], p[q1]["f1"], p[q1]["cover_em"]) == (0.0, pytest.approx(0.8), 1.0)
    assert p[q1]["turns"] == 1 and p[q1]["searches"] == 0 and p[q1]["queries"] == []
    # q2: never answers; two invalid tool turns and the forced one.
    assert p[q2]["prediction"] == "" and p[q2]["stop_reason"] == "no_answer"
    assert (p[q2]["em"], p[q2]["f1"], p[q2]["cover_em"], p[q2]["format"]) == (0.0, 0.0, 0.0, 0.0)
    assert p[q2]["turns"] == 3 and p[q2]["searches"] == 0
    # q3: the article is dropped by normalisation; no newline between think and answer is still well formed.
    assert (p[q3]["em"], p[q3]["f1"], p[q3]["format"]) == (1.0, 1.0, 1.0)

    m = written["metrics"]
    assert set(m) == set(METRIC_COLUMNS)
    assert m["em"] == pytest.approx(0.5) and m["f1"] == pytest.approx((1 + 0.8 + 0 + 1) / 4)
    assert m["turns"] == pytest.approx((2 + 1 + 3 + 1) / 4) and m["searches"] == pytest.approx(0.25)
    for key in METRIC_COLUMNS:
        column = table.column(key).to_pylist()
        assert m[key] == pytest.approx(math.fsum(column) / len(column))
    assert all(r["generated_tokens"] > 0 and r["latency_s"] >= 0 for r in table.to_pylist())


def test_no_retrieval_baseline_answers_at_once(tiny, tmp_path):
    path, questions = _qa(tiny, [["a"], ["b"], ["c"]])

    def script(question, response):
        if question == questions[0]:
            return "<think>from memory</think>\n<answer>a</answer>"
        if question == questions[2]:  # right, but no reasoning: no turn-limit notice excuses it here
            return "<answer>c</answer>"
        return "<think>hmm</think>\n<search>something</search>"

    policy = ScriptedPolicy(tiny.tok, script)
    closed_book = get_method("none")
    metrics = evaluate(None, path, closed_book.make_environment(None, {}), tmp_path / "none", run_id="r1",
                       dataset="toy", rollout_cfg=closed_book.eval_rollout(_Cfg()), generator=policy,
                       tokenizer=tiny.tok)
    rows = pq.read_table(tmp_path / "none" / "predictions.parquet").to_pylist()
    assert len(policy.prompts) == 3  # one turn each, no observations
    assert all("search" not in prompt and NO_SEARCH_INSTRUCTION.split(".")[0] in prompt for prompt in policy.prompts)
    assert [(r["em"], r["format"], r["turns"], r["searches"], r["queries"]) for r in rows] == [
        (1.0, 1.0, 1, 0, []), (0.0, 0.0, 1, 0, []), (1.0, 0.0, 1, 0, [])]
    assert rows[1]["prediction"] == "" and rows[1]["observation_tokens"] == 0
    assert metrics["metrics"]["em"] == pytest.approx(2 / 3) and metrics["metrics"]["searches"] == 0.0
    with pytest.raises(ValueError, match="needs --index/--bm25"):
        environment(parse_recipe({"env": "search"}, "r"), {})


def test_evaluation_progress_lines_carry_the_generation_counts(tiny, tmp_path, capsys, monkeypatch):
    """evaluate() counts every generate call of a rollout batch and reports the counts on its
    progress line (rate-limited to one per 10 s in a job; every call here)."""
    import ragrl.progress

    class EveryCall(ragrl.progress.Ticker):
        def __init__(self, desc, interval=10.0, stream=None):
            super().__init__(desc, 0.0, stream)

    monkeypatch.setattr(ragrl.progress, "Ticker", EveryCall)
    path, questions = _qa(tiny, [["a"], ["b"], ["c"]])
    answers = {q: f"<think>t</think>\n<answer>{a}</answer>" for q, a in zip(questions, "abc")}
    policy = ScriptedPolicy(tiny.tok, lambda question, response: answers[question])
    closed_book = get_method("none")
    evaluate(None, path, closed_book.make_environment(None, {}), tmp_path / "p", run_id="r1", dataset="toy",
             rollout_cfg=closed_book.eval_rollout(_Cfg()), generator=policy, tokenizer=tiny.tok, batch_size=2)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress] eval r1/toy: ")]
    tokens = [len(tiny.tok.encode(answers[q], add_special_tokens=False)) for q in questions]
    # Two batches (2 + 1 questions), one turn each: the counts run on across batches.
    assert [re.sub(r" in [0-9.]+s$", "", x) for x in lines if "generate calls" in x] == [
        f"[progress] eval r1/toy: 1 generate calls, 2 sequences, {sum(tokens[:2]):,} new tokens",
        f"[progress] eval r1/toy: 2 generate calls, 3 sequences, {sum(tokens):,} new tokens"]


def test_evaluate_a_saved_model_greedily(tiny, tmp_path):
    qa = tiny.root / "world" / "qa" / "test.parquet"
    cfg = RolloutConfig(max_turns=1, max_turn_tokens=12, max_obs_tokens=256)
    runs = []
    for name in ("a", "b"):
        env = MultiQuerySearchEnvironment(AgentRetriever(tiny.searcher), 3, 3)
        evaluate(tiny.model_dir, qa, env, tmp_path / name, run_id="tiny",
                 dataset="toy_test", rollout_cfg=cfg, batch_size=2, max_questions=3, dtype="float32")
        runs.append(_read(tmp_path / name))
    (table, metrics), (again, _) = runs
    assert table.num_rows == metrics["n"] == 3
    assert table.column("id").to_pylist() == pq.read_table(qa).column("id").to_pylist()[:3]
    assert all(1 <= t <= 2 for t in table.column("turns").to_pylist())
    # Greedy decoding: the same model gives the same responses.
    assert table.column("response").to_pylist() == again.column("response").to_pylist()
    for key in METRIC_COLUMNS:
        assert metrics["metrics"][key] == pytest.approx(sum(table.column(key).to_pylist()) / 3)


def test_cli_evaluates_every_dataset_of_a_run_in_one_call(tiny, tmp_path, capsys):
    """`ragrl eval` with two --dataset/--qa pairs: one directory per dataset, each the same as
    evaluating that dataset alone (greedy decoding); a --qa count that does not match is refused
    before anything is written."""
    from ragrl.cli import main

    qa_a, _ = _qa(tiny, [["x"], ["y"]])
    qa_b, _ = _qa(tiny, [["x"], ["y"], ["z"]])
    recipe = json.dumps({"env": "search", "retriever": "bm25", "topk": 2,
                         "rollout": {"max_turns": 1, "max_turn_tokens": 8, "max_obs_tokens": 64}})
    common = ["eval", "--recipe", recipe, "--bm25", str(tiny.root / "bm25"), "--model", str(tiny.model_dir),
              "--run-id", "r", "--batch-size", "2"]
    assert main([*common, "--dataset", "a", "--qa", str(qa_a), "--dataset", "b", "--qa", str(qa_b),
                 "--out", str(tmp_path / "both")]) == 0
    assert main([*common, "--dataset", "b", "--qa", str(qa_b), "--out", str(tmp_path / "alone")]) == 0
    both_a, metrics_a = _read(tmp_path / "both" / "a")
    both_b, metrics_b = _read(tmp_path / "both" / "b")
    alone_b, _ = _read(tmp_path / "alone" / "b")
    assert (metrics_a["dataset"], metrics_a["n"], metrics_b["dataset"], metrics_b["n"]) == ("a", 2, "b", 3)
    assert both_b.column("prediction").to_pylist() == alone_b.column("prediction").to_pylist()
    capsys.readouterr()
    assert main([*common, "--dataset", "a", "--dataset", "b", "--qa", str(qa_a), "--out", str(tmp_path / "bad")]) == 2
    assert "--qa given 1 times for 2 --dataset (a, b)" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_cli_samples_at_a_temperature_reproducibly_from_a_seed(tiny, tmp_path, capsys):
    """`ragrl eval --temperature T --seed S`: the same seed gives the same responses, another seed
    other ones, greedy (the default) is recorded as such, and metrics.json names the decoding so a
    sampled run is never read as a greedy one. A bad temperature is refused before anything is
    written."""
    from ragrl.cli import main

    qa = tiny.root / "world" / "qa" / "test.parquet"
    recipe = json.dumps({"env": "search", "retriever": "bm25", "topk": 2,
                         "rollout": {"max_turns": 1, "max_turn_tokens": 24, "max_obs_tokens": 64, "temperature": 1.5}})
    common = ["eval", "--recipe", recipe, "--bm25", str(tiny.root / "bm25"), "--model", str(tiny.model_dir),
              "--run-id", "r", "--batch-size", "4", "--max-questions", "6", "--dataset", "t", "--qa", str(qa)]
    runs = {}
    for name, extra in {"greedy": [], "s0": ["--temperature", "1.5", "--seed", "0"],
                        "s0_again": ["--temperature", "1.5", "--seed", "0"], "s1": ["--temperature", "1.5", "--seed", "1"],
                        "recipe": ["--temperature", "recipe", "--seed", "1"]}.items():
        assert main([*common, *extra, "--out", str(tmp_path / name)]) == 0
        table, metrics = _read(tmp_path / name / "t")
        runs[name] = (table.column("response").to_pylist(), metrics["decoding"])
    assert runs["greedy"][1] == {"temperature": 0.0, "seed": None}
    assert runs["s0"][1] == {"temperature": 1.5, "seed": 0}
    assert runs["recipe"][1] == {"temperature": 1.5, "seed": 1}  # the recipe's rollout temperature
    assert runs["s0"][0] == runs["s0_again"][0]
    assert runs["s1"][0] == runs["recipe"][0]
    assert runs["s0"][0] != runs["s1"][0]
    assert runs["s0"][0] != runs["greedy"][0]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--temperature", "-1", "--out", str(tmp_path / "bad")])
    assert exit_info.value.code == 2
    assert "argument --temperature: must be >= 0, got '-1'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_row_with_bad_metadata_fails_before_any_rollout_and_writes_nothing(tiny, tmp_path):
    """A question's metadata is read per batch (the KG metrics' answer entities): the evaluation
    checks every row first, so a bad row names the file and the row before any generation."""
    from ragrl.errors import InputError

    path = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["a?", "b?"], "golden_answers": [["a"], ["b"]],
                             "metadata": ['{"type": "1hop"}', '["not", "an", "object"]']}), path)
    policy = ScriptedPolicy(tiny.tok, lambda question, response: "<answer>a</answer>")
    closed_book = get_method("none")
    with pytest.raises(InputError, match=r"qa\.parquet: QA row 'q1': metadata: expected a JSON object, got list"):
        evaluate(None, path, closed_book.make_environment(None, {}), tmp_path / "out", run_id="r1", dataset="toy",
                 rollout_cfg=closed_book.eval_rollout(_Cfg()), generator=policy, tokenizer=tiny.tok)
    assert policy.prompts == [] and not (tmp_path / "out").exists()
