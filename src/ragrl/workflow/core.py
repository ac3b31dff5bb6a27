"""What every part of the workflow shares: where outputs go, the run record, what each stage of a
recipe reads, canonical JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Every output is under RESULTS (relative to Snakemake's working directory).
RESULTS = "results"


@dataclass(frozen=True)
class Run:
    """One evaluated run: a model evaluated under a recipe's settings.

    stage: base, no_retrieval, sft, rl, oracle; graph (a reader run answering every search from
    `graph`'s ranking on `datasets`); outside (a HARR generator that is no run of this workflow).
    own_datasets: a base run on its recipe's own evaluation datasets, not the shared ones."""

    id: str
    recipe: str
    settings: Mapping[str, Any]
    model: str
    stage: str
    own_datasets: bool = False
    graph: str | None = None
    reader: str | None = None
    datasets: tuple[str, ...] = ()


def recipe_json(settings: Any) -> str:
    """The canonical JSON of a setting: a job's params, so that equal settings compare equal."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


# What each stage of a recipe reads. Rules get only their part as params, so that editing one
# setting re-runs exactly the jobs it affects (Snakemake re-runs a job when its params change):
# a new RL learning rate re-runs that recipe's RL and what follows, not its SFT.
ROLLOUT_KEYS = ("env", "plugin", "retriever", "topk", "max_queries", "rollout", "seed", "options")
# How the SFT data are made (ragrl.recipe.SFT_EXTRA_KEYS minus `enabled`, which only gates the rules).
SFT_DATA_KEYS = ("limit", "source", "teacher", "import")


def recipe_part(settings: Mapping[str, Any], stage: str) -> dict:
    """What `stage` (sft_data, sft, rl, eval) of a recipe reads of its settings."""
    if stage == "sft_data":
        return {**{k: settings[k] for k in ROLLOUT_KEYS if k in settings},
                "sft": {k: settings["sft"].get(k) for k in SFT_DATA_KEYS if k in settings["sft"] or k == "limit"}}
    if stage == "sft":
        return {"sft": settings["sft"], "seed": settings.get("seed", 0)}
    if stage == "rl":
        return {k: v for k, v in settings.items() if k not in ("sft", "eval_datasets")}
    if stage == "eval":
        return {k: settings[k] for k in ROLLOUT_KEYS if k in settings}
    raise ValueError(stage)
