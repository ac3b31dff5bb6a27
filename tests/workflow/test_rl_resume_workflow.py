"""Issue 18 F1 / F2 through Snakemake, as a user meets them: the RL job after its policy was
rebuilt with other weights at the same path, and after a typo in its settings."""

from __future__ import annotations

import json

import pytest

from helpers import TINY, run_snakemake

TARGET = "results/train/kg_r1_rl/train_log.jsonl"


def _config(**tiny_overrides) -> dict:
    config = json.loads(json.dumps(TINY))
    kg = config["recipes"]["kg_r1"]
    # No SFT: RL starts from the tiny policy itself, the cheapest upstream model to rebuild.
    kg["sft"] = {**kg["sft"], "enabled": False}
    kg["rl"] = {**kg["rl"], "steps": 2, "batch_prompts": 2, "group_size": 2, "checkpoint_every": 1}
    config["recipes"] = {"kg_r1": kg}
    config["models"]["tiny"].update(tiny_overrides)
    return config


@pytest.mark.integration
def test_rl_restarts_on_new_weights_and_a_typo_keeps_its_checkpoints(tmp_path):
    work = tmp_path / "results/train/kg_r1_rl/work"
    log = tmp_path / "logs/rl/kg_r1.log"

    first = run_snakemake(tmp_path, _config(), TARGET)
    assert first.returncode == 0, first.stderr[-3000:]
    old_final = (work / "final/model.safetensors").read_bytes()

    # F1: the policy is rebuilt in place with other weights; RL must train again, not resume.
    second = run_snakemake(tmp_path, _config(seed=1), TARGET)
    assert second.returncode == 0, second.stderr[-3000:]
    text = log.read_text()
    assert "resuming from" not in text and "changed: input 'policy'" in text
    assert len((tmp_path / TARGET).read_text().splitlines()) == 2
    assert (work / "final/model.safetensors").read_bytes() != old_final
    # The superseded checkpoints went once the new run had saved its own.
    assert not [p for p in work.iterdir() if p.name.startswith("superseded-")]
    checkpoints = sorted(p.name for p in (work / "checkpoints").iterdir())

    # F2: a typo fails naming the key, before any job starts (the recipe is checked when the DAG
    # is built; the rl job checks again before it touches its work dir, tests/unit/test_rl_work_dir.py),
    # and the finished training's checkpoints stay.
    config = _config(seed=1)
    config["recipes"]["kg_r1"]["rl"]["stepz"] = 3
    third = run_snakemake(tmp_path, config, TARGET)
    assert third.returncode != 0
    assert "recipes.kg_r1.rl.stepz" in third.stdout + third.stderr
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == checkpoints
    assert not [p for p in work.iterdir() if p.name.startswith("superseded-")]

    # F12: every job log ends with a newline.
    for path in (tmp_path / "logs").rglob("*.log"):
        assert path.read_bytes().endswith(b"\n"), path
