"""Per-rule resources from config `resources`: the entry named after the rule, over `default`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _merged(config: dict, rule_name: str) -> dict[str, Any]:
    merged = dict(config["resources"]["default"])
    merged.update(config["resources"]["rules"].get(rule_name, {}))
    return merged


def rule_resources(config: dict, rule_name: str) -> dict[str, Any]:
    """Snakemake resources of rule `rule_name` (threads apart: rule_threads); runtime grows on retry."""
    merged = _merged(config, rule_name)
    merged.setdefault("mem_mb", 2000)
    merged.setdefault("runtime", 30)
    merged.setdefault("gpu", 0)
    merged.pop("threads", None)
    if not merged["gpu"]:
        # A gpu_model set in `default` must not turn CPU rules into `--gpus=<model>:0` requests.
        merged.pop("gpu_model", None)
    merged["runtime"] = growing_runtime(merged["runtime"], merged.pop("max_runtime", None))
    return merged


def growing_runtime(minutes: int, cap: int | None = None) -> Callable[[Any, int], int]:
    """A Snakemake runtime callable: `minutes` on the first attempt, doubled on each retry, at most `cap`.

    A job killed at its time limit is retried (profile `retries`) with twice the time each
    attempt: 30 → 60 → 120 minutes, so a too-tight runtime in config costs a retry, not the run.
    The cap keeps a retry within the partition's MaxTime: beyond it sbatch refuses the job, while
    a retry at the cap still helps a job that resumes from checkpoints (RL)."""
    def runtime(wildcards, attempt):
        grown = minutes * 2 ** (attempt - 1)
        return grown if cap is None else max(minutes, min(grown, cap))

    return runtime


def rule_threads(config: dict, rule_name: str) -> int:
    return _merged(config, rule_name).get("threads", 1)
