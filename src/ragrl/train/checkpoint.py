"""Checkpoints that make an RL run resumable after a kill, and the final model.

Layout under `out_dir`:

    checkpoints/step-N/            one directory per checkpoint, published by a single rename
        config.json, generation_config.json, model.safetensors   policy weights (HF format)
        tokenizer files                                          so a checkpoint can be evaluated as is
        optimizer.pt                  torch optimizer state (single process / DDP: identical on all ranks)
        optimizer-rank{R}.pt          DeepSpeed ZeRO-1/2: each rank's optimizer partition instead
        rng-rank{R}.pt                python / numpy / torch / cuda RNG states of rank R
        scheduler.json                LR scheduler state (plain numbers)
        trainer_state.json            step, log_offset, num_processes, config; written last
        critic/                       algorithm ppo: the value model (HF token-classification
                                      model with one label), its optimizer.pt and scheduler.json
    final/                          HF model + tokenizer + trainer_state.json ({"finished": true})
    train_log.jsonl                 one JSON line per step

Only tensors, numbers and strings are ever pickled, and everything is read back with
torch.load(weights_only=True): a checkpoint directory cannot execute code when resumed. That is
why DeepSpeed's own save_checkpoint (which pickles loss-scaler and enum objects) is not used.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ragrl import hostinfo
from ragrl.errors import InputError
from ragrl.io import atomic_dir, publish_tree_modes, write_json
from ragrl import workdir
from ragrl.workdir import release_superseded

CHECKPOINTS = "checkpoints"
FINAL = "final"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # one file, or shards and their index
CRITIC = "critic"


# --- locating ----------------------------------------------------------------------------------


def list_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first. A directory without trainer_state.json is not one."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / TRAINER_STATE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def read_trainer_state(directory: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(directory) / TRAINER_STATE).read_text())


def is_finished(out_dir: str | os.PathLike, steps: int) -> bool:
    """True when out_dir/final holds a model trained for at least `steps` steps. Without its
    weights (Snakemake deletes a re-run job's declared output first) it is not finished."""
    final = Path(out_dir) / FINAL
    state_file = final / TRAINER_STATE
    if not state_file.is_file() or not any((final / n).is_file() for n in _WEIGHTS):
        return False
    state = json.loads(state_file.read_text())
    return bool(state.get("finished")) and int(state.get("step", -1)) >= steps


def remove_stale_temporaries(out_dir: str | os.PathLike) -> None:
    """Delete half-written checkpoint directories left by a killed run (main process only)."""
    root = Path(out_dir) / CHECKPOINTS
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".") and child.name.endswith(".tmp") and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def truncate_log(path: str | os.PathLike, offset: int) -> None:
    """Cut the step log back to `offset` bytes: lines of steps after the checkpoint are redone."""
    path = Path(path)
    if not path.exists():
        if offset:
            raise FileNotFoundError(f"{path} is missing but the checkpoint expects {offset} bytes of it")
        return
    if path.stat().st_size < offset:
        raise InputError(f"{path} is shorter ({path.stat().st_size} B) than the checkpoint's log offset {offset}")
    os.truncate(path, offset)


# --- RNG ---------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        # numpy's key array becomes a tensor so that weights_only loading accepts it.
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuples(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value):
    # random.setstate insists on tuples; be tolerant of a loader that returned lists.
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


# --- optimizer ---------------------------------------------------------------------------------


def _zero_optimizer(optimizer):
    """The DeepSpeed ZeRO optimizer behind accelerate's wrapper, or None for a plain torch optimizer."""
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and type(inner).__module__.startswith("deepspeed."):
        return inner
    return None


# Of a ZeRO-1/2 optimizer's state_dict only these are saved: the base (torch) optimizer state of
# this rank's partition and its fp32 master weights. The rest (loss scaler object, enums, slice
# maps) is configuration, which the resumed optimizer already has from the same DeepSpeed config.
_ZERO_KEYS = ("base_optimizer_state", "single_partition_of_fp32_groups", "partition_count")


def save_optimizer(accelerator, optimizer, directory: Path) -> None:
    zero = _zero_optimizer(optimizer)
    if zero is not None:
        if _zero_stage(accelerator) == 3:
            raise NotImplementedError("resumable checkpoints support DeepSpeed ZeRO stages 1 and 2, not 3")
        full = zero.state_dict()
        part = {key: full[key] for key in _ZERO_KEYS}
        part["num_processes"] = accelerator.num_processes
        torch.save(part, directory / f"optimizer-rank{accelerator.process_index}.pt")
    elif accelerator.is_main_process:
        torch.save(optimizer.state_dict(), directory / "optimizer.pt")


def load_optimizer(accelerator, optimizer, directory: Path) -> None:
    zero = _zero_optimizer(optimizer)
    if zero is None:
        state = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state)
        return
    path = directory / f"optimizer-rank{accelerator.process_index}.pt"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} missing: a ZeRO checkpoint must be resumed with the DeepSpeed setup that wrote it"
        )
    part = torch.load(path, map_location="cpu", weights_only=True)
    if part["num_processes"] != accelerator.num_processes:
        raise InputError(
            f"checkpoint {directory} was written by {part['num_processes']} processes; ZeRO optimizer partitions "
            f"cannot be resumed by {accelerator.num_processes}"
        )
    current = zero.state_dict()
    current.update({key: part[key] for key in _ZERO_KEYS})
    # Every rank reads only its own entry of the list; fp32 master weights come from the file so
    # that bf16 training resumes without the precision loss of re-deriving them from bf16 weights.
    zero.load_state_dict([current] * accelerator.num_processes, load_optimizer_states=True, load_from_fp32_weights=True)


# --- model -------------------------------------------------------------------------------------


def _zero_stage(accelerator) -> int:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return int(plugin.zero_stage) if plugin is not None else 0


def gather_state_dict(accelerator, model) -> dict | None:
    """Full weights when they are sharded (ZeRO-3; a collective, so every rank calls it), else None:
    with DDP and ZeRO-1/2 every rank holds the whole model and save_pretrained can read it directly."""
    return accelerator.get_state_dict(model) if _zero_stage(accelerator) == 3 else None


def write_model(accelerator, model, state_dict: dict | None, directory: Path) -> None:
    """HF save_pretrained (safetensors) of the policy; main process only."""
    kwargs = {"state_dict": state_dict} if state_dict is not None else {}
    accelerator.unwrap_model(model).save_pretrained(directory, safe_serialization=True, **kwargs)


def copy_tokenizer(source_dir: str | os.PathLike, directory: Path) -> None:
    import transformers

    transformers.AutoTokenizer.from_pretrained(source_dir).save_pretrained(directory)


# --- saving and loading a checkpoint -----------------------------------------------------------


def save_checkpoint(
    accelerator,
    model,
    optimizer,
    scheduler,
    out_dir: str | os.PathLike,
    step: int,
    trainer_state: dict[str, Any],
    keep: int,
    tokenizer_dir: str | os.PathLike | None = None,
    critic: tuple[Any, Any, Any] | None = None,
) -> Path:
    """Write checkpoints/step-N on all ranks, publish it with one rename, then drop all but the last `keep`.

    Must be called by every process (ranks write their own RNG and optimizer-partition files).
    `critic`: (model, optimizer, scheduler) of the value model (algorithm ppo), saved under critic/
    in the same checkpoint, so that the policy and its critic are always resumed from one step.
    """
    root = Path(out_dir) / CHECKPOINTS
    final_dir = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if critic is not None:
            (tmp / CRITIC).mkdir()
    accelerator.wait_for_everyone()

    state_dict = gather_state_dict(accelerator, model)
    save_optimizer(accelerator, optimizer, tmp)
    torch.save(rng_state(), tmp / f"rng-rank{accelerator.process_index}.pt")
    if critic is not None:
        critic_model, critic_optimizer, critic_scheduler = critic
        critic_state = gather_state_dict(accelerator, critic_model)
        save_optimizer(accelerator, critic_optimizer, tmp / CRITIC)
    if accelerator.is_main_process:
        write_model(accelerator, model, state_dict, tmp)
        if tokenizer_dir is not None:
            copy_tokenizer(tokenizer_dir, tmp)
        write_json(scheduler.state_dict(), tmp / "scheduler.json")
        if critic is not None:
            write_model(accelerator, critic_model, critic_state, tmp / CRITIC)
            write_json(critic_scheduler.state_dict(), tmp / CRITIC / "scheduler.json")
    accelerator.wait_for_everyone()

    if accelerator.is_main_process:
        # trainer_state.json last: it is what makes a directory count as a checkpoint.
        write_json({**trainer_state, "step": step, "num_processes": accelerator.num_processes}, tmp / TRAINER_STATE)
        publish_tree_modes(tmp)
        if final_dir.exists():
            shutil.rmtree(final_dir)
        os.replace(tmp, final_dir)
        for _, old in list_checkpoints(out_dir)[: -max(keep, 1)]:
            shutil.rmtree(old, ignore_errors=True)
        # The work of an earlier definition was kept until this run had something to resume from.
        release_superseded(out_dir)
    accelerator.wait_for_everyone()
    return final_dir


def load_checkpoint_state(
    accelerator, optimizer, scheduler, directory: str | os.PathLike, critic: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    """Restore optimizer, scheduler and this rank's RNG from a checkpoint; returns its trainer_state.

    The weights are not touched here: the caller builds the policy from the checkpoint directory
    (it is an HF model directory) and the critic from its critic/ directory before wrapping them.
    `critic`: (optimizer, scheduler) of the value model, restored from critic/.
    """
    directory = Path(directory)
    state = read_trainer_state(directory)
    load_optimizer(accelerator, optimizer, directory)
    scheduler.load_state_dict(json.loads((directory / "scheduler.json").read_text()))
    if critic is not None:
        critic_optimizer, critic_scheduler = critic
        load_optimizer(accelerator, critic_optimizer, directory / CRITIC)
        critic_scheduler.load_state_dict(json.loads((directory / CRITIC / "scheduler.json").read_text()))
    rng_file = directory / f"rng-rank{accelerator.process_index}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True))
    else:
        # A different process count: the run continues correctly but not bit-for-bit.
        print(f"[rl] warning: no {rng_file.name} in {directory}; RNG streams start afresh", file=sys.stderr)
    return state


def save_final(
    accelerator, model, out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike, trainer_state: dict[str, Any],
    host_record: dict | None = None,
) -> Path:
    """out_dir/final: HF model + the policy's tokenizer (+ `host_record` as ragrl.hostinfo.RECORD),
    published atomically; call on every rank."""
    final = Path(out_dir) / FINAL
    state_dict = gather_state_dict(accelerator, model)
    if accelerator.is_main_process:
        with atomic_dir(final) as tmp:
            write_model(accelerator, model, state_dict, tmp)
            copy_tokenizer(tokenizer_dir, tmp)
            if host_record is not None:
                hostinfo.write_record(tmp, host_record)
            write_json({**trainer_state, "finished": True}, tmp / TRAINER_STATE)
    accelerator.wait_for_everyone()
    return final


def prepare_work_dir(out_dir: Path, definition: dict, inputs: dict | None = None) -> None:
    """Keep checkpoints only if they belong to this exact training (settings and input contents,
    see ragrl.workdir): they are what a killed job resumes from, but a job re-run because its
    settings or inputs changed must start over, and the old checkpoints are only set aside.
    Both RL backends (ours, verl) call this."""
    workdir.prepare_work_dir(out_dir, definition, inputs, tag="rl")
    final = out_dir / FINAL
    if workdir.is_main_process() and final.exists() and not (final / "model.safetensors").exists():
        # Snakemake removed the declared output (a forced re-run): rebuild final/ from the last
        # checkpoint instead of reporting the finished run as done without its weights.
        shutil.rmtree(final)
