"""Progress in log files: plain lines, no carriage returns."""

from __future__ import annotations

import io

from ragrl.progress import progress


def test_log_lines_without_carriage_returns():
    stream = io.StringIO()  # not a TTY, like a Snakemake log file
    assert list(progress(range(5), desc="encode", unit="chunk", interval=0.0, stream=stream)) == list(range(5))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[-1].startswith("[done] encode: 5/5 chunk (100%)")
    assert len(lines) == 6  # one per item (interval 0) and the final line
