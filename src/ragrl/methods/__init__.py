"""Methods as plug-ins: one module per method, looked up by name, never branched on.

A method (Search-R1's search agent, RAG-R1's multi-query agent, KG-R1's KG agent, a closed-book
baseline, or one a researcher writes) is a `Method` declared in one module: its environment
factory, its reward, its cold-start SFT-data builder, the workflow inputs its environment reads,
the metrics its evaluation adds and the RL backends it supports. The CLI, the stages, the
evaluation, the rules and the verl bridge look a method up here and call its hooks; none of them
names a method (tests/test_methods.py checks that).

A recipe names its method with `env:`. Built-in methods live in this package; any other module
that defines a module-level `METHOD` is loaded from the recipe's `plugin:` (a dotted module name
or a path to a .py file), so a new method needs no edit of this package, the CLI or the rules.

This module and the method modules import only the standard library at import time: the
workflow (`rules/common.smk`) reads the declarations to plan the DAG without importing torch.
Hooks import what they need when called.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What an environment may read, by kind (a passage retriever, a knowledge graph): the rules turn each into file inputs and CLI flags, the
# CLI turns the flags back into objects (ragrl.stages.agent.load_backends).
INPUT_KINDS = ("retriever", "graph")
# Cold-start SFT routes every agent method has (ragrl.stages.agent); "gold" is the method's own.
GENERIC_SFT_SOURCES = ("teacher", "import")
RL_BACKENDS = ("local", "verl")


@dataclass(frozen=True)
class Score:
    """A trajectory's reward: the global scalar, optional per-turn rewards (turn-level
    advantages), and the named components that go into the training log."""

    reward: float
    turn_rewards: list[float] | None = None
    components: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    """Everything the generic layers need to know about one method.

    Hooks (called with a parsed `ragrl.recipe.Recipe`):
      make_environment(recipe, backends) -> Environment     backends: {input kind: object}
      score(recipe, trajectory, row) -> Score                 row: the QA row (golden_answers, ...)
      verl_reward(weights, trajectory, golds) -> dict         {"score", components}: verl's reward of a
                                                              trajectory our agent loop recorded (a dict:
                                                              response_text, answer, actions = its turn
                                                              record)
      gold_sft(recipe, qa_path, policy, env, backends, out, limit) -> stats   (sft.source gold)
      gold_sft_reason(dataset_spec) -> str | None             why gold SFT data cannot be planned
      eval_metrics(recipe, row, trajectory) -> dict           extra metric columns per prediction (a
                                                              value may be None: left out of its mean)
      eval_group(recipe, row) -> str | None                   the row's group in metrics.json's
                                                              by_type (default: metadata.type)
      rollout(cfg) -> RolloutConfig                           the method's rollout settings, applied
                                                              when a recipe is parsed (every stage)
      files(recipe) -> {name: path}                           files the hooks read besides the
                                                              environment's inputs (a KB): inputs of
                                                              the recipe's jobs
      engine(generator, tokenizer, env, rollout_cfg) -> engine   the episode loop RL and evaluation
                                                              drive (default: the tag-action
                                                              `RolloutEngine`): `run_rows(rows, n,
                                                              seed)` -> trajectories with prompt_ids,
                                                              response_ids, loss_mask, turn_index,
                                                              prompt_index; `record(row, traj)` may
                                                              replace the prediction row's generic
                                                              fields
    """

    name: str
    summary: str
    make_environment: Callable[..., Any]
    score: Callable[..., Score]
    inputs: tuple[str, ...] = ()
    reward_keys: tuple[str, ...] = ()
    default_reward: Mapping[str, float] = field(default_factory=dict)
    turn_reward_keys: tuple[str, ...] = ()
    # recipes.<name>.options: settings only this method reads (a dataclass, checked key by key).
    options: type | None = None
    gold_sft: Callable[..., Any] | None = None
    gold_sft_reason: Callable[[Mapping[str, Any]], str | None] | None = None
    eval_metrics: Callable[..., dict] | None = None
    eval_metric_columns: tuple[str, ...] = ()
    eval_group: Callable[..., str | None] | None = None
    rollout: Callable[..., Any] | None = None
    files: Callable[..., Mapping[str, str]] | None = None
    engine: Callable[..., Any] | None = None
    # Columns of the QA file the hooks read besides id, question, golden_answers, metadata.
    row_columns: tuple[str, ...] = ()
    verl_reward: Callable[..., dict] | None = None
    rl_backends: tuple[str, ...] = ("local",)
    # The untrained policy's `base` and `no_retrieval` rows are evaluated with the first recipe
    # whose method says so (an open-domain QA agent; not a KG agent, whose datasets name a KG).
    baselines: bool = False
    # The untrained policy is also evaluated with each recipe of this method (`<recipe>_base`, on
    # the recipe's own datasets and prompt): a method whose task the shared baselines do not pose.
    own_baseline: bool = False
    # Whether an oracle row (the RL policy with every search answered by the question's supporting
    # passages) means something: it does for an agent that reads retrieved passages.
    oracle_row: bool = True
    # How a run of this method changes the rollout settings before evaluation (closed book: no
    # tool turns, its own prompt).
    eval_rollout: Callable[..., Any] | None = None
    sft_data: bool = True  # False: the method has no cold-start SFT (e.g. the closed-book baseline)
    # Option fields holding an OpenAI-compatible endpoint entry {model, base_url?, serve?,
    # api_key_env?} that the hooks call (a judge, an embedder): a job running the hooks starts a vLLM
    # server for each entry without base_url and stops it at the end (ragrl.serving.endpoint_url).
    endpoints: tuple[str, ...] = ()

    def make_engine(self, generator, tokenizer, env, rollout_cfg):
        if self.engine is not None:
            return self.engine(generator, tokenizer, env, rollout_cfg)
        from ragrl.agent.rollout import RolloutEngine

        return RolloutEngine(generator, tokenizer, env, rollout_cfg)

    @property
    def sft_sources(self) -> tuple[str, ...]:
        return (("gold",) if self.gold_sft else ()) + GENERIC_SFT_SOURCES

    def __post_init__(self) -> None:
        bad = [k for k in self.inputs if k not in INPUT_KINDS]
        if bad:
            raise ValueError(f"method {self.name!r}: unknown input kind(s) {bad}; expected some of {INPUT_KINDS}")
        bad = [b for b in self.rl_backends if b not in RL_BACKENDS]
        if bad:
            raise ValueError(f"method {self.name!r}: unknown RL backend(s) {bad}; expected some of {RL_BACKENDS}")
        if self.verl_reward is None and "verl" in self.rl_backends:
            raise ValueError(f"method {self.name!r}: the verl backend needs verl_reward")


_BUILTIN = {
    "search": "ragrl.methods.search",
    "multi_query_search": "ragrl.methods.multi_query_search",
    "kg": "ragrl.methods.kg",
    "none": "ragrl.methods.closed_book",
    "knowrl": "ragrl.methods.knowrl",
    "graph_constructor": "ragrl.methods.graph_constructor",
}
_REGISTRY: dict[str, Method] = {}


def builtin_names() -> tuple[str, ...]:
    return tuple(_BUILTIN)


def register(method: Method) -> Method:
    """Make `method` known by its name (a plug-in module calls this, or just defines METHOD)."""
    known = _REGISTRY.get(method.name)
    if known is not None and known is not method:
        raise ValueError(f"method {method.name!r} is registered twice")
    _REGISTRY[method.name] = method
    return method


def get_method(name: str, plugin: str | None = None) -> Method:
    """The method `name`: built in, already registered, or defined by the module `plugin`."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BUILTIN:
        return register(_module_method(importlib.import_module(_BUILTIN[name]), _BUILTIN[name]))
    if plugin:
        method = _module_method(load_plugin(plugin), plugin)
        if method.name != name:
            raise ValueError(f"plugin {plugin!r} defines method {method.name!r}, not {name!r}")
        return register(method)
    raise ValueError(f"unknown method (env) {name!r}; built in: {sorted(_BUILTIN)}; "
                     "another method needs `plugin: <module or path.py>` in its recipe")


def load_plugin(plugin: str):
    """Import a plug-in module by dotted name or by path (`tests/plugins/echo_method.py`)."""
    if plugin.endswith(".py"):
        path = Path(plugin).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"plugin {plugin!r}: no such file")
        module_name = f"ragrl_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"plugin {plugin!r}: not a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(plugin)


def _module_method(module, where: str) -> Method:
    method = getattr(module, "METHOD", None)
    if not isinstance(method, Method):
        raise ValueError(f"plugin {where!r} defines no METHOD (a ragrl.methods.Method)")
    return method
