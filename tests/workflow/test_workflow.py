"""The workflow end to end through the Snakemake CLI, on a tiny config in a temp dir."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from helpers import KG_DATASETS, KG_RUNS, REPO, RUNS, TINY, jobs_run, run_snakemake

def _end_to_end_config() -> dict:
    """TINY plus AutoGraph-R1 (the default config's recipe, shrunk): its constructor, the KGs it
    builds, graph_rank over them, the reader runs and KG-R1 over the built KG. One DAG for both, since
    two runs of the shared jobs (world, indexes, search_r1, kg_r1) cost the suite ~5 minutes."""
    config = json.loads(json.dumps(TINY))
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    recipe = json.loads(json.dumps(default["recipes"]["autograph_r1"]))
    recipe["sft"] = {**recipe["sft"], "epochs": 1, "batch_size": 4}
    recipe["rl"] = {**recipe["rl"], "steps": 2, "batch_prompts": 2, "group_size": 2, "checkpoint_every": 1,
                    "filter_tied_groups": False}
    recipe["rollout"] = {**recipe["rollout"], "max_turn_tokens": 48}
    config["recipes"]["autograph_r1"] = recipe
    config["recipes"]["kg_r1"]["eval_datasets"] = default["recipes"]["kg_r1"]["eval_datasets"]
    config["datasets"]["world_kgqa_A_test_built"] = default["datasets"]["world_kgqa_A_test_built"]
    config["kgs"]["world_built"] = default["kgs"]["world_built"]
    config["construct_kg"] = {**default["construct_kg"], "max_turn_tokens": 48}
    config["results"]["tables"] += [t for t in default["results"]["tables"] if t["name"].startswith("autograph_")]
    return config


GRAPHS = ("base", "sft", "rl", "gold")
GRAPH_READERS = [f"graph_{g}_reader" for g in GRAPHS]


@pytest.mark.integration
def test_workflow_runs_end_to_end(tmp_path):
    config = _end_to_end_config()
    proc = run_snakemake(tmp_path, config, "--verbose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    world = tmp_path / "results/world"
    assert (world / "passages.parquet").is_file() and (world / "qa/test.parquet").is_file()
    model = tmp_path / "results/models/tiny"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model)
    assert len(tok) <= 600 and lm.config.hidden_size == 128
    assert (tmp_path / "results/checks/policy_generate.txt").read_text().strip()
    for rule in ("world", "tiny_model", "policy_generate", "retrieval_table"):
        assert (tmp_path / f"logs/{rule}.log").is_file()
        assert (tmp_path / f"benchmarks/{rule}.tsv").is_file()
    assert (tmp_path / "benchmarks/embed_shard/world/1-of-2.tsv").is_file()
    # Every configured retriever was evaluated, and dense retrieval finds supporting passages.
    import csv

    rows = list(csv.DictReader((tmp_path / "results/tables/retrieval_recall.csv").open()))
    assert {r["retriever"] for r in rows} == {"flat", "bm25", "hybrid"}
    flat = next(r for r in rows if r["retriever"] == "flat" and r["dataset"] == "world_test")
    assert float(flat["hit@10"]) > 0.5
    service = json.loads((tmp_path / "results/checks/retrieval_service_world_hybrid.json").read_text())
    assert service["agreement_with_in_process"] >= 0.95 and service["healthy_after_bad_request"]
    assert service["empty_query_list_status"] == 200 and 400 <= service["bad_request_status"] < 500

    # Every run was evaluated and lands in the results database, the table and the leaderboard.
    import duckdb

    con = duckdb.connect(str(tmp_path / "results/ragrl.duckdb"), read_only=True)
    leaderboard = con.execute("select run_id, dataset, value from leaderboard").fetchall()
    expected = [(r, "world_test") for r in RUNS + GRAPH_READERS] + [(r, d) for r in KG_RUNS for d in KG_DATASETS]
    expected += [(r, "world_kgqa_A_test_built") for r in KG_RUNS]
    agent_rows = [(r, d) for r, d, _ in leaderboard if not r.startswith("autograph_") and r not in
                  [f"graph_{g}" for g in GRAPHS]]
    assert sorted(agent_rows) == sorted(expected)
    steps = con.execute("select run_id, count(*) from train_log group by run_id order by run_id").fetchall()
    assert steps == [("autograph_r1_rl", 2), ("kg_r1_rl", 2), ("search_r1_rl", 2)]
    # The KG agent's log carries KG-R1's reward parts (turn rewards feed the turn-level advantage).
    assert con.execute("select count(reward_turn_mean) from train_log where run_id = 'kg_r1_rl'").fetchone()[0] == 2
    predictions = con.execute("select run_id, dataset, count(*) from predictions group by all").fetchall()
    assert {(r, d): n for r, d, n in predictions if (r, d) in expected} == {k: 4 for k in expected}
    assert con.execute("select count(*) from jobs where rule = 'rl'").fetchone()[0] == 3
    # Every evaluation (agents, graph rankings, readers: all embed or generate with torch) records
    # the host, torch and CPU kernels that computed it.
    hosts = con.execute("select count(*), count(cpu), count(torch), count(cpu_capability) from hosts").fetchone()
    n_evals = con.execute("select count(*) from (select distinct run_id, dataset from evals)").fetchone()[0]
    assert n_evals > 0 and hosts == (n_evals,) * 4, (hosts, n_evals)
    # Each agent model names the hosts that trained it, stage by stage (the random base has none).
    stages = dict(con.execute("select run_id, string_agg(stage, ' ' order by seq) from train_hosts "
                              "where dataset in ('world_test', 'world_kgqa_A_test') group by run_id").fetchall())
    assert {r: stages.get(r) for r in RUNS + KG_RUNS} == {
        "base": None, "no_retrieval": None, "search_r1_sft": "sft", "search_r1_rl": "sft rl",
        "search_r1_oracle": "sft rl", "kg_r1_sft": "sft", "kg_r1_rl": "sft rl"}
    assert con.execute("select count(*) from train_hosts where cpu is null or torch is null").fetchone()[0] == 0
    # The tables report greedy decoding, and the database says so for every run they show.
    decoded = dict(con.execute("select run_id, temperature from decodings where dataset = 'world_test'").fetchall())
    assert {r: decoded.get(r) for r in RUNS} == dict.fromkeys(RUNS, 0.0)
    table = (tmp_path / "results/tables/toy_em.md").read_text()
    for run_id, dataset, value in leaderboard:
        if run_id in RUNS and dataset == "world_test":
            assert run_id in table and f"{value:.3f}" in table
    kg_table = (tmp_path / "results/tables/kg_transfer_em.md").read_text()
    assert all(r in kg_table for r in KG_RUNS) and all(d in kg_table for d in KG_DATASETS)
    assert (tmp_path / "results/plots/metrics_em.png").stat().st_size > 0
    _assert_autograph_outputs(tmp_path, proc.stdout + proc.stderr, con)
    con.close()

    # Nothing left to do: a second run is a no-op.
    again = run_snakemake(tmp_path, config, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr

    # Changing one run's setting re-executes exactly that run's downstream jobs.
    changed = json.loads(json.dumps(config))
    changed["recipes"]["search_r1"]["rl"]["lr"] = 3e-4
    rerun = run_snakemake(tmp_path, changed)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    ran = jobs_run(rerun.stdout + rerun.stderr)
    assert ran == {
        ("rl", "recipe=search_r1"), ("merge_rl", "recipe=search_r1"),
        ("eval", "run=search_r1_rl"), ("run_manifest", "run=search_r1_rl"),
        # the oracle row evaluates the same RL policy, and the graph rows read with it
        ("eval", "run=search_r1_oracle"), ("run_manifest", "run=search_r1_oracle"),
        *{(job, f"run={r}") for r in GRAPH_READERS for job in ("eval", "run_manifest")},
        ("results_db", ""), ("results_tables", ""), ("results_plots", ""), ("all", ""),
    }, ran


def _assert_autograph_outputs(tmp_path: Path, log: str, con) -> None:
    """AutoGraph-R1's part of the DAG: gold SFT data, SFT, GRPO through the generic RL stage on the
    constructor's own engine, the per-episode evaluation, construct_kg with the untrained / SFT / RL
    constructors, graph_rank over each built graph and the gold KG, reader runs over the rankings,
    KG-R1 over the KG built from text, and the autograph_* tables."""
    import pyarrow.parquet as pq

    jobs = jobs_run(log)
    assert {w for r, w in jobs if r == "construct_kg"} == {"constructor=base", "constructor=sft", "constructor=rl"}
    assert {w for r, w in jobs if r == "graph_rank"} == {f"graph={g}, dataset=world_test" for g in GRAPHS}
    # The RL constructor's KG is what the KG-R1 agent queries on the built dataset.
    assert "results/kg_built/rl" in (tmp_path / "logs/eval/kg_r1_rl.log").read_text()
    # The constructor's RL went through the generic trainer: one log line per step with its reward parts.
    steps = [json.loads(line) for line in (tmp_path / "results/train/autograph_r1_rl/train_log.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2]

    metrics = {(r, m): v for r, m, v in con.execute(
        "select run_id, metric, value from evals where dataset = 'world_test'").fetchall()}
    for run in ("autograph_r1_base", "autograph_r1_sft", "autograph_r1_rl"):
        assert 0.0 <= metrics[run, "recall@2"] <= 1.0 and (run, "valid") in metrics
        assert 0.0 <= metrics[run, "carried"] <= metrics[run, "valid"]  # R_C's term: only a valid graph carries
    assert "autograph_r1_rl" in (tmp_path / "results/tables/autograph_carried.md").read_text()
    # The gold KG links questions to their passages; the untrained random policy writes no valid
    # triple, so its graph ranks nothing (recall 0, every question unranked).
    assert metrics["graph_gold", "recall@5"] > 0.3
    assert metrics["graph_gold", "recall@5"] >= metrics["graph_gold", "recall@2"]
    assert metrics["graph_base", "recall@5"] == 0.0 and metrics["graph_base", "unranked"] == 1.0
    for reader in GRAPH_READERS:
        assert (reader, "em") in metrics
    stats = json.loads((tmp_path / "results/kg_built/base/construction.json").read_text())
    assert stats["passages"] == pq.read_metadata(tmp_path / "results/world/passages.parquet").num_rows
    table = (tmp_path / "results/tables/autograph_graph_recall5.md").read_text()
    assert all(f"graph_{g}" in table for g in GRAPHS) and re.search(r"\d \[\d\.\d+, \d\.\d+\]", table)


@pytest.mark.slow
@pytest.mark.parametrize(
    "config,needle",
    [
        ({"world": {"seed": "x"}}, "config key 'world.seed'"),
        ({"world": {"size": 5}}, "config key 'world.size'"),
        ({"wrold": {}}, "config key 'wrold': unknown key"),
        # Issue 18 F4: a factory typo used to pass -n and fail hours later in the index job.
        ({"retrieval": {"indexes": {"bad": "Flatt,Foo"}}},
         "config key 'retrieval.indexes.bad': FAISS cannot build 'Flatt,Foo' for embedding sizes"),
        ({"models": {"policy": "nonsense"}}, "config key 'models.policy': unknown model name"),
        ({"models": {"embedding": "./no/such/dir"}}, "config key 'models.embedding': model path './no/such/dir' does not exist"),
        ({"datasets": {"q": {"format": "kgqa", "path": "q.jsonl", "kg": "nope"}}}, "config key 'datasets.q.kg'"),
        # A mixed QA set or corpus pairs its formats with its files by position.
        ({"datasets": {"mix": {"format": ["musique", "hotpotqa"], "path": ["m.jsonl", "h.json", "x.json"]}}},
         "config key 'datasets.mix.format': 2 formats for 3 path (one each, in order)"),
        ({"datasets": {"mix": {"format": ["musique", "hotpotqa"], "path": "m.jsonl"}}},
         "config key 'datasets.mix.path': a list of formats needs a list of files"),
        ({"datasets": {"mix": {"format": ["parquet", "musique"], "path": ["q.parquet", "m.jsonl"]}}},
         "config key 'datasets.mix.format': a QA parquet is used in place"),
        ({"corpora": {"mix": {"format": ["musique"], "inputs": ["m.jsonl", "h.json"]}}},
         "config key 'corpora.mix.format': 1 formats for 2 inputs"),
        ({"corpora": {"mix": {"format": ["musique", "msuique"], "inputs": ["m.jsonl", "h.json"]}}},
         "config key 'corpora.mix.format'"),
        ({"datasets": {"qa": {"format": "parquet", "path": "qa.parquet"}},
          "recipes": {"kg_r1": {"env": "kg", "train_dataset": "qa"}}},
         "config key 'recipes.kg_r1.train_dataset': dataset 'qa' names no kg"),
        # An RL ablation may only share the SFT model of a recipe of its own method.
        ({"recipes": {"a": {"env": "search", "train_dataset": "qa"},
                      "b": {"env": "knowrl", "train_dataset": "qa", "sft": {"from": "a"}}}},
         "config key 'recipes.b.sft.from': 'a' must be another recipe of the same env"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, config, needle):
    proc = run_snakemake(tmp_path, config, "-n")
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.integration
def test_failed_job_leaves_no_partial_output(tmp_path):
    bad = json.loads(json.dumps(TINY))
    bad["models"]["tiny"]["num_heads"] = 4  # head_dim 32: the build job fails
    bad["corpora"] = {"world": TINY["corpora"]["world"]}
    # The model as the target: the whole DAG ran its other branches (embedding, indexes) beside the
    # failing job for ~100 s of a CI worker and proved nothing more.
    proc = run_snakemake(tmp_path, bad, "results/models/tiny/config.json")
    assert proc.returncode != 0
    assert (tmp_path / "results/world/passages.parquet").is_file()  # the upstream job finished
    model_dir = tmp_path / "results/models"
    leftovers = [p for p in model_dir.rglob("*")] if model_dir.exists() else []
    assert leftovers == [] or all(p.is_dir() for p in leftovers), leftovers
    assert "head_dim" in (tmp_path / "logs/tiny_model.log").read_text()
