"""Choices made by hashing a key instead of drawing from a random stream.

The same key gives the same answer in every run, process and `PYTHONHASHSEED`, so two stages that
must agree (KnowRL's SFT builder and its evaluation) need not share a file, and adding or
reordering rows does not move which other rows are chosen.
"""

from __future__ import annotations

import hashlib


def in_hashed_share(key: str, share: float) -> bool:
    """Whether `key` falls in a fixed `share` of all keys (0: none, 1: all), by SHA-256."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share
