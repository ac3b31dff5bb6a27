"""HARR's training loop: rollouts of G per question, one GRPO update per step, resumable.

Layout under `out_dir`:

    checkpoints/step-N/   trainable.safetensors (the encoder's trainable tensors: LoRA adapters,
                          or everything in a full fine-tune), optimizer.pt, state.json (written last)
    final/                state.json {"finished": true, "step": N} and encoder/ (merged
                          sentence-transformers model, when the policy can save one)
    train_log.jsonl       one JSON line per step
    definition.json       what the work belongs to (ragrl.workdir, written by the stage before
                          training): work of another definition is moved aside, never resumed, and
                          deleted once this run saves its first checkpoint

Questions of step s are a function of (seed, s) alone, and the rollout callback is given s, so a
run resumed from checkpoint N makes the same steps N+1.. as the run that was killed would have
(the callback seeds its sampler from the step). Checkpoints hold tensors and numbers only and are
read back with weights_only=True.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ragrl import hostinfo
from ragrl.errors import InputError
from ragrl.io import atomic_dir, atomic_path, write_json
from ragrl.progress import progress
from ragrl.settings import RetrieverTrainConfig  # noqa: F401  (stdlib settings, re-exported)
from ragrl.train.retriever_grpo import Trajectory, update
from ragrl.train.rl import prompt_indices
from ragrl.workdir import release_superseded

_STEP = re.compile(r"^step-(\d+)$")
STATE = "state.json"


RolloutFn = Callable[[Sequence[Mapping[str, Any]], int], list[Trajectory]]


def step_questions(n_rows: int, step: int, per_step: int, seed: int) -> list[int]:
    """Row indices of 1-based `step`: the RL core's seeded per-epoch slices (ragrl.train.rl)."""
    if n_rows < 1:
        raise InputError("HARR training has no questions (did the filter keep none?)")
    return prompt_indices(n_rows, per_step, step, seed)


def _trainable(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().contiguous() for n, p in policy.named_parameters() if p.requires_grad}


def _checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    root = out_dir / "checkpoints"
    found = [(int(m.group(1)), p) for p in root.glob("step-*") if (m := _STEP.match(p.name)) and (p / STATE).is_file()]
    return sorted(found)


def _save(out_dir: Path, step: int, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
          cfg: RetrieverTrainConfig) -> None:
    from safetensors.torch import save_file

    with atomic_dir(out_dir / "checkpoints" / f"step-{step}") as tmp:
        save_file(_trainable(policy), str(tmp / "trainable.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        write_json({"step": step, "config": asdict(cfg)}, tmp / STATE)
    for _, old in _checkpoints(out_dir)[: -cfg.keep_checkpoints]:
        shutil.rmtree(old)
    # The work of an earlier definition (ragrl.workdir) was kept until this run had something to resume from.
    release_superseded(out_dir)


def _resume(out_dir: Path, policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    from safetensors.torch import load_file

    found = _checkpoints(out_dir)
    if not found:
        return 0
    step, ckpt = found[-1]
    tensors = load_file(str(ckpt / "trainable.safetensors"))
    expected = set(_trainable(policy))
    if set(tensors) != expected:
        raise InputError(f"{ckpt}: its trainable tensors do not match this encoder's "
                         f"({len(set(tensors) ^ expected)} names differ); was it made with other settings?")
    with torch.no_grad():
        params = dict(policy.named_parameters())
        for name, value in tensors.items():
            params[name].copy_(value)
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    print(f"[resume] {out_dir}: from step {step} ({ckpt})", flush=True)
    return step


def _log_lines_upto(log: Path, step: int) -> list[str]:
    if not log.is_file():
        return []
    return [line for line in log.read_text().splitlines() if line and json.loads(line)["step"] <= step]


def train_retriever(policy: torch.nn.Module, index: Any, rows: Sequence[Mapping[str, Any]], rollout: RolloutFn,
                    out_dir: str | Path, cfg: RetrieverTrainConfig) -> Path:
    """Train the query encoder; return out_dir/final. Re-running after a kill resumes."""
    out_dir = Path(out_dir)
    final = out_dir / "final"
    if (final / STATE).is_file() and json.loads((final / STATE).read_text()).get("step", -1) >= cfg.steps:
        return final
    params = [p for p in policy.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the query encoder has no trainable parameters")
    # Constant learning rate, as the authors' lr_scheduler_type constant: no scheduler state to resume.
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    done = _resume(out_dir, policy, optimizer)
    segments = hostinfo.training_segments(out_dir, done, cfg.steps)
    # The index's encoder it starts from is a hub or packaged model: no record to chain.
    record = hostinfo.training_record("harr", segments)
    log = out_dir / "train_log.jsonl"
    lines = _log_lines_upto(log, done)  # steps after the checkpoint are made again
    for step in progress(range(done + 1, cfg.steps + 1), desc="HARR retriever GRPO", total=cfg.steps - done,
                         unit="step"):
        batch = [rows[i] for i in step_questions(len(rows), step, cfg.questions_per_step, cfg.seed)]
        trajectories = rollout(batch, step)
        stats = update(policy, index, optimizer, trajectories, alpha=cfg.alpha, clip_eps=cfg.clip_eps,
                       max_grad_norm=cfg.max_grad_norm, loss_agg=cfg.loss_agg)
        lines.append(json.dumps({"step": step, **stats}, sort_keys=True))
        with atomic_path(log) as tmp:
            tmp.write_text("\n".join(lines) + "\n")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _save(out_dir, step, policy, optimizer, cfg)
    with atomic_dir(final) as tmp:
        save_merged = getattr(policy, "save_merged", None)
        if save_merged is not None:
            save_merged(tmp / "encoder")
            hostinfo.write_record(tmp / "encoder", record)
        write_json({"finished": True, "step": cfg.steps, "config": asdict(cfg)}, tmp / STATE)
    return final
