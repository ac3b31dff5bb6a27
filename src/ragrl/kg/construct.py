"""Build a corpus-level KG with a constructor model: every passage, batched, resumable.

Each passage is a one-document constructor episode (the same chat frame and prompt as training,
`ragrl.kg.constructor`); its triples get the passage id as `source_id`. The output directory is
in the KG store's format (`triples.parquet`: head, relation, tail, source_id), so `ragrl serve-kg
--kg <out>` serves it and the PPR retriever reads its source edges.

Resume: batches are written as numbered part files into a work directory keyed by the settings
and the content of the passages and the model (`ragrl.workdir`); a re-run after a kill skips the
parts already written and generates only the rest. Parts keep the raw model output, so the
triples are re-derived (parse, validity) when the KG is assembled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ragrl.errors import InputError
from ragrl.io import write_json, write_parquet
from ragrl.kg.constructor import ChatFrame, Document, document_message
from ragrl.kg.extraction import parse_triples, unique_triples
from ragrl.progress import progress

PART_SCHEMA = pa.schema([("passage_id", pa.string()), ("output", pa.string())])
TRIPLE_SCHEMA = pa.schema([("head", pa.string()), ("relation", pa.string()), ("tail", pa.string()),
                           ("source_id", pa.string())])


@dataclass(frozen=True)
class ConstructSettings:
    batch_size: int = 16
    max_turn_tokens: int = 256
    temperature: float = 0.0  # greedy: the KG a constructor builds, not a sample of it
    top_p: float = 1.0
    allow_empty: bool = True  # a passage with nothing to extract adds no triples, it is no error here
    limit: int | None = None
    seed: int = 0
    system_prompt: str | None = None  # None: ragrl's constructor prompt (ragrl/kg/prompts)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_turn_tokens < 1:
            raise InputError(f"batch_size and max_turn_tokens must be >= 1, got {self.batch_size}, "
                             f"{self.max_turn_tokens}")


def read_passages(path: str | Path, limit: int | None = None) -> list[Document]:
    from ragrl.io import read_columns

    rows = read_columns(path, ["id", "text"], optional=("title",)).to_pylist()
    rows = rows[:limit] if limit is not None else rows
    return [Document(str(r["id"]), str(r.get("title") or ""), str(r["text"])) for r in rows]


def construct_kg(passages: str | Path, model: str | Path, out: str | Path, work: str | Path, generator, tokenizer,
                 settings: ConstructSettings = ConstructSettings(), endpoint: Mapping[str, str] | None = None) -> dict:
    """Generate every missing part, then assemble `out/triples.parquet` and `out/construction.json`.
    `endpoint`: where `generator` serves `model` ({base_url, served_name}; None: in process)."""
    from ragrl.agent.generation import cut_at_stop
    from ragrl.workdir import prepare_work_dir

    docs = read_passages(passages, settings.limit)
    work = Path(work)
    # Parts decoded by another server (or in process) are another model's output. Only a served run
    # adds the key, so the work of in-process runs keeps the fingerprint it had.
    # Likewise a system prompt: the work of runs with ragrl's own keeps its fingerprint.
    construct = {k: v for k, v in asdict(settings).items() if not (k == "system_prompt" and v is None)}
    definition = {"construct": construct, **({"endpoint": dict(endpoint)} if endpoint else {})}
    prepare_work_dir(work, definition, {"passages": passages, "model": model}, tag="construct-kg")
    frame = ChatFrame(tokenizer, settings.system_prompt)
    stops = [frame.eos_id] if frame.eos_id is not None else []
    batches = [docs[i:i + settings.batch_size] for i in range(0, len(docs), settings.batch_size)]
    todo = [b for b in range(len(batches)) if not _part(work, b).exists()]
    if len(todo) < len(batches):
        print(f"[construct-kg] resuming: {len(batches) - len(todo)} of {len(batches)} batches already in {work}",
              flush=True)
    start = time.monotonic()
    generated = 0
    for b in progress(todo, desc=f"construct KG ({len(docs)} passages, batch {settings.batch_size})", unit="batch"):
        batch = batches[b]
        prompts = [frame.prompt_ids(document_message(d, 0)) for d in batch]
        outputs = generator.generate(prompts, settings.max_turn_tokens, settings.temperature, settings.top_p,
                                     settings.seed * 1_000_003 + b, stop_token_ids=stops)
        texts = [tokenizer.decode(cut_at_stop(list(o), stops, settings.max_turn_tokens), skip_special_tokens=True)
                 for o in outputs]
        write_parquet(pa.Table.from_pylist([{"passage_id": d.id, "output": t} for d, t in zip(batch, texts)],
                                           schema=PART_SCHEMA), _part(work, b))
        generated += len(batch)
    elapsed = time.monotonic() - start
    stats = assemble(work, len(batches), out, settings.allow_empty)
    stats.update(passages=len(docs), generated_now=generated,
                 passages_per_s=round(generated / elapsed, 3) if generated and elapsed > 0 else None,
                 settings=asdict(settings), model=str(model))
    write_json(stats, Path(out) / "construction.json")
    return stats


def _part(work: Path, b: int) -> Path:
    return work / "parts" / f"part-{b:06d}.parquet"


def assemble(work: Path, n_parts: int, out: str | Path, allow_empty: bool = True) -> dict:
    """Parts → unique (head, relation, tail, source_id) triples in the KG store's format."""
    rows, invalid, errors = [], 0, {}
    for b in range(n_parts):
        for r in pq.read_table(_part(work, b)).to_pylist():
            turn = parse_triples(r["output"], allow_empty=allow_empty)
            if not turn.valid:
                invalid += 1
                kind = (turn.error or "").split(":")[0][:60]
                errors[kind] = errors.get(kind, 0) + 1
                continue
            rows += [{"head": t.subject, "relation": t.relation, "tail": t.object, "source_id": r["passage_id"]}
                     for t in unique_triples(turn.triples)]
    if not rows:
        print("[construct-kg] warning: no passage gave a valid triple; the KG is empty", flush=True)
    write_parquet(pa.Table.from_pylist(rows, schema=TRIPLE_SCHEMA), Path(out) / "triples.parquet")
    return {"triples": len(rows), "invalid_passages": invalid,
            "invalid_reasons": dict(sorted(errors.items())), "entities": len({x for r in rows for x in
                                                                             (r["head"], r["tail"])})}


def construct_kg_stage(passages: Path, model: Path | str, out: Path, work: Path, settings: ConstructSettings, *,
                       base_url: str | None = None, served_name: str | None = None) -> dict:
    """What `ragrl construct-kg` runs: the model in process (HF), or behind an OpenAI-compatible
    completions endpoint (`base_url`, the name it serves the model under)."""
    from ragrl.agent.generation import load_generator

    generator, tokenizer = load_generator(model, base_url=base_url, served_name=served_name)
    endpoint = {k: v for k, v in (("base_url", base_url), ("served_name", served_name)) if v}
    stats = construct_kg(passages, model, out, work, generator, tokenizer, settings, endpoint=endpoint)
    print("[construct-kg] " + json.dumps({k: stats[k] for k in ("passages", "triples", "invalid_passages",
                                                                 "passages_per_s")}), flush=True)
    return stats


__all__ = ["ConstructSettings", "assemble", "construct_kg", "construct_kg_stage", "read_passages"]
