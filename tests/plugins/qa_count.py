"""A pipeline method written outside ragrl, as a researcher would add one (tests/workflow/test_methods.py).

It counts the questions of one QA set (results/qa_count/<dataset>.json) with a rule of its own
(qa_count.smk, beside this file) and checks its one setting before the DAG is built. Nothing under
src/ or rules/ knows it: config enables it with

    pipelines:
      qa_count: {plugin: <path to this file>, dataset: world_test}
"""

from __future__ import annotations

from pathlib import Path

from ragrl.workflow.core import RESULTS
from ragrl.workflow.pipelines import Pipeline, PipelinePlan


class QACountPlan(PipelinePlan):
    def settings(self) -> dict:
        return self.workflow.config["pipelines"]["qa_count"]

    def errors(self) -> list[str]:
        dataset = self.settings().get("dataset")
        if dataset not in self.workflow.config["datasets"]:
            return [f"config key 'pipelines.qa_count.dataset': {dataset!r} is not a key of datasets"]
        return []

    def outputs(self) -> list[str]:
        return [f"{RESULTS}/qa_count/{self.settings()['dataset']}.json"]


PIPELINE = Pipeline("qa_count", str(Path(__file__).with_suffix(".smk")), QACountPlan)
