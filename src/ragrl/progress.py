"""Progress reporting that reads well both in a terminal and in a Snakemake log file.

On a TTY this is a tqdm bar. In a log file (not a TTY) tqdm's carriage returns turn into one huge
line, so there we print a plain line at most every `interval` seconds and once at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")

_NOTED: set[str] = set()


def note_once(key: str, message: str) -> None:
    """Print `message` to stderr the first time `key` is seen in this process: a fallback said once
    in a log of thousands of steps, not once per step."""
    if key not in _NOTED:
        _NOTED.add(key)
        print(message, file=sys.stderr, flush=True)


def progress(
    items: Iterable[T],
    desc: str,
    total: int | None = None,
    unit: str = "it",
    interval: float = 10.0,
    stream=None,
) -> Iterator[T]:
    stream = stream if stream is not None else sys.stderr
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if stream.isatty():
        yield from tqdm(items, desc=desc, total=total, unit=unit, file=stream)
        return
    ticker = Ticker(desc, interval, stream)
    done = 0
    for item in items:
        yield item
        done += 1
        elapsed = ticker.due()
        if elapsed is not None:
            _line(stream, desc, done, total, unit, elapsed)
    _line(stream, desc, done, total, unit, ticker.elapsed(), final=True)


def _line(stream, desc: str, done: int, total: int | None, unit: str, elapsed: float, final: bool = False) -> None:
    rate = done / elapsed if elapsed > 0 else 0.0
    of = f"/{total}" if total is not None else ""
    pct = f" ({100.0 * done / total:.0f}%)" if total else ""
    tag = "done" if final else "progress"
    # Slow items (a chunk of 1024 passages, an RL step) read better as seconds per item.
    speed = f"{rate:.1f} {unit}/s" if rate >= 1 or done == 0 else f"{elapsed / done:.1f} s/{unit}"
    print(f"[{tag}] {desc}: {done}{of} {unit}{pct} in {elapsed:.1f}s, {speed}", file=stream, flush=True)


class Ticker:
    """Progress lines for work counted as it goes, whose total is not known ahead: how many turns a
    rollout batch takes depends on what the policy writes, and one batch of 100 KG-R1 questions is
    a minute of generation. At most one line every `interval` seconds, so a log shows the batch
    moving without a line per generate call. `progress` above keeps its pace with one."""

    def __init__(self, desc: str, interval: float = 10.0, stream=None) -> None:
        self.desc = desc
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self.start = self.last = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def due(self) -> float | None:
        """The seconds since the start when a line is due (at least `interval` since the last), else None."""
        now = time.monotonic()
        if now - self.last < self.interval:
            return None
        self.last = now
        return now - self.start

    def tick(self, counts: Mapping[str, int]) -> None:
        elapsed = self.due()
        if elapsed is not None:
            shown = ", ".join(f"{value:,} {name}" for name, value in counts.items())
            print(f"[progress] {self.desc}: {shown} in {elapsed:.1f}s", file=self.stream, flush=True)
