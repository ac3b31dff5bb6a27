"""Every run of the results database → its family, step and the runs a reader compares it with
(ragrl.results.paired). All of it follows from the run table, as the DAG does."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    recipes = dict(out)
    for plan in wf.pipelines.values():
        out.update(plan.lineage(recipes))
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


def run_families(wf: Workflow) -> list[str]:
    """The families of lineage(wf), in order of first appearance."""
    return list(dict.fromkeys(entry["family"] for entry in lineage(wf).values()))
