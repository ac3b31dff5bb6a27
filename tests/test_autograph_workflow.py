"""AutoGraph-R1's whole DAG on the small test world (the default config's recipe, shrunk): gold SFT
data, SFT, GRPO through the generic RL stage on the constructor's own engine, the per-episode
evaluation, construct_kg with the untrained / SFT / RL constructors, graph_rank over each built
graph and the gold KG, reader runs over the rankings, KG-R1 over the KG built from text, and the
autograph_* tables."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest
import yaml

from test_workflow import REPO, TINY, _jobs_run, _snakemake

pytestmark = pytest.mark.integration


def _config() -> dict:
    config = copy.deepcopy(TINY)
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    recipe = copy.deepcopy(default["recipes"]["autograph_r1"])
    recipe["sft"] = {**recipe["sft"], "epochs": 1, "batch_size": 4}
    recipe["rl"] = {**recipe["rl"], "steps": 2, "batch_prompts": 2, "group_size": 2, "checkpoint_every": 1,
                    "filter_tied_groups": False}
    recipe["rollout"] = {**recipe["rollout"], "max_turn_tokens": 48}
    config["recipes"]["autograph_r1"] = recipe
    config["recipes"]["kg_r1"]["eval_datasets"] = default["recipes"]["kg_r1"]["eval_datasets"]
    config["datasets"]["world_kgqa_A_test_built"] = default["datasets"]["world_kgqa_A_test_built"]
    config["kgs"]["world_built"] = default["kgs"]["world_built"]
    config["construct_kg"] = {**default["construct_kg"], "max_turn_tokens": 48}
    config["results"]["tables"] = [t for t in default["results"]["tables"] if t["name"].startswith("autograph_")]
    return config


def test_autograph_dag_builds_graphs_ranks_passages_and_reads_them(tmp_path):
    import duckdb

    proc = _snakemake(tmp_path, _config(), "--verbose")
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = _jobs_run(proc.stdout + proc.stderr)
    assert {w for r, w in jobs if r == "construct_kg"} == {"constructor=base", "constructor=sft", "constructor=rl"}
    assert {w for r, w in jobs if r == "graph_rank"} == {f"graph={g}, dataset=world_test" for g in
                                                          ("base", "sft", "rl", "gold")}
    # The RL constructor's KG is what the KG-R1 agent queries on the built dataset.
    assert "results/kg_built/rl" in (tmp_path / "logs/eval/kg_r1_rl.log").read_text()
    # The constructor's RL went through the generic trainer: one log line per step with its reward parts.
    steps = [json.loads(line) for line in (tmp_path / "results/train/autograph_r1_rl/train_log.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2]

    con = duckdb.connect(str(tmp_path / "results/ragrl.duckdb"), read_only=True)
    metrics = {(r, m): v for r, m, v in con.execute(
        "select run_id, metric, value from evals where dataset = 'world_test'").fetchall()}
    for run in ("autograph_r1_base", "autograph_r1_sft", "autograph_r1_rl"):
        assert 0.0 <= metrics[run, "recall@2"] <= 1.0 and (run, "valid") in metrics
    # The gold KG links questions to their passages; the untrained random policy writes no valid
    # triple, so its graph ranks nothing (recall 0, every question unranked).
    assert metrics["graph_gold", "recall@5"] > 0.3
    assert metrics["graph_gold", "recall@5"] >= metrics["graph_gold", "recall@2"]
    assert metrics["graph_base", "recall@5"] == 0.0 and metrics["graph_base", "unranked"] == 1.0
    for g in ("base", "sft", "rl", "gold"):
        assert (f"graph_{g}_reader", "em") in metrics
    built = con.execute("select count(*) from evals where run_id = 'kg_r1_rl' and dataset = 'world_kgqa_A_test_built'"
                        ).fetchone()[0]
    assert built > 0
    stats = json.loads((tmp_path / "results/kg_built/base/construction.json").read_text())
    assert stats["passages"] == pq.read_metadata(tmp_path / "results/world/passages.parquet").num_rows
    table = (tmp_path / "results/tables/autograph_graph_recall5.md").read_text()
    assert all(f"graph_{g}" in table for g in ("base", "sft", "rl", "gold")) and "±" in table
