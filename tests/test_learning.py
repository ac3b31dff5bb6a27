"""Learning on the embedded default (issue 12), shrunk for CI: the pretrained base reads, and SFT
from it answers held-out questions. A change that breaks reading (pretraining data, tokenizer,
SFT masking, the gold trajectories, the rollout) makes EM fall to 0 here.

The base is the repository's shipped pretrained model for the default world (rule pretrain
finds it by cache key and copies it), so the test pays for SFT and evaluation only.
"""

from __future__ import annotations

import json

import pytest
import yaml

from test_workflow import REPO, _snakemake

EVAL = "results/eval/search_r1_sft"


def _learning_config() -> dict:
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["pretrain"]["enabled"] = True
    # BM25 instead of the dense index: no embedding model to load, and names match exactly. SFT
    # as the default's (every training question, 3 epochs): fewer steps leave EM at 0. Measured
    # 2026-11-25 to shorten this test: sft.limit 200 (75 steps) gave EM 0.01, format 0.03;
    # all questions (147 steps) 0.26, 262 s alone.
    search = {**cfg["recipes"]["search_r1"], "retriever": "bm25"}
    cfg["recipes"] = {"search_r1": search}
    cfg["corpora"] = {"world": cfg["corpora"]["world"]}
    cfg["datasets"] = {k: v for k, v in cfg["datasets"].items() if k in ("world_train", "world_dev", "world_test")}
    cfg["retrieval"].update(indexes={"flat": "Flat"}, hybrid=False)
    cfg["evaluation"].update(max_questions=100, batch_size=25, baselines=False, oracle=False)
    cfg["results"]["tables"] = []
    cfg["construct_kg"] = None  # its constructors are autograph_r1's runs, not configured here
    return cfg


@pytest.mark.integration
def test_sft_from_the_pretrained_base_answers_held_out_questions(tmp_path):
    proc = _snakemake(tmp_path, _learning_config(), EVAL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the shipped base was reused, not retrained
    assert "reused the pretrained model" in (tmp_path / "logs/pretrain.log").read_text()
    metrics = json.loads((tmp_path / EVAL / "world_test/metrics.json").read_text())
    assert metrics["n"] == 100
    # Test questions are about entities no training question mentions: every right answer was
    # read from a retrieved passage. The default run's SFT model gets 0.34 (Flat index) and 0.27
    # with BM25 (2026-11-24); gold turns whose names the policy cannot copy token for token gave
    # 0.09, and length-grouped SFT batches 0.21: a bound at 0.15 catches such regressions, not noise.
    assert metrics["metrics"]["em"] >= 0.15, metrics
