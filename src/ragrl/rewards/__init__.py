"""Rule-based rewards and metrics (pure functions; no model calls)."""

from ragrl.rewards.qa import (
    METRICS,
    composite_reward,
    cover_exact_match,
    exact_match,
    extract_answer,
    f1,
    format_reward,
    normalize_answer,
    strip_observations,
    turns_format_reward,
)

__all__ = [
    "METRICS",
    "composite_reward",
    "cover_exact_match",
    "exact_match",
    "extract_answer",
    "f1",
    "format_reward",
    "normalize_answer",
    "strip_observations",
    "turns_format_reward",
]
