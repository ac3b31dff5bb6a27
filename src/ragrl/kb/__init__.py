"""KnowRL's knowledge base: SQLite `documents(title PRIMARY KEY, text)`, passages joined by a separator."""

from ragrl.kb.build import SEPARATOR, build_kb, kb_titles, read_document, validate_kb

__all__ = ["SEPARATOR", "build_kb", "kb_titles", "read_document", "validate_kb"]
