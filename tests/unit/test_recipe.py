"""Recipe settings from config → typed stage settings, with the offending key named."""

from __future__ import annotations

import json

import pytest

from ragrl.recipe import parse_recipe, rl_config, sft_args

BASE = {"env": "search", "retriever": "flat", "train_dataset": "world_train", "topk": 2,
        "rollout": {"max_turns": 2, "temperature": 0.7}, "sft": {"epochs": 1, "lr": 0.001, "limit": 8},
        "rl": {"steps": 3, "group_size": 2, "lr": 1e-4}, "reward": {"em": 1.0, "format": 0.1}}


def test_parse_maps_settings_onto_stage_configs():
    recipe = parse_recipe(json.dumps(BASE), "search_r1")
    assert recipe.rollout.max_turns == 2 and recipe.topk == 2
    cfg = rl_config(recipe)
    assert cfg.steps == 3 and cfg.group_size == 2
    assert cfg.temperature == 0.7  # follows the rollout: log-probs must be of the sampling distribution
    args = sft_args(recipe)
    assert args.epochs == 1 and args.lr == 0.001


@pytest.mark.parametrize("section,bad,needle", [
    ("rollout", {"max_turnz": 2}, "recipes.search_r1.rollout': unknown setting(s) ['max_turnz']"),
    ("rollout", {"max_obs_tokens": 0}, "recipes.search_r1.rollout'"),
    ("rl", {"loss_agg": "mean"}, "recipes.search_r1.rl'"),
    ("sft", {"lr": -1}, "recipes.search_r1.sft'"),
])
def test_bad_settings_name_their_key(section, bad, needle):
    raw = {**BASE, section: bad}
    with pytest.raises(ValueError) as err:
        recipe = parse_recipe(raw, "search_r1")
        rl_config(recipe)
        sft_args(recipe)
    assert needle in str(err.value)


def test_unknown_env_and_reward_are_rejected():
    with pytest.raises(ValueError, match="recipes.x.env"):
        parse_recipe({**BASE, "env": "web"}, "x")
    with pytest.raises(ValueError, match="recipes.x.reward"):
        parse_recipe({**BASE, "reward": {"bleu": 1.0}}, "x")
