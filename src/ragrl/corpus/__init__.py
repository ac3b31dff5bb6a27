"""Passage corpora: readers for public formats into the passages contract."""

from ragrl.corpus.chunking import DEFAULT_WORDS, word_windows
from ragrl.corpus.readers import (
    CONTENT_ADDRESSED,
    CORPUS_FORMATS,
    PASSAGE_SCHEMA,
    content_id,
    format_contents,
    read_2wikimultihopqa,
    read_dpr,
    read_flashrag,
    read_hotpotqa,
    read_kilt,
    read_musique,
    read_passages,
    split_contents,
    write_flashrag_jsonl,
    write_passages,
)

__all__ = [
    "CONTENT_ADDRESSED",
    "CORPUS_FORMATS",
    "DEFAULT_WORDS",
    "PASSAGE_SCHEMA",
    "content_id",
    "format_contents",
    "read_2wikimultihopqa",
    "read_dpr",
    "read_flashrag",
    "read_hotpotqa",
    "read_kilt",
    "read_musique",
    "read_passages",
    "split_contents",
    "word_windows",
    "write_flashrag_jsonl",
    "write_passages",
]
