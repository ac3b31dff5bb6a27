"""construct_kg (rules/construct_kg.smk): the knowledge graphs constructors build from a corpus,
the gold KGs they are compared with, graph_rank over each, and reader runs over the rankings.
A pipeline method (ragrl.workflow.pipelines): the generic layers reach it through PIPELINE only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ragrl.errors import InputError
from ragrl.workflow.core import RESULTS
from ragrl.workflow.pipelines import Pipeline, PipelinePlan
from ragrl.workflow.table import method_of

if TYPE_CHECKING:
    from ragrl.workflow.core import Run

# What defines a graph besides its constructor: the passages it reads and the budgets.
BUILD_KEYS = ("corpus", "batch_size", "max_turn_tokens", "limit")


class GraphPlan(PipelinePlan):
    """The graphs of config `construct_kg` (none without it)."""

    def settings(self) -> dict:
        return self.workflow.config.get("construct_kg") or {}

    def constructors(self) -> dict[str, Any]:
        """Graph name -> "policy" (the base policy), {run: id} (that run's model), or a path or hub id."""
        return self.settings().get("constructors", {})

    def gold(self) -> dict[str, str]:
        return self.settings().get("gold", {})

    def built(self) -> list[str]:
        return [f"{RESULTS}/kg_built/{name}/triples.parquet" for name in self.constructors()]

    def outputs(self) -> list[str]:
        return self.rank_outputs() + self.manifests() + self.built()

    def evals(self) -> list[str]:
        return self.rank_outputs()

    def errors(self) -> list[str]:
        """construct_kg's names: its corpus, the runs that build graphs, the reader run, its datasets."""
        wf = self.workflow
        config, s = wf.config, self.settings()
        errors = []
        if s["corpus"] not in config["corpora"]:
            errors.append(f"config key 'construct_kg.corpus': '{s['corpus']}' is not a key of corpora {sorted(config['corpora'])}")
        known = wf.recipe_runs
        for name, spec in s["constructors"].items():
            if isinstance(spec, dict) and spec["run"] not in known:
                errors.append(f"config key 'construct_kg.constructors.{name}.run': '{spec['run']}' is not an evaluated run {sorted(known)}")
        for name in set(s["constructors"]) & set(s.get("gold", {})):
            errors.append(f"config key 'construct_kg.gold.{name}': '{name}' is also a constructor")
        for i, name in enumerate(s.get("datasets", [])):
            if name not in config["datasets"]:
                errors.append(f"config key 'construct_kg.datasets[{i}]': '{name}' is not a key of datasets")
        reader = s.get("reader")
        if reader is not None:
            if reader not in known:
                errors.append(f"config key 'construct_kg.reader': '{reader}' is not an evaluated run {sorted(known)}")
            elif "retriever" not in method_of(known[reader].settings).inputs:
                errors.append(f"config key 'construct_kg.reader': run '{reader}' does not search (its method reads no retriever)")
            if len(s.get("datasets", [])) > 1:
                errors.append("config key 'construct_kg.reader': reader runs answer one dataset; construct_kg.datasets names "
                              f"{len(s['datasets'])}")
        return errors

    def constructor(self, name: str) -> Any:
        constructors = self.constructors()
        if name not in constructors:
            raise InputError(f"construct_kg.constructors has no {name!r}; it names {sorted(constructors)}")
        return constructors[name]

    def constructor_inputs(self, name: str) -> dict[str, Any]:
        # "policy": the base policy (the built tiny model is a workflow output); {run: id}: that run's
        # checkpoint (a workflow output); else a path or hub id.
        spec, wf = self.constructor(name), self.workflow
        if isinstance(spec, dict):
            model = wf.run_model_inputs(spec["run"])
        else:
            model = wf.policy_inputs() if spec == "policy" else []
        return {"passages": wf.passages_path(self.settings()["corpus"]), "model": model}

    def constructor_model(self, name: str, model_input) -> str:
        spec, wf = self.constructor(name), self.workflow
        if isinstance(spec, dict):
            return wf.model_param(wf.runs[spec["run"]].model, model_input)
        return wf.policy_param(model_input) if spec == "policy" else spec

    def definition(self, graph: str) -> dict:
        """What defines a graph: a gold KG's path, or its constructor (a run's definition or a model)."""
        s = self.settings()
        if graph in self.gold():
            return {"gold": s["gold"][graph]}
        spec = s["constructors"][graph]
        settings = {k: s.get(k) for k in BUILD_KEYS}
        if s.get("system_prompt") is not None:  # absent: the definition stays as it was
            settings["system_prompt"] = s["system_prompt"]
        if isinstance(spec, dict):
            return {"run": self.workflow.run_definition(spec["run"]), **settings}
        return {"model": self.workflow.config["models"]["policy"] if spec == "policy" else spec, **settings}

    def names(self) -> list[str]:
        """Graphs the benchmark ranks passages over: each constructor's KG, then the gold KGs."""
        return list(self.constructors()) + list(self.gold())

    def triples(self, graph: str) -> str:
        gold = self.gold()
        return f"{gold[graph].rstrip('/')}/triples.parquet" if graph in gold else f"{RESULTS}/kg_built/{graph}/triples.parquet"

    def rank_outputs(self) -> list[str]:
        datasets = self.settings().get("datasets", [])
        return [f"{RESULTS}/graph_rag/graph_{g}/{d}/metrics.json" for g in self.names() for d in datasets]

    def manifests(self) -> list[str]:
        if not self.settings().get("datasets"):
            return []
        return [f"{RESULTS}/graph_rag/runs/graph_{g}/run.json" for g in self.names()]

    def eval_runs(self, recipe_runs: Mapping[str, Run]) -> dict[str, Run]:
        """Reader runs: the reader run's policy and settings, every search answered by a graph's PPR
        ranking of the question's passages (stage "graph")."""
        s = self.settings()
        # A dangling reader is a config error (errors(), which may run after HARR's asked for the runs).
        if not s.get("reader") or not s.get("datasets") or s["reader"] not in recipe_runs:
            return {}
        reader = recipe_runs[s["reader"]]
        return {f"graph_{g}_reader": replace(reader, id=f"graph_{g}_reader", stage="graph", graph=g, reader=s["reader"],
                                             datasets=tuple(s["datasets"])) for g in self.names()}

    def run_inputs(self, run: Run) -> dict[str, Any]:
        # One dataset (checked): its ranking over the run's graph.
        return {"passages": self.workflow.passages_path(self.workflow.config["retrieval"]["corpus"]),
                "ranking": f"{RESULTS}/graph_rag/graph_{run.graph}/{run.datasets[0]}/ranking.parquet"}

    def run_args(self, run: Run, inputs: Mapping[str, Any]) -> list[str]:
        return ["--ranking", inputs["ranking"], "--passages", inputs["passages"]]

    def run_definition(self, run: Run) -> dict:
        """The reader's own definition, and the graph its passages come from."""
        assert run.reader is not None and run.graph is not None
        return {**self.workflow.run_definition(run.reader), "graph": {run.graph: self.definition(run.graph)}}

    def lineage(self, recipe_lineage: Mapping[str, Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
        """The corpus-level graphs (graph_<g>) and their reader runs (graph_<g>_reader): a graph built
        by a run takes that run's step and starts from the graph its start run built; a gold graph is
        the variant of the graph an RL constructor built; a reader run varies the reader's own run."""
        wf = self.workflow
        runs, gold = wf.recipe_runs, self.gold()
        built = {g: spec["run"] for g, spec in self.constructors().items() if isinstance(spec, dict)}
        # The model behind each constructor: a run's, or the base policy's ("policy").
        models = {g: runs[r].model for g, r in built.items()}
        models.update({g: wf.policy_dir() for g, spec in self.constructors().items() if spec == "policy"})

        def graph_step(g):
            if g in gold:
                return "gold"
            if g in built:
                return recipe_lineage[built[g]]["step"]
            return "base" if g in models else "model"

        def built_by(run):
            # The graph the model of `run` built (the base policy's, for a base run).
            return next((g for g, m in models.items() if run and m == runs[run].model), None)

        final = next((g for g, r in built.items() if recipe_lineage[r]["step"] == "rl"), None)

        def links(g):
            if g in gold:
                return {"variant_of": final}
            return {"start_run": built_by(recipe_lineage[built[g]].get("start_run"))} if g in built else {}

        out: dict[str, dict[str, str | None]] = {}
        for g in self.names() if self.manifests() else []:
            out[f"graph_{g}"] = {"family": "construct_kg", "step": graph_step(g),
                                 **{k: f"graph_{v}" for k, v in links(g).items() if v}}
        readers = self.eval_runs(runs)
        for g in self.names() if readers else []:
            entry = {"family": "construct_kg", "step": f"{graph_step(g)} graph",
                     **{k: f"graph_{v}_reader" for k, v in links(g).items() if v}}
            entry.setdefault("variant_of", self.settings()["reader"])
            out[f"graph_{g}_reader"] = entry
        return out


PIPELINE = Pipeline("construct_kg", "rules/construct_kg.smk", GraphPlan, builtin=True)
