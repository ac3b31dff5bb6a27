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
]
