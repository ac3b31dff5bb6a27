"""Config validation: every error names its config key, so a typo fails `snakemake -n`, not a job
hours into a run.

The checks run in phases; a phase runs only when the ones before it found nothing, since it
relies on what they checked (the recipe checks parse every recipe the reference checks then use).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ragrl.config import config_errors, drop_null_entries
from ragrl.errors import InputError
from ragrl.models import ModelNameError, check_model_name
from ragrl.recipe import parse_recipe
from ragrl.retrieval.factory import factory_error
from ragrl.workflow.table import Workflow, method_of


def normalise(config: dict) -> dict:
    """Remove, in place, the entries an overlay set to null (ragrl.config.drop_null_entries): the one
    change made to config before validation, which then fills the schema's defaults in."""
    return drop_null_entries(config)


def validate(config: dict, schema_path: str | Path) -> list[str]:
    """Every error of the first failing phase (schema, models, recipes, references, SFT routes, index
    factories, pipeline methods), one line each, as `config key 'a.b': message`; [] for a valid config.

    The checks after the schema's read defaults, so `config` is the config with the schema's
    defaults filled in (Snakemake's validate(set_default=True)); it is not changed."""
    errors = config_errors(config, schema_path)
    if errors:
        return errors
    # One Workflow for every phase: its run table is computed once, on first use (after the recipe
    # checks have passed, as the phases run in order).
    try:
        wf = Workflow(config)
    except InputError as exc:  # a pipeline plug-in that cannot be loaded
        return [str(exc)]
    for phase in PHASES:
        errors = phase(wf)
        if errors:
            return errors
    return []


def model_errors(wf: Workflow) -> list[str]:
    config = wf.config
    for key in ("policy", "embedding"):
        try:
            check_model_name(config["models"][key], key=f"models.{key}")
        except ModelNameError as exc:
            # A typo in a model name must not surface hours into a run; the first one is enough.
            return [str(exc)]
    return []


def recipe_errors(wf: Workflow) -> list[str]:
    """Every key of every recipe section against the dataclass or method it feeds, and sft.from."""
    errors = []
    recipes = wf.config["recipes"]
    for name, settings in recipes.items():
        try:
            parse_recipe(settings, name)
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
            continue
        owner = (settings.get("sft") or {}).get("from")
        if owner is not None and (owner not in recipes or owner == name
                                  or (recipes[owner].get("sft") or {}).get("from")
                                  or recipes[owner].get("env") != settings.get("env")):
            errors.append(f"config key 'recipes.{name}.sft.from': {owner!r} must be another recipe of the same "
                          "env that trains its own SFT model")
    return errors


def reference_errors(wf: Workflow) -> list[str]:
    """Names that point at other config entries: a dangling one must fail here, not as a "missing
    input" deep in the DAG."""
    config = wf.config
    errors = []
    retrieval, datasets = config["retrieval"], config["datasets"]
    # The passage corpus matters only where something retrieves passages (KG agents do not).
    uses_passages = retrieval["eval"]["datasets"] or any("retriever" in method_of(r).inputs
                                                         for r in config["recipes"].values())
    if uses_passages and retrieval["corpus"] not in config["corpora"]:
        errors.append(f"config key 'retrieval.corpus': '{retrieval['corpus']}' is not a key of corpora {sorted(config['corpora'])}")
    errors += _unknown(retrieval["eval"]["datasets"], datasets, "retrieval.eval.datasets", "datasets")
    for name in retrieval["indexes"]:
        if name in ("bm25", "hybrid"):
            errors.append(f"config key 'retrieval.indexes.{name}': '{name}' is reserved for the sparse/hybrid retrievers")
    if retrieval["hybrid"] and not (retrieval["bm25"] and retrieval["indexes"]):
        errors.append("config key 'retrieval.hybrid': needs retrieval.bm25 and at least one dense index")
    errors += mixed_input_errors(config)
    for name, spec in datasets.items():
        if "kg" in spec and spec["kg"] not in config["kgs"]:
            errors.append(f"config key 'datasets.{name}.kg': '{spec['kg']}' is not a key of kgs {sorted(config['kgs'])}")
    for name, settings in config["recipes"].items():
        errors += _recipe_reference_errors(wf, name, settings)
    errors += _unknown(config["evaluation"]["datasets"], datasets, "evaluation.datasets", "datasets")
    return errors


def _unknown(names: list[str], known: dict, key: str, what: str) -> list[str]:
    return [f"config key '{key}[{i}]': '{name}' is not a key of {what} {sorted(known)}"
            for i, name in enumerate(names) if name not in known]


def _recipe_reference_errors(wf: Workflow, name: str, settings: dict) -> list[str]:
    config, key = wf.config, f"recipes.{name}"
    errors = []
    inputs = method_of(settings).inputs
    if "retriever" in inputs and settings.get("retriever") not in wf.retrievers():
        errors.append(f"config key '{key}.retriever': '{settings.get('retriever')}' is not one of {wf.retrievers()}")
    datasets = [("train_dataset", settings["train_dataset"])]
    datasets += [(f"eval_datasets[{i}]", d) for i, d in enumerate(settings.get("eval_datasets", []))]
    for field, dataset in datasets:
        if dataset not in config["datasets"]:
            errors.append(f"config key '{key}.{field}': '{dataset}' is not a key of datasets")
        elif "graph" in inputs and "kg" not in config["datasets"][dataset]:
            errors.append(f"config key '{key}.{field}': dataset '{dataset}' names no kg (datasets.{dataset}.kg), "
                          f"which method {settings['env']!r} needs")
    return errors


def mixed_input_errors(config: dict) -> list[str]:
    """A list of formats pairs with the files by position (a mixed corpus or QA set)."""
    errors = []
    for section, files in (("corpora", "inputs"), ("datasets", "path")):
        for name, spec in config[section].items():
            fmt, paths = spec["format"], spec[files]
            if isinstance(fmt, list) and not isinstance(paths, list):
                errors.append(f"config key '{section}.{name}.{files}': a list of formats needs a list of files, one each")
            elif isinstance(fmt, list) and len(fmt) != len(paths):
                errors.append(f"config key '{section}.{name}.format': {len(fmt)} formats for {len(paths)} "
                              f"{files} (one each, in order)")
            elif section == "datasets" and isinstance(paths, list) and "parquet" in ([fmt] if isinstance(fmt, str) else fmt):
                errors.append(f"config key 'datasets.{name}.format': a QA parquet is used in place and cannot be "
                              "mixed with other files; mix files in the public formats")
    return errors


def sft_route_errors(wf: Workflow) -> list[str]:
    """A route that cannot make SFT data from its dataset (gold plans on real questions), saying
    what to set instead."""
    config = wf.config
    errors = []
    for name, settings in config["recipes"].items():
        parsed = parse_recipe(settings, name)
        method, dataset = parsed.method, config["datasets"][settings["train_dataset"]]
        if not wf.sft_enabled(name) or parsed.sft_source != "gold" or method.gold_sft_reason is None:
            continue
        why = method.gold_sft_reason(dataset)
        if why:
            errors.append(f"config key 'recipes.{name}.sft.source': gold (the default) cannot be used: {why}. "
                          "Set sft.source: teacher (with sft.teacher: {model}, served by the job, or "
                          "{base_url, model}), sft.source: import (with sft.import: {path, format}), "
                          "or sft.enabled: false")
    return errors


def index_factory_errors(wf: Workflow) -> list[str]:
    """FAISS parses a factory string without data: a typo fails `snakemake -n`, not the index job
    hours later with a bare swig RuntimeError."""
    return [f"config key 'retrieval.indexes.{name}': {reason}"
            for name, factory in wf.config["retrieval"]["indexes"].items()
            if (reason := factory_error(factory)) is not None]


def pipeline_errors(wf: Workflow) -> list[str]:
    """Each enabled pipeline method's own checks (ragrl.workflow.pipelines), after the generic ones
    they rely on (the recipes' runs)."""
    return [e for plan in wf.pipelines.values() for e in plan.errors()]


PHASES: tuple[Callable[[Workflow], list[str]], ...] = (
    model_errors, recipe_errors, reference_errors, sft_route_errors, index_factory_errors, pipeline_errors)
