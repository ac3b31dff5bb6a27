"""Cutting documents into fixed-size word windows, as DPR did for its Wikipedia split.

DPR's 100-word passages (psgs_w100.tsv, also the basis of the wiki-18 corpus Search-R1 uses) run
across paragraph boundaries and do not overlap; matching that keeps retrieval numbers comparable
with published ones. "Word" means a whitespace-separated token, which is what DPR counted.
"""

from __future__ import annotations

from collections.abc import Iterable

from ragrl.errors import InputError

DEFAULT_WORDS = 100


def check_window(words: int) -> int:
    # bool is an int subclass; `words=True` is a config typo, not a window of one word.
    if isinstance(words, bool) or not isinstance(words, int) or words < 1:
        raise InputError(f"passage size must be a positive number of words, got {words!r}")
    return words


def word_windows(paragraphs: Iterable[str], words: int = DEFAULT_WORDS) -> list[str]:
    """Join the paragraphs' words and cut them into consecutive windows of at most `words`.

    Only the last window may be shorter; no window is empty.
    """
    check_window(words)
    tokens = [token for paragraph in paragraphs for token in paragraph.split()]
    return [" ".join(tokens[start : start + words]) for start in range(0, len(tokens), words)]
