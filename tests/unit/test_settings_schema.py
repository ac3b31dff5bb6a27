"""ragrl.settings declares each setting once: the checks and the schema's blocks are read off it."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from ragrl import settings
from ragrl.errors import InputError
from ragrl.recipe import RL_EXTRA_KEYS, SFT_EXTRA_KEYS

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config/schemas/config.schema.yaml"
SETTINGS = (settings.RolloutConfig, settings.SFTArgs, settings.RLConfig, settings.EncoderTraining,
            settings.RetrieverTrainConfig, settings.HarrEnvironment)


def _gen_schema():
    spec = importlib.util.spec_from_file_location("gen_schema", REPO / "scripts/gen_schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _schema_block(cls) -> dict:
    """The `properties` of the schema block that restates `cls`, found by its KEY."""
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]
    section, *rest = cls.KEY.split(".")
    if section == "harr":
        return schema["harr"]["properties"][rest[0]]["properties"]
    return schema["recipes"]["additionalProperties"]["properties"][section]["properties"]


def test_schema_file_is_what_gen_schema_writes():
    text = SCHEMA.read_text()
    assert _gen_schema().render(text) == text, "config/schemas/config.schema.yaml is stale: run scripts/gen_schema.py"


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_schema_block_states_every_field_as_declared(cls):
    # Independent of the generator's text: the parsed YAML against the declaration, both ways.
    block = _schema_block(cls)
    fragment = settings.schema_fragment(cls)
    # The route keys beside the settings are hand-written (test_methods checks them against recipe.py).
    extra = {"sft": set(SFT_EXTRA_KEYS), "rl": set(RL_EXTRA_KEYS)}.get(cls.KEY, set())
    assert set(block) - extra == set(fragment)
    for name, prop in fragment.items():
        assert block[name] == {k: v for k, v in prop.items() if k != "default"}, name
        default = getattr(cls(), name)
        assert prop["default"] == (list(default) if isinstance(default, tuple) else default), name


def _boundary_cases(cls):
    """(field, a value just inside its bounds or choices, one just outside)."""
    properties = settings.schema_fragment(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        step = 1 if "integer" in properties[f.name].get("type", ()) else 0.5
        if "ge" in meta:
            yield f.name, meta["ge"], meta["ge"] - step
        if "gt" in meta:
            yield f.name, meta["gt"] + step, meta["gt"]
        if "le" in meta:
            yield f.name, meta["le"], meta["le"] + step
        if "choices" in meta:
            yield f.name, meta["choices"][-1], "bogus"


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_checks_and_schema_enforce_the_same_bounds(cls):
    properties = settings.schema_fragment(cls)
    for name, inside, outside in _boundary_cases(cls):
        # k1, the last choice, is allowed only as a reward term, which only ppo takes.
        context = {"use_kl_in_reward": True, "algorithm": "ppo"} if name == "kl_estimator" else {}
        cls(**{**context, name: inside})
        jsonschema.validate(inside, properties[name])
        with pytest.raises(InputError, match="^" + re.escape(f"{cls.KEY}.{name}={outside!r} must be ")):
            cls(**{**context, name: outside})
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(outside, properties[name])


def test_every_problem_is_named_at_once_and_cross_field_checks_stay():
    with pytest.raises(InputError) as err:
        settings.RLConfig(steps=0, lr=-1.0, loss_agg="mean", use_kl_in_reward=True)
    assert str(err.value) == ("rl.loss_agg='mean' must be one of ('token-mean', 'grpo', 'dr_grpo'); rl.lr=-1.0 must be > 0; "
                              "rl.steps=0 must be >= 1; use_kl_in_reward needs algorithm 'ppo' (not 'grpo')")
    with pytest.raises(InputError, match=r"rollout\.top_p=0 must be in \(0, 1\]"):
        settings.RolloutConfig(top_p=0)
    with pytest.raises(InputError, match="sft needs epochs > 0 or max_steps > 0"):
        settings.SFTArgs(epochs=0)
    assert settings.SFTArgs(epochs=0, max_steps=5).max_steps == 5  # max_steps overrides epochs
    with pytest.raises(InputError, match="needs topk <= pool_size"):
        settings.HarrEnvironment(topk=5, pool_size=3)
    with pytest.raises(InputError, match="has no {state} placeholder"):
        settings.HarrEnvironment(template="{instruction}")
    with pytest.raises(InputError, match="forced_answer_prefill needs turn_limit_notice"):
        settings.RolloutConfig(turn_limit_notice=False)
    assert not settings.RolloutConfig(turn_limit_notice=False, forced_answer_prefill=False).turn_limit_notice
    # Tied groups are zero-signal only where advantages are normalised per group (grpo, remax).
    with pytest.raises(InputError, match="algorithm 'ppo_clip' takes no filter_tied_groups"):
        settings.RLConfig(algorithm="ppo_clip", filter_tied_groups=True)
    assert settings.RLConfig(algorithm="remax", filter_tied_groups=True).filter_tied_groups
    # None is allowed where the annotation admits it, whatever the bounds.
    assert settings.RLConfig(micro_batch_size=None, clip_eps_high=None).micro_batch_size is None


def test_setting_refuses_two_bounds_on_one_side():
    with pytest.raises(TypeError):
        settings.setting(1, help="x", ge=0, gt=0)
