"""What every part of the workflow shares: where outputs go, the run record, canonical JSON."""

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
