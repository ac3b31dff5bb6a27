"""Pipeline methods: methods whose jobs are their own rules rather than a recipe's sft → rl → eval
(HARR trains the retriever, AutoGraph-R1's inference stage builds and ranks graphs).

A pipeline is one module defining a module-level `PIPELINE` (a `Pipeline`), its rule file and its
config: the generic layers (ragrl.workflow.table, checks, lineage; rules/common.smk, results.smk;
the Snakefile) ask the enabled pipelines' plans what they add and never name one, so adding a
pipeline edits none of them (tests/workflow/test_methods.py adds one from the tests folder,
tests/plugins/qa_count.py).

The built-in pipelines are enabled by their own top-level config key (`harr:`, `construct_kg:`);
another is named under `pipelines:` with `plugin: <module or path.py>`, its other keys its settings.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragrl.errors import InputError
from ragrl.methods import load_plugin

if TYPE_CHECKING:
    from ragrl.workflow.core import Run
    from ragrl.workflow.table import Workflow

# In this order their plans answer (the results database's inputs, lineage, tables).
BUILTIN = ("ragrl.workflow.harr", "ragrl.workflow.graphs")


class PipelinePlan:
    """What the generic workflow asks of a pipeline, for one config; every answer is empty unless a
    pipeline says otherwise. Output paths are relative to Snakemake's working directory (RESULTS)."""

    def __init__(self, workflow: Workflow):
        self.workflow = workflow

    def errors(self) -> list[str]:
        """Config errors, one line each as `config key 'a.b': message` (run after the generic checks)."""
        return []

    def outputs(self) -> list[str]:
        """What the default target (rule all) asks of this pipeline."""
        return []

    # ---- runs the generic evaluation rule (rules/agents.smk, eval) evaluates for this pipeline

    def eval_runs(self, recipe_runs: Mapping[str, Run]) -> dict[str, Run]:
        """Runs it adds to the run table, made from the recipes' runs; `datasets` set on each."""
        return {}

    def run_inputs(self, run: Run) -> dict[str, Any]:
        """Inputs of one of its runs' evaluation job besides the model and QA sets."""
        return {}

    def run_args(self, run: Run, inputs: Mapping[str, Any]) -> list[str]:
        """The flags its run's evaluation passes in place of a retriever's."""
        return []

    def run_definition(self, run: Run) -> dict:
        """What defines one of its runs (the manifest's config hash)."""
        raise NotImplementedError(f"pipeline adds run {run.id!r} but says nothing of its definition")

    # ---- what the results database reads

    def manifests(self) -> list[str]:
        return []

    def evals(self) -> list[str]:
        """metrics.json files of its own jobs."""
        return []

    def predictions(self) -> list[str]:
        return []

    def train_logs(self) -> list[str]:
        """Training logs, each under a directory named by its run id."""
        return []

    def trained_runs(self) -> list[str]:
        """Run ids with a training log (a training plot each)."""
        return []

    def tables(self) -> list[dict]:
        """Results tables (config results.tables' form) it adds to config's."""
        return []

    def gating_runs(self) -> list[str]:
        """Ids of the workflow's runs whose models this pipeline's own jobs read (HARR's generator):
        the jobs that train them run at a raised priority (Workflow.train_priority), so that the
        pipeline's chain starts as early as it can."""
        return []

    def lineage(self, recipe_lineage: Mapping[str, Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
        """Run id → {family, step, start_run, variant_of, ablation_of} (ragrl.workflow.lineage) of its
        runs, given the recipes' runs' lineage."""
        return {}


@dataclass(frozen=True)
class Pipeline:
    """A pipeline method. name: its name (a built-in's config key, a plug-in's key under
    `pipelines:`); rules: its rule file, relative to the repository root or absolute; plan: builds its
    plan for a Workflow (a PipelinePlan subclass); builtin: enabled by top-level config `name`."""

    name: str
    rules: str
    plan: Callable[[Workflow], PipelinePlan]
    builtin: bool = False


def _module_pipeline(module, where: str) -> Pipeline:
    pipeline = getattr(module, "PIPELINE", None)
    if not isinstance(pipeline, Pipeline):
        raise InputError(f"{where} defines no PIPELINE (a ragrl.workflow.pipelines.Pipeline)")
    return pipeline


def builtin_pipelines() -> list[Pipeline]:
    return [_module_pipeline(importlib.import_module(m), m) for m in BUILTIN]


def enabled_pipelines(config: Mapping[str, Any]) -> list[Pipeline]:
    """The built-ins whose config key is set (not null, not empty), then config `pipelines`' plug-ins.
    InputError names the config key of a plug-in that cannot be loaded."""
    builtins = builtin_pipelines()
    out = [p for p in builtins if config.get(p.name)]
    builtin = {p.name for p in builtins}
    for name, spec in (config.get("pipelines") or {}).items():
        key = f"config key 'pipelines.{name}.plugin'"
        if name in builtin:
            raise InputError(f"config key 'pipelines.{name}': {name!r} is a built-in pipeline (top-level `{name}:`)")
        try:
            pipeline = _module_pipeline(load_plugin(spec["plugin"]), f"{key}: {spec['plugin']!r}")
        except (FileNotFoundError, ImportError) as exc:
            raise InputError(f"{key}: {exc}") from exc
        if pipeline.name != name:
            raise InputError(f"{key}: {spec['plugin']!r} defines pipeline {pipeline.name!r}, not {name!r}")
        out.append(pipeline)
    return out
