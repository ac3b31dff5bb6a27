"""The workflow end to end through the Snakemake CLI, on a tiny config in a temp dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

TINY = {
    "world": {"seed": 3, "size": 30},
    "models": {"tiny": {"vocab_size": 600, "hidden_size": 128, "num_heads": 2, "num_kv_heads": 1,
                        "num_layers": 2, "intermediate_size": 256}},
}


def _snakemake(workdir: Path, config: dict, *args: str) -> subprocess.CompletedProcess:
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        # The default config first, the test's overrides merged over it: how users layer configs.
        [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--configfile", str(REPO / "config/config.yaml"), str(cfg),
         "--cores", "2", *args],
        capture_output=True, text=True, env=env, timeout=900,
    )


@pytest.mark.integration
def test_workflow_runs_end_to_end(tmp_path):
    proc = _snakemake(tmp_path, TINY)
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
    assert {r["retriever"] for r in rows} == {"flat", "hnsw", "bm25", "hybrid"}
    flat = next(r for r in rows if r["retriever"] == "flat" and r["dataset"] == "world_test")
    assert float(flat["hit@10"]) > 0.5
    service = json.loads((tmp_path / "results/checks/retrieval_service_world_hybrid.json").read_text())
    assert service["agreement_with_in_process"] >= 0.95 and service["healthy_after_bad_request"]
    # Nothing left to do: a second run is a no-op.
    again = _snakemake(tmp_path, TINY, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.parametrize(
    "config,needle",
    [
        ({"world": {"seed": "x"}}, "config key 'world.seed'"),
        ({"world": {"size": 5}}, "config key 'world.size'"),
        ({"wrold": {}}, "config key 'wrold': unknown key"),
        ({"models": {"policy": "nonsense"}}, "config key 'models.policy': unknown model name"),
        ({"models": {"embedding": "./no/such/dir"}}, "config key 'models.embedding': model path './no/such/dir' does not exist"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, config, needle):
    proc = _snakemake(tmp_path, config, "-n")
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.integration
def test_failed_job_leaves_no_partial_output(tmp_path):
    bad = {"world": TINY["world"], "models": {"tiny": {**TINY["models"]["tiny"], "num_heads": 4}}}  # head_dim 32
    proc = _snakemake(tmp_path, bad)
    assert proc.returncode != 0
    assert (tmp_path / "results/world/passages.parquet").is_file()  # the upstream job finished
    model_dir = tmp_path / "results/models"
    leftovers = [p for p in model_dir.rglob("*")] if model_dir.exists() else []
    assert leftovers == [] or all(p.is_dir() for p in leftovers), leftovers
    assert "head_dim" in (tmp_path / "logs/tiny_model.log").read_text()
