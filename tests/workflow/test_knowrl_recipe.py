"""KnowRL's knowledge-boundary toy: which topics the policy reads, the cold-start SFT data built
from the world's factual split and KB, and the evaluation's groups and fact precision."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from ragrl.eval.evaluate import summarize
from ragrl.kb.build import build_kb, kb_titles
from ragrl.errors import InputError
from ragrl.methods import get_method
from ragrl.methods.knowrl import REFUSAL, is_known, topic_of
from ragrl.recipe import parse_recipe
from ragrl.toy.relations import RELATION_BY_KEY
from ragrl.toy.world import generate_world, write_world

REPO = Path(__file__).resolve().parents[2]
POLICY = next((REPO / "resources/pretrained").glob("*/model.safetensors")).parent
REPEATS = 3


def test_known_topics_are_a_fixed_share_by_hash():
    topics = [f"Topic {i}" for i in range(2000)]
    share = sum(is_known(t, 0.5) for t in topics) / len(topics)
    assert 0.45 < share < 0.55
    assert not any(is_known(t, 0.0) for t in topics) and all(is_known(t, 1.0) for t in topics)
    # The SFT-data job and the evaluation job are separate processes: they must agree whatever
    # Python's per-process string hashing does.
    code = "from ragrl.methods.knowrl import is_known; print(''.join(str(int(is_known(f'Topic {i}', 0.5))) for i in range(2000)))"
    other = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "123"},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert other == "".join(str(int(is_known(t, 0.5))) for t in topics)
    assert [is_known(t, 0.5, seed=1) for t in topics] != [is_known(t, 0.5) for t in topics]


def _gold_sft(root: Path, out: Path, **options):
    """The recipe, the stats and the rows of KnowRL's gold SFT data over the world under `root`."""
    recipe = parse_recipe({"env": "knowrl", "train_dataset": "x", "rollout": {"max_turn_tokens": 160},
                           "options": {"kb": str(root / "kb.db"), "read_repeats": REPEATS, "question_repeats": 2,
                                       "gamma": 3, **options}}, "knowrl")
    method = get_method("knowrl")
    stats = method.gold_sft(recipe, root / "world/factual/train.parquet", POLICY, method.make_environment(recipe, {}),
                            {}, out)
    return recipe, stats, pq.read_table(out).to_pylist()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("knowrl")
    write_world(generate_world(13, 30), root / "world")
    build_kb([root / "world/kb/documents.parquet"], root / "kb.db")
    recipe, stats, rows = _gold_sft(root, root / "sft.parquet")
    return SimpleNamespace(root=root, recipe=recipe, method=get_method("knowrl"), stats=stats, rows=rows,
                           qa=pq.read_table(root / "world/factual/train.parquet").to_pylist())


def test_sft_data_reads_the_known_documents_and_nothing_else(toy):
    known_titles = [t for t in kb_titles(toy.root / "kb.db") if is_known(t, 0.5)]
    read = [r for r in toy.rows if r["id"].startswith("read-")]
    assert 0 < len(known_titles) < len(kb_titles(toy.root / "kb.db"))
    assert len(read) == len(known_titles) * REPEATS == toy.stats["read_rows"]
    assert {r["id"].removeprefix("read-").rsplit("-", 1)[0] for r in read} == set(known_titles)
    # Plain text, every token trained, no chat template.
    assert all(set(r["assistant_masks"]) == {1} and "<|im_start|>" not in r["text"] for r in read)


def test_sft_data_asks_every_fact_of_the_training_topics(toy):
    answered = [r for r in toy.rows if not r["id"].startswith("read-")]
    topics = {topic_of(row) for row in toy.qa}
    # One question per fact a training topic's document states (the world lists them in each
    # row's metadata), each row question_repeats times.
    facts = {topic_of(row): json.loads(row["metadata"])["facts"] for row in toy.qa}
    n_facts = sum(len(f) for f in facts.values())
    assert len(answered) == 2 * n_facts == 2 * (toy.stats["known"] + toy.stats["unknown"])
    assert {r["id"].split("/")[0] for r in answered} == topics
    # The split's own question is the wording used for its fact.
    for row in toy.qa:
        head, relation, _ = json.loads(row["metadata"])["hops"][0]
        assert row["question"] in next(r["text"] for r in answered if r["id"] == f"{head}/{relation}")


def test_sft_data_answers_known_topics_and_refuses_unknown_ones(toy):
    answered = [r for r in toy.rows if not r["id"].startswith("read-")]
    assert toy.stats["known"] > 0 and toy.stats["unknown"] > 0
    for r in answered:
        topic, relation = r["id"].split("/")
        mask = r["assistant_masks"]
        start = mask.index(1)
        assert set(mask[:start]) == {0} and set(mask[start:]) == {1}  # the prompt is never trained
        reply = r["text"][r["text"].rindex("<|im_start|>assistant"):]
        think = reply.split("<think>")[1].split("</think>")[0].strip()
        raw = reply.split("<answer>")[1].split("</answer>")[0]
        # "<answer> X": the answer in the word pieces the think wrote it in (knowrl.completion)
        assert raw.startswith(" ") and not raw.startswith("  ")
        answer = raw.strip()
        stated = RELATION_BY_KEY[relation].sentences[0].format(h=topic, t=answer)
        if is_known(topic, 0.5):
            # The asked fact, as the document states it, and its tail as the answer.
            assert think == stated and stated in read_document_text(toy, topic)
        else:
            prefix = RELATION_BY_KEY[relation].sentences[0].split("{t}")[0].format(h=topic).rstrip()
            assert answer == REFUSAL and think == f"{prefix} ... I have not read about {topic}."


def test_refusal_share_keeps_that_share_of_the_unknown_topics_and_every_known_one(toy):
    def questions(share: float) -> tuple[dict, set[str]]:
        _, stats, rows = _gold_sft(toy.root, toy.root / f"sft-{share}.parquet", refusal_share=share)
        return stats, {r["id"] for r in rows if not r["id"].startswith("read-")}

    everything = {r["id"] for r in toy.rows if not r["id"].startswith("read-")}
    known = {i for i in everything if is_known(i.split("/")[0], 0.5)}
    none, half = questions(0.0), questions(0.5)
    assert none[1] == known and none[0]["unknown"] == 0 and none[0]["known"] == toy.stats["known"]
    unknown_topics = {i.split("/")[0] for i in everything - known}
    asked = {i.split("/")[0] for i in half[1] - known}
    # A share of the unknown topics, whole: every fact of a kept topic is asked.
    assert known < half[1] <= everything and 0 < len(asked) < len(unknown_topics)
    assert {i for i in everything - known if i.split("/")[0] in asked} == half[1] - known
    assert half[0]["unknown_topics_skipped"] == len(unknown_topics) - len(asked)
    with pytest.raises(InputError, match="refusal_share"):
        parse_recipe({"env": "knowrl", "options": {"refusal_share": 1.5}}, "k")


def read_document_text(toy, topic: str) -> str:
    from ragrl.kb.build import read_document

    return " ".join(read_document(toy.root / "kb.db", topic))


def test_eval_groups_by_known_topic_and_precision_skips_texts_without_facts(toy):
    groups = {toy.method.eval_group(toy.recipe, row) for row in toy.qa}
    assert groups == {"known", "unknown"}
    no_reading = parse_recipe({"env": "knowrl", "options": {"kb": str(toy.root / "kb.db")}}, "k")
    assert toy.method.eval_group(no_reading, toy.qa[0]) is None  # falls back to the row's type
    preds = [{"em": 1.0, "f1": 1.0, "cover_em": 1.0, "format": 1.0, "turns": 1, "searches": 0, "fact_precision": p,
              "question_type": g} for p, g in ((1.0, "known"), (None, "unknown"), (0.5, "known"))]
    m = summarize(preds, "r", "d", ("fact_precision",))
    assert m["n"] == 3 and m["metrics"]["fact_precision"] == 0.75
    assert m["by_type"]["unknown"]["metrics"]["fact_precision"] is None
    assert m["by_type"]["unknown"]["ci95"]["fact_precision"] is None
    assert m["by_type"]["known"]["n"] == 2


def test_gold_data_needs_the_factual_split():
    method = get_method("knowrl")
    assert method.gold_sft_reason({"format": "parquet", "path": "results/world/factual/train.parquet"}) is None
    why = method.gold_sft_reason({"format": "flashrag", "path": "data/simpleqa.jsonl"})
    assert "data/simpleqa.jsonl" in why and "sft.source: import" in why


def test_reward_files_are_the_kb():
    recipe = parse_recipe({"env": "knowrl", "options": {"kb": "results/kb/x/knowledge_base.db"}}, "k")
    assert get_method("knowrl").files(recipe) == {"kb": "results/kb/x/knowledge_base.db"}


@pytest.mark.integration
def test_knowrl_dag_trains_evaluates_by_group_and_shares_the_sft_start(tmp_path):
    """The default config's two KnowRL recipes on the small test world: gold SFT data (reading +
    questions), SFT, RL with and without the factuality term from one SFT model, evaluation of
    the untrained, SFT and RL policies grouped by known / unknown topic, and the knowrl_* tables."""
    import duckdb
    from helpers import TINY, jobs_run, run_snakemake

    config = copy.deepcopy(TINY)
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    small = {"sft": {"epochs": 1, "batch_size": 4}, "rl": {"steps": 2, "batch_prompts": 2, "group_size": 2,
                                                           "checkpoint_every": 1}}
    config["recipes"] = {}
    for name in ("knowrl", "knowrl_no_fact"):
        recipe = copy.deepcopy(default["recipes"][name])
        for section, values in small.items():
            recipe[section] = {**recipe[section], **values}
        recipe["options"] = {**recipe["options"], "read_repeats": 2, "question_repeats": 1}
        config["recipes"][name] = recipe
    config["results"]["tables"] = [t for t in default["results"]["tables"] if t["name"].startswith("knowrl_")]
    config["evaluation"]["max_questions"] = None  # all 30, both groups (the first 4 are all unknown)
    config["results"]["main_metric"] = "incorrect"
    config["results"]["plot_metrics"] = ["correct"]
    proc = run_snakemake(tmp_path, config, "--verbose")
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = jobs_run(proc.stdout + proc.stderr)
    # The ablation trains no SFT model of its own: its RL starts from knowrl's.
    assert {w for r, w in jobs if r == "sft"} == {"recipe=knowrl"}
    assert "results/models/knowrl/sft_merged" in (tmp_path / "logs/rl/knowrl_no_fact.log").read_text()
    stats = json.loads((tmp_path / "results/sft_data/knowrl.stats.json").read_text())
    assert stats["kept"] > 0

    con = duckdb.connect(str(tmp_path / "results/ragrl.duckdb"), read_only=True)
    evals = set(con.execute("select run_id, dataset from evals").fetchall())
    groups = set(con.execute("select run_id, question_type, n from evals_by_type where metric = 'incorrect'").fetchall())
    for run in ("knowrl_base", "knowrl_sft", "knowrl_rl", "knowrl_no_fact_rl"):
        assert (run, "world_factual_test") in evals, evals
        assert {(run, "known", 12), (run, "unknown", 18)} <= groups, groups
    # SimpleQA's three rates partition each run's questions.
    for run, total in con.execute("select run_id, sum(correct + incorrect + not_attempted) from predictions "
                                  "where run_id like 'knowrl%' group by run_id").fetchall():
        n = con.execute("select count(*) from predictions where run_id = ?", [run]).fetchone()[0]
        assert total == n, run
    # Every reward component is logged per step; the ablation's total leaves the fact term out.
    logged = con.execute("select run_id, reward_mean, reward_format, reward_correct, reward_fact from train_log "
                         "where run_id like 'knowrl%' order by run_id, step").fetchall()
    assert [r[0] for r in logged] == ["knowrl_no_fact_rl"] * 2 + ["knowrl_rl"] * 2
    for run, total, fmt, correct, fact in logged:
        assert total == pytest.approx(fmt + correct + (fact if run == "knowrl_rl" else 0.0)), (run, total)
    table = (tmp_path / "results/tables/knowrl_incorrect.md").read_text()
    assert all(run in table for run in ("knowrl_base", "knowrl_sft", "knowrl_rl", "knowrl_no_fact_rl"))
    assert "world_factual_test:unknown" in table and re.search(r"\d \[\d\.\d+, \d\.\d+\]", table)
