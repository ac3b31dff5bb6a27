"""Every run of the results database → its family, step and the runs a reader compares it with
(ragrl.results.paired). All of it follows from the run table, as the DAG does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragrl.recipe import harr_lineage

if TYPE_CHECKING:
    from ragrl.workflow.table import Workflow

# The stages whose model a recipe trains (or leaves untrained); the others evaluate one of these otherwise.
MODEL_STAGES = ("base", "sft", "rl")


def lineage(wf: Workflow) -> dict[str, dict[str, str]]:
    """Run id → {family, step} and, where they exist: start_run (what its model was trained from),
    variant_of (the same policy or constructor with one thing changed: oracle or no retrieval, a
    graph's ranking, the gold graph), ablation_of (a recipe sharing another's SFT start, sft.from,
    against that recipe's RL run)."""
    out = recipe_lineage(wf)
    out.update(graph_lineage(wf, out))
    out.update(harr_lineage(wf.harr.runs()))
    return {r: {k: v for k, v in entry.items() if v is not None} for r, entry in out.items()}


def recipe_lineage(wf: Workflow) -> dict[str, dict[str, str | None]]:
    """The lineage of the recipes' runs (ragrl.workflow.Workflow.recipe_runs)."""
    runs = wf.recipe_runs

    def run_of(name, stage):
        return next((r for r, run in runs.items() if run.recipe == name and run.stage == stage), None)

    def base_of(name):
        # The untrained policy on the recipe's own task, else the shared base row.
        shared = next((r for r, run in runs.items() if run.stage == "base" and not run.own_datasets), None)
        return run_of(name, "base") or shared

    out = {}
    for run_id, run in runs.items():
        name, stage = run.recipe, run.stage
        owner = wf.sft_owner(name)
        entry = {"family": owner, "step": stage}
        if stage == "sft":
            entry["start_run"] = base_of(name)
        elif stage == "rl":
            entry["start_run"] = run_of(owner, "sft") if wf.sft_enabled(name) else base_of(owner)
            if owner != name:
                entry["ablation_of"] = run_of(owner, "rl")
        elif stage != "base":  # oracle, no_retrieval: the model of a trained (or base) run, evaluated otherwise
            entry["variant_of"] = next((r for r, o in runs.items() if o.model == run.model
                                        and o.recipe == name and o.stage in MODEL_STAGES), None)
        out[run_id] = entry
    return out


def graph_lineage(wf: Workflow, recipe_lineage: dict[str, dict[str, str | None]]) -> dict[str, dict[str, str | None]]:
    """The corpus-level graphs (graph_<g>) and their reader runs (graph_<g>_reader): a graph built
    by a run takes that run's step and starts from the graph its start run built; a gold graph is
    the variant of the graph an RL constructor built; a reader run varies the reader's own run."""
    graphs, runs = wf.graphs, wf.recipe_runs
    gold = graphs.gold()
    built = {g: spec["run"] for g, spec in graphs.constructors().items() if isinstance(spec, dict)}
    # The model behind each constructor: a run's, or the base policy's ("policy").
    models = {g: runs[r].model for g, r in built.items()}
    models.update({g: wf.policy_dir() for g, spec in graphs.constructors().items() if spec == "policy"})

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

    out = {}
    for g in graphs.names() if graphs.manifests() else []:
        out[f"graph_{g}"] = {"family": "construct_kg", "step": graph_step(g),
                             **{k: f"graph_{v}" for k, v in links(g).items() if v}}
    readers = graphs.reader_runs(runs)
    for g in graphs.names() if readers else []:
        entry = {"family": "construct_kg", "step": f"{graph_step(g)} graph",
                 **{k: f"graph_{v}_reader" for k, v in links(g).items() if v}}
        entry.setdefault("variant_of", graphs.settings()["reader"])
        out[f"graph_{g}_reader"] = entry
    return out


def run_families(wf: Workflow) -> list[str]:
    """The families of lineage(wf), in order of first appearance."""
    return list(dict.fromkeys(entry["family"] for entry in lineage(wf).values()))
