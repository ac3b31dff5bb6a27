"""The RL job's work dir: resume a killed run of the same training, start over after a change."""

from __future__ import annotations

from ragrl.train.checkpoint import prepare_work_dir as _prepare_work_dir


def test_same_definition_keeps_checkpoints(tmp_path):
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    (work / "checkpoints" / "step-2").mkdir(parents=True)
    _prepare_work_dir(work, {"lr": 1e-4})
    assert (work / "checkpoints" / "step-2").is_dir()


def test_changed_definition_starts_over(tmp_path):
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    (work / "checkpoints" / "step-2").mkdir(parents=True)
    _prepare_work_dir(work, {"lr": 3e-4})
    assert not (work / "checkpoints").exists()


def test_final_without_weights_is_rebuilt(tmp_path):
    # Snakemake deletes a re-run job's declared outputs (final/model.safetensors) first.
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    (work / "final").mkdir()
    (work / "final" / "trainer_state.json").write_text("{}")
    _prepare_work_dir(work, {"lr": 1e-4})
    assert not (work / "final").exists()
