"""HARR (rules/harr.smk): jobs exist when config names `harr` (the default does; `harr: null` drops
them): filter -> train (HARR, and the no-history ablation) -> evaluation of the frozen generator
with the frozen / HARR / no-history encoder -> the encoders' recall@k on multi-hop questions -> tables.
A pipeline method (ragrl.workflow.pipelines): the generic layers reach it through PIPELINE only."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

from ragrl.recipe import HARR_RUNS, HarrRecipe, harr_generator_spec, harr_lineage, parse_harr
from ragrl.workflow.core import RESULTS, Run, recipe_json, recipe_part
from ragrl.workflow.pipelines import Pipeline, PipelinePlan
from ragrl.workflow.table import method_of

# harr.generator's keys that say how the generator is served (ragrl.recipe.harr_generator_spec).
ENDPOINT_KEYS = ("base_url", "served_name", "serve")


class HarrPlan(PipelinePlan):
    """The HARR runs of config `harr` (none without it)."""

    def settings(self) -> dict | None:
        return self.workflow.config.get("harr") or None

    @cached_property
    def parsed(self) -> HarrRecipe:
        """config `harr`, parsed (every key checked against its dataclass; ValueError if one is wrong)."""
        return parse_harr(self.settings())

    def runs(self) -> dict[str, tuple[bool, ...]]:
        """Evaluated HARR run ids -> (trained encoder?, history-aware states?); none without `harr`."""
        return dict(HARR_RUNS) if self.settings() else {}

    def trained_runs(self) -> list[str]:
        return [r for r, (trained, _) in self.runs().items() if trained]

    def json(self) -> str:
        return recipe_json(self.parsed.to_config())

    def generator_settings(self) -> dict:
        """harr.generator as a mapping (ragrl.recipe.harr_generator_spec): {run} or {model, recipe},
        with its endpoint settings."""
        return harr_generator_spec(self.settings()["generator"])

    def gating_runs(self) -> list[str]:
        if not self.settings() or (generator := self.generator()).stage == "outside":
            return []
        return [generator.id]

    def generator(self) -> Run:
        """The frozen generator as a run: a run of this workflow, or an outside checkpoint with the
        recipe settings config gives it (stage "outside")."""
        spec = self.generator_settings()
        if "run" in spec:
            return self.workflow.runs[spec["run"]]
        return Run("harr.generator", "harr.generator", spec["recipe"], spec["model"], "outside")

    def generator_definition(self) -> dict:
        spec = self.generator_settings()
        if "run" in spec:
            return self.workflow.run_definition(spec["run"])
        return {"model": spec["model"], "recipe": {"eval": recipe_part(spec["recipe"], "eval")}}

    def endpoint_args(self) -> list[str]:
        """--generator-endpoint for a served generator (external base_url, or `serve`: a vLLM server
        the job starts and stops); nothing when it is loaded in process."""
        spec = self.generator_settings()
        endpoint = {k: spec[k] for k in ENDPOINT_KEYS if k in spec}
        return ["--generator-endpoint", recipe_json(endpoint)] if endpoint else []

    def generator_json(self) -> str:
        return recipe_json(recipe_part(self.generator().settings, "eval"))

    def world_inputs(self) -> dict[str, Any]:
        """The generator's checkpoint, the dense index the encoder searches and its passages."""
        wf = self.workflow
        corpus = wf.config["retrieval"]["corpus"]
        spec = self.generator_settings()
        # An outside checkpoint (hub id or path) is not a workflow output: passed by name.
        return {"generator": wf.run_model_inputs(spec["run"]) if "run" in spec else [],
                "index": f"{wf.dense_index_dir(corpus, self.settings()['index'])}/meta.json",
                "passages": wf.passages_path(corpus)}

    def generator_arg(self, generator_input) -> str:
        model = self.generator().model
        if model == self.workflow.policy_dir():
            return self.workflow.policy_param(generator_input)
        return generator_input[0] if generator_input else model

    def history_flag(self, run: str) -> str:
        return "--history" if self.runs()[run][1] else "--no-history"

    def encoder_inputs(self, run: str) -> dict[str, str]:
        # The trained runs read their merged encoder; the frozen run the index's own encoder.
        return {"encoder": f"{RESULTS}/harr/train/{run}/work/final/state.json"} if self.runs()[run][0] else {}

    def encoder_args(self, inputs) -> list[str]:
        return ["--encoder", os.path.join(os.path.dirname(inputs["encoder"]), "encoder")] if "encoder" in inputs.keys() else []

    def errors(self) -> list[str]:
        """config `harr`: its settings, the generator run (one that searches), its index and datasets."""
        wf = self.workflow
        config = wf.config
        if not self.settings():
            return []
        try:
            parsed = self.parsed
        except (ValueError, TypeError) as exc:
            return [str(exc)]
        errors = []
        run = self.generator_settings().get("run")
        if run is not None and run not in wf.runs:
            errors.append(f"config key 'harr.generator': '{run}' is not an evaluated run {sorted(wf.runs)}")
        elif "retriever" not in method_of(self.generator().settings).inputs:
            what = f"run '{run}'" if run else "its recipe"
            errors.append(f"config key 'harr.generator': {what} does not search (its method reads no retriever)")
        if parsed.index not in config["retrieval"]["indexes"]:
            errors.append(f"config key 'harr.index': '{parsed.index}' is not a dense index of retrieval.indexes "
                          f"{sorted(config['retrieval']['indexes'])}")
        fields = [("train_dataset", parsed.train_dataset)] + [(f"eval_datasets[{i}]", d)
                                                              for i, d in enumerate(parsed.eval_datasets)]
        errors += [f"config key 'harr.{field}': '{name}' is not a key of datasets"
                   for field, name in fields if name not in config["datasets"]]
        return errors

    def outputs(self) -> list[str]:
        return self.evals()

    def evals(self) -> list[str]:
        return self.eval_outputs() + self.recall_outputs()

    def lineage(self, recipe_lineage) -> dict[str, dict[str, str | None]]:
        return harr_lineage(self.runs())

    def eval_outputs(self) -> list[str]:
        if not self.settings():
            return []
        return [f"{RESULTS}/harr/eval/{run}/{d}/metrics.json" for run in self.runs() for d in self.settings()["eval_datasets"]]

    def predictions(self) -> list[str]:
        return [p.replace("metrics.json", "predictions.parquet") for p in self.eval_outputs()]

    def recall_outputs(self) -> list[str]:
        if not self.settings() or not self.parsed.recall_k:
            return []
        return [f"{RESULTS}/harr/recall/{run}/{d}/metrics.json" for run in self.runs() for d in self.settings()["eval_datasets"]]

    def manifests(self) -> list[str]:
        return [f"{RESULTS}/harr/runs/{run}/run.json" for run in self.runs()]

    def train_logs(self) -> list[str]:
        # Named by run id: the results database files a training log under its directory's name.
        return [f"{RESULTS}/harr/train/{run}/train_log.jsonl" for run in self.trained_runs()]

    def tables(self) -> list[dict]:
        """Tables harr_em / harr_f1 (frozen vs HARR vs no-history, 95% intervals) and harr_recall /
        harr_all (the encoders' recall@k and all@k on the multi-hop questions, k = environment.topk)."""
        if not self.settings():
            return []
        parsed = self.parsed
        rows, evals = list(self.runs()), list(parsed.eval_datasets)
        answers = [
            {"name": "harr_em", "title": "HARR: the frozen generator with each query encoder (exact match)",
             "metric": "em", "runs": rows, "datasets": evals},
            {"name": "harr_f1", "title": "HARR: the frozen generator with each query encoder (F1)", "metric": "f1",
             "runs": rows, "datasets": evals},
        ]
        if not parsed.recall_k:
            return answers
        k = parsed.environment.topk if parsed.environment.topk in parsed.recall_k else max(parsed.recall_k)
        multihop = [f"{d}_multihop" for d in evals]
        return answers + [
            {"name": "harr_recall", "title": f"HARR: query encoders' recall@{k} on multi-hop questions",
             "metric": f"recall@{k}", "runs": rows, "datasets": multihop},
            {"name": "harr_all", "title": f"HARR: query encoders' all@{k} (every supporting passage) on multi-hop questions",
             "metric": f"all@{k}", "runs": rows, "datasets": multihop},
        ]


PIPELINE = Pipeline("harr", "rules/harr.smk", HarrPlan, builtin=True)
