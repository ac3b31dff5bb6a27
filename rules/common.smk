# Shared helpers: config validation, path functions, per-rule resources.
# No workflow logic lives here; the stages are in src/ragrl.

import os
import sys
from pathlib import Path

from snakemake.utils import validate

# The workflow imports a few standard-library-only helpers of its own package; putting src/ on the
# path lets `snakemake` run from any environment that has Snakemake, as conda-based clusters do.
# Jobs run `python -m ragrl ...` in whatever env they get (the venv here, a conda env on a
# cluster); PYTHONPATH makes that the workflow's own copy without installing it into each env.
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
os.environ.update(PYTHONPATH=os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p))

from ragrl.config import config_errors  # noqa: E402
from ragrl.models import ModelNameError, check_model_name  # noqa: E402
from ragrl.paths import hf_model_files, world_files  # noqa: E402


_errors = config_errors(config, Path(workflow.basedir) / "config/schemas/config.schema.yaml")
if _errors:
    raise WorkflowError("invalid config:\n  " + "\n  ".join(_errors))
validate(config, schema="../config/schemas/config.schema.yaml", set_default=True)


def _check_models():
    # Fail before any job starts: a typo in a model name must not surface hours into a run.
    for key in ("policy", "embedding"):
        try:
            check_model_name(config["models"][key], key=f"models.{key}")
        except ModelNameError as exc:
            raise WorkflowError(str(exc)) from None


_check_models()

RESULTS = "results"


def world_dir():
    return f"{RESULTS}/world"


def world_outputs():
    return [f"{world_dir()}/{f}" for f in world_files()]


def tiny_model_dir():
    return f"{RESULTS}/models/tiny"


def policy_dir():
    """The base policy: the locally built tiny model, or whatever config names."""
    policy = config["models"]["policy"]
    return tiny_model_dir() if policy == "tiny" else policy


def policy_inputs():
    # A hub id or an external path is not a workflow output, so rules depend on it only by name.
    if config["models"]["policy"] == "tiny":
        return [f"{tiny_model_dir()}/{f}" for f in hf_model_files()]
    return []


def output_dir(wildcards, output):
    """The directory of a rule's first output (a stage's --out), derived so it works without a shared FS."""
    return os.path.dirname(output[0])


def input_dir(wildcards, input):
    return os.path.dirname(input[0])


def policy_param(wildcards, input):
    # The built tiny policy is an input file; a hub id or an external path is passed by name.
    return os.path.dirname(input[0]) if input else config["models"]["policy"]


def rule_resources(rule_name):
    """Resources from config: the entry named after the rule, over the default entry."""
    merged = dict(config["resources"]["default"])
    merged.update(config["resources"]["rules"].get(rule_name, {}))
    merged.setdefault("mem_mb", 2000)
    merged.setdefault("runtime", 30)
    merged.setdefault("gpu", 0)
    merged.pop("threads", None)
    return merged


def rule_threads(rule_name):
    merged = dict(config["resources"]["default"])
    merged.update(config["resources"]["rules"].get(rule_name, {}))
    return merged.get("threads", 1)


def all_outputs():
    outputs = world_outputs()
    outputs.append(f"{RESULTS}/checks/policy_generate.txt")
    return outputs
