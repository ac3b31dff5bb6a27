"""The verl backend of `ragrl rl`: multi-GPU / multi-node GRPO on a Ray cluster (recipe `rl.backend: verl`).

verl 0.9 lives in its own virtualenv (.venv-verl, scripts/verl_venv.sh; envs/verl.yaml on a
cluster) because it pins transformers < 5.11 and the project runs 5.23. So this package is split
by where each module runs:

    overrides.py   pure: recipe + paths -> the `key=value` Hydra overrides of verl.trainer.main_ppo
    data.py        main env: our QA parquet -> verl's RL parquet (prompt, reward_model, extra_info)
    launch.py      main env: what `ragrl rl` runs for backend verl (data, retrieval service, Ray
                   launch via scripts/verl_ray_launch.sh, model merger, training log)
    reward.py      verl env: `compute_score(data_source, solution_str, ground_truth, extra_info)`,
                   loaded by verl's custom-reward loader; a thin wrapper of ragrl.rewards.qa
    agent_loop.py  verl env: our protocol, environments and rollout engine as a verl AgentLoopBase

A package of its own, above `ragrl.recipe` and `ragrl.methods` (it parses the recipe and looks the
method up by name, as the stages do) and below `ragrl.stages`: under `ragrl.train` it made the
core import the plug-ins and the plug-ins the core.

Only the last two import verl; nothing here is imported by the local backend. docs/VERL.md says
how to run it and what is tested without a GPU.
"""
