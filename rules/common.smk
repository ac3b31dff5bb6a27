# Input functions and thin path helpers: the rules' side of ragrl.workflow, which holds the
# workflow's logic (validation, the run table, lineage, paths) as plain, tested functions.

import json
import os
import sys
from pathlib import Path

from snakemake.utils import validate

# The workflow imports its own package; putting src/ on the path lets `snakemake` run from any
# environment that has Snakemake, as conda-based clusters do. Jobs run `python -m ragrl ...` in
# whatever env they get (the venv here, a conda env on a cluster); PYTHONPATH makes that the
# workflow's own copy without installing it into each env.
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
os.environ.update(PYTHONPATH=os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p))

from ragrl.config import config_errors  # noqa: E402
from ragrl.paths import DENSE_INDEX_FILES, hf_model_files, safe_name  # noqa: E402
from ragrl.workflow import RESULTS, Workflow, lineage, normalise, recipe_json, run_families  # noqa: E402
from ragrl.workflow import rule_resources as _rule_resources, rule_threads as _rule_threads  # noqa: E402
from ragrl.workflow import validate as workflow_errors  # noqa: E402

_SCHEMA = Path(workflow.basedir) / "config/schemas/config.schema.yaml"


def _stop_on(errors):
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


# An overlay drops a default's entry by setting it to null (`recipes: {rag_r1: null}`, `harr: null`);
# config/paper/*.yaml use this to drop the embedded default's toy corpora, datasets and recipes.
normalise(config)
# The schema's errors by key before Snakemake's validate, which names none but fills the defaults
# the other checks read.
_stop_on(config_errors(config, _SCHEMA))
validate(config, schema="../config/schemas/config.schema.yaml", set_default=True)
_stop_on(workflow_errors(config, _SCHEMA))

WF = Workflow(config)


wildcard_constraints:
    corpus="[A-Za-z0-9_]+",
    dataset="[A-Za-z0-9_]+",
    retriever="[A-Za-z0-9_]+",
    index="[A-Za-z0-9_]+",
    shard="[0-9]+",
    n="[0-9]+",


def rule_resources(rule_name):
    """Resources from config: the entry named after the rule, over the default entry."""
    return _rule_resources(config, rule_name)


def rule_threads(rule_name):
    return _rule_threads(config, rule_name)


def output_dir(wildcards, output):
    """The directory of a rule's first output (a stage's --out), derived so it works without a shared FS."""
    return os.path.dirname(output[0])


def input_dir(wildcards, input):
    return os.path.dirname(input[0])


def policy_param(wildcards, input):
    # The built tiny policy is an input file; a hub id or an external path is passed by name.
    return WF.policy_param(input)


def policy_arg(wildcards, input):
    """--policy for rules that name the base policy among other inputs (as input.policy)."""
    return WF.policy_param(input.policy)


# ---------------------------------------------------------------- corpora, QA sets, retrieval


def corpus_inputs(wildcards):
    return config["corpora"][wildcards.corpus]["inputs"]


def qa_source(wildcards):
    return config["datasets"][wildcards.dataset]["path"]


def retriever_inputs(wildcards):
    """The index files one retriever reads (a dense dir's files, the BM25 dir, or both)."""
    return WF.retriever_files(wildcards.corpus, wildcards.retriever)


def retriever_args(wildcards, input):
    """CLI flags selecting that retriever: --index DIR, --bm25 DIR, --mode."""
    return WF.retriever_flags(input, wildcards.retriever)


# ---------------------------------------------------------------- recipes and runs (rules/agents.smk)


def recipe_env_flags(wildcards, input):
    return WF.recipe_env_flags(wildcards.recipe, input)


def run_inputs(wildcards):
    return WF.run_inputs(wildcards.run)


def run_settings_json(wildcards):
    return WF.run_settings_json(wildcards.run)


def run_env_args(wildcards, input):
    return WF.run_env_args(wildcards.run, input)


def run_model_arg(wildcards, input):
    return WF.model_param(WF.runs[wildcards.run].model, input.model)

