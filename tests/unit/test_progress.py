"""Progress in log files: plain lines, no carriage returns."""

from __future__ import annotations

import io

from ragrl.agent.generation import CountingGenerator
from ragrl.progress import Ticker, progress


def test_log_lines_without_carriage_returns():
    stream = io.StringIO()  # not a TTY, like a Snakemake log file
    assert list(progress(range(5), desc="encode", unit="chunk", interval=0.0, stream=stream)) == list(range(5))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[-1].startswith("[done] encode: 5/5 chunk (100%)")
    assert len(lines) == 6  # one per item (interval 0) and the final line


def test_ticker_lines_are_rate_limited_and_name_the_counts():
    stream = io.StringIO()
    ticker = Ticker("eval run/ds", interval=0.0, stream=stream)
    ticker.tick({"generate calls": 1, "new tokens": 12000})
    assert stream.getvalue().startswith("[progress] eval run/ds: 1 generate calls, 12,000 new tokens in ")
    quiet = Ticker("eval run/ds", interval=3600.0, stream=stream)
    quiet.tick({"generate calls": 2})
    assert len(stream.getvalue().splitlines()) == 1  # within the interval: no line


def test_counting_generator_counts_what_it_returns_and_passes_the_rest_through():
    class Scripted:
        tokenizer = "tok"

        def generate(self, batch, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                     stop_token_ids=(), stop_strings=()):
            assert stop_token_ids == (7,) and stop_strings == ("</search>",)
            return [[1] * (i + 1) for i in range(len(batch))]

    seen = []
    gen = CountingGenerator(Scripted(), seen.append)
    assert gen.generate([[5], [5], [5]], 4, stop_token_ids=(7,), stop_strings=("</search>",)) == [[1], [1, 1], [1, 1, 1]]
    gen.generate([[5]], 4, stop_token_ids=(7,), stop_strings=("</search>",))
    assert seen == [{"generate calls": 1, "sequences": 3, "new tokens": 6},
                    {"generate calls": 2, "sequences": 4, "new tokens": 7}]
    assert gen.tokenizer == "tok"
