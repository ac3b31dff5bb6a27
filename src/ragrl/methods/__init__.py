"""Methods as plug-ins: one module per method, looked up by name, never branched on.

A method (Search-R1's search agent, RAG-R1's multi-query agent, KG-R1's KG agent, a closed-book
baseline, or one a researcher writes) is a `Method` declared in one module: its environment
factory, its reward, its cold-start SFT-data builder, the workflow inputs its environment reads,
the metrics its evaluation adds and the RL backends it supports. The CLI, the stages, the
evaluation, the rules and the verl bridge look a method up here and call its hooks; none of them
names a method (tests/workflow/test_methods.py checks that).

A recipe names its method with `env:`. Built-in methods live in this package; any other module
that defines a module-level `METHOD` is loaded from the recipe's `plugin:` (a dotted module name
or a path to a .py file), so a new method needs no edit of this package, the CLI or the rules.

This module and the method modules import only the standard library at import time: the
workflow (`ragrl.workflow`) reads the declarations to plan the DAG without importing torch.
Hooks import what they need when called.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ragrl.errors import InputError

if TYPE_CHECKING:
    # For mypy only: at run time this package imports the standard library alone (see above). The
    # recipe is typed Any in the hooks: ragrl.recipe imports this package, and importing it back,
    # even for mypy, would add an import cycle.
    from ragrl.agent.environments import Environment
    from ragrl.agent.generation import Generator
    from ragrl.settings import RolloutConfig

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


def token_turns(turn_values: Sequence[float], trajectory: Any) -> list[float]:
    """Per-turn values (one per turn record, i.e. per generation call) cut to the calls that
    produced tokens: a last call that generated nothing has a record but no tokens, and its value
    would reach no token yet move the group's turn-reward mean and std."""
    return list(turn_values[: max(trajectory.turn_index, default=-1) + 1])


# The hooks' signatures. Every caller passes a hook's arguments by position, so the parameters are
# positional-only: mypy checks a plug-in's arity and annotated types against them, not its
# parameter names. `recipe` is a parsed `ragrl.recipe.Recipe`; `row` a QA row as a dict (id,
# question, golden_answers, metadata and the method's `row_columns`); `trajectory` what the
# method's engine returned (`ragrl.agent.rollout.Trajectory` with the default engine).


class MakeEnvironment(Protocol):
    """`backends`: {input kind: object} for the method's `inputs` (ragrl.stages.agent.load_backends;
    {} where verl builds prompts). Called by the SFT, RL and evaluation stages and verl's agent loop."""

    def __call__(self, recipe: Any, backends: Mapping[str, Any], /) -> Environment: ...


class ScoreHook(Protocol):
    """The local trainer's reward of one rollout (ragrl.stages.agent_rl.make_rollout_fn)."""

    def __call__(self, recipe: Any, trajectory: Any, row: dict[str, Any], /) -> Score: ...


class VerlReward(Protocol):
    """verl's reward of one response (`compute_score` of the verl bridge): `weights` the
    recipe's reward weights, `trajectory` the turn record our agent loop passed through verl
    ({"response_text", "answer", "actions"}), `golds` the golden answers. Returns {"score": the
    weighted reward, and each component}, every key logged by verl."""

    def __call__(self, weights: Mapping[str, float], trajectory: Mapping[str, Any], golds: Sequence[str],
                 /) -> dict[str, float]: ...


class GoldSFT(Protocol):
    """The `gold` cold-start SFT data (ragrl.stages.agent.sft_data): reads the QA parquet `qa`,
    tokenizes with `policy`'s tokenizer, writes the SFT data to `out` (at most `limit` questions,
    None: all); `env` is what `make_environment` returned. Returns the data's stats (kept, total, ...)."""

    def __call__(self, recipe: Any, qa: Path, policy: Path, env: Any, backends: Mapping[str, Any], out: Path,
                 limit: int | None, /) -> dict[str, Any]: ...


class GoldSFTReason(Protocol):
    """Why gold SFT data cannot be made from `dataset` (a config `datasets` entry: format, path,
    ...), or None when it can: `snakemake -n` fails with the reason (ragrl.workflow.checks)."""

    def __call__(self, dataset: Mapping[str, Any], /) -> str | None: ...


class EvalMetrics(Protocol):
    """Extra prediction columns for one evaluated question (the method's `eval_metric_columns`);
    a None value is left out of its column's mean (ragrl.eval.evaluate)."""

    def __call__(self, recipe: Any, row: dict[str, Any], trajectory: Any, /) -> Mapping[str, float | None]: ...


class EvalGroup(Protocol):
    """The question's group in metrics.json's by_type; None: its metadata.type."""

    def __call__(self, recipe: Any, row: dict[str, Any], /) -> str | None: ...


class RolloutHook(Protocol):
    """New rollout settings from the recipe's: `rollout` when a recipe is parsed (every stage),
    `eval_rollout` before evaluation only."""

    def __call__(self, cfg: RolloutConfig, /) -> RolloutConfig: ...


class Files(Protocol):
    """{name: path} of files the hooks read besides the environment's inputs (a KB): inputs of the
    recipe's jobs (ragrl.workflow)."""

    def __call__(self, recipe: Any, /) -> Mapping[str, str]: ...


class EpisodeEngine(Protocol):
    """The episode loop RL and evaluation drive. `run_rows` returns `n` trajectories per row,
    prompt-major, each with prompt_ids, response_ids, loss_mask, turn_index and prompt_index.
    Evaluation also reads `env.spec.tools`, or calls `record(row, trajectory) -> dict` instead
    where the engine has one (the prediction row's generic fields)."""

    def run_rows(self, rows: Sequence[dict[str, Any]], /, n: int | None = None,
                 seed: int | None = None) -> Sequence[Any]: ...


class EngineHook(Protocol):
    """The method's engine over `env` (what its `make_environment` returned, so typed Any: a
    method with its own engine has its own environment class). A class whose constructor takes
    these is one."""

    def __call__(self, generator: Generator, tokenizer: Any, env: Any, rollout_cfg: RolloutConfig,
                 /) -> EpisodeEngine: ...


@dataclass(frozen=True)
class Method:
    """Everything the generic layers need to know about one method, in two groups.

    Behaviour hooks: functions the stages call, each typed by a Protocol above (its docstring says
    who calls it with what), so mypy checks a plug-in's hooks (tests/unit/test_typecheck.py). Only
    `make_environment` and `score` are required.

    Declarations: plain data the workflow and the recipe parser read without calling anything
    (which inputs the jobs need, which reward keys a recipe may weigh, whether there is cold-start
    SFT, which baseline rows to add, ...).
    """

    name: str
    summary: str
    # ---- behaviour hooks
    make_environment: MakeEnvironment
    score: ScoreHook
    verl_reward: VerlReward | None = None
    gold_sft: GoldSFT | None = None
    gold_sft_reason: GoldSFTReason | None = None
    eval_metrics: EvalMetrics | None = None
    eval_group: EvalGroup | None = None
    # Applied when a recipe is parsed, so SFT data, RL and evaluation share it (a single-turn method).
    rollout: RolloutHook | None = None
    # How a run of this method changes the rollout settings before evaluation (closed book: no
    # tool turns, its own prompt).
    eval_rollout: RolloutHook | None = None
    files: Files | None = None
    # None: the tag-action `ragrl.agent.rollout.RolloutEngine`.
    engine: EngineHook | None = None
    # ---- declarations
    inputs: tuple[str, ...] = ()
    # Columns of the QA file the hooks read besides id, question, golden_answers, metadata.
    row_columns: tuple[str, ...] = ()
    reward_keys: tuple[str, ...] = ()
    default_reward: Mapping[str, float] = field(default_factory=dict)
    turn_reward_keys: tuple[str, ...] = ()
    # recipes.<name>.options: settings only this method reads (a dataclass, checked key by key).
    options: type | None = None
    eval_metric_columns: tuple[str, ...] = ()
    rl_backends: tuple[str, ...] = ("local",)
    sft_data: bool = True  # False: the method has no cold-start SFT (e.g. the closed-book baseline)
    # The untrained policy's `base` and `no_retrieval` rows are evaluated with the first recipe
    # whose method says so (an open-domain QA agent; not a KG agent, whose datasets name a KG).
    baselines: bool = False
    # The untrained policy is also evaluated with each recipe of this method (`<recipe>_base`, on
    # the recipe's own datasets and prompt): a method whose task the shared baselines do not pose.
    own_baseline: bool = False
    # Whether an oracle row (the RL policy with every search answered by the question's supporting
    # passages) means something: it does for an agent that reads retrieved passages.
    oracle_row: bool = True
    # Option fields holding an OpenAI-compatible endpoint entry {model, base_url?, serve?,
    # api_key_env?} that the hooks call (a judge, an embedder): a job running the hooks starts a vLLM
    # server for each entry without base_url and stops it at the end (ragrl.serving.endpoint_url).
    endpoints: tuple[str, ...] = ()

    def make_engine(self, generator: Generator, tokenizer: Any, env: Any, rollout_cfg: RolloutConfig) -> EpisodeEngine:
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
            raise InputError(f"method {self.name!r}: unknown input kind(s) {bad}; expected some of {INPUT_KINDS}")
        bad = [b for b in self.rl_backends if b not in RL_BACKENDS]
        if bad:
            raise InputError(f"method {self.name!r}: unknown RL backend(s) {bad}; expected some of {RL_BACKENDS}")
        if self.verl_reward is None and "verl" in self.rl_backends:
            raise InputError(f"method {self.name!r}: the verl backend needs verl_reward")


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
        raise InputError(f"method {method.name!r} is registered twice")
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
            raise InputError(f"plugin {plugin!r} defines method {method.name!r}, not {name!r}")
        return register(method)
    raise InputError(f"unknown method (env) {name!r}; built in: {sorted(_BUILTIN)}; "
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
            raise InputError(f"plugin {plugin!r}: not a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(plugin)


def _module_method(module, where: str) -> Method:
    method = getattr(module, "METHOD", None)
    if not isinstance(method, Method):
        raise InputError(f"plugin {where!r} defines no METHOD (a ragrl.methods.Method)")
    return method
