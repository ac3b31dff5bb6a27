"""The workflow's logic as plain functions over the config dict: validation, the run table, lineage,
the paths of every stage and the resources of every rule.

The Snakefile (rules/common.smk) builds one `Workflow` from its validated config and its input
functions call it; nothing here imports Snakemake, so all of it is tested as plain Python
(tests/unit/test_workflow_table.py). Standard library + the `ragrl` modules the Snakefile imported before.
"""

from __future__ import annotations

from ragrl.workflow.checks import normalise, validate
from ragrl.workflow.lineage import lineage, run_families
from ragrl.workflow.resources import growing_runtime, rule_resources, rule_threads
from ragrl.workflow.core import RESULTS, ROLLOUT_KEYS, SFT_DATA_KEYS, Run, recipe_json, recipe_part
from ragrl.workflow.table import Workflow, method_of

__all__ = ["RESULTS", "ROLLOUT_KEYS", "SFT_DATA_KEYS", "Run", "Workflow", "growing_runtime", "lineage", "method_of", "run_families",
           "normalise", "recipe_json", "recipe_part", "rule_resources", "rule_threads", "validate"]
