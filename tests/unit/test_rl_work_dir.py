"""The RL job's work dir: resume a killed run of the same training, start over after a change of
settings or of any input's content, and never lose the previous training's checkpoints before
the new one has its own (issue 18 F1, F2)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ragrl import workdir
from ragrl.train.checkpoint import prepare_work_dir as _prepare_work_dir


def _policy(path, weights: bytes):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(weights)
    return path


def _checkpoint(work, step):
    (work / "checkpoints" / f"step-{step}").mkdir(parents=True)
    (work / "checkpoints" / f"step-{step}" / "trainer_state.json").write_text(json.dumps({"step": step}))


def _aside(work):
    return sorted(p.name for p in work.iterdir() if p.name.startswith(workdir.SUPERSEDED))


def test_same_definition_keeps_checkpoints(tmp_path):
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    _prepare_work_dir(work, {"lr": 1e-4})
    assert (work / "checkpoints" / "step-2").is_dir() and not _aside(work)


def test_changed_settings_set_old_checkpoints_aside(tmp_path):
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    _prepare_work_dir(work, {"lr": 3e-4})
    assert not (work / "checkpoints").exists()
    [aside] = _aside(work)
    assert (work / aside / "checkpoints" / "step-2" / "trainer_state.json").is_file()


def test_new_weights_at_the_same_path_do_not_resume(tmp_path, capsys):
    # F1: re-run SFT rewrites sft_merged/ in place; RL must not resume from the old model's steps.
    policy = _policy(tmp_path / "sft_merged", b"old weights")
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4}, {"policy": policy})
    _checkpoint(work, 3)
    (work / "final").mkdir()
    (work / "final" / "model.safetensors").write_bytes(b"old final")
    _prepare_work_dir(work, {"lr": 1e-4}, {"policy": policy})
    assert (work / "checkpoints" / "step-3").is_dir()  # same content: a killed run resumes

    _policy(policy, b"new weights")
    _prepare_work_dir(work, {"lr": 1e-4}, {"policy": policy})
    assert not (work / "checkpoints").exists() and not (work / "final").exists()
    assert "changed: input 'policy'" in capsys.readouterr().out


def test_superseded_work_goes_with_the_first_new_checkpoint(tmp_path):
    from types import SimpleNamespace

    import torch

    from ragrl.train.checkpoint import save_checkpoint

    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    _prepare_work_dir(work, {"lr": 3e-4})
    assert _aside(work)

    class Model(torch.nn.Linear):
        def save_pretrained(self, directory, **kwargs):
            torch.save(self.state_dict(), directory / "weights.pt")

    model = Model(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    accelerator = SimpleNamespace(is_main_process=True, process_index=0, num_processes=1,
                                  state=SimpleNamespace(), wait_for_everyone=lambda: None,
                                  unwrap_model=lambda m: m)
    save_checkpoint(accelerator, model, optimizer, scheduler, work, 1, {"log_offset": 0}, keep=2)
    assert (work / "checkpoints" / "step-1").is_dir() and not _aside(work)


def test_returning_to_the_superseded_definition_resumes_it(tmp_path):
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    _prepare_work_dir(work, {"lr": 3e-4})  # e.g. a typo'd value, reverted before any checkpoint
    _prepare_work_dir(work, {"lr": 1e-4})
    assert (work / "checkpoints" / "step-2").is_dir()


def test_final_without_weights_is_rebuilt(tmp_path):
    # Snakemake deletes a re-run job's declared outputs (final/model.safetensors) first.
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    (work / "final").mkdir()
    (work / "final" / "trainer_state.json").write_text("{}")
    _prepare_work_dir(work, {"lr": 1e-4})
    assert not (work / "final").exists()


def test_unknown_rl_setting_fails_before_the_work_dir_is_touched(tmp_path):
    # F2: `rl: {stepz: 3}` used to delete checkpoints/ and final/ and only then fail on the key.
    from ragrl.recipe import parse_recipe
    from ragrl.stages.agent_rl import train_agent

    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    # Reading the recipe rejects the key (so `snakemake -n` does, before any job) ...
    with pytest.raises(ValueError, match=r"recipes\.kg_r1\.rl.*'stepz'"):
        parse_recipe({"env": "kg", "rl": {"stepz": 3}}, "kg_r1")
    # ... and the RL job checks again before it touches the work dir, whatever built its recipe.
    recipe = dataclasses.replace(parse_recipe({"env": "kg"}, "kg_r1"), rl={"stepz": 3})
    with pytest.raises(ValueError, match=r"recipes\.kg_r1\.rl.*'stepz'"):
        train_agent(recipe, tmp_path / "qa.parquet", tmp_path / "policy", work, None)
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before


def test_content_digest_sees_content_not_names_or_times(tmp_path):
    a = _policy(tmp_path / "a", b"w")
    b = _policy(tmp_path / "b", b"w")
    assert workdir.content_digest(a) == workdir.content_digest(b)
    (b / ".model.safetensors.tmp").write_bytes(b"half-written")  # an atomic write's leftover
    assert workdir.content_digest(a) == workdir.content_digest(b)
    # Where a model was trained is not what it is: the same weights from another host fingerprint alike.
    from ragrl import hostinfo

    assert workdir.PROVENANCE_FILES == (hostinfo.RECORD,)
    hostinfo.write_record(b, hostinfo.training_record("sft", [hostinfo.segment(0)]))
    assert workdir.content_digest(a) == workdir.content_digest(b)
    (b / "model.safetensors").write_bytes(b"v")
    assert workdir.content_digest(a) != workdir.content_digest(b)


def test_only_rank_zero_moves_files(tmp_path, monkeypatch):
    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(TimeoutError, match="rank 1"):
        workdir.prepare_work_dir(work, {"lr": 3e-4}, wait_s=0.2)
    assert (work / "checkpoints" / "step-2").is_dir()  # untouched: rank 0 decides
    assert workdir.prepare_work_dir(work, {"lr": 1e-4}, wait_s=0.2)  # rank 0 already stamped this one


@pytest.mark.parametrize("change", ["qa", "index"])
def test_a_verl_run_on_changed_inputs_does_not_resume(tmp_path, monkeypatch, change):
    """Issue #34's audit, for the verl backend (verl itself resumes whatever global_step_N its
    checkpoint dir holds): its work dir is keyed before verl is launched."""
    import sys

    import transformers

    from ragrl.recipe import parse_recipe
    from ragrl.verl.launch import run_verl

    class Launched(RuntimeError):
        pass

    def stop(*args, **kwargs):
        raise Launched("past the work dir")

    monkeypatch.setenv("RAGRL_VERL_PYTHON", sys.executable)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop)
    recipe = parse_recipe({"env": "search", "rl": {"backend": "verl"}}, "search_r1")
    inputs = {"qa": tmp_path / "qa.parquet", "index": tmp_path / "index"}
    inputs["qa"].write_bytes(b"questions v1")
    _policy(inputs["index"], b"vectors v1")
    policy, work = _policy(tmp_path / "policy", b"w"), tmp_path / "work"

    def run():
        with pytest.raises(Launched):
            run_verl(recipe, inputs["qa"], policy, work, index=inputs["index"])

    run()
    (work / "verl_checkpoints" / "global_step_2").mkdir(parents=True)
    run()
    assert (work / "verl_checkpoints" / "global_step_2").is_dir()  # the same run resumes
    if change == "qa":
        inputs["qa"].write_bytes(b"questions v2")
    else:
        _policy(inputs["index"], b"vectors v2")
    run()
    assert not (work / "verl_checkpoints").exists()
    [aside] = _aside(work)
    assert (work / aside / "verl_checkpoints" / "global_step_2").is_dir()


def test_how_the_work_is_split_resumes_and_what_is_trained_starts_over(tmp_path):
    # An out-of-memory fix (smaller micro-batches or log-prob chunks) or a longer server start-up
    # must resume hours of RL; a changed learning rate is another training.
    from ragrl.recipe import parse_recipe
    from ragrl.stages.agent_rl import resume_key

    def key(**rl):
        return resume_key(parse_recipe({"env": "search", "retriever": "flat", "rl": {"steps": 4, "lr": 1e-5, **rl}},
                                       "search_r1"))

    work = tmp_path / "work"
    _prepare_work_dir(work, {"recipe": key()})
    _checkpoint(work, 2)
    _prepare_work_dir(work, {"recipe": key(logprob_chunk_tokens=64, micro_batch_size=1, checkpoint_every=1,
                                           rollout_engine="auto", rollout_serve={"startup_timeout_s": 1800})})
    assert (work / "checkpoints" / "step-2").is_dir() and not _aside(work)
    _prepare_work_dir(work, {"recipe": key(lr=2e-5)})
    assert not (work / "checkpoints").exists() and len(_aside(work)) == 1


def test_a_row_with_bad_metadata_fails_before_the_work_dir_is_touched(tmp_path):
    """The rewards read a row's metadata when its batch comes up (KG-R1's answer entities): the RL
    job checks every training row first, so a bad row 300 of 400 fails at once, naming the file
    and the row, and the previous checkpoints stay."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragrl.errors import InputError
    from ragrl.recipe import parse_recipe
    from ragrl.stages.agent_rl import train_agent

    work = tmp_path / "work"
    _prepare_work_dir(work, {"lr": 1e-4})
    _checkpoint(work, 2)
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    qa = tmp_path / "qa.parquet"
    metadata = ['{"answers": [{"text": "A", "kb_id": "m.1"}]}'] * 299 + ['{"answers": [{"text": "B"']
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(300)], "question": ["?"] * 300,
                             "golden_answers": [["A"]] * 300, "metadata": metadata}), qa)
    with pytest.raises(InputError, match=r"qa\.parquet: QA row 'q299': metadata: not a JSON object"):
        train_agent(parse_recipe({"env": "kg"}, "kg_r1"), qa, tmp_path / "policy", work, None)
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before
