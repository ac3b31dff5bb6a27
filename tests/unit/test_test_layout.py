"""Where test files live, and that none imports another.

Every test_*.py sits in tests/unit/ (no Snakemake run, no backend), tests/workflow/ (Snakemake,
make, the CLI end to end) or tests/backends/ (vLLM, verl, SLURM, servers, GPU): tests/README.md.

No test file imports another: what several share lives in tests/helpers.py (or another module
whose name does not start with test_), so each test file stands alone and running one file never
collects, or sets up, another's."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = ("unit", "workflow", "backends")


def _test_file_imports(path: Path, test_modules: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path.name}:{node.lineno} imports {name}" for name in names
                  if name.split(".")[0] in test_modules]
    return found


def test_no_test_file_imports_another():
    files = sorted(TESTS.rglob("*.py"))
    test_modules = {p.stem for p in files if p.stem.startswith("test_")}
    assert test_modules, f"no test files under {TESTS}"
    offenders = [line for path in files for line in _test_file_imports(path, test_modules)]
    assert not offenders, "move what is shared to tests/helpers.py:\n" + "\n".join(offenders)


def test_every_test_file_is_in_one_of_the_three_folders():
    files = sorted(TESTS.rglob("test_*.py"))
    assert files, f"no test files under {TESTS}"
    misplaced = [str(p.relative_to(TESTS)) for p in files
                 if len(p.relative_to(TESTS).parts) != 2 or p.relative_to(TESTS).parts[0] not in FOLDERS]
    assert not misplaced, f"test files belong in tests/{{{','.join(FOLDERS)}}}/ (tests/README.md):\n" + "\n".join(misplaced)
    names = [p.name for p in files]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
