"""HARR through the Snakemake CLI on a tiny world: filter -> train (HARR, no-history) -> evaluation of
the frozen generator with the frozen / HARR / no-history encoder -> recall@k -> tables harr_*."""

from __future__ import annotations

import copy
import csv
import json
import math
import re

import pytest

from helpers import REPO, TINY, run_snakemake

HARR_RUNS = ["harr_frozen", "harr_frozen_history", "harr", "harr_no_history"]


def harr_tiny_config(outside_generator: bool = False) -> dict:
    """The workflow test's tiny world with one search recipe, no baselines, and HARR on a tiny budget.

    The filter is off: the tiny generator answers nothing right, so no question's F1 varies and
    the filter would keep none (tested in tests/unit/test_harr_stage.py).

    `outside_generator`: the generator is the shipped pretrained policy (an outside checkpoint with
    the search recipe's settings) and no recipe is trained. The end-to-end run uses it: a run-named
    generator would make this test train and evaluate the whole Search-R1 recipe first (SFT, RL,
    two evaluations: ~200 s of job time); the dry runs below keep the run-named form, and the
    default `make run` runs it.
    """
    cfg = copy.deepcopy(TINY)
    search = cfg["recipes"]["search_r1"]
    cfg["recipes"] = {"search_r1": search}
    cfg["evaluation"].update(baselines=False, oracle=False, max_questions=4, batch_size=4)
    cfg["retrieval"].update(bm25=False, hybrid=False)
    cfg["retrieval"]["eval"]["datasets"] = []
    cfg["results"]["tables"] = []
    cfg["harr"] = {
        "generator": "search_r1_sft", "index": "flat", "train_dataset": "world_train", "eval_datasets": ["world_test"],
        "filter": False, "filter_limit": 6, "recall_k": [1, 2, 5],
        "environment": {"topk": 2, "pool_size": 8, "template": "{state}"},
        "encoder": {"lora": True, "lora_r": 4, "lora_alpha": 8},
        "train": {"steps": 2, "questions_per_step": 2, "group_size": 2, "lr": 1e-4, "checkpoint_every": 1},
    }
    if outside_generator:
        (shipped,) = (REPO / "resources/pretrained").glob("*/config.json")
        cfg["recipes"] = {}
        cfg["harr"]["generator"] = {"model": f"resources/pretrained/{shipped.parent.name}",
                                    "recipe": {k: search[k] for k in ("env", "topk", "rollout")}}
    return cfg


def _table(path) -> dict[str, list[str]]:
    rows = list(csv.reader(path.open()))
    return {r[0]: r[1:] for r in rows[1:]}


def _number(cell: str) -> float:
    return float(cell.strip("*").split(" [")[0])


@pytest.mark.integration
def test_harr_dag_makes_its_tables(tmp_path):
    proc = run_snakemake(tmp_path, harr_tiny_config(outside_generator=True))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (tmp_path / "results/models").exists()  # nothing trained but the encoders
    tables = tmp_path / "results/tables"
    for name, dataset in (("harr_em", "world_test"), ("harr_f1", "world_test"), ("harr_recall", "world_test_multihop"),
                          ("harr_all", "world_test_multihop")):
        rows = _table(tables / f"{name}.csv")
        assert list(rows) == HARR_RUNS, (name, rows)
        header = next(csv.reader((tables / f"{name}.csv").open()))
        assert header[1:] == [dataset]
        values = [_number(v[0]) for v in rows.values()]
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values), (name, values)
        assert (tables / f"{name}.md").read_text().count("harr") >= 3
    # The trained runs logged every step; the frozen run reads the index's own encoder.
    for run in ("harr", "harr_no_history"):
        log = [json.loads(line) for line in (tmp_path / f"results/harr/train/{run}/train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == [1, 2]
        assert (tmp_path / f"results/harr/train/{run}/work/final/encoder/config.json").is_file()
    # The history-aware run's encoder saw history states, the ablation's did not (their logs say so).
    assert "history=True" in (tmp_path / "logs/harr/train/harr.log").read_text()
    assert "history=False" in (tmp_path / "logs/harr/train/harr_no_history.log").read_text()
    # Recall on the multi-hop questions only: every counted question has two or more supporting passages.
    recall = json.loads((tmp_path / "results/harr/recall/harr/world_test/metrics.json").read_text())
    assert recall["dataset"] == "world_test_multihop" and recall["n"] > 0
    assert recall["metrics"]["recall@5"] >= recall["metrics"]["recall@1"]
    for job in ("filter", "train/harr", "eval/harr_frozen/world_test", "recall/harr/world_test"):
        # benchmarks/<rule>/...: the results database reads a job's rule from that path
        bench = "harr_" + job
        assert (tmp_path / f"logs/harr/{job}.log").is_file() and (tmp_path / f"benchmarks/{bench}.tsv").is_file()
    import duckdb

    con = duckdb.connect(str(tmp_path / "results/ragrl.duckdb"), read_only=True)
    rules = {r for (r,) in con.execute("select distinct rule from jobs").fetchall()}
    assert {"harr_filter", "harr_train", "harr_eval", "harr_recall"} <= rules and "harr" not in rules
    steps = dict(con.execute("select run_id, count(*) from train_log group by run_id").fetchall())
    assert steps["harr"] == 2 and steps["harr_no_history"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("change, needle", [
    ({"train": {"stepz": 2}}, "harr.train"),
    ({"encoder": {"lora_rank": 4}}, "harr.encoder"),
    ({"environment": {"topk": 9, "pool_size": 4}}, "harr.environment"),
    ({"generator": "search_r1_typo"}, "harr.generator"),
    ({"index": "hnsw"}, "harr.index"),
    ({"eval_datasets": ["world_tset"]}, "harr.eval_datasets[0]"),
])
def test_a_bad_harr_setting_fails_the_dry_run(tmp_path, change, needle):
    cfg = harr_tiny_config()
    cfg["harr"].update(change)
    proc = run_snakemake(tmp_path, cfg, "-n")
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_the_harr_dry_run_plans_every_job(tmp_path):
    proc = run_snakemake(tmp_path, harr_tiny_config(), "-n", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = dict(re.findall(r"^(harr_\w+)\s+(\d+)$", proc.stdout, re.M))
    # four evaluated runs (frozen, frozen on history-aware states, HARR, no-history), two trained
    assert counts == {"harr_filter": "1", "harr_train": "2", "harr_eval": "4", "harr_recall": "4", "harr_manifest": "4"}
    # A run-named generator is built first: its recipe's SFT and merge are in the plan.
    assert re.search(r"^merge_sft\s+1$", proc.stdout, re.M) and re.search(r"^sft\s+1$", proc.stdout, re.M), proc.stdout
