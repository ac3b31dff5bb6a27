"""The library is a stack of layers (docs/ARCHITECTURE.md, "The layers"; the contract is
`[tool.importlinter]` in pyproject.toml): a module imports only from layers below its own, so no
two packages import each other. And no module imports another's private (`_name`) helpers: a
helper two modules share is public API of the one that defines it.

The contract runs through `lint-imports` (import-linter, on grimp's import graph), which sees
imports inside functions too: most of the library imports lazily, and the cycles it had
(toy <-> train, kg <-> rewards, train <-> methods through the verl bridge) were all lazy."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "ragrl"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(src_root: Path) -> subprocess.CompletedProcess:
    # --no-cache: grimp's cache lives in the working directory, and two xdist workers (or a copy of
    # the tree with the same module names) must not read each other's graph.
    env = {**os.environ, "PYTHONPATH": str(src_root)}
    return subprocess.run([str(LINT_IMPORTS), str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=src_root, env=env, capture_output=True, text=True, timeout=300)


def test_the_layer_contract_holds():
    proc = _lint(REPO / "src")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


# Each probe puts one import into a copy of src/ (inside a function, as the library's lazy imports
# are) that the contract must refuse: an upward import, the two cycles this contract replaced, and
# an import between siblings of one layer, which are declared independent.
PROBES = [
    ("ragrl/kg/probe_upward.py", "from ragrl.stages import agent", "ragrl.kg.probe_upward -> ragrl.stages.agent"),
    ("ragrl/toy/probe_cycle.py", "from ragrl.train.sft_data import SFT_SCHEMA",
     "ragrl.toy.probe_cycle -> ragrl.train.sft_data"),
    ("ragrl/kg/probe_cycle.py", "from ragrl.rewards.autograph import ConnectivityJudge",
     "ragrl.kg.probe_cycle -> ragrl.rewards.autograph"),
    ("ragrl/corpus/probe_sibling.py", "from ragrl.kg.store import KGStore",
     "ragrl.corpus.probe_sibling -> ragrl.kg.store"),
]


@pytest.mark.parametrize(("path", "line", "reported"), PROBES, ids=[p[0] for p in PROBES])
def test_the_contract_refuses(tmp_path, path, line, reported):
    shutil.copytree(SRC, tmp_path / "ragrl", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / path).write_text(f"def probe():\n    {line}\n    return None\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "0 kept, 1 broken" in proc.stdout
    assert reported in proc.stdout, proc.stdout[-3000:]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """`from ragrl.x import _name` (at any depth, inside functions too) in `module`, where
    ragrl.x is another module. A relative import is resolved against `module`'s package."""
    found = []
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[:len(package) - node.level + 1]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        if target.split(".")[0] != "ragrl" or target == module:
            continue
        found += [f"line {node.lineno}: from {target} import {a.name}" for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_crosses_a_module():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path, SRC.parent)
        hits = private_imports(path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py")
        offenders += [f"{module}: {hit}" for hit in hits]
    assert not offenders, "private names imported across modules (make them public):\n" + "\n".join(offenders)


def test_the_private_name_scan_finds_them():
    source = "import os\n\ndef f():\n    from ragrl.toy.tiny_model import TinyModelSpec, _helper\n"
    assert private_imports(source, "ragrl.train.pretrain") == ["line 4: from ragrl.toy.tiny_model import _helper"]
    assert private_imports("from .sft_data import _x\n", "ragrl.train.kg_sft_data") == [
        "line 1: from ragrl.train.sft_data import _x"]
    assert private_imports("from ..toy import _x\n", "ragrl.train", is_package=True) == [
        "line 1: from ragrl.toy import _x"]
    # A module's own private names and dunders are not crossings.
    assert private_imports("from ragrl.toy.tiny_model import _helper\n", "ragrl.toy.tiny_model") == []
    assert private_imports("from ragrl import __version__\n", "ragrl.cli") == []
