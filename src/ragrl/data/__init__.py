"""QA sets: loaders for public formats into the QA contract."""

from ragrl.data.qa import QA_FORMATS, QA_SCHEMA, load_qa, write_qa

__all__ = ["QA_FORMATS", "QA_SCHEMA", "load_qa", "write_qa"]
