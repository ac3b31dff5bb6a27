"""The checkpoint-writing half of tests/verl_standin_launcher.sh (runs in the verl venv).

Writes <trainer.default_local_dir>/global_step_<steps>/actor/ as verl's FSDP checkpoint manager
does for one rank (model_world_size_1_rank_0.pt, fsdp_config.json, huggingface/), the tracker
file, and one file-logger line per step, so `ragrl rl` continues with verl's real model merger.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def main(overrides: list[str]) -> None:
    values = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("+"))
    policy = Path(values["actor_rollout_ref.model.path"])
    steps = int(values["trainer.total_training_steps"])
    root = Path(values["trainer.default_local_dir"])
    actor = root / f"global_step_{steps}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    hf = actor / "huggingface"
    hf.mkdir(exist_ok=True)
    for f in policy.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy(f, hf / f.name)
    (root / "latest_checkpointed_iteration.txt").write_text(str(steps))
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as log:
        for step in range(1, steps + 1):
            log.write(json.dumps({"step": step, "data": {"critic/score/mean": 0.0, "actor/lr": 1e-6}}) + "\n")
    print(f"verl stand-in: {len(overrides)} overrides checked, checkpoint at {actor}")


if __name__ == "__main__":
    main(sys.argv[1:])
