"""construct_kg (rules/construct_kg.smk): the knowledge graphs constructors build from a corpus,
the gold KGs they are compared with, graph_rank over each, and reader runs over the rankings."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ragrl.errors import InputError
from ragrl.workflow.core import RESULTS

if TYPE_CHECKING:
    from ragrl.workflow.core import Run
    from ragrl.workflow.table import Workflow

# What defines a graph besides its constructor: the passages it reads and the budgets.
BUILD_KEYS = ("corpus", "batch_size", "max_turn_tokens", "limit")


class GraphPlan:
    """The graphs of config `construct_kg` (none without it)."""

    def __init__(self, workflow: Workflow):
        self.workflow = workflow

    def settings(self) -> dict:
        return self.workflow.config.get("construct_kg") or {}

    def constructors(self) -> dict[str, Any]:
        """Graph name -> "policy" (the base policy), {run: id} (that run's model), or a path or hub id."""
        return self.settings().get("constructors", {})

    def gold(self) -> dict[str, str]:
        return self.settings().get("gold", {})

    def outputs(self) -> list[str]:
        return [f"{RESULTS}/kg_built/{name}/triples.parquet" for name in self.constructors()]

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

    def reader_runs(self, recipe_runs: dict[str, Run]) -> dict[str, Run]:
        """Reader runs: the reader run's policy and settings, every search answered by a graph's PPR
        ranking of the question's passages (stage "graph")."""
        s = self.settings()
        if not s.get("reader") or not s.get("datasets"):
            return {}
        reader = recipe_runs[s["reader"]]
        return {f"graph_{g}_reader": replace(reader, id=f"graph_{g}_reader", stage="graph", graph=g, reader=s["reader"],
                                             datasets=tuple(s["datasets"])) for g in self.names()}
