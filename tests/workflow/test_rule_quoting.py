"""Paths from config reach the shell quoted (issue 18 F10): a space is part of the name, and a
`;` in a name runs nothing."""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO, TINY, run_snakemake

_PLACEHOLDER = re.compile(r"(?<!\{)\{([^{}]+)\}(?!\})")


def _shell_strings(text: str) -> list[str]:
    """The string literals of every `shell:` block of a rules file."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "shell:":
            continue
        for body in lines[i + 1:]:
            stripped = body.strip()
            if not stripped.startswith(('"', "'")):
                break
            found.append(stripped)
    return found


def test_every_shell_placeholder_is_quoted():
    unquoted = []
    for path in sorted((REPO / "rules").glob("*.smk")):
        for literal in _shell_strings(path.read_text()):
            unquoted += [f"{path.name}: {{{m}}}" for m in _PLACEHOLDER.findall(literal) if not m.endswith(":q")]
    assert not unquoted, unquoted


@pytest.mark.integration
def test_paths_with_space_and_semicolon(tmp_path):
    raw = tmp_path / "raw data; touch PWNED; x"
    raw.mkdir()
    corpus = raw / "psgs w100.tsv"
    corpus.write_text("id\ttext\ttitle\n" + "".join(f"{i}\tpassage {i} about topic {i % 7}\tT{i}\n"
                                                   for i in range(1, 41)))
    work = tmp_path / "work dir"
    work.mkdir()
    config = json.loads(json.dumps(TINY))
    config["corpora"] = {"raw": {"format": "dpr", "inputs": [str(corpus)]}}
    config["retrieval"].update(corpus="raw", indexes={"flat": "Flat"}, shards=2)
    targets = ["results/corpus/raw/passages.parquet", "results/index/raw/flat/meta.json", "results/index/raw/bm25"]
    proc = run_snakemake(work, config, *targets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.rglob("PWNED")) and not (work / "PWNED").exists()
    from ragrl.retrieval.searcher import load_searcher

    assert load_searcher(work / "results/index/raw/bm25").search(["17"], 1)[0][0].id == "17"
    assert len(load_searcher(work / "results/index/raw/flat").passages) == 40
