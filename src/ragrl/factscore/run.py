"""`ragrl factscore`: score a JSONL of {id?, topic, text} against a KB, one JSON line out per input."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ragrl.factscore.core import FactScorer


def read_items(path: str | os.PathLike) -> list[dict]:
    from ragrl.corpus.readers import get_str, iter_jsonl

    items = []
    for at, record in iter_jsonl(path):
        topic = get_str(record, "topic", at, nonblank=True)
        text = get_str(record, "text", at)
        items.append({"id": str(record.get("id", at.line)), "topic": topic, "text": text})
    return items


def score_file(scorer: FactScorer, path: str | os.PathLike, out: str | os.PathLike, batch_size: int = 64) -> dict:
    """Score every item (in batches: one extraction batch per `batch_size` texts); the output is
    written only when all are scored, and not when every reply of the backend's model was in the
    wrong format (its reading, no facts, would be every score)."""
    from ragrl.io import write_text
    from ragrl.progress import progress

    items = read_items(path)
    lines = []
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    for batch in progress(batches, f"factscore {Path(path).name}", unit="batch"):
        for item, fs in zip(batch, scorer.score_many([(it["topic"], it["text"]) for it in batch])):
            lines.append(json.dumps({"id": item["id"], **fs.to_dict()}, ensure_ascii=False))
    scorer.require_usable_replies()
    write_text("\n".join(lines) + "\n", out)
    scored = [json.loads(line) for line in lines]
    n = len(scored)
    return {"items": n, "mean_score": sum(s["score"] for s in scored) / n,
            "mean_precision": sum(s["precision"] for s in scored) / n,
            "missing_topics": len(scorer.missing_topics), "backend_calls": dict(scorer.calls),
            "offformat_replies": scorer.offformat}
