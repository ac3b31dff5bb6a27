"""Replies of the model endpoints a reward asks to grade or read text (KnowRL's grader and fact
extractor/verifier, AutoGraph-R1's judge).

A reward read from a broken endpoint is silently wrong: a null reply read as "no facts" zeroes
the factuality term, one read as "no" zeroes R_C, and training goes on against noise. So:
- a reply without a message (null content) is asked again like a transient failure, then raises
  naming the endpoint; one with no text before its token cap raises at once (`chat_text`);
- a reply with text in the wrong format keeps the reading the paper's code gives it (KnowRL: no
  facts, an unparsed grade scores 0; AutoGraph-R1: no), since a working model misformats now and
  then, but is counted and logged (`ReplyTally`); `DEAD_RUN` of them in a row raise: the
  endpoint no longer answers the prompt (a wrong model, a broken chat template).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import httpx

# Rewards score one trajectory at a time, so one call is often one reply: a run of off-format
# replies across calls, not one call, tells a dead endpoint from a stray reply. A model that
# misformats 5% of its replies gives 8 in a row about once in 2.6e10 replies; a dead one gives
# them within the first training step.
DEAD_RUN = 8


def chat_text(http: httpx.Client, url: str, body: dict, *, retries: int, backoff: float, max_backoff: float,
              rejected: type[Exception], unavailable: type[Exception], service: str) -> str:
    """The reply text of one chat completion. Transport failures are retried by
    `request_with_retries`. A null message is asked again up to `retries` times, then raises
    `rejected`, as does a body that is not a chat completion. A blank text cut by the token cap
    (finish_reason "length") raises at once: asked again at temperature 0 it is cut again, and the
    cap is a setting to raise. Any other blank text is returned: the caller's format check counts
    it as off-format, so one stray empty reply does not stop a training run (`ReplyTally`)."""
    from ragrl.http_retry import backoff_delay, request_with_retries

    finish = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_delay(attempt, backoff, max_backoff))
        response = request_with_retries(http, "POST", url, retries=retries, backoff=backoff, max_backoff=max_backoff,
                                        rejected=rejected, unavailable=unavailable, service=service, json=body)
        content, finish = _message(response, url, service, rejected)
        if content is not None and not content.strip() and finish == "length":
            raise rejected(f"{service} at {url} answered with no text before its token cap (model {body.get('model')!r}, "
                           f"max_tokens {body.get('max_tokens')!r}, finish_reason 'length'): raise max_tokens, or the "
                           "model does not answer this prompt; an empty reply is not scored as one")
        if content is not None:
            return content
    raise rejected(f"{service} at {url} answered with no content {retries + 1} time(s) (model {body.get('model')!r}, "
                   f"finish_reason {finish!r}); an empty reply is not scored as one")


def _message(response: httpx.Response, url: str, service: str, rejected: type[Exception]) -> tuple[str | None, Any]:
    try:
        choice = response.json()["choices"][0]
        content = choice["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise rejected(f"{service} at {url} answered without choices[0].message.content (not a chat completion): "
                       f"{response.text[:300]!r}") from None
    if content is not None and not isinstance(content, str):
        raise rejected(f"{service} at {url}: message content is {type(content).__name__}, not text")
    return content, choice.get("finish_reason")


@dataclass
class ReplyTally:
    """Off-format replies of one endpoint in one role: counted, logged per call that had any, and
    `dead_run` in a row raise `error` (None: never, for a measurement that wants every reply)."""

    role: str  # "grader", "fact extraction", ...
    where: str  # the endpoint's URL
    error: type[Exception]
    reading: str  # what an off-format reply is read as
    dead_run: int | None = DEAD_RUN
    log: TextIO | None = None
    replies: int = 0
    offformat: int = 0
    run: int = 0

    def record(self, usable: Sequence[bool]) -> int:
        """Count one call's replies, in order; returns how many were off-format."""
        bad = sum(not ok for ok in usable)
        self.replies += len(usable)
        self.offformat += bad
        for ok in usable:
            self.run = 0 if ok else self.run + 1
        if bad:
            print(f"{self.role} at {self.where}: {bad} of {len(usable)} replies off-format, read as {self.reading} "
                  f"({self.offformat} of {self.replies} so far)", file=self.log or sys.stderr, flush=True)
        if self.dead_run is not None and self.run >= self.dead_run:
            raise self.error(f"{self.role} at {self.where}: the last {self.run} replies were all off-format "
                             f"({self.offformat} of {self.replies} in all): the endpoint does not answer the "
                             "prompt, and its replies would score as " + self.reading)
        return bad

    def require_usable(self) -> None:
        """At the end of a job: a job whose every reply was off-format scored nothing."""
        if self.replies and self.offformat == self.replies:
            raise self.error(f"{self.role} at {self.where}: all {self.replies} replies were off-format; "
                             f"read as {self.reading}, every score would be that reading's")
