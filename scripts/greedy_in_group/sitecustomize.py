"""An RL ablation outside the trainer (docs/BENCHMARKS.md, "A greedy rollout in the group"): with
GREEDY_IN_GROUP=1 and this directory on PYTHONPATH, every `ragrl rl` the process starts rolls out
G - 1 samples per prompt and the policy's own greedy rollout of it, and the group's advantages and
loss are taken over all G. Not a ragrl setting: it measured no gain.

    GREEDY_IN_GROUP=1 PYTHONPATH=scripts/greedy_in_group .venv/bin/python scripts/rl_ablation.py \
        --results RUN/results --method search_r1 --from-logs --name search_r1_gig
"""
import os

if os.environ.get("GREEDY_IN_GROUP") == "1":
    import ragrl.stages.agent_rl as agent_rl

    _group_rollouts = agent_rl.group_rollouts

    def group_rollouts(recipe, tokenizer, env, batch_prompts, group_size, model, step, generators=None,
                       generator=None, temperature=None):
        # The greedy call of remax's baseline (temperature 0) and a group of one pass through.
        if temperature is not None or group_size < 2:
            return _group_rollouts(recipe, tokenizer, env, batch_prompts, group_size, model, step, generators,
                                   generator, temperature)
        sampled = _group_rollouts(recipe, tokenizer, env, batch_prompts, group_size - 1, model, step, generators,
                                  generator)
        greedy = _group_rollouts(recipe, tokenizer, env, batch_prompts, 1, None, step, generators, generator,
                                 temperature=0.0)
        return [*sampled, *greedy]

    agent_rl.group_rollouts = group_rollouts
