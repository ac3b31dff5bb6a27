"""Import a method's published cold-start SFT file into the SFT parquet (`ragrl.train.sft_data`).

Real datasets have no gold plans, so a paper recipe's SFT data come from a teacher or from the
file its authors published (RAG-R1 ships its SFT trajectories for LLaMA-Factory in data/SFT).
Formats (`sft.import.format`):

* `chat_json`: a JSON array or JSON Lines of conversations, each in one of LLaMA-Factory's
  layouts: OpenAI `{"messages": [{"role", "content"}, ...]}`, ShareGPT
  `{"conversations": [{"from": "human"|"gpt"|"system"|"observation", "value"}, ...]}`, or Alpaca
  `{"instruction", "input", "output"[, "system"]}`.
* `sft_parquet`: a parquet already in our layout (`id, input_ids, assistant_masks`), copied
  after its columns are checked.

Tokenization follows the policy's chat template, as the file's authors trained: the loss mask is
1 on assistant messages only (not on their role header), 0 on system / user / tool messages, and
0 inside any `<information>…</information>` block an assistant message carries inline (Search-R1
style trajectories put retrieved documents there: they are the environment's words). Each block
is encoded on its own, as the rollout engine encodes observations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from ragrl.agent.protocol import INFO_CLOSE, INFO_OPEN
from ragrl.errors import InputError
from ragrl.train.sft_data import SFTDataStats, report_stats, sft_row, write_sft_data

_INFO = re.compile("(" + re.escape(INFO_OPEN) + r".*?" + re.escape(INFO_CLOSE) + ")", re.S)
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "observation": "tool", "function": "tool", "tool": "tool"}


def read_chat_records(path: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, record) pairs: `file:line` for JSON Lines, `file[i]` for a JSON array."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        for i, rec in enumerate(records):
            yield f"{path}[{i}]", rec
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


def to_messages(record, where: str) -> list[dict]:
    """One conversation as OpenAI-style messages, whatever LLaMA-Factory layout it came in."""
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected an object, got {type(record).__name__}")
    if "messages" in record:
        messages = [{"role": str(m.get("role")), "content": m.get("content")} for m in _list(record, "messages", where)]
    elif "conversations" in record:
        messages = []
        for m in _list(record, "conversations", where):
            role = _SHAREGPT_ROLES.get(str(m.get("from")))
            if role is None:
                raise InputError(f"{where}: conversations[].from {m.get('from')!r} is not one of {sorted(_SHAREGPT_ROLES)}")
            messages.append({"role": role, "content": m.get("value")})
        if isinstance(record.get("system"), str):
            messages.insert(0, {"role": "system", "content": record["system"]})
    elif "instruction" in record and "output" in record:
        prompt = "\n".join(p for p in (record.get("instruction"), record.get("input")) if p)
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]
        if isinstance(record.get("system"), str):
            messages.insert(0, {"role": "system", "content": record["system"]})
    else:
        raise InputError(f"{where}: no 'messages', 'conversations' or 'instruction'/'output' (keys: {sorted(record)})")
    for i, m in enumerate(messages):
        if m["role"] not in ("system", "user", "assistant", "tool") or not isinstance(m["content"], str):
            raise InputError(f"{where}: message {i} needs a role in system/user/assistant/tool and a string content")
    if not any(m["role"] == "assistant" for m in messages) or messages[-1]["role"] != "assistant":
        raise InputError(f"{where}: the conversation must end with an assistant message")
    return messages


def _list(record: dict, key: str, where: str) -> list[dict]:
    value = record[key]
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise InputError(f"{where}: '{key}' must be a list of objects")
    return value


def tokenize_conversation(messages: list[dict], tokenizer) -> tuple[list[int], list[int]]:
    """Ids and loss mask of a conversation under the tokenizer's chat template (see module doc)."""
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            header = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
            _extend(ids, mask, tokenizer, _delta(header, rendered), 0)
            full = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
            body = _delta(full, header)
            for piece in _INFO.split(body):
                _extend(ids, mask, tokenizer, piece, 0 if _INFO.fullmatch(piece) else 1)
        else:
            full = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
            _extend(ids, mask, tokenizer, _delta(full, rendered), 0)
        rendered = full
    return ids, mask


def _delta(text: str, prefix: str) -> str:
    if not text.startswith(prefix):
        raise InputError("the policy's chat template does not render a conversation as a growing prefix; "
                         "import the file with a ChatML-style template")
    return text[len(prefix):]


def _extend(ids: list[int], mask: list[int], tokenizer, text: str, value: int) -> None:
    if text:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [value] * len(piece)


def import_sft_stage(path: str | Path, fmt: str, model_dir: str | Path, out: str | Path, *, rollout_cfg=None,
                     limit: int | None = None) -> dict:
    """The file at `path` as SFT rows tokenized for the policy in `model_dir`; conversations over
    the rollout's context budget are dropped (and counted), as the gold route drops them."""
    import transformers

    stats = SFTDataStats(f"import:{fmt}")
    if fmt == "sft_parquet":
        table = pq.read_table(path)
        missing = {"id", "input_ids", "assistant_masks"} - set(table.column_names)
        if missing:
            raise InputError(f"{path}: not an SFT parquet, missing columns {sorted(missing)}")
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        rows = [sft_row(str(r["id"]), r["input_ids"], r["assistant_masks"], int(r.get("num_turns") or 1), tokenizer)
                for r in table.to_pylist()[:limit]]
        stats.total = stats.kept = len(rows)
    elif fmt == "chat_json":
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        # A conversation longer than the context the engine ends trajectories at (none under roll).
        max_len = rollout_cfg.context_limit if rollout_cfg is not None else None
        rows = []
        for n, (where, record) in enumerate(read_chat_records(path)):
            if limit is not None and n >= limit:
                break
            stats.total += 1
            messages = to_messages(record, where)
            ids, mask = tokenize_conversation(messages, tokenizer)
            if max_len is not None and len(ids) > max_len:
                stats.dropped["sequence_too_long"] += 1
                continue
            turns = sum(m["role"] == "assistant" for m in messages)
            rows.append(sft_row(str(record.get("id", n)), ids, mask, turns, tokenizer))
        stats.kept = len(rows)
    else:
        raise InputError(f"unknown SFT import format {fmt!r}; expected chat_json or sft_parquet")
    write_sft_data(rows, stats, out)
    report_stats(stats, out)
    return stats.to_dict()
